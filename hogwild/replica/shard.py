"""A barrier worker's shard of each step: the mean of the step's gradients over its slice of the
parameters, and the replica's one optimizer state stepping that slice (replica/meeting.py has the
protocol; replica/update.py calls :meth:`ShardStep.apply` once a step it is a member of closed).

Under the flat rules a shard is an equal slice of the dense values; under a torch optimizer whole
parameters, whose rules may span a parameter (Adafactor's factored moments). Either way its state is
views of the replica's shared state, so the members step in parallel and nothing is copied.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

import torch
from torch import Tensor

from hogwild.config.schema import OptimConfig
from hogwild.errors import UserError
from hogwild.replica.meeting import Meeting, Piece, mean_into
from hogwild.replica.optim import (FlatOptimizer, Optimizer, TorchOptimizer, bind_views, decays, rebound_state,
                                   state_views, torch_optimizer)
from hogwild.replica.shared import Slot

logger = logging.getLogger(__name__)

# The learning rate of the replica's optimizer step number ``t`` (replica/worker.py makes it).
Rate = Callable[[int], float]


class ShardStep:
    """Worker ``index``'s shards at ``meeting``, with their optimizers (built on first use)."""

    def __init__(self, cfg: OptimConfig, meeting: Meeting, index: int, flat: Tensor, params: list[Tensor],
                 state: dict[str, Tensor]) -> None:
        self.cfg, self.m, self.i, self.flat, self.params, self.state = cfg, meeting, index, flat, params, state
        self.slots: list[Slot] = meeting.slots
        self.views = meeting.row_views(index)
        self.cuda = flat.device.type == "cuda"
        self.last_count = 0
        """Finite gradients in the last step this worker applied a shard of (their mean's divisor)."""
        self._shards: dict[tuple[int, int], tuple[Optimizer, list[Piece], dict[tuple[int, str], int]]] = {}
        self._torch_views: Optional[tuple[list[dict[str, object]], list[dict[str, Tensor]]]] = None

    def apply(self, step: int, rate: Optional[Rate]) -> None:
        """Step this worker's shard of ``step``: its members' mean gradient there, then the optimizer."""
        members = self.m.members(step)
        cells = self.m.cells
        contributors = [j for j in members if cells[j]["finite"] > 0]
        self.last_count = len(contributors)
        appliers = self.m.appliers(step) if len(members) > 1 else members  # one worker alone applies its own
        if not contributors or self.i not in appliers:
            return
        opt, pieces, where = self._shard(appliers.index(self.i), len(appliers))
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
        """This worker's share of a step of ``parts`` members, and the optimizer over it."""
        key = (rank, parts)
        if key not in self._shards:
            if self.cfg._target_:
                pieces = self.m.param_shard(rank, parts)
                params = [self.params[p.slot] for p in pieces]
                opt = torch_optimizer(self.cfg, params)
                if self._torch_views is None:
                    self._torch_views = state_views(self.cfg, self.params, self.slots, self.state)
                probe, views = self._torch_views
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
