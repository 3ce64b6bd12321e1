"""Keys that moved to another group: the old spelling is still taken for one release, with one
logged line that names the new key, so a command line or a script written before the move runs on.

An override is rewritten before Hydra composes it (its structured schema would refuse a key the
dataclass no longer has), and a config stored before the move (a checkpoint's, which holds every key)
has its keys put in their new places before it is read back; nothing else reads the old names.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping

logger = logging.getLogger(__name__)

# The release after 0.1 drops these.
MOVED: dict[str, str] = {f"optim.{key}": f"pace.{key}"
                         for key in ("min_wait", "max_wait", "straggler_wait", "balance", "chunks")}
MOVED.update({f"sync.{key}": f"elastic.{key}"
              for key in ("coordinator", "replicas", "slot", "peer_timeout_s", "min_replicas")})
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


def moved_tree(tree: Mapping[str, Any]) -> dict[str, Any]:
    """A stored config (a checkpoint's ``config``) with every moved key in its new group, so that a
    file written before the move still reads (``{"sync": {"slot": 1}}`` -> ``{"elastic": {"slot": 1}}``).
    A value already at the new key wins; nothing is logged (the user typed none of it)."""
    out = dict(tree)
    for old, new in MOVED.items():
        old_group, old_key = old.split(".")
        new_group, new_key = new.split(".")
        group = out.get(old_group)
        if not isinstance(group, Mapping) or old_key not in group:
            continue
        group = out[old_group] = dict(group)
        value = group.pop(old_key)
        dest = out.get(new_group)
        dest = out[new_group] = dict(dest) if isinstance(dest, Mapping) else {}
        dest.setdefault(new_key, value)
    return out
