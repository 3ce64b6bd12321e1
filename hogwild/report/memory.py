"""This replica's peak memory: the proportional set size (PSS) of the leader and every process
below it (its workers and their DataLoader processes), sampled by a thread of its own four times
a second, so a peak inside a long blocking step (the final round, a checkpoint's write) is seen
as well as one between them.

PSS divides each shared page among the processes that map it, so the model in ``/dev/shm``,
which the leader and every worker map, counts once, where RSS would count it once per process.
The sum over the process tree is what the replica really holds. Linux only (``/proc``);
elsewhere nothing is measured and the figure is None.

:class:`PeakPss` is the benchmark scripts' sampler (``hogwild.bench``): a full PSS sample of
several process trees at every tick, for a script that compares processes it started itself.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Optional

logger = logging.getLogger(__name__)

PROC = Path("/proc")
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
GROWTH = 1.02
"""A full PSS sample is taken when the tree's resident set grew this much since the last one."""
REFRESH_S = 10.0
"""...and at least this often."""


def pss_bytes(pid: int) -> Optional[int]:
    """The PSS of one process, or None when it is gone or ``/proc`` does not say."""
    try:
        text = (PROC / str(pid) / "smaps_rollup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024  # kB
    return None


def rss_bytes(pid: int) -> Optional[int]:
    """The resident set of one process, from ``statm``: cheap (no walk of its page tables, which
    ``smaps_rollup`` makes, 10 ms or more for a process with torch loaded), but it counts every
    shared page once per process that maps it."""
    try:
        resident = int((PROC / str(pid) / "statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return resident * PAGE


def process_tree(root: int) -> list[int]:
    """``root`` and every live process below it."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        try:
            tasks = list((PROC / str(pid) / "task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue
    return found


class PeakMemory:
    """The largest PSS of the process tree under ``root`` seen by :meth:`sample`.

    The thread reads the tree's resident set four times a second, which costs microseconds, and
    takes a full PSS sample only when it grew by :data:`GROWTH` or :data:`REFRESH_S` went by. A PSS
    sample of a leader and a worker with torch loaded costs about 23 ms of CPU: four a second took
    9 % of the core a one-core machine's worker trains on (BENCHMARKS.md §20)."""

    def __init__(self, root: Optional[int] = None, every_s: float = 0.25) -> None:
        self.root = root if root is not None else os.getpid()
        self.every_s = every_s
        self.peak: Optional[int] = None
        self._rss_at_sample: Optional[int] = None  # the tree's resident set at the last PSS sample
        self._sampled_at = 0.0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        """Sample in the background until :meth:`stop` (a daemon thread: it never holds the
        process up; reading ``/proc`` releases the GIL to the leader between lines)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="hogwild-peak-memory", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            rss = self._rss()
            last = self._rss_at_sample
            if last is None or rss > last * GROWTH or time.monotonic() - self._sampled_at >= REFRESH_S:
                self.sample()

    def _rss(self) -> int:
        return sum(s for s in (rss_bytes(pid) for pid in process_tree(self.root)) if s is not None)

    def sample(self) -> None:
        """A full PSS sample of the tree now."""
        rss = self._rss()
        sizes = [s for s in (pss_bytes(pid) for pid in process_tree(self.root)) if s is not None]
        self._rss_at_sample, self._sampled_at = rss, time.monotonic()
        if sizes:
            self.peak = max(self.peak or 0, sum(sizes))

    @property
    def peak_mb(self) -> Optional[float]:
        return None if self.peak is None else self.peak / 2**20


class PeakPss:
    """The largest summed proportional set size (PSS, bytes) of ``roots`` and every process below
    them, sampled every ``every_s`` seconds on a thread while the ``with`` block runs: pages that
    several processes share (a model in shared memory) count once. Scripts may rely on ``peak``
    (bytes, 0 where ``/proc`` says nothing: not Linux) and ``peak_mib``."""

    def __init__(self, *roots: int, every_s: float = 0.25) -> None:
        self.roots, self.every_s, self.peak = roots, every_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            pids = {pid for root in self.roots for pid in process_tree(root)}
            self.peak = max(self.peak, sum(s for s in map(pss_bytes, pids) if s is not None))
            if self._stop.wait(self.every_s):
                return

    @property
    def peak_mib(self) -> float:
        return self.peak / 2**20

    def __enter__(self) -> PeakPss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
