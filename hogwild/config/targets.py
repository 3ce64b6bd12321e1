"""``_target_`` import paths (``model._target_``, ``data._target_``): import and call a user's
callable, turning every way it can fail into one line that names the key."""

from __future__ import annotations

import importlib
import re
from typing import Any, Callable

from omegaconf import OmegaConf

from hogwild.errors import ConfigError, first_line


def import_target(path: str, key: str) -> Callable[..., Any]:
    module, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr) if module else importlib.import_module(attr)
    except SystemExit as e:
        raise ConfigError(f"{key}: importing {path!r} called sys.exit({e.code!r}); nothing was trained") from None
    except Exception as e:  # noqa: BLE001 - a missing module, a typo, a module that fails to import
        raise ConfigError(f"{key}: cannot import {path!r} ({type(e).__name__}: {first_line(e)})") from None


def call_target(fn: Callable[..., Any], path: str, group: str, kwargs: dict[str, Any],
                given: dict[str, Any]) -> Any:
    """``fn(**kwargs)``; a keyword the user gave (``given``) that ``fn`` rejects is named as
    ``<group>.<arg>``, any other failure as ``<group>._target_``."""
    try:
        return fn(**kwargs)
    except SystemExit as e:  # even sys.exit(0): a run that trained nothing is no success
        raise ConfigError(f"{group}._target_: {path}(...) called sys.exit({e.code!r}) instead of returning; "
                          "nothing was trained") from None
    except Exception as e:  # noqa: BLE001 - the user's factory failed: say how, in one line
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
    for key, path in stored_targets(resolved).items():
        if key.split(".")[0] in calls and said.get(key) != path:
            raise ConfigError(f"{key}: {source} asks to call {path!r}; name it yourself ({key}={path}) "
                              f"or pass {TRUST_FLAG}=true if you trust the file")
