"""``_target_`` import paths (``model._target_``, ``data._target_``): import and call a user's
callable, turning every way it can fail into one line that names the key."""

from __future__ import annotations

import importlib
import re
from typing import Any, Callable

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


def refuse_stored_targets(config: Any, overrides: list[str], trusted: bool, source: str,
                          calls: tuple[str, ...] = ("model", "data", "loss")) -> None:
    """A checkpoint names callables in its stored config; calling them would run whatever code the
    file's author chose (``model._target_=os.system``). ``weights_only=True`` does not help: the
    config is plain strings. So a stored ``_target_`` is used only when the command line sets
    that key itself (the user names the code to run) or passes ``trust_targets=true``; this
    check runs before anything is imported, since importing a module already runs its code.
    ``calls``: the groups whose targets the command will call (evaluation builds no optimizer)."""
    if trusted:
        return
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
    for key, path in stored_targets(config).items():
        if key.split(".")[0] in calls and key not in given:
            raise ConfigError(f"{key}: {source} asks to call {path!r}; name it yourself ({key}={path}) "
                              f"or pass {TRUST_FLAG}=true if you trust the file")
