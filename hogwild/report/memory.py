"""This replica's peak memory: the proportional set size (PSS) of the leader and every process
below it (its workers and their DataLoader processes), sampled by a thread of its own four times
a second, so a peak inside a long blocking step (the final round, a checkpoint's write) is seen
as well as one between them.

PSS divides each shared page among the processes that map it, so the model in ``/dev/shm``,
which the leader and every worker map, counts once, where RSS would count it once per process.
The sum over the process tree is what the replica really holds. Linux only (``/proc``);
elsewhere nothing is measured and the figure is None.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Optional

logger = logging.getLogger(__name__)

PROC = Path("/proc")


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
    """The largest PSS of the process tree under ``root`` seen by :meth:`sample`."""

    def __init__(self, root: Optional[int] = None, every_s: float = 0.25) -> None:
        self.root = root if root is not None else os.getpid()
        self.every_s = every_s
        self.peak: Optional[int] = None
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
            self.sample()

    def sample(self) -> None:
        sizes = [s for s in (pss_bytes(pid) for pid in process_tree(self.root)) if s is not None]
        if sizes:
            self.peak = max(self.peak or 0, sum(sizes))

    @property
    def peak_mb(self) -> Optional[float]:
        return None if self.peak is None else self.peak / 2**20
