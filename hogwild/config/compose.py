"""Compose and validate the config from a command line, before Hydra runs anything.

The command line is read by Hydra's own argument parser and sweeps are expanded by Hydra's
basic sweeper, so this module keeps no list of Hydra's flags. Every job a multirun would
start is composed and converted to the dataclass schema up front (design rule 9 in
docs/design.md): a bad value anywhere in a sweep fails in one line before the first job runs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hogwild.config import schema as config_mod
from hogwild.config.env import default_run_id
from hogwild.config.defaults import resolved
from hogwild.config.moved import renamed
from hogwild.config.schema import Config
from hogwild.errors import ConfigError, UserError, first_line
from hogwild.files import make_run_dir, refuse_links


def _conf_dir() -> str:
    """The bundled configs: ``hogwild/conf`` in an installed wheel (pyproject.toml maps the
    repository's ``conf/`` onto the package ``hogwild.conf``), ``conf/`` beside the package in a
    source checkout or an editable install."""
    pkg = Path(__file__).resolve().parent.parent
    for cand in (pkg / "conf", pkg.parent / "conf"):
        if (cand / "config.yaml").is_file():
            return str(cand)
    raise FileNotFoundError(f"hogwild's configs are missing: neither {pkg / 'conf'} nor {pkg.parent / 'conf'} "
                            "holds config.yaml (a broken install; reinstall the package)")


CONF_DIR = _conf_dir()
GROUPS = ("model", "data", "optim", "sync", "experiment")
# Past this many jobs, each swept value is checked once (with the others at their first
# value) instead of every combination: composing costs ~30 ms per job.
MAX_COMBINATIONS = 64


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("hogwild_run_id"):
        OmegaConf.register_new_resolver("hogwild_run_id", lambda: default_run_id())
    config_mod.register()


def _omegaconf_message(e: BaseException) -> str:
    """``train.epochs: Value 'x' could not be converted to Integer`` from any OmegaConf error."""
    chain: list[BaseException] = []
    cur: Optional[BaseException] = e
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    for err in chain:
        if isinstance(err, UserError):
            return str(err)
    for err in chain:
        if isinstance(err, OmegaConfBaseException):
            key = getattr(err, "full_key", None) or getattr(err, "key", None) or "config"
            text = first_line(err)
            if "not in struct" in text or (text.startswith("Key '") and "' not in '" in text):
                text = "unknown config key (misspelled?)"
                if str(key).split(".")[0] in _target_groups():
                    text += f"; an argument of {str(key).split('.')[0]}._target_ takes a '+': +{key}=..."
            return f"{key}: {text}"
    appended = re.search(r"Could not append to config\. An item is already at '([\w.]+)'", first_line(e))
    if appended:
        key = appended.group(1)
        return _plus_on_field(key)
    return first_line(e)


def _unknown_keys(node: Any, schema: type, prefix: str = "") -> None:
    """Hydra's ``+key=value`` can add a key the schema does not have (``+train.epoch=1`` for
    ``train.epochs``); OmegaConf then drops it silently. Refuse it instead, naming it."""
    import dataclasses
    import difflib

    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in node.keys():
        name = f"{prefix}{key}"
        if key not in fields:
            near = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean {prefix}{near[0]}?)" if near else ""
            raise ConfigError(f"{name}: unknown config key{hint}")
        sub = fields[key].type
        sub = getattr(config_mod, sub, None) if isinstance(sub, str) else sub
        if dataclasses.is_dataclass(sub) and OmegaConf.is_dict(node._get_node(key)):
            _unknown_keys(node._get_node(key), sub, f"{name}.")  # type: ignore[arg-type]


def _target_groups() -> dict[str, type]:
    """The groups whose schema takes a ``_target_`` (model, data, loss, optim, sched), read off
    the schema itself, so a new one needs no second list here."""
    import dataclasses
    import typing

    return {name: t for name, t in typing.get_type_hints(Config).items()
            if dataclasses.is_dataclass(t) and "_target_" in {f.name for f in dataclasses.fields(t)}}


def _target_kwargs(dcfg: Any) -> None:
    """``model._target_=X +model.depth=3``: keys under a group with a ``_target_`` that the schema
    lacks are the target's keyword arguments; move them into ``kwargs`` (checked against the
    target's signature when it is called)."""
    import dataclasses

    from omegaconf import open_dict

    for group, schema in _target_groups().items():
        node = dcfg.get(group) if OmegaConf.is_dict(dcfg) else None
        if node is None or not node.get("_target_"):
            continue
        known = {f.name for f in dataclasses.fields(schema)}
        with open_dict(node):
            for key in [k for k in node.keys() if k not in known]:
                node.kwargs[key] = node[key]
                del node[key]


def to_config(dcfg: Any) -> Config:
    """DictConfig -> validated :class:`Config`; every failure becomes a :class:`ConfigError`."""
    if OmegaConf.is_dict(dcfg):
        _target_kwargs(dcfg)
        _unknown_keys(dcfg, Config)
    try:
        cfg = OmegaConf.to_object(dcfg)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - OmegaConf wraps __post_init__ errors in its own types
        raise ConfigError(_omegaconf_message(e)) from None
    assert isinstance(cfg, Config)
    return resolved(cfg)  # the sync defaults a job runs with, decided once (config/defaults.py)


