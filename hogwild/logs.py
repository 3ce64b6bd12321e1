"""One logging setup for every process hogwild starts (the leader through Hydra's
``job_logging`` in conf/config.yaml, workers, the coordinator and the checkpoint commands), and
the context every line carries: which replica, elastic slot and epoch, or worker wrote it, so a
log of several processes reads like torchft's, without each message typing it by hand."""

from __future__ import annotations

import logging
from typing import Any

FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(context)s%(message)s"
ORDER = ("replica", "slot", "epoch", "worker")
# The process's place in the job; every Context filter reads it, also the one Hydra builds from
# conf/config.yaml, so one call to stamp() reaches every handler.
_FIELDS: dict[str, Any] = {}


class Context(logging.Filter):
    """Adds ``record.context``: ``"[slot 1 epoch 3] "``, or ``""`` before anything is stamped."""

    def filter(self, record: logging.LogRecord) -> bool:
        shown = [f"{k} {_FIELDS[k]}" for k in ORDER if _FIELDS.get(k) is not None]
        record.context = f"[{' '.join(shown)}] " if shown else ""
        return True


def stamp(**fields: Any) -> None:
    """Set (or, with None, clear) this process's context fields."""
    unknown = set(fields) - set(ORDER)
    if unknown:
        raise ValueError(f"unknown log context {sorted(unknown)}")
    _FIELDS.update(fields)


def setup(level: int = logging.INFO, **fields: Any) -> None:
    """Log to stderr in the project's format, with the context filter, in a process Hydra does
    not configure."""
    stamp(**fields)
    logging.basicConfig(level=level, format=FORMAT)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, Context) for f in handler.filters):
            handler.addFilter(Context())
