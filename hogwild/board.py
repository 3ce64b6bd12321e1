"""The shared board: how workers and their leader talk, with named fields.

Two small float64 tensors in shared memory, read through numpy structured views so every
cell has a name:

- ``stats``: one row per worker, written only by that worker (its position, counters,
  timings), read by the leader;
- ``control``: one record written only by the leader (stop, the next sync point, ...),
  read by the workers.

No other module indexes these tensors by number.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, fields

import numpy as np
import torch
from torch import Tensor

STATS = np.dtype([(name, np.float64) for name in (
    "pos",         # batches this worker's shard has been read to (its data position)
    "applied",     # updates written into the shared model
    "samples",     # samples processed
    "loss",        # EMA of the training loss (0 until the first update)
    "skipped",     # non-finite updates dropped
    "done",        # 1 once the worker finished its quota
    "step_s",      # total seconds spent in steps
    "sync_s",      # seconds of the steps that overlapped a sync round
    "sync_steps",  # steps that overlapped a sync round
    "ready",       # 1 once warm-up is over
    "lag_wait_s",  # seconds spent waiting for a round (sync.max_lag)
)])
CONTROL = np.dtype([(name, np.float64) for name in (
    "stop",          # workers leave their loop
    "next_sync_at",  # replica position of the next round (inf: never)
    "syncing",       # a round is in flight
    "notified",      # the sync point a worker last woke the leader for
    "go",            # every replica is ready: start training
    "next_report_at",  # replica position of the next metrics point (the leader wakes for it)
    "lag_limit",     # replica position at which workers wait for the pending round (inf: never)
)])


@dataclass
class Totals:
    """One replica's (or, once all-reduced, the job's) counters, in a fixed order."""

    applied: float = 0.0
    samples: float = 0.0
    skipped: float = 0.0
    restarts: float = 0.0
    step_s: float = 0.0
    sync_s: float = 0.0
    sync_steps: float = 0.0
    pos: float = 0.0
    lag_wait_s: float = 0.0

    def to_tensor(self) -> Tensor:
        return torch.tensor(astuple(self), dtype=torch.float64)

    @classmethod
    def from_tensor(cls, t: Tensor) -> "Totals":
        values = t.double().cpu().tolist()
        return cls(**{f.name: v for f, v in zip(fields(cls), values)})

    def stall_s(self) -> float:
        """Extra time workers' steps took while a sync ran, beyond their usual step time."""
        other = max(self.pos - self.sync_steps, 1.0)
        return max(0.0, self.sync_s - self.sync_steps * (self.step_s - self.sync_s) / other)


class Board:
    """The leader's handle on the board; workers receive the same object (its tensors are shared)."""

    def __init__(self, workers: int) -> None:
        self.stats_t = torch.zeros(workers, len(STATS.names), dtype=torch.float64).share_memory_()
        self.control_t = torch.zeros(len(CONTROL.names), dtype=torch.float64).share_memory_()

    @property
    def stats(self) -> np.ndarray:
        """Structured view, shape (workers,): ``board.stats["pos"]`` is every worker's position."""
        return self.stats_t.numpy().view(STATS).reshape(-1)

    @property
    def control(self) -> np.void:
        """Structured record: ``board.control["stop"] = 1`` writes the shared cell."""
        return self.control_t.numpy().view(CONTROL)[0]

    def row(self, i: int) -> np.void:
        return self.stats[i]

    def replica_pos(self) -> float:
        return float(self.stats["pos"].sum())

    def applied(self) -> int:
        return int(self.stats["applied"].sum())

    def skipped(self) -> int:
        return int(self.stats["skipped"].sum())

    def samples(self) -> float:
        return float(self.stats["samples"].sum())

    def all_ready(self) -> bool:
        return bool((self.stats["ready"] > 0).all())

    def all_done(self) -> bool:
        return bool((self.stats["done"] > 0).all())

    def loss(self) -> float:
        """Mean training-loss EMA over workers that have made an update."""
        losses = [float(x) for x in self.stats["loss"] if x > 0]
        return sum(losses) / len(losses) if losses else float("nan")

    def totals(self, restarts: int) -> Totals:
        s = self.stats
        return Totals(applied=float(s["applied"].sum()), samples=float(s["samples"].sum()),
                      skipped=float(s["skipped"].sum()), restarts=float(restarts),
                      step_s=float(s["step_s"].sum()), sync_s=float(s["sync_s"].sum()),
                      sync_steps=float(s["sync_steps"].sum()), pos=float(s["pos"].sum()),
                      lag_wait_s=float(s["lag_wait_s"].sum()))
