"""How a worker's gradient reaches the shared model (``optim.update``): two updaters with one face.

- :class:`HogwildUpdate`: the worker steps the shared weights itself, at once, lock-free, with
  its own optimizer (state private or shared): Hogwild!, as mnist_hogwild does.
- :class:`BarrierUpdate`: the worker's gradient meets the others' in shared memory, and the members
  of each step apply its mean to their shard of the parameters with the replica's one optimizer
  state (replica/meeting.py). Rows of sparse embedding tables are still written directly, as under
  Hogwild: their rows rarely collide, and a batch's rows are few.

The worker loop (replica/worker.py) calls :meth:`begin` before it computes a gradient (its
``.grad`` go where the updater wants them) and :meth:`apply` after, with the gradient's verdict.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Callable, Optional, Protocol, Union

import numpy as np
import torch
from torch import Tensor

from hogwild.config.schema import OptimConfig
from hogwild.errors import UserError
from hogwild.replica.deadline import due, pivot_of
from hogwild.replica.meeting import (AUTO_CHUNKS, MIN_CHUNK_S, MIN_CHUNK_SAMPLES, PACE_WINDOW, STEPS_KEY, Meeting,
                                     Piece, balanced_share, mean_into, wait_until)
from hogwild.replica.optim import (FlatOptimizer, Optimizer, TorchOptimizer, bind_views, decays, rebound_state,
                                   state_views, torch_optimizer)
from hogwild.replica.shared import Slot

# The learning rate of the replica's optimizer step number ``t`` (replica/worker.py makes it).
Rate = Callable[[int], float]


class Updater(Protocol):
    batches_per_step: int
    """Batches one optimizer step takes (the learning-rate schedule counts steps)."""
    wait_s: float
    """Seconds spent waiting for the other workers (none under Hogwild)."""

    def ready(self) -> None:
        """The worker's loop starts: steps may count on it from now."""

    def begin(self) -> bool:
        """Make ready for the next gradient; False when the run stops first."""

    def share(self) -> float:
        """The share of each batch the next gradient is computed on (1: the whole batch)."""

    def chunks(self) -> int:
        """The chunks the next batch is computed in (optim.chunks; 1: whole, or the share :meth:`share` says)."""

    def hand_in(self, chunk_s: float, chunks_left: int) -> bool:
        """Whether to hand in the chunks computed so far rather than compute the ``chunks_left``
        others (about ``chunk_s`` seconds each) first."""

    def apply(self, grads: list[Optional[Tensor]], ok: bool, rate: Optional[Rate], pos: int,
              samples: int = 0, fraction: float = 1.0) -> int:
        """Deliver the gradient just computed (``ok``: finite) on ``samples`` samples, ``fraction``
        of its batch; ``pos``: the replica's position in batches. How many of this worker's
        gradients reached the model (0 or 1)."""

    def finish(self) -> None:
        """The worker's loop ends: no step waits for it any more."""