def _group_options(conf_dir: str, group: str) -> list[str]:
    return sorted(p.stem for p in Path(conf_dir, group).glob("*.yaml"))


def _unparsable(parser: Any, overrides: list[str]) -> str:
    """The key of the first override Hydra's grammar refuses ("override" when none alone is)."""
    for o in overrides:
        try:
            parser.parse_overrides([o])
        except Exception:  # noqa: BLE001 - the one that fails names its key
            key = o.partition("=")[0].strip().lstrip("+~")
            return key if key and o.count("=") else "override"
    return "override"


def _jobs(overrides: list[str], conf_dir: str, multirun: bool) -> list[list[str]]:
    """The override list of every job the command line starts (one unless it sweeps)."""
    import itertools

    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    try:
        parsed = parser.parse_overrides(overrides)
    except Exception as e:  # noqa: BLE001 - Hydra's grammar errors
        hint = next((f" (Hydra's grammar takes no bare ~: write {o.split('=')[0]}=$HOME/..., or quote the value)"
                     for o in overrides if "=~" in o or "=~/" in o), "")
        raise ConfigError(f"{_unparsable(parser, overrides)}: {first_line(e)}{hint}") from None
    parsed = [o for o in parsed if not o.get_key_element().lstrip("+~").startswith(("hydra.", "hydra/"))]
    for o in parsed:
        group = o.get_key_element().lstrip("+~").split("@")[0]
        if group not in GROUPS:
            continue
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()]
        options = _group_options(conf_dir, group)
        for value in values:
            if isinstance(value, str) and value not in options:
                raise ConfigError(f"{group}: unknown option {value!r}; choose one of {', '.join(options)}")
    if not multirun:
        return [overrides]  # a sweep without -m is Hydra's error, raised by compose()
    # Every combination of the swept values, as Hydra's basic sweeper would run them.
    # A key given twice keeps its last value.
    choices: dict[str, list[str]] = {}
    for o in parsed:
        key = o.get_key_element()
        if o.is_sweep_override() and not o.is_discrete_sweep():
            raise ConfigError(f"{key}: an interval sweep needs a sweeper plugin; list the values instead (a,b,c)")
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
        choices[key] = [f"{key}={v}" for v in values]
    jobs = [list(job) for job in itertools.product(*choices.values())]
    if len(jobs) <= MAX_COMBINATIONS:
        return jobs
    first = jobs[0]
    per_value = {tuple(first)}
    for i, o in enumerate(parsed):
        if o.is_sweep_override():
            for line in (f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()):
                per_value.add(tuple(first[:i] + [line] + first[i + 1:]))
    return [list(j) for j in per_value]


def _plus_on_field(key: str) -> str:
    return (f"{key}: already a config key: set it without '+' ({key}=...); "
            "a _target_ whose signature takes it is passed it")


def _refuse_plus_on_fields(overrides: list[str]) -> None:
    """``+data.path=x`` on a schema field: Hydra refuses a ``+`` only where the key holds a value,
    so on a field whose default is None it appended the key without a word. Refused the same way
    for every field (a ``+`` is for a _target_'s own arguments)."""
    import dataclasses
    import typing

    for override in overrides:
        if not override.startswith("+") or override.startswith("++"):
            continue
        key = override[1:].partition("=")[0]
        node: Any = Config
        for part in key.split("."):
            hints = typing.get_type_hints(node) if dataclasses.is_dataclass(node) else {}
            if part not in hints:
                break
            node = hints[part]
        else:
            raise ConfigError(_plus_on_field(key))


def compose(overrides: list[str], config_name: str = "config", conf_dir: str = CONF_DIR) -> Config:
    """The validated :class:`Config` of one job's overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    overrides = renamed(overrides)
    _refuse_plus_on_fields(overrides)
    try:
        with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
            dcfg = hydra_compose(config_name=config_name, overrides=overrides)
    except Exception as e:  # noqa: BLE001 - Hydra composition errors of every kind
        raise ConfigError(_omegaconf_message(e)) from None
    return to_config(dcfg)


def preflight(argv: list[str]) -> Optional[Config]:
    """Validate every job of this command line; the first job's config, or None when Hydra is
    asked to print (``--help``, ``--cfg``, ``--info``, ...) rather than run."""
    # Hydra's own argument parser, so its flags need no second list here. It is in a private
    # module: pyproject.toml bounds hydra-core below 1.4, and tests/config covers every flag we read.
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(argv)
    if args.help or args.hydra_help or args.cfg or args.info or args.shell_completion:
        return None
    conf_dir = str(Path(args.config_dir).resolve()) if args.config_dir else CONF_DIR
    name = args.config_name or "config"
    overrides = list(args.overrides)
    jobs = _jobs(overrides, conf_dir, args.multirun)
    first: Optional[Config] = None
    for num, job in enumerate(jobs):
        cfg = compose(job, name, conf_dir)
        run_dir = Path(cfg.run_dir, str(num)) if args.multirun else Path(cfg.run_dir)
        make_run_dir(run_dir)
        refuse_links(run_dir)
        first = first or cfg
    return first

