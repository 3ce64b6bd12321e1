"""One logging setup for every process hogwild starts (the leader through Hydra's
``job_logging`` in conf/config.yaml, workers, the coordinator and the checkpoint commands), and
the context every line carries: which replica, elastic slot and epoch, or worker wrote it, so a
log of several processes reads like torchft's, without each message typing it by hand."""

from __future__ import annotations

import logging
import sys
from typing import Any, Optional

from hogwild.errors import say

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


class QuietFileHandler(logging.FileHandler):
    """A log file that a full or read-only disk cannot turn into tracebacks. logging's own
    ``handleError`` prints "--- Logging error ---" and a traceback on stderr for every line it
    fails to write, above the one error line the run ends with (a full run_dir: exit 5, from the
    write that the run needs). Here the first failure says so in one short line and the file is
    dropped: the console still gets every line."""

    dropped = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.dropped:
            super().emit(record)

    def flush(self) -> None:
        try:
            super().flush()
        except (OSError, ValueError) as e:  # ValueError: a stream closed under it
            self.drop(e)

    def handleError(self, record: Optional[logging.LogRecord]) -> None:  # noqa: N802 - logging's name
        self.drop(sys.exc_info()[1])

    def drop(self, e: Optional[BaseException]) -> None:
        """Stop writing the file, saying why once."""
        if self.dropped:
            return
        self.dropped = True
        stream, self.stream = self.stream, None  # type: ignore[assignment]
        try:
            if stream is not None:
                stream.close()  # its unwritten lines go with it; the descriptor is closed all the same
        except (OSError, ValueError):
            pass
        why = (e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__) if e else "unknown"
        say(f"hogwild: warning: cannot write the log file {self.baseFilename} ({why}); "
            "logging to it stops, the console still gets every line")
