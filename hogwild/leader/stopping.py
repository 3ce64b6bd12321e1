"""SIGINT and SIGTERM for the leader: stop at once while setting up, stop gracefully after.

Before any worker exists there is nothing to save, so a signal unwinds the set-up at once
(:class:`StopNow`). Once workers run, the first signal asks the leader to stop them and write
a final checkpoint; a second Ctrl-C kills the workers and exits.
"""

from __future__ import annotations

import logging
import signal
from typing import Any, Callable, Optional

from hogwild.errors import EXIT_SIGINT, StopNow

logger = logging.getLogger(__name__)


class Stopper:
    def __init__(self) -> None:
        self.signal: Optional[int] = None
        """The signal that asked the run to stop, if any."""
        self._kill: Optional[Callable[[], None]] = None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def workers_started(self, kill: Callable[[], None]) -> None:
        """From now on a signal stops gracefully; ``kill`` is the forced exit's last resort."""
        self._kill = kill

    def _handle(self, signum: int, _frame: Any) -> None:
        if self._kill is None:  # still setting up: nothing to save, stop at once
            self.signal = signum
            raise StopNow()
        if self.signal is not None and signum == signal.SIGINT:
            logger.error("second interrupt: forcing exit")
            self._kill()
            raise SystemExit(EXIT_SIGINT)
        self.signal = signum
        logger.warning("%s received: stopping workers and writing a final checkpoint "
                       "(Ctrl-C again to force)", signal.Signals(signum).name)
