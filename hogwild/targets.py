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
    except Exception as e:  # noqa: BLE001 - a missing module, a typo, a module that fails to import
        raise ConfigError(f"{key}: cannot import {path!r} ({type(e).__name__}: {first_line(e)})") from None


def call_target(fn: Callable[..., Any], path: str, group: str, kwargs: dict[str, Any],
                given: dict[str, Any]) -> Any:
    """``fn(**kwargs)``; a keyword the user gave (``given``) that ``fn`` rejects is named as
    ``<group>.<arg>``, any other failure as ``<group>._target_``."""
    try:
        return fn(**kwargs)
    except Exception as e:  # noqa: BLE001 - the user's factory failed: say how, in one line
        bad = re.search(r"unexpected keyword argument '(\w+)'", str(e))
        if isinstance(e, TypeError) and bad and bad.group(1) in given:
            raise ConfigError(f"{group}.{bad.group(1)}: {path} takes no argument {bad.group(1)!r}") from None
        raise ConfigError(f"{group}._target_: {path}(...) raised {type(e).__name__}: {first_line(e)}") from None