class HogwildUpdate:
    def __init__(self, opt: Optimizer, params: list[Tensor], batches_per_step: int = 1) -> None:
        """``batches_per_step``: the plan's (config/plan.py), the worker's ``train.accumulate``."""
        self.opt, self.params = opt, params
        self.batches_per_step = batches_per_step
        self.wait_s = 0.0

    def ready(self) -> None:
        pass

    def begin(self) -> bool:
        for p in self.params:
            p.grad = None  # backward allocates each gradient afresh
        return True

    def finish(self) -> None:
        pass

    def share(self) -> float:
        return 1.0  # nobody waits for anybody: no batch is cut

    def chunks(self) -> int:
        return 1

    def hand_in(self, chunk_s: float, chunks_left: int) -> bool:
        return False

    def apply(self, grads: list[Optional[Tensor]], ok: bool, rate: Optional[Rate], pos: int,
              samples: int = 0, fraction: float = 1.0) -> int:
        if not ok:
            return 0
        if rate is not None:
            self.opt.set_lr(rate(pos // self.batches_per_step))
        self.opt.step(grads)
        return 1


@dataclass(frozen=True)
class Seat:
    """Where a worker sits at its replica's meeting: the meeting, its row there, and the replica's
    shared weights and one optimizer state that the members' shards step."""

    meeting: Meeting
    index: int
    """The worker's row (its local index)."""
    flat: Tensor
    opt_state: dict[str, Tensor]


@dataclass(frozen=True)
class Signals:
    """How a barrier worker hears that the run stops, tells the chair it arrived (``notify``) and is
    woken by it (``kick``); a pipe is None where nobody listens (a replica of one worker, tests)."""

    stopping: Callable[[], bool]
    notify: Optional[Connection] = None
    kick: Optional[Connection] = None


class BarrierUpdate:
    """One worker's side of the meeting (replica/meeting.py has the protocol)."""

    def __init__(self, cfg: OptimConfig, seat: Seat, params: list[Tensor], signals: Signals,
                 direct: Optional[Optimizer] = None, chunks: tuple[int, float] = (1, 0.0)) -> None:
        """``direct``: the optimizer of the sparse tables' rows, which this worker writes itself.
        ``cfg.balance``: a slower worker computes on a share of its batch (:func:`balanced_share`).
        ``chunks``: each batch in this many chunks once a whole one takes this many seconds
        (:func:`chunks_for`)."""
        meeting = seat.meeting
        self.cfg, self.m, self.i, self.flat, self.params = cfg, meeting, seat.index, seat.flat, params
        self.slots: list[Slot] = meeting.slots
        self.state, self.direct = seat.opt_state, direct
        self.notify, self.kick, self.stopping = signals.notify, signals.kick, signals.stopping
        # A sparse table's rows are written as each gradient is applied: never in chunks.
        self._chunks, self._chunk_s = (chunks[0] if meeting.workers > 1 and not meeting.tables else 1), chunks[1]
        self.balance = bool(cfg.balance) and meeting.workers > 1
        self._share = 1.0
        self._paces: deque[float] = deque(maxlen=PACE_WINDOW)
        self.wait_s = 0.0
        self.last_count = 0
        """Finite gradients in the last step this worker applied a shard of (their mean's divisor)."""
        self.views = meeting.row_views(seat.index)
        self.sparse = meeting.tables
        self.cuda = seat.flat.device.type == "cuda"
        self._shards: dict[tuple[int, int], tuple[Optimizer, list[Piece], dict[tuple[int, str], int]]] = {}
        self._torch_views: Optional[tuple[list[dict[str, object]], list[dict[str, Tensor]]]] = None
        self._read, self._t0 = -1, 0.0

    # ------------------------------------------------------------------ gradients
    def ready(self) -> None:
        self.m.cells[self.i]["live"] = 1.0
        self._tell()

    def finish(self) -> None:
        self.m.cells[self.i]["live"] = 0.0
        self._tell()

    def begin(self) -> bool:
        head = self.m.head
        t0 = time.perf_counter()
        # The weights are read only when no step is being applied: every gradient of a step is
        # computed on the weights it moves, as DDP's are.
        whole = wait_until(lambda: head["applied"] == head["open"], self.stopping, self.kick)
        self.wait_s += time.perf_counter() - t0
        if not whole:
            return False
        self._read, self._t0 = int(head["applied"]), time.perf_counter()
        # Chunks decide a batch's parts as it is computed: the pace's split is not asked for. The others'
        # paces as they are now, each written with its last gradient.
        if self.balance and self.chunks() == 1:
            cells = self.m.cells
            # A part may come half the straggler bound after the pivot and still be waited for.
            self._share = balanced_share(float(cells[self.i]["pace"]), cells["pace"][cells["live"] > 0].tolist(),
                                         self.cfg.straggler_wait / 2)
        self.m.rows[self.i].zero_()
        for i, p in enumerate(self.params):
            # Backward adds into the row; a table's gradient stays sparse, a frozen parameter's None.
            p.grad = self.views.get(i)
        return True

    def share(self) -> float:
        return self._share

    def chunks(self) -> int:
        return self._chunks if float(self.m.cells[self.i]["pace"]) >= self._chunk_s else 1

    def hand_in(self, chunk_s: float, chunks_left: int) -> bool:
        """optim.chunks: yes once the open step's pivot has brought its fresh gradient and the rest
        would come after ``optim.min_wait`` of the pivot's compute time, the least the chair waits
        from it; yes too when the step closed without this worker (the gradient is late however
        much more it holds, and the sooner it comes the sooner it reads fresh weights)."""
        head, cells = self.m.head, self.m.cells
        step = int(head["open"])
        if step != self._read:
            return True
        live = np.flatnonzero(cells["live"] > 0)
        arrived = [int(j) for j in live if j != self.i and cells[j]["arrived"] == step]
        pivot = pivot_of(step, arrived, len(live), cells)
        if pivot is None:
            return False
        return time.monotonic() + chunks_left * chunk_s > due(cells, pivot, self.cfg.min_wait)

    def apply(self, grads: list[Optional[Tensor]], ok: bool, rate: Optional[Rate], pos: int,
              samples: int = 0, fraction: float = 1.0) -> int:
        if ok and self.direct is not None and self.sparse:
            if rate is not None:
                self.direct.set_lr(rate(int(self.m.head["t"])))
            self.direct.step([g if i in self.sparse else None for i, g in enumerate(grads)])
        if self.cuda:
            torch.cuda.synchronize()  # the row is written before anyone is told so
        cell = self.m.cells[self.i]
        cell["finite"], cell["read"], cell["samples"] = float(ok), self._read, float(samples)
        cell["compute_s"], cell["at"] = time.perf_counter() - self._t0, time.monotonic()
        # What a whole batch would have taken: by the part it really was (a batch's last part may be
        # smaller than the share asked for).
        self._paces.append(cell["compute_s"] / max(fraction, 1e-3))
        cell["pace"] = statistics.median(self._paces)
        if self.m.workers == 1:
            return self._alone(ok, rate)
        t0 = time.perf_counter()
        try:
            step = self._meet()
            if step is None:
                return 0
            self._apply_shard(step, rate)
            self.m.finish(self.i, step)
            self._tell()
            wait_until(lambda: self.m.head["applied"] > step, self.stopping, self.kick)
        finally:
            self.wait_s += time.perf_counter() - t0
        return int(ok)

    def _tell(self) -> None:
        if self.notify is not None:
            try:
                self.notify.send_bytes(b"m")
            except OSError:
                pass  # the leader is gone: the wait that follows sees it

    def _meet(self) -> Optional[int]:
        """Arrive, and wait for the step this gradient is in: the open one, or, when that closed
        without it (later than the bound), the next. None when the run stops first."""
        head, cell = self.m.head, self.m.cells[self.i]
        while True:
            step = int(head["open"])
            cell["arrived"] = step
            self._tell()
            if not wait_until(lambda: head["open"] > step, self.stopping, self.kick):
                return None
            if int(cell["member_of"]) == step:
                return step

    def _alone(self, ok: bool, rate: Optional[Rate]) -> int:
        """A replica of one worker: it closes and applies its own steps (no chair runs)."""
        head, cell = self.m.head, self.m.cells[self.i]
        step = int(head["open"])
        cell["member_of"], head["count"] = step, float(ok)
        head["t"] = float(self.state[STEPS_KEY][0])
        if ok:
            self.state[STEPS_KEY] += 1
        head["open"] = step + 1
        self._apply_shard(step, rate)
        cell["done"] = step
        head["applied"] = step + 1
        return int(ok)

    # ------------------------------------------------------------------ the shard
    def _apply_shard(self, step: int, rate: Optional[Rate]) -> None:
        members = self.m.members(step)
        cells = self.m.cells
        contributors = [j for j in members if cells[j]["finite"] > 0]
        self.last_count = len(contributors)
        if not contributors or self.i not in members:
            return
        opt, pieces, where = self._shard(members.index(self.i), len(members))
        if not mean_into(self.m.rows, self.i, contributors, pieces, cells["samples"][contributors].tolist()):
            return  # finite gradients whose mean overflows: this shard skips the step
        t = int(self.m.head["t"])
        if rate is not None:
            opt.set_lr(rate(t))
        if isinstance(opt, FlatOptimizer):
            opt.t = t  # step() counts it up to this step's number: Adam's bias correction is the replica's
            opt.step([self.m.rows[self.i, p.row_offset:p.row_offset + p.numel] for p in pieces])
        else:
            for p in pieces:
                self.params[p.slot].grad = self.views[p.slot]  # a poisoned step may have put another there
            opt.step([])
            if where:
                self._check_in_place(opt, [self.params[p.slot] for p in pieces], where)
        if self.cuda:
            torch.cuda.synchronize()  # the shard is written before the step is called applied

    def _check_in_place(self, opt: Optimizer, params: list[Tensor], where: dict[tuple[int, str], int]) -> None:
        assert isinstance(opt, TorchOptimizer)
        key = rebound_state(opt.opt, params, where)
        if key is not None:
            raise UserError(f"optim._target_: {self.cfg._target_} replaced its state {key!r} with a new tensor instead "
                            "of updating it in place, so the replica's one shared state would never move; use "
                            "optim.update=hogwild (each worker then keeps its own state)")
        where.clear()  # checked once: torch's rules either always rebind or never

    def _shard(self, rank: int, parts: int) -> tuple[Optimizer, list[Piece], dict[tuple[int, str], int]]:
        """This worker's share of a step of ``parts`` members, and the optimizer over it (built on
        first use; its state is views of the replica's shared state)."""
        key = (rank, parts)
        if key not in self._shards:
            if self.cfg._target_:
                pieces = self.m.param_shard(rank, parts)
                params = [self.params[p.slot] for p in pieces]
                opt = torch_optimizer(self.cfg, params)
                probe, views = self._all_views()
                where = bind_views(opt.opt, params, [probe[p.slot] for p in pieces], [views[p.slot] for p in pieces])
                self._shards[key] = (opt, pieces, where)
            else:
                pieces = self.m.value_shard(rank, parts)
                slot_decay = decays(self.cfg, [s.shape for s in self.slots])
                run_slots = [Slot(self.slots[p.slot].name, self.slots[p.slot].offset + p.start, (p.numel,))
                             for p in pieces]
                opt = FlatOptimizer(self.cfg, self.flat, run_slots, self.state,
                                    decay=[slot_decay[p.slot] for p in pieces], racing=False)
                self._shards[key] = (opt, pieces, {})
        return self._shards[key]

    def _all_views(self) -> tuple[list[dict[str, object]], list[dict[str, Tensor]]]:
        if self._torch_views is None:
            self._torch_views = state_views(self.cfg, self.params, self.slots, self.state)
        return self._torch_views


def chunks_for(setting: Union[int, str], model: torch.nn.Module, batch_size: int) -> tuple[int, float]:
    """optim.chunks as a barrier worker runs it: (chunks, the seconds a whole batch must take before
    it is cut). An explicit number is kept as it is; auto (:data:`AUTO_CHUNKS` of at least
    :data:`MIN_CHUNK_SAMPLES` samples once a batch takes :data:`MIN_CHUNK_S`) keeps whole batches for a
    model with batch-norm layers, whose statistics would be a chunk's instead of the batch's."""
    if setting != "auto":
        return int(setting), 0.0
    if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return 1, 0.0
    return max(1, min(AUTO_CHUNKS, batch_size // MIN_CHUNK_SAMPLES)), MIN_CHUNK_S
