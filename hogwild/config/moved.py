"""Keys that moved to another group: the old spelling is still taken for one release, with one
logged line that names the new key, so a command line or a script written before the move runs on.

An override is rewritten before Hydra composes it (its structured schema would refuse a key the
dataclass no longer has); nothing else reads the old names.
"""

from __future__ import annotations

import logging
from typing import Iterable

logger = logging.getLogger(__name__)

# The release after 0.1 drops these.
MOVED: dict[str, str] = {f"optim.{key}": f"pace.{key}"
                         for key in ("min_wait", "max_wait", "straggler_wait", "balance", "chunks")}
_warned: set[str] = set()


def renamed(overrides: Iterable[str]) -> list[str]:
    """``overrides`` with every moved key spelled as it is now (``optim.chunks=1`` ->
    ``pace.chunks=1``; a leading ``+``, ``++`` or ``~`` is kept); one warning per old key a process."""
    out: list[str] = []
    for override in overrides:
        body = override.lstrip("+~")
        prefix = override[:len(override) - len(body)]
        key, eq, value = body.partition("=")
        new = MOVED.get(key.strip())
        if new is None:
            out.append(override)
            continue
        if key not in _warned:
            _warned.add(key)
            logger.warning("%s is deprecated: it moved to %s (the old key is taken until the next release)", key, new)
        out.append(f"{prefix}{new}{eq}{value}")
    return out
