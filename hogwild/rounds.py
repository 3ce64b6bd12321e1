"""This replica's side of the sync rounds: run one round on the live buffer while the
workers train, and keep the round's bookkeeping (count, timings, drift, next sync point)."""

from __future__ import annotations

import logging
import time

import torch

from hogwild.board import Board
from hogwild.comm import Comm
from hogwild.schedule import SyncSchedule
from hogwild.sync import RoundOutcome, SyncRule, sync_round
from hogwild.telemetry import Telemetry

logger = logging.getLogger(__name__)


class Rounds:
    def __init__(self, flat: torch.Tensor, rule: SyncRule, comm: Comm, board: Board,
                 schedule: SyncSchedule, tel: Telemetry, syncs: int = 0) -> None:
        self.flat, self.rule, self.comm, self.board = flat, rule, comm, board
        self.schedule, self.tel = schedule, tel
        self.syncs = syncs  # rounds of the whole lineage, restored ones included
        self.times: list[float] = []  # this process's rounds
        self.last_drift = 0.0
        board.control["next_sync_at"] = schedule.next_sync_at

    def run(self, *, done: bool, stop: bool, want_checkpoint: bool, reached: bool, final: bool,
            timeout_s: float) -> RoundOutcome:
        t0 = time.perf_counter()
        ctl = self.board.control
        ctl["syncing"] = 1.0
        pos_at_snap = self.board.replica_pos()
        try:
            out = sync_round(self.flat, self.rule, done=done, stop=stop, want_checkpoint=want_checkpoint,
                             reached=reached, last_drift=self.last_drift, final=final, timeout_s=timeout_s)
        finally:
            ctl["syncing"] = 0.0
        if not out.healthy:
            logger.warning("replica %d held non-finite parameters; excluded from the sync and "
                           "restored from the consensus of the others", self.comm.rank)
        self.last_drift = out.drift
        dt = time.perf_counter() - t0
        self.syncs += 1
        self.times.append(dt)
        step = int(self.board.replica_pos())
        self.tel.metrics.scalar("sync/seconds", dt, step)
        if len(self.times) > 1:  # the drifts riding on round 1 were measured by nobody
            self._record_drift(out.last_drifts, step)
        ctl["next_sync_at"] = self.schedule.after_round(pos_at_snap)
        return out

    def _record_drift(self, drifts: list[float], step: int) -> None:
        rec = self.schedule.record_drift(drifts)
        if rec is not None:
            self.tel.drift(rec, step)

    def close(self) -> float:
        """After the final round: record its drift (it has no later round to ride on) and
        return the mean round time over every replica, in one small gather."""
        mine = torch.tensor([self.last_drift, _mean(self.times)], dtype=torch.float64)
        gathered = self.comm.all_gather(mine)
        if self.comm.world_size == 1:
            return 0.0
        self._record_drift([float(g[0]) for g in gathered], int(self.board.replica_pos()))
        return _mean([float(g[1]) for g in gathered])


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0
