"""Native calls that may not return: with a deadline, or until a signal.

A call into torch's C++ (a ``TCPStore`` client, a process group's rendezvous) cannot be
interrupted from Python. Two cases bite:

- A store client blocks in ``recv`` on a server that accepted the connection and stopped
  answering (a coordinator under SIGSTOP, a network that drops packets), far past its own
  timeout: seen at 12 s and more against 2 s, and forever for the constructor.
- A rendezvous that never completes (a peer that never comes) holds the main thread, so the
  Python signal handlers never run, and SIGTERM is ignored until SIGKILL.

So such a call runs in its own daemon thread, and the caller waits in short slices: until a
deadline (:class:`Bounded`) or until asked to stop (:func:`until_stopped`). A call given up on is
left to finish by itself; until it does, :class:`Bounded` fails later calls at once instead of
piling more blocked threads onto a dead server. A process that exits while one still runs must
leave with ``os._exit`` (see :func:`left_running`): tearing the interpreter down under a thread
inside C++ aborts it ("terminate called without an active exception"). The same holds for a
process group aborted in the middle of a run (:func:`hold`): its worker threads may still hold a
collective's tensors, and freeing those during teardown takes the GIL from a dying interpreter.
That holds whatever the run's exit code: a run that recovered and finished well exits 0 the same way.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Generic, Optional, TypeVar

from hogwild.errors import StopNow

T = TypeVar("T")

_LEFT: list[threading.Thread] = []
_HELD: list[object] = []  # aborted process groups: never freed, so no destructor runs in teardown
_LEFT_LOCK = threading.Lock()


class CallTimedOut(TimeoutError):
    """A native call did not return within its deadline (or an earlier one still has not)."""


def left_running() -> bool:
    """Some native call given up on still runs, or a group was aborted mid-run: the process
    must end with ``os._exit``."""
    with _LEFT_LOCK:
        _LEFT[:] = [t for t in _LEFT if t.is_alive()]
        return bool(_LEFT) or bool(_HELD)


def leave(thread: threading.Thread) -> None:
    """A thread inside a native call that its caller gave up on (see the module)."""
    with _LEFT_LOCK:
        _LEFT.append(thread)


def hold(obj: object) -> None:
    """Native state given up on mid-run (an aborted process group): kept until the process
    ends, which it then does with ``os._exit`` (see the module)."""
    with _LEFT_LOCK:
        _HELD.append(obj)


def _start(fn: Callable[[], T], name: str) -> tuple[threading.Thread, dict[str, object]]:
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = e

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread, box


def _result(box: dict[str, object]) -> T:  # type: ignore[type-var]
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


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
        return self.start(fn, what).result()

    def start(self, fn: Callable[[], T], what: str) -> Pending[T]:
        """``fn`` started on its thread now, its deadline counted from now; :meth:`Pending.result`
        waits for it."""
        if self.stuck():
            raise CallTimedOut(f"{what}: an earlier call is still blocked")
        thread, box = _start(fn, self.name)
        return Pending(self, thread, box, what, time.monotonic() + self.deadline_s)

    def give_up(self, thread: threading.Thread) -> None:
        """``thread`` overran its deadline: later calls fail at once until it returns."""
        with self._lock:
            self._stuck = thread
        leave(thread)


class Pending(Generic[T]):
    """A call under way on a thread of its own (:meth:`Bounded.start`)."""

    def __init__(self, owner: Bounded, thread: threading.Thread, box: dict[str, object], what: str,
                 deadline_at: float) -> None:
        self._owner, self._thread, self._box, self._what, self._deadline_at = owner, thread, box, what, deadline_at

    def result(self) -> T:
        """What the call returned or raised, waited for until its deadline (then :class:`CallTimedOut`)."""
        self._thread.join(max(0.0, self._deadline_at - time.monotonic()))
        if self._thread.is_alive():
            self._owner.give_up(self._thread)
            raise CallTimedOut(f"{self._what}: no answer within {self._owner.deadline_s:g}s")
        return _result(self._box)


def until_stopped(fn: Callable[[], T], stopped: Callable[[], bool], name: str, poll_s: float = 0.2) -> T:
    """``fn()``, waited for in slices so that signal handlers run; :class:`StopNow` as soon as
    ``stopped()`` (or a handler raises it), leaving ``fn`` to finish by itself."""
    thread, box = _start(fn, name)
    try:
        while thread.is_alive():
            if stopped():
                raise StopNow()
            thread.join(poll_s)
    except BaseException:
        if thread.is_alive():
            leave(thread)
        raise
    return _result(box)
