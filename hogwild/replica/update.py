"""How a worker's gradient reaches the shared model (``optim.update``): two updaters with one face.

- :class:`HogwildUpdate`: the worker steps the shared weights itself, at once, lock-free, with
  its own optimizer (state private or shared): Hogwild!, as mnist_hogwild does.
- :class:`BarrierUpdate`: the worker's gradient meets the others' in shared memory, and the members
  of each step apply its mean to their shard of the parameters with the replica's one optimizer
  state (replica/meeting.py, replica/shard.py). Rows of sparse embedding tables are still written
  directly, as under Hogwild: their rows rarely collide, and a batch's rows are few. How its batch
  is cut and when it hands in chunks is its pacer's to say (replica/pacing.py).

The worker loop (replica/worker.py) calls :meth:`begin` before it computes a gradient (its
``.grad`` go where the updater wants them), :meth:`split` for how to compute it, and :meth:`apply`
after, with the gradient's verdict.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Callable, Optional, Protocol

import torch
from torch import Tensor

from hogwild.config.schema import OptimConfig
from hogwild.replica.meeting import STEPS_KEY, Meeting, wait_until
from hogwild.replica.optim import Optimizer
from hogwild.replica.pacing import WHOLE, Pacer, Split
from hogwild.replica.shard import Rate, ShardStep


class Updater(Protocol):
    batches_per_step: int
    """Batches one optimizer step takes (the learning-rate schedule counts steps)."""
    wait_s: float
    """Seconds spent waiting for the other workers (none under Hogwild)."""

    def ready(self) -> None:
        """The worker's loop starts: steps may count on it from now."""

    def begin(self) -> bool:
        """Make ready for the next gradient; False when the run stops first."""

    def split(self) -> Split:
        """How the next batch is computed: whole, a share of it, or in chunks (replica/pacing.py)."""

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

    def split(self) -> Split:
        return WHOLE  # nobody waits for anybody: no batch is cut

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

    def __init__(self, cfg: OptimConfig, seat: Seat, params: list[Tensor], signals: Signals, pacer: Pacer,
                 direct: Optional[Optimizer] = None) -> None:
        """``pacer``: how this worker cuts its batches (replica/pacing.py); ``direct``: the optimizer
        of the sparse tables' rows, which this worker writes itself."""
        meeting = seat.meeting
        self.m, self.i, self.params, self.pacer, self.direct = meeting, seat.index, params, pacer, direct
        self.state = seat.opt_state
        self.notify, self.kick, self.stopping = signals.notify, signals.kick, signals.stopping
        self.shard = ShardStep(cfg, meeting, seat.index, seat.flat, params, seat.opt_state)
        self.views, self.sparse, self.cuda = self.shard.views, meeting.tables, self.shard.cuda
        self.wait_s = 0.0
        self._read, self._t0 = -1, 0.0

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
        cell = self.m.cells[self.i]
        cell["began"] = cell["tick"] = time.monotonic()
        self.m.rows[self.i].zero_()
        for i, p in enumerate(self.params):
            # Backward adds into the row; a table's gradient stays sparse, a frozen parameter's None.
            p.grad = self.views.get(i)
        return True

    def split(self) -> Split:
        return self.pacer.split(self.i, self.m.cells)  # the others' paces as they are now

    def hand_in(self, chunk_s: float, chunks_left: int) -> bool:
        return self.pacer.hand_in(self.i, self._read, self.m.cells, int(self.m.head["open"]), chunk_s, chunks_left)

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
        cell["pace"] = self.pacer.timed(float(cell["compute_s"]), fraction)
        if self.m.workers == 1:
            return self._alone(ok, rate)
        t0 = time.perf_counter()
        try:
            step = self._meet()
            if step is None:
                return 0
            self.shard.apply(step, rate)
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
        self.shard.apply(step, rate)
        cell["done"] = step
        head["applied"] = step + 1
        return int(ok)
