"""``_target_`` import paths (``model._target_``, ``data._target_``): import and call a user's
callable, turning every way it can fail into one line that names the key."""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any, Callable, Optional

from omegaconf import OmegaConf

from hogwild.errors import PASSES, ConfigError, ForcedExit, first_line, user_call


def import_target(path: str, key: str) -> Callable[..., Any]:
    """The object at ``path``: a module attribute (``torch.optim.AdamW``), or an attribute of one
    (``transformers.AutoModelForCausalLM.from_config``, a classmethod), found by importing the
    longest prefix that is a module."""
    parts = path.split(".")
    error: Optional[BaseException] = None
    for cut in range(len(parts) - 1, 0, -1) if len(parts) > 1 else [1]:
        module = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(module)
        except ForcedExit:
            raise
        except SystemExit as e:
            raise ConfigError(f"{key}: importing {path!r} called sys.exit({e.code!r}) instead of returning") from None
        except ModuleNotFoundError as e:
            if e.name is not None and module.startswith(e.name) and cut > 1:
                error = error or e
                continue  # not a module: a shorter prefix may be, and the rest its attributes
            error = e
            break
        except (SystemExit, KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as e:  # noqa: BLE001 - a module that fails to import, however it raises
            error = e
            break
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError as e:
            error = e
            break
        return obj  # type: ignore[no-any-return]
    assert error is not None
    raise ConfigError(f"{key}: cannot import {path!r} ({type(error).__name__}: {first_line(error)})") from None


def build_nested(value: Any, key: str) -> Any:
    """``value`` with every mapping that holds a ``_target_`` built first, innermost first, as
    Hydra's ``instantiate`` does: ``model._target_=GPT +model.config._target_=GPTConfig
    +model.config.n_layer=2`` calls ``GPT(config=GPTConfig(n_layer=2))``."""
    if isinstance(value, dict):
        built = {k: build_nested(v, f"{key}.{k}") for k, v in value.items() if k != "_target_"}
        target = value.get("_target_")
        if not target:
            return built
        fn = import_target(str(target), f"{key}._target_")
        return call_target(fn, str(target), key, built, built)
    if isinstance(value, list):
        return [build_nested(v, f"{key}.{i}") for i, v in enumerate(value)]
    return value


def signature_of(fn: Callable[..., Any]) -> tuple[set[str], bool]:
    """The keyword names ``fn`` takes, and whether it takes ``**kwargs`` (also when its signature
    cannot be read: a builtin, a C extension)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return set(), True
    names = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return names, any(p.kind is p.VAR_KEYWORD for p in params.values())


def schema_kwargs(node: Any, fn: Callable[..., Any], path: str, group: str, handled: tuple[str, ...] = ()
                  ) -> dict[str, Any]:
    """The fields of a group's schema (``model.dropout``, ``optim.momentum``, ``sched.step_size``)
    that the user set to other than their default, for a ``_target_`` that takes them: never
    dropped in silence. A changed field the target does not take is an error naming it.
    ``handled``: fields hogwild applies itself (``optim.lr``, ``sched.warmup_steps``)."""
    import dataclasses

    names, open_kw = signature_of(fn)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(node):
        if f.name in ("name", "_target_", "kwargs", *handled) or f.name in node.kwargs:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        value = getattr(node, f.name)
        if value == default:
            continue
        if f.name not in names and not open_kw:
            raise ConfigError(f"{group}.{f.name}: {path} takes no argument {f.name!r} (set to {value!r}; "
                              f"remove it, or pass what {path} takes as {group}.<argument>=...)")
        out[f.name] = value
    return out


def call_target(fn: Callable[..., Any], path: str, group: str, kwargs: dict[str, Any],
                given: dict[str, Any]) -> Any:
    """``fn(**kwargs)``, every nested ``_target_`` among them built first (:func:`build_nested`);
    a keyword the user gave (``given``) that ``fn`` rejects is named as ``<group>.<arg>``, any
    other failure as ``<group>._target_``."""
    kwargs = {k: build_nested(v, f"{group}.{k}") for k, v in kwargs.items()}
    try:
        with user_call(f"{group}._target_: {path}(...)", errors=False):  # even sys.exit(0) is no success
            return fn(**kwargs)
    except PASSES:
        raise
    except BaseException as e:  # noqa: BLE001 - the user's factory failed (however it raised): say how
        bad = re.search(r"unexpected keyword argument '(\w+)'", str(e))
        if isinstance(e, TypeError) and bad and bad.group(1) in given:
            raise ConfigError(f"{group}.{bad.group(1)}: {path} takes no argument {bad.group(1)!r}") from None
        raise ConfigError(f"{group}._target_: {path}(...) raised {type(e).__name__}: {first_line(e)}") from None


TRUST_FLAG = "trust_targets"


def stored_targets(config: Any, prefix: str = "") -> dict[str, str]:
    """Every non-empty ``..._target_`` in a config stored in a file, by dotted key."""
    found: dict[str, str] = {}
    if isinstance(config, dict):
        for key, value in config.items():
            name = f"{prefix}{key}"
            if key == "_target_" and value:
                found[name] = str(value)
            elif isinstance(value, (dict, list)):
                found.update(stored_targets(value, f"{name}."))
    elif isinstance(config, list):
        for i, value in enumerate(config):
            found.update(stored_targets(value, f"{prefix}{i}."))
    return found


def _vouched(overrides: list[str]) -> dict[str, str]:
    """The targets the command line names as plain values. A value that is itself an
    interpolation (``model._target_=${model.kwargs.x}``) names nothing: it points at whatever the
    file stored there, so it vouches for nothing."""
    said: dict[str, str] = {}
    for override in overrides:
        key, eq, _ = override.partition("=")
        key = key.lstrip("+~")
        if not eq or not key.endswith("_target_"):
            continue
        try:
            node = OmegaConf.from_dotlist([override.lstrip("+~")])
            if not OmegaConf.is_interpolation(node, key) and "${" not in str(OmegaConf.select(node, key)):
                said[key] = str(OmegaConf.select(node, key))
        except Exception:  # noqa: BLE001 - a malformed override vouches for nothing; the merge names it
            continue
    return said


def refuse_stored_targets(resolved: Any, overrides: list[str], trusted: bool, source: str,
                          calls: tuple[str, ...] = ("model", "data", "loss")) -> None:
    """A checkpoint names callables in its stored config; calling them would run whatever code the
    file's author chose (``model._target_=os.system``). ``weights_only=True`` does not help: the
    config is plain strings. So a target is called only when the command line names that same
    callable for that key as a plain value (the user names the code to run) or passes
    ``trust_targets=true``; this check runs before anything is imported, since importing a module
    already runs its code.

    ``resolved`` is the config as it will be used: stored values and overrides merged and every
    ``${...}`` resolved. Judging the stored strings instead let a file hide a target behind an
    interpolation that the user, told to name the string, then resolved to the hidden callable.
    ``calls``: the groups whose targets the command will call (evaluation builds no optimizer)."""
    if trusted:
        return
    said = _vouched(overrides)
    # Every target at once: one line per target, one command at a time, was one rerun per target.
    unnamed = {key: path for key, path in stored_targets(resolved).items()
               if key.split(".")[0] in calls and said.get(key) != path}
    if unnamed:
        keys = ", ".join(unnamed)
        asks = ", ".join(repr(p) for p in unnamed.values())
        names = " ".join(f"{k}={p}" for k, p in unnamed.items())
        raise ConfigError(f"{keys}: {source} asks to call {asks}; name {'them' if len(unnamed) > 1 else 'it'} "
                          f"yourself ({names}) or pass {TRUST_FLAG}=true if you trust the file")
