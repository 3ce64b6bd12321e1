"""SIGINT and SIGTERM for the leader: stop at once while setting up, stop gracefully after.

Before any worker exists there is nothing to save, so a signal unwinds the set-up at once
(:class:`StopNow`). Once workers run, the first signal asks the leader to stop them and write
a final checkpoint; a second Ctrl-C kills the workers and exits.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Any, Callable, Optional

from hogwild.errors import EXIT_SIGINT, ForcedExit, StopNow

logger = logging.getLogger(__name__)


class Stopper:
    def __init__(self) -> None:
        self.signal: Optional[int] = None
        """The signal that asked the run to stop, if any."""
        self._kill: Optional[Callable[[], None]] = None
        self._previous: dict[int, Any] = {}
        self._unraisable: Optional[Callable[[Any], Any]] = None

    def install(self) -> None:
        """Take SIGINT and SIGTERM for the run. Only the main thread may set handlers: a run
        started from another thread (hogwild.train in a script's worker thread) is stopped by
        its caller instead."""
        if threading.current_thread() is not threading.main_thread():
            logger.debug("not in the main thread: SIGINT/SIGTERM keep their handlers")
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        self._unraisable, sys.unraisablehook = sys.unraisablehook, self._swallowed

    def uninstall(self) -> None:
        """Give the caller's handlers back: a script that called hogwild.train gets its own Ctrl-C."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._unraisable is not None:
            sys.unraisablehook, self._unraisable = self._unraisable, None

    def workers_started(self, kill: Callable[[], None]) -> None:
        """From now on a signal stops gracefully; ``kill`` is the forced exit's last resort."""
        self._kill = kill

    def _swallowed(self, unraisable: Any) -> None:
        """A signal's :class:`StopNow` that landed in code which cannot raise (a weakref callback
        inside an import, a ``__del__``) is dropped there and printed as "Exception ignored" with a
        traceback. It needs no line: the signal is recorded, and the start-up stops at its next
        check of it. Anything else goes to the hook there was."""
        if isinstance(unraisable.exc_value, StopNow):
            logger.debug("a stop landed where it could not be raised; the start-up stops at its next check")
            return
        assert self._unraisable is not None
        self._unraisable(unraisable)

    def _handle(self, signum: int, _frame: Any) -> None:
        if self._kill is None:  # still setting up: nothing to save, stop at once
            self.signal = signum
            raise StopNow()
        if self.signal is not None and signum == signal.SIGINT:
            logger.error("second interrupt: forcing exit")
            self._kill()
            raise ForcedExit(EXIT_SIGINT)
        self.signal = signum
        logger.warning("%s received: stopping workers and writing a final checkpoint "
                       "(Ctrl-C again to force)", signal.Signals(signum).name)
