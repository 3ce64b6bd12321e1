"""How long a barrier step waits for its last workers once its pivot's gradient is in (the chair,
replica/meeting.py, asks before each step and tells after it).

The bound is a multiple of the pivot's compute time (the median live worker's fresh gradient, from
whose arrival it runs; a step that is a part of a batch, ``optim.balance``, waits a part's time):

- for workers that compute on the step's weights, the median plus :data:`MADS` median absolute
  deviations of the last :data:`WINDOW` lags, each a gradient's arrival behind the pivot of the step
  it was computed for, late ones included (hivemind #676's deadline, from the recent arrival offsets
  instead of a constant), within ``optim.min_wait`` and ``optim.max_wait``;
- ``optim.straggler_wait`` when every missing worker was missing from the step before too: it still
  computes on older weights, and its gradient is stale whenever it comes.

Why: a fixed fraction of a step is wrong both ways. Two workers that share a core with a busy process
take turns at being the slower one for spells of several steps, a third of a step behind and more,
and half a step cut a quarter of their gradients, each then one update old, which AdamW pays for
(BENCHMARKS.md §22: waiting for every gradient ended 0.08 lower). The rule before this one also gave
a worker that had joined a step late the straggler's tenth of a step at the next, though it computed
that one on fresh weights like the others, so in a slow spell it was cut every other step. A worker
stopped for a second is an outlier among its lags: the step it misses waits ``optim.min_wait`` for
it and the steps after, while it still computes on older weights, the floor, where waiting for
every gradient held each step for the stop (0.07 worse). The least wait stays at the rule's old
bound, half a step: in the model of balanced workers (BENCHMARKS.md §22, one seed) a bound that
could fall under it ended 0.02 higher.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from typing import Optional, Sequence

import numpy as np

logger = logging.getLogger(__name__)

WINDOW = 16
"""Lags remembered: one stall in a window is an outlier, a worker behind for good moves the median
within half of it."""
MADS = 3.0
"""The bound's distance above the median lag, in median absolute deviations (a robust three sigmas)."""
MIN_LAGS = 4
"""Until this many lags are known the bound is ``optim.min_wait``."""
PIVOTS_KEPT = 32
"""Steps whose pivot is remembered: a gradient later than this many steps brings no lag."""


def pivot_of(step: int, members: Sequence[int], live: int, cells: np.ndarray) -> Optional[int]:
    """The member whose fresh gradient the bound of ``step`` ran from: the median live worker's, in
    arrival order (None when fewer than half of the ``live`` workers brought fresh ones)."""
    fresh = sorted((int(j) for j in members if cells[j]["read"] == step), key=lambda j: cells[j]["at"])
    half = max(1, -(-live // 2))
    return fresh[half - 1] if len(fresh) >= half else None


def due(cells: np.ndarray, pivot: int, wait: float) -> float:
    """When a step whose pivot is ``pivot`` stops waiting ``wait`` of the pivot's compute times
    (``time.monotonic()``): the chair closes it then, and a worker in chunks hands in before it."""
    return float(cells[pivot]["at"]) + wait * float(cells[pivot]["compute_s"])


class Deadline:
    """One replica chair's bound (the module's text): :meth:`bound` before a step closes,
    :meth:`closed` after."""

    def __init__(self, min_wait: float, max_wait: float, straggler_wait: float) -> None:
        self.min_wait, self.max_wait, self.straggler_wait = min_wait, max_wait, straggler_wait
        self.behind: set[int] = set()
        """The workers missing from the last closed step: still computing on older weights."""
        self.lags: deque[float] = deque(maxlen=WINDOW)
        self._usual = min_wait
        """The lags' median plus MADS deviations, at least min_wait: set as a step closes, read by
        every look of the chair at the open one."""
        self._pivots: dict[int, tuple[float, float]] = {}
        self.last = min(min_wait, max_wait)
        """The last bound given (metrics.json's ``wait_bound``)."""

    def bound(self, missing: set[int]) -> float:
        """How long, in the pivot's compute times, the open step waits for the ``missing`` workers."""
        wait = self.straggler_wait if missing and missing <= self.behind else self._usual
        self.last = min(self.max_wait, wait)
        return self.last

    def closed(self, step: int, members: Sequence[int], live: Sequence[int], cells: np.ndarray) -> None:
        """Step ``step`` closed with ``members`` of the ``live`` workers: who is behind, and each
        member's lag behind the pivot of the step it computed for."""
        self.behind = set(live) - set(members)
        pivot = pivot_of(step, members, len(live), cells)
        if pivot is not None:
            self._pivots[step] = (float(cells[pivot]["at"]), float(cells[pivot]["compute_s"]))
            self._pivots.pop(step - PIVOTS_KEPT, None)
        lags: list[float] = []
        for j in members:
            at, s = float(cells[j]["at"]), int(cells[j]["read"])
            if s not in self._pivots:
                continue
            start, compute_s = self._pivots[s]
            # Only those after the pivot (the pivot itself, and those before it, are not waited for).
            if at > start and compute_s > 0:
                lags.append((at - start) / compute_s)
        self.heard(lags)

    def heard(self, lags: Sequence[float]) -> None:
        """New lags, in pivots' compute times: the bound for workers on a step's weights follows."""
        self.lags.extend(lags)
        if lags and len(self.lags) >= MIN_LAGS:
            med = statistics.median(self.lags)
            mad = statistics.median(abs(x - med) for x in self.lags)
            self._usual = max(self.min_wait, med + MADS * mad)

    def forget(self, worker: int) -> None:
        """Worker ``worker`` died: its successor starts on fresh weights."""
        self.behind.discard(worker)
