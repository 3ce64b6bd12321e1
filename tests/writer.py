"""A thread that keeps adding +1 to a whole buffer: workers writing while a sync runs."""

from __future__ import annotations

import threading

from torch import Tensor


class Writer:
    def __init__(self, flat: Tensor) -> None:
        self.flat = flat
        self._done, self._started = threading.Event(), threading.Event()
        self._count = 0
        self._thread = threading.Thread(target=self._run)
        self._thread.start()
        self._started.wait()

    def _run(self) -> None:
        while not self._done.is_set():
            self.flat.add_(1.0)
            self._count += 1
            self._started.set()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    @property
    def increments(self) -> float:
        """Total mass added to the buffer (every element once per pass)."""
        return float(self._count * self.flat.numel())
