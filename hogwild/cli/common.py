"""What every console script shares: the user's own modules on the path, and the
``key=value`` arguments of the checkpoint commands."""

from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

from hogwild.config.targets import TRUST_FLAG
from hogwild.errors import ConfigError


def import_from_cwd() -> None:
    """A user's model module next to where the command runs (``model._target_=mynets.Net``) must
    import here and in every spawned worker, which inherits this ``sys.path``."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def _flag(arg: str) -> bool:
    key, _, value = arg.partition("=")
    if value.lower() not in ("true", "false"):
        raise ConfigError(f"{key}: must be true or false, got {value!r}")
    return value.lower() == "true"


def checkpoint_args(args: Sequence[str], usage: str, keys: Sequence[str] = ("checkpoint",)
                    ) -> tuple[dict[str, str], bool, list[str]]:
    """``checkpoint=PATH [out=FILE] [trust_targets=true] [overrides...]`` -> (the named keys,
    whether stored targets are trusted, the config overrides)."""
    named: dict[str, str] = {}
    for key in keys:
        hits = [a for a in args if a.startswith(f"{key}=")]
        if len(hits) != 1 or not hits[0].partition("=")[2]:
            raise ConfigError(f"{key}: usage: {usage}")
        named[key] = hits[0].partition("=")[2]
    trust = [a for a in args if a.startswith(f"{TRUST_FLAG}=")]
    trusted = _flag(trust[-1]) if trust else False
    overrides = [a for a in args if a.partition("=")[0] not in (*keys, TRUST_FLAG)]
    return named, trusted, overrides


def checkpoint_command(argv: Optional[Sequence[str]], usage: str, keys: Sequence[str] = ("checkpoint",)
                       ) -> tuple[dict[str, str], bool, list[str]]:
    """The start of every checkpoint command (eval, export): the user's modules importable, log
    lines on, and its arguments read (:func:`checkpoint_args`)."""
    from hogwild import logs

    import_from_cwd()
    logs.setup()
    return checkpoint_args(sys.argv[1:] if argv is None else argv, usage, keys)
