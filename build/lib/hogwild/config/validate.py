"""The checks every config dataclass runs in ``__post_init__``: each raises
:class:`ConfigError` naming the offending key, one line, before anything is spawned."""

from __future__ import annotations

from hogwild.errors import ConfigError


def require(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {msg}")


def choice(value: str, key: str, choices: tuple[str, ...]) -> None:
    require(value in choices, key, f"unknown value {value!r}; choose one of {', '.join(choices)}")


def positive(value: float, key: str, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    require(ok, key, f"must be {'>= 0' if allow_zero else '> 0'}, got {value}")
