"""Store calls with a deadline that holds against a coordinator that is stopped, not dead.

A ``TCPStore`` client's own timeout does not bound a call to a server that accepted the
connection and then stopped answering (a coordinator under SIGSTOP, a host whose network drops
packets): the kernel still completes the TCP handshake, and the client blocks in ``recv`` until
the server wakes, seen at 12 s and more against a 2 s timeout, and forever for the constructor.
Every round of an elastic leader touches the store, so one such call would stop the whole job.

So each call runs in its own daemon thread, and the caller waits at most ``deadline_s``. A call
that overruns is left to finish on its own (a blocked thread cannot be interrupted), and until
it does, later calls fail at once instead of piling more blocked threads onto a dead server.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional, TypeVar

T = TypeVar("T")


class CallTimedOut(TimeoutError):
    """A store call did not return within its deadline (or an earlier one still has not)."""


class Bounded:
    """Runs one blocking call at a time under a deadline (see the module)."""

    def __init__(self, deadline_s: float, name: str = "hogwild-store-call") -> None:
        self.deadline_s, self.name = deadline_s, name
        self._stuck: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def stuck(self) -> bool:
        """An earlier call overran its deadline and has not returned yet."""
        with self._lock:
            if self._stuck is not None and not self._stuck.is_alive():
                self._stuck = None
            return self._stuck is not None

    def call(self, fn: Callable[[], T], what: str) -> T:
        if self.stuck():
            raise CallTimedOut(f"{what}: an earlier call is still blocked")
        box: dict[str, object] = {}

        def run() -> None:
            try:
                box["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread below
                box["error"] = e

        thread = threading.Thread(target=run, name=self.name, daemon=True)
        thread.start()
        thread.join(self.deadline_s)
        if thread.is_alive():
            with self._lock:
                self._stuck = thread
            raise CallTimedOut(f"{what}: no answer within {self.deadline_s:g}s")
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        return box["value"]  # type: ignore[return-value]
