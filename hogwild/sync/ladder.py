"""``sync.compress=auto``: a paced average's rounds send fewer bytes once the link, not the steps,
sets their pace.

Whole fp32 rounds are the best a fast link can carry: every value averaged every round, nothing
rounded. On a slow link they take longer than the steps between them, the workers run on past a
round still in flight, and the model is averaged less often and later than the steps allow. On the
1.8M-parameter GPT of BENCHMARKS.md §20, whole fp32 rounds over 10 Mbit/s met every 21-25 steps and
ended 0.11 above the same job on loopback; int8 rounds of a quarter of the model each met every two
steps and ended level with it. Over 100 Mbit/s the same wire reached torchft DiLoCo's final loss
1.51x sooner, against 1.32x with whole fp32 rounds; over 1 Gbit/s whole fp32 rounds already met at
the floor of two optimizer steps and had nothing to gain.

So the rule climbs a ladder of wires while the link asks for :data:`~hogwild.sync.schedule.PACE_FLOOR`
optimizer steps between rounds or more: fp32, int8 (4x fewer bytes at two replicas), int8 in four
fragments (16x). It climbs straight to the lowest rung whose rounds, at the bytes it saves, would ask
for fewer (on the 10 Mbit/s link, one rung at a time spent the first 40 s of 90 in slow rounds). It
never climbs down: a link that was slow once is not trusted to stay fast.

Every leader climbs at the same round: the decision reads only the round's reduced control vector
(the wanted intervals every leader sent), the rung, which the rule's state carries to a checkpoint
and to a joiner's heal, and the schedule's floor (two optimizer steps: the same on replicas of
equal workers). A leader whose workers are done still decides with the others (sync/rounds.py).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Optional

import torch
from torch import Tensor

from hogwild.config.schema import SyncConfig
from hogwild.config.sync import RUNGS, wire_label
from hogwild.replica.board import Board
from hogwild.sync.base import SyncContext, SyncRule
from hogwild.sync.comm import Comm
from hogwild.sync.schedule import link_ask

logger = logging.getLogger(__name__)

RUNG = "wire_rung"
"""The rung's key in the rule's state (a checkpoint, a joiner's heal)."""
HOLD = "wire_hold"
"""The rounds the rule still waits before it may climb again: in the state too, or a joiner healed
right after a climb would climb a round before the others (a collective mismatch)."""


def cost(rung: int, replicas: int) -> float:
    """A round's bytes on ``rung`` against whole fp32 rounds: int8's ring all_gather sends
    ``(R - 1) n`` bytes against fp32's all_reduce ``2 (R - 1) / R * 4n``, so ``R / 8`` of them (a
    quarter at two replicas, as much at eight, 128 times as much at 1,024), and F fragments send 1 / F
    of the model (sync/wire.py)."""
    dtype, fragments = RUNGS[rung]
    return (1.0 if dtype == "fp32" else replicas / 8) / fragments


def fitting(rung: int, ask: float, floor: int, replicas: int) -> int:
    """The rung to climb to from ``rung``, where the link asks for ``ask`` steps between rounds.

    Only a rung above that sends fewer bytes than this one, at this many replicas, is a step up. Of
    those, fewer fragments first (each value travels more often), then fewer bytes; the first whose
    rounds would ask for fewer than ``floor`` steps, else the cheapest; ``rung`` itself when the link
    does not set the pace or nothing above is cheaper. Before 2026-11-28 the top rung was taken
    whatever it sent: from 32 replicas on int8 in four fragments sends more than whole fp32 rounds
    (docs/scale.md, "The simulator")."""
    if ask < floor:
        return rung
    here = cost(rung, replicas)
    cheaper = sorted((r for r in range(rung + 1, len(RUNGS)) if cost(r, replicas) < here),
                     key=lambda r: (RUNGS[r][1], cost(r, replicas), r))
    for higher in cheaper:
        if ask * cost(higher, replicas) / here < floor:
            return higher
    return min(cheaper, key=lambda r: (cost(r, replicas), r)) if cheaper else rung


class Ladder(SyncRule):
    """One rung's rule at a time (sync/rules.py builds it with the rung's ``sync.dtype`` and
    ``sync.fragments``); everything else is the rung's rule's own."""

    name = "ladder"  # a wrapper, not a sync.mode: never registered

    def __init__(self, cfg: SyncConfig, comm: Comm, params: Optional[int],
                 make: Callable[[SyncConfig, Comm], SyncRule]) -> None:
        super().__init__(cfg, comm, params)
        self._make = make
        self.rung = 0
        self.inner = make(self._cfg(0), self.comm)
        self._board: Optional[Board] = None
        self._hold = 0
        """Rounds whose wanted intervals were measured on a lower rung: the round after a climb
        carries the asks of the round that climbed."""
        self._agreed: Optional[Tensor] = None
        """The last whole round's target (the replicas' mean, alike on every replica; the round's
        own buffer, not a copy): a compressed rung starts from it as its agreed base."""

    def _cfg(self, rung: int) -> SyncConfig:
        dtype, fragments = RUNGS[rung]
        return dataclasses.replace(self.cfg, dtype=dtype, fragments=fragments, compress="off")

    def after_round(self, paces: list[tuple[float, float]], floor: int) -> bool:
        """Every leader, after each round that was not the last, with the round's agreed wanted
        intervals and the schedule's floor: climb a rung if the link asks for it. True: climbed."""
        ask = link_ask(paces)
        if ask is None:
            return False  # nothing measured: the rounds that carry asks are the ones counted
        if self._hold > 0:
            self._hold -= 1
            return False
        rung = fitting(self.rung, ask, floor, len(paces))
        if rung == self.rung:
            return False
        self._climb(rung)
        logger.info("the link sets the rounds' pace (a round asks for %.1f steps between rounds, the floor is %d): "
                    "rounds now send %s (sync.compress=auto)", ask, floor, self.wire_name)
        return True

    def _climb(self, rung: int) -> None:
        # The agreed state travels to the new rung in the whole model's layout (a fragmented
        # rule cuts it): average's base, which every replica holds alike, or, from whole fp32
        # rounds, the last round's mean. Without either, a compressed average would take the first
        # healthy replica's snapshot in its first round (a whole fp32 model through the slow link
        # once more). The old wire's rounding residual, one round's worth, is dropped.
        state = dict(self.inner.state_dict())
        if "base" not in state and self._agreed is not None:
            state["base"] = self._agreed.clone()
        self.rung, self._agreed = rung, None
        self.inner = self._make(self._cfg(rung), self.comm)
        if state:
            self.inner.load_state_dict(state)
        if self._board is not None:
            self.inner.attach(self._board)
        self._hold = 1

    # Everything below is the rung's rule's.
    def prime(self, flat: Tensor) -> None:
        self.inner.prime(flat)

    def attach(self, board: Board) -> None:
        self._board = board
        self.inner.attach(board)

    def plan(self, numel: int, final: bool, timeout_s: Optional[float] = None) -> list[slice]:
        return self.inner.plan(numel, final, timeout_s)

    def target(self, snap: Tensor, ctx: SyncContext) -> Tensor:
        return self.inner.target(snap, ctx)

    def exchange(self, snap: Tensor, ctl: Tensor, rank: int, timeout_s: float,
                 final: bool = False) -> tuple[Tensor, Tensor]:
        out = self.inner.exchange(snap, ctl, rank, timeout_s, final)
        self.ending, self.spread = self.inner.ending, self.inner.spread
        if RUNGS[self.rung][1] == 1:
            self._agreed = out[0]
        return out

    def scratch(self, name: str, numel: int, like: Tensor) -> Tensor:
        return self.inner.scratch(name, numel, like)

    def settle(self, flat: Tensor) -> None:
        self.inner.settle(flat)

    def positional(self) -> dict[str, Tensor]:
        return self.inner.positional()

    def set_positional(self, state: dict[str, Tensor]) -> None:
        self.inner.set_positional(state)

    def held(self) -> list[Tensor]:
        return self.inner.held()

    def state_dict(self) -> dict[str, Tensor]:
        return {**self.inner.state_dict(), RUNG: torch.tensor([self.rung], dtype=torch.int64),
                HOLD: torch.tensor([self._hold], dtype=torch.int64)}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        rung = int(state[RUNG]) if RUNG in state else 0
        if rung != self.rung:
            self._climb(min(rung, len(RUNGS) - 1))
            self._hold = 0  # a state saved without its hold: from a group that already measured this rung
        if HOLD in state:
            self._hold = int(state[HOLD])
        self.inner.load_state_dict({k: v for k, v in state.items() if k not in (RUNG, HOLD)})

    @property
    def wire_name(self) -> str:
        return wire_label(*RUNGS[self.rung])
