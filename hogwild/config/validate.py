"""The checks every config dataclass runs in ``__post_init__``: each raises
:class:`ConfigError` naming the offending key, one line, before anything is spawned."""

from __future__ import annotations

from hogwild.errors import ConfigError


def require(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {msg}")


def choice(value: str, key: str, choices: tuple[str, ...]) -> None:
    require(value in choices, key, f"unknown value {value!r}; choose one of {', '.join(choices)}")


def duration(value: object, key: str) -> float:
    """Seconds from a number of seconds or ``[[DD:]HH:]MM:SS`` (Lightning's ``max_time`` form):
    finite and positive."""
    import math

    if isinstance(value, bool):
        raise ConfigError(f"{key}: must be seconds or HH:MM:SS, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        parts = str(value).strip().split(":")
        try:
            numbers = [float(p) for p in parts]
        except ValueError:
            raise ConfigError(f"{key}: must be seconds or HH:MM:SS (or DD:HH:MM:SS), got {value!r}") from None
        if not 1 <= len(numbers) <= 4 or any(n < 0 for n in numbers) or any(n >= 60 for n in numbers[1:][-2:]):
            raise ConfigError(f"{key}: must be seconds or HH:MM:SS (or DD:HH:MM:SS), got {value!r}")
        seconds = sum(n * unit for n, unit in zip(reversed(numbers), (1, 60, 3600, 86400)))
    require(math.isfinite(seconds) and 0 < seconds < 10 * 365 * 86400, key,
            f"must be a positive duration under ten years, got {value!r}")
    return seconds


# Bounds of what the lower layers take: torch's int64 counters and seeds, and the timeouts that
# become a Python timedelta and a C++ duration in Gloo and TCPStore (1e15 s overflowed them).
INT64_MAX = 2**63 - 1
MAX_TIMEOUT_S = 1e7  # about 116 days


def at_most(value: float, bound: float, key: str, what: str = "") -> None:
    require(value <= bound, key, f"must be at most {bound:g}{what}, got {value}")


def timeout(value: float, key: str) -> None:
    """A timeout that reaches a collective, a store or a socket: positive, finite, and at most
    :data:`MAX_TIMEOUT_S`."""
    positive(value, key)
    at_most(value, MAX_TIMEOUT_S, key, " seconds")


def positive(value: float, key: str, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    require(ok, key, f"must be {'>= 0' if allow_zero else '> 0'}, got {value}")
