"""``hogwild-train``: a thin Hydra entry point. Validate the whole config, then run a leader.

The config is composed and converted to the dataclass schema *before* Hydra's own runner
starts and before any process is spawned (DESIGN rule 9), so a typo, a bad value or an
unknown group option fails in one line naming the key, with exit code 2.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, NoReturn, Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hogwild import config as config_mod
from hogwild.config import Config, ConfigError, first_line
from hogwild.distributed import default_run_id, hydra_output_subdir

logger = logging.getLogger(__name__)

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
EXIT_USAGE = 2
# Hydra flags whose next argv item is their value, not an override.
_FLAGS_WITH_VALUE = {"-cn", "--config-name", "-cp", "--config-path", "-cd", "--config-dir",
                     "-p", "--package", "--experimental-rerun"}
# Flags that print instead of run: leave them to Hydra untouched.
_INFO_FLAGS = {"-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "-sc",
               "--shell-completion", "--version"}


def register_resolvers() -> None:
    for name, fn in (("hogwild_run_id", default_run_id), ("hogwild_hydra_subdir", hydra_output_subdir)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, lambda _fn=fn: _fn())
    config_mod.register()


def report_user_error(e: BaseException) -> NoReturn:
    """One line, no traceback, non-zero exit: the contract for every user mistake."""
    msg = " ".join(str(e).split())
    sys.stderr.write(f"hogwild: error: {msg}\n")
    sys.stderr.flush()
    raise SystemExit(EXIT_USAGE)


def _omegaconf_message(e: BaseException) -> str:
    """``train.epochs: Value 'x' could not be converted to Integer`` from any OmegaConf error."""
    chain: list[BaseException] = []
    cur: Optional[BaseException] = e
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    for err in chain:
        if isinstance(err, ConfigError):
            return str(err)
    for err in chain:
        if isinstance(err, OmegaConfBaseException):
            key = getattr(err, "full_key", None) or getattr(err, "key", None) or "config"
            text = first_line(err)
            if "not in struct" in text:
                text = "unknown config key (misspelled?)"
            return f"{key}: {text}"
    return first_line(e)


def to_config(dcfg: Any) -> Config:
    """DictConfig -> validated :class:`Config`; every failure becomes a :class:`ConfigError`."""
    try:
        cfg = OmegaConf.to_object(dcfg)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - OmegaConf wraps __post_init__ errors in its own types
        raise ConfigError(_omegaconf_message(e)) from None
    assert isinstance(cfg, Config)
    return cfg


def _overrides(argv: list[str]) -> Optional[list[str]]:
    """Overrides from argv, or None when Hydra is asked to print rather than run."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        flag = a.split("=", 1)[0]
        if flag in _INFO_FLAGS:
            return None
        if flag in _FLAGS_WITH_VALUE:
            skip = "=" not in a
            continue
        if a.startswith("-"):
            continue
        out.append(a)
    return out


def _group_options(group: str) -> list[str]:
    return sorted(p.stem for p in Path(CONF_DIR, group).glob("*.yaml"))


def preflight(argv: list[str]) -> Optional[Config]:
    """Compose the config Hydra will run (first value of each sweep) and validate it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = _overrides(argv)
    if overrides is None:
        return None
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as e:  # noqa: BLE001 - Hydra's grammar errors
        raise ConfigError(f"override: {first_line(e)}") from None
    first: list[str] = []
    for o in parsed:
        key = o.get_key_element()
        if key.startswith(("hydra.", "hydra/", "+hydra")):
            continue
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else None
        line = f"{key}={values[0]}" if values else o.input_line
        group = key.lstrip("+~").split("@")[0]
        value = values[0] if values else o.value()
        if group in ("model", "data", "optim", "sync", "experiment") and isinstance(value, str):
            options = _group_options(group)
            if value not in options:
                raise ConfigError(f"{group}: unknown option {value!r}; choose one of {', '.join(options)}")
        first.append(line)
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            dcfg = compose(config_name="config", overrides=first)
    except Exception as e:  # noqa: BLE001 - Hydra composition errors of every kind
        raise ConfigError(_omegaconf_message(e)) from None
    return to_config(dcfg)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _hydra_main(dcfg: DictConfig) -> Optional[float]:
    from hogwild.leader import run

    try:
        cfg = to_config(dcfg)
        run_dir = HydraConfig.get().runtime.output_dir
        result = run(cfg, run_dir)
    except ConfigError as e:
        report_user_error(e)
    if "test_accuracy" in result:
        logger.info("test accuracy %.4f, test loss %.4f, %d steps, %.0f samples/s in %.1fs",
                    result["test_accuracy"], result["test_loss"], result["steps"],
                    result["samples_per_s"], result["wall_s"])
        logger.info("outputs in %s: metrics.json, checkpoints/last.pt, tb/ (tensorboard --logdir %s/tb)",
                    result["run_dir"], result["run_dir"])
    if result["exit_code"] != 0:
        if "error" in result:
            sys.stderr.write(f"hogwild: error: {result['error']}\n")
        raise SystemExit(result["exit_code"])
    return float(result.get("test_accuracy", 0.0))


def main() -> None:
    register_resolvers()
    try:
        preflight(sys.argv[1:])
    except ConfigError as e:
        report_user_error(e)
    _hydra_main()


if __name__ == "__main__":
    main()
