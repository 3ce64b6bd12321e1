"""How a barrier step is paced (``pace.*``): how long it waits for its last workers, and how each
worker computes its batch (whole, a share of it, or in chunks) so that its gradient comes with the
others'. Every rule about time is here, behind one seam, :class:`Pacer`; the barrier
(replica/meeting.py, replica/update.py) keeps arrive, meet and apply, and asks:

- the chair, before it closes the open step: :meth:`Pacer.close_at`; after: :meth:`Pacer.closed`;
- a worker, before each batch: :meth:`Pacer.split`; after each chunk: :meth:`Pacer.hand_in`; after
  each gradient, its pace: :meth:`Pacer.timed`.

A policy is one class registered under ``pace.policy`` (its settings in config/pace.py):

- ``deadline`` (:class:`Pacer`): once the fresh gradients of half the live workers are in, the step
  waits for the others a bound times the compute time of the last of that half, the pivot: the
  median plus :data:`MADS` median absolute deviations of the last :data:`WINDOW` lags (each a
  gradient's arrival behind the pivot of the step it was computed for: hivemind #676's deadline,
  from the recent arrival offsets instead of a constant), within ``pace.min_wait`` and
  ``pace.max_wait``; ``pace.straggler_wait`` when every missing worker was missing from the step
  before too (it computes on older weights, so its gradient is stale whenever it comes).
- ``backup`` (:class:`BackupWorkers`): Chen et al. 2016: a step closes once all but the
  ``pace.backup`` slowest live workers are in.

Why a bound that moves: a fixed fraction of a step is wrong both ways. Two workers that share a core
with a busy process take turns at being the slower one for spells of several steps, a third of a step
behind and more, and half a step cut a quarter of their gradients, each then one update old, which
AdamW pays for (BENCHMARKS.md §22: waiting for every gradient ended 0.08 lower). A worker stopped for
a second is an outlier among its lags: the step it misses waits ``pace.min_wait`` for it, where
waiting for every gradient held each step for the stop (0.07 worse). The least wait stays half a
step: in the model of balanced workers (§22, one seed) a bound that could fall under it ended 0.02
higher.

How a worker cuts its batch: with ``pace.chunks`` it computes it in chunks and hands in what it has
once the pivot is in and the rest would come after ``pace.min_wait`` (no pace estimated, so a
slowness that moves between workers is followed at once); else, with ``pace.balance``, a worker much
slower than the pivot computes a share of each batch (:func:`balanced_share`), and so, under
``pace.chunks=auto`` from a step of :data:`PLAN_FROM_S`, does a worker steadily slower than it. Either way the rest
is its next part, and a step's mean weighs each gradient by its samples.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import deque
from typing import NamedTuple, Optional, Sequence, Union

import numpy as np
import torch

from hogwild.config.pace import PaceConfig
from hogwild.config.registry import PACERS

logger = logging.getLogger(__name__)

WINDOW = 16
"""Lags remembered: one stall in a window is an outlier, a worker behind for good moves the median
within half of it."""
MADS = 3.0
"""The bound's distance above the median lag, in median absolute deviations (a robust three sigmas)."""
MIN_LAGS = 4
"""Until this many lags are known the bound is ``pace.min_wait``."""
PIVOTS_KEPT = 32
"""Steps whose pivot is remembered: a gradient later than this many steps brings no lag."""
# pace.balance: a worker cuts its batch only when a whole one takes it this much longer than the
# pivot's (noise between equal workers stays under it), never into more than this many parts, and its
# pace is the median of its last few measurements: one gradient that spans a stall (a preempted or
# paused process) is an outlier, not a slower worker, while a worker slowed for good moves the median
# within a few steps. A moving average read each stall as slowness for several steps and split
# batches the worker could compute whole (BENCHMARKS.md §22).
BALANCE_BAND = 1.15
MAX_PARTS = 4
MIN_PACE_S = 0.005
"""Below this a batch's time is jitter, and a meeting per part would cost more than it saves."""
PACE_WINDOW = 5
# pace.chunks=auto: a batch in this many chunks of at least this many samples, once a whole one
# takes this long (below it each chunk's own overhead shows: a batch of a few milliseconds is mostly
# Python and kernel launches). Four chunks of the GPT of BENCHMARKS.md §15 took what one batch did.
AUTO_CHUNKS = 4
MIN_CHUNK_SAMPLES = 8
MIN_CHUNK_S = 0.02
PLAN_FROM_S = 0.3
"""pace.chunks=auto: once the median live worker's whole batch takes this long (seconds), a worker
steadily slower than it (each of its last paces over pace.balance's band) computes the share
pace.balance plans instead of chunks; a worker slowed for a moment, or nobody, still computes in
chunks. A quota throttles in periods of 100 ms by default: a batch of several periods sees a steady
rate, which a planned share matches, where a shorter one sees bursts, which only chunks follow. In
the pacing grid (BENCHMARKS.md) planned shares beat chunks with a worker at half a core at the
0.34, 0.47 and 1 s steps (tied in the last invocation at 0.47 s), chunks kept the stops and the busy
core; at three quarters of a core at 1 s chunks trained 6 % more (a plan of half a batch leaves that
worker a quarter idle)."""
STALL_CHUNKS = 3.0
"""A worker in chunks that has finished none for this many of its chunk times (as it runs) is
stopped (a quota's throttled spell, a paused process): a step waits for it no longer."""
CHUNKS_KEPT = 8
"""Chunk times a worker remembers; the least of them is its time as it runs."""


class Split(NamedTuple):
    """How a worker computes its next batch."""

    share: float = 1.0
    """The share of the batch its next gradient is computed on (1: the rest of it, whole)."""
    chunks: int = 1
    """Above 1: in chunks of a ``chunks``-th, handed in when :meth:`Pacer.hand_in` says."""


WHOLE = Split()


def pivot_of(step: int, members: Sequence[int], live: int, cells: np.ndarray) -> Optional[int]:
    """The member whose fresh gradient the bound of ``step`` runs from: the median live worker's, in
    arrival order (None when fewer than half of the ``live`` workers brought fresh ones)."""
    fresh = sorted((int(j) for j in members if cells[j]["read"] == step), key=lambda j: cells[j]["at"])
    half = max(1, -(-live // 2))
    return fresh[half - 1] if len(fresh) >= half else None


def due(cells: np.ndarray, pivot: int, wait: float) -> float:
    """When a step whose pivot is ``pivot`` stops waiting ``wait`` of the pivot's compute times
    (``time.monotonic()``)."""
    return float(cells[pivot]["at"]) + wait * float(cells[pivot]["compute_s"])


def stalled_since(cells: np.ndarray, missing: set[int]) -> float:
    """When every ``missing`` worker computing in chunks will have stopped long enough to count as
    stopped (``time.monotonic()``; inf where one of them computes whole batches, which say nothing as
    they go): its last chunk plus :data:`STALL_CHUNKS` of its chunk times."""
    if not missing:
        return math.inf
    return max(float(cells[j]["tick"]) + STALL_CHUNKS * float(cells[j]["chunk_s"]) if cells[j]["chunk_s"] > 0
               else math.inf for j in missing)


def expected_pivot(me: int, live: Sequence[int], cells: np.ndarray) -> tuple[float, float]:
    """When the open step's pivot is expected (``time.monotonic()``), and its pace: the median live
    worker's arrival, from each other worker's read of the weights and its pace (inf while a pace is
    unknown)."""
    others = sorted((float(cells[j]["began"]) + float(cells[j]["pace"]) if cells[j]["pace"] > 0 else math.inf,
                     float(cells[j]["pace"])) for j in live if j != me)
    half = max(1, -(-len(live) // 2))
    return others[half - 1] if len(others) >= half else (math.inf, 0.0)


def balanced_share(mine: float, paces: Sequence[float], slack: float = 0.05) -> float:
    """The share of its batch a worker computes (``pace.balance``, LB-BSP) so that its gradient
    arrives with the step's pivot, the median live worker's: 1 for a worker at most
    :data:`BALANCE_BAND` slower than the pivot (or where the pivot's batch takes under
    :data:`MIN_PACE_S`), else one of the fewest equal parts (at most :data:`MAX_PARTS`) that take it at
    most ``1 + slack`` times the pivot's time: a part that comes that little after the pivot is waited
    for, and one that comes well before it leaves the worker idle until the step closes. ``mine`` and
    ``paces`` (every live worker's, ``mine`` among them): seconds a whole batch takes, 0 where not
    measured yet. Equal parts also give a batch few shapes (torch.compile and the kernels' caches see
    few). In the model of a worker twice as slow (BENCHMARKS.md §22) this ended 1.534 against 1.653
    for joining late and 1.766 for waiting, as DDP does."""
    if mine <= 0 or sum(p > 0 for p in paces) < 2:
        return 1.0
    pivot = median_pace(paces)
    if mine <= BALANCE_BAND * pivot or pivot < MIN_PACE_S:
        return 1.0
    return 1.0 / min(MAX_PARTS, math.ceil(mine / (pivot * (1.0 + slack))))


class Chunking(NamedTuple):
    """``pace.chunks`` as a worker runs it."""

    chunks: int = 1
    """Chunks a batch is cut into (1: whole batches)."""
    from_s: float = 0.0
    """Seconds this worker's whole batch must take before it is cut into chunks."""
    plan_from_s: float = math.inf
    """Seconds the median live worker's whole batch takes from which a steadily slow worker computes
    pace.balance's planned share instead of chunks (:data:`PLAN_FROM_S`)."""


def chunks_for(setting: Union[int, str], model: Optional[torch.nn.Module], batch_size: int) -> Chunking:
    """``pace.chunks`` as a worker runs it. An explicit number cuts every batch, whatever the step;
    auto is :data:`AUTO_CHUNKS` of at least :data:`MIN_CHUNK_SAMPLES` samples once a batch takes
    :data:`MIN_CHUNK_S`, a steadily slow worker's planned share instead from a step of
    :data:`PLAN_FROM_S`, and whole batches for a model with batch-norm layers, whose statistics would
    be a chunk's instead of the batch's."""
    if setting != "auto":
        return Chunking(int(setting))
    if model is not None and any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return Chunking()
    return Chunking(max(1, min(AUTO_CHUNKS, batch_size // MIN_CHUNK_SAMPLES)), MIN_CHUNK_S, PLAN_FROM_S)


def median_pace(paces: Sequence[float]) -> float:
    """The step's median worker's pace (the lower median for an even count): the pivot's, seconds a
    whole batch takes; 0 while none is measured. ``paces``: 0 where not measured yet."""
    known = sorted(p for p in paces if p > 0)
    return known[max(1, -(-len(known) // 2)) - 1] if known else 0.0


@PACERS.register("deadline")
class Pacer:
    """The ``deadline`` policy, and the seam every policy keeps (the module's text). The chair's
    instance and each worker's are their own: they share nothing but the meeting's cells."""

    def __init__(self, cfg: PaceConfig, chunks: Chunking = Chunking(), workers: int = 2,
                 tables: bool = False) -> None:
        """``chunks``: :func:`chunks_for`'s; a batch is cut only among ``workers`` > 1 (one worker waits
        for nobody), and never with sparse ``tables``, whose rows are written as each gradient comes."""
        self.cfg = cfg
        split = workers > 1 and not tables
        self.chunking = Chunking(*chunks) if split else Chunking()
        self.balance = bool(cfg.balance) and split
        self.behind: set[int] = set()
        """The workers missing from the last closed step: still computing on older weights."""
        self.lags: deque[float] = deque(maxlen=WINDOW)
        self._usual = cfg.min_wait
        """The lags' median plus MADS deviations, at least min_wait: set as a step closes."""
        self._pivots: dict[int, tuple[float, float]] = {}
        self._paces: deque[float] = deque(maxlen=PACE_WINDOW)
        self._chunks: deque[float] = deque(maxlen=CHUNKS_KEPT)
        self.last = min(cfg.min_wait, cfg.max_wait)
        """The last bound given (metrics.json's ``wait_bound``)."""

    # ------------------------------------------------------------------ the chair's half
    def close_at(self, step: int, arrived: Sequence[int], live: Sequence[int], cells: np.ndarray) -> Optional[float]:
        """When the open ``step``, which the ``arrived`` of the ``live`` workers have arrived for (not
        all of them), closes (``time.monotonic()``); None: not before more arrive."""
        # The bound runs from the median live worker's fresh gradient, not the first: the first of
        # many workers comes early by chance alone (with 8, a bound from the first left a late
        # gradient in one step of nine in the model, BENCHMARKS.md §17). Late gradients that joined
        # do not count: alone they wait for fresh ones.
        pivot = pivot_of(step, arrived, len(live), cells)
        if pivot is None:
            return None
        missing = set(live) - set(arrived)
        return min(due(cells, pivot, self.bound(missing)), stalled_since(cells, missing))

    def bound(self, missing: set[int]) -> float:
        """How long, in the pivot's compute times, the open step waits for the ``missing`` workers."""
        wait = self.cfg.straggler_wait if missing and missing <= self.behind else self._usual
        self.last = min(self.cfg.max_wait, wait)
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
            self._usual = max(self.cfg.min_wait, med + MADS * mad)

    def forget(self, worker: int) -> None:
        """Worker ``worker`` died: its successor starts on fresh weights."""
        self.behind.discard(worker)

    def appliers(self, members: Sequence[int], cells: np.ndarray) -> list[int]:
        """The members of a closing step that step a shard of it: every one but those much slower than
        the median member (:data:`BALANCE_BAND`). A slow member's shard would hold the step, and every
        worker's next read of the weights, until it ran again: a quota's throttled spell (50 ms of every
        100 at half a core) is longer than a step of a small model."""
        pivot = median_pace([float(cells[j]["pace"]) for j in members])
        fast = [int(j) for j in members if pivot <= 0 or float(cells[j]["pace"]) <= BALANCE_BAND * pivot]
        return fast or [int(j) for j in members]

    # ------------------------------------------------------------------ a worker's half
    def split(self, me: int, cells: np.ndarray) -> Split:
        """How worker ``me`` computes its next batch, from the paces in ``cells`` as they are now."""
        pace, live = float(cells[me]["pace"]), cells["pace"][cells["live"] > 0].tolist()
        c = self.chunking
        chunked = c.chunks > 1 and pace >= c.from_s
        share = 1.0
        pivot = median_pace(live)
        if self.balance and (not chunked or pivot >= c.plan_from_s and self._steady(pivot)):
            # A part may come half the straggler bound after the pivot and still be waited for.
            share = balanced_share(pace, live, self.cfg.straggler_wait / 2)
        if chunked and share == 1.0:
            return Split(1.0, c.chunks)  # chunks decide a batch's parts as it is computed
        cells[me]["chunk_s"] = 0.0  # a whole batch or part says nothing as it goes: the chair cannot see it stop
        return Split(share)

    def _steady(self, pivot: float) -> bool:
        """Whether each of this worker's last :data:`PACE_WINDOW` paces was over the balance band of the
        ``pivot``'s (the median live worker's pace): a share is planned for a steady slowness (a
        quota) only. Beside a busy process the slowness moves between workers in spells of a few
        steps; a plan from the median of the paces came three steps late into each spell and out of
        it, and trained 10 % fewer samples than chunks (BENCHMARKS.md, the pacing grid), where one
        fast pace now ends it."""
        return len(self._paces) == PACE_WINDOW and min(self._paces) > BALANCE_BAND * pivot

    def hand_in(self, me: int, read: int, cells: np.ndarray, open_step: int, chunk_s: float, chunks_left: int) -> bool:
        """Whether worker ``me``, which computes on the weights of step ``read``, hands in the chunks
        it has rather than compute its ``chunks_left`` others (``chunk_s`` seconds each) first: yes
        once the open step's pivot is in and the rest would come after ``pace.min_wait`` of the
        pivot's compute time, the least the chair waits from it; yes too when the step closed
        without it (its gradient is late however much more it holds, and the sooner it comes the
        sooner it reads fresh weights)."""
        now = time.monotonic()
        self._chunks.append(now - float(cells[me]["tick"]))
        cells[me]["chunk_s"], cells[me]["tick"] = min(self._chunks), now  # the chair sees it run
        if open_step != read:
            return True
        live = np.flatnonzero(cells["live"] > 0)
        arrived = [int(j) for j in live if j != me and cells[j]["arrived"] == open_step]
        pivot = pivot_of(open_step, arrived, len(live), cells)
        if pivot is not None:
            return now + chunks_left * chunk_s > due(cells, pivot, self.cfg.min_wait)
        # The pivot is not in yet. When it will be before this worker's next chunk is done, and the
        # rest would come after the bound from it, what is done goes now: the step then closes the
        # moment the pivot arrives, with nobody waiting for this worker. A pivot already overdue is
        # no forecast (it is stopped, or slower than it was): computing on is.
        expected, its_pace = expected_pivot(me, live, cells)
        return (now <= expected < now + chunk_s
                and now + chunks_left * chunk_s > expected + self.cfg.min_wait * its_pace)

    def timed(self, compute_s: float, fraction: float) -> float:
        """This worker's pace after a gradient that took ``compute_s`` on ``fraction`` of its batch:
        the median of what its last whole batches would have taken."""
        self._paces.append(compute_s / max(fraction, 1e-3))
        return statistics.median(self._paces)


@PACERS.register("backup")
class BackupWorkers(Pacer):
    """``pace.policy=backup``: a step closes as soon as all but the ``pace.backup`` slowest live
    workers have arrived (Chen et al. 2016, "Revisiting distributed synchronous SGD"): no bound to
    tune, and a straggler's gradient joins the next step. Batches are cut as under ``deadline``."""

    def close_at(self, step: int, arrived: Sequence[int], live: Sequence[int], cells: np.ndarray) -> Optional[float]:
        self.last = 0.0
        return -math.inf if len(arrived) >= max(1, len(live) - self.cfg.backup) else None


def make_pacer(cfg: PaceConfig, model: Optional[torch.nn.Module] = None, batch_size: int = 0, workers: int = 2,
               tables: bool = False) -> Pacer:
    """``pace.policy``'s pacer: for the chair (no model), or for one of ``workers`` workers of ``model``
    on batches of ``batch_size`` (``tables``: the model has sparse tables)."""
    cls = PACERS.get(cfg.policy)
    chunks = chunks_for(cfg.chunks, model, batch_size) if model is not None else Chunking()
    return cls(cfg, chunks, workers, tables)
