"""The shared board: how workers and their leader talk, with named fields.

Two small float64 tensors in shared memory, read through numpy structured views so every
cell has a name. The leader maps them from a file in the run directory
(``progress/rank<r>.board``): the pages are shared like any shared memory, and they are still
there after a ``kill -9``, so a restarted run counts exactly how many steps the previous
attempt made beyond its checkpoint. Tests use an anonymous board.

- ``stats``: one row per worker, written only by that worker (its position, counters,
  timings), read by the leader;
- ``control``: one record written only by the leader (stop, the next sync point, ...),
  read by the workers.

No other module indexes these tensors by number.
"""

from __future__ import annotations

import errno
import os
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Optional

import numpy as np
import torch
from torch import Tensor

from hogwild.files import open_nofollow

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
    "wait_s",      # seconds spent waiting for the other workers (optim.update=barrier)
    "data_s",      # seconds of steps spent reading and collating batches
    "compute_s",   # seconds of steps spent in the forward pass, the loss and backward
    "update_s",    # seconds of steps spent applying the update (optimizer, or the barrier's shard), waits excluded
    "cpu_s",       # CPU seconds of this worker's process during its steps
    "parts",       # gradients computed on a part of a batch, all but each batch's last (pace.balance, pace.chunks)
)])
CONTROL = np.dtype([(name, np.float64) for name in (
    "stop",          # workers leave their loop
    "next_sync_at",  # replica position of the next round (inf: never)
    "syncing",       # a round is in flight
    "notified",      # the sync point a worker last woke the leader for
    "go",            # every replica is ready: start training
    "next_report_at",  # replica position of the next metrics point (the leader wakes for it)
    "lag_limit",     # replica position at which workers wait for the pending round (inf: never)
    "base_steps",    # job steps restored from the checkpoint this attempt started from
    "go_at",         # time.monotonic() when training started (schedules under train.max_time)
    "row_epoch",     # sync.row_sparse: the stamp workers give the rows they write (replica/rows.py)
)])


@dataclass
class Counts:
    """The one counter record: a replica's counts (from its board), the job's (all-reduced in
    a fixed order as one tensor), or a run lineage's (the first five, which a checkpoint
    carries across restarts; the rest describe one attempt)."""

    steps: int = 0
    """Updates applied."""
    samples: float = 0.0
    skipped_nonfinite: int = 0
    worker_restarts: int = 0
    syncs: int = 0
    step_s: float = 0.0
    sync_s: float = 0.0
    sync_steps: float = 0.0
    pos: float = 0.0
    lag_wait_s: float = 0.0
    wait_s: float = 0.0
    """Seconds workers waited for each other (optim.update=barrier)."""
    data_s: float = 0.0
    compute_s: float = 0.0
    update_s: float = 0.0
    cpu_s: float = 0.0
    batch_parts: float = 0.0
    """Gradients slower workers computed on a part of a batch, all but each batch's last (pace.balance, pace.chunks)."""

    LINEAGE: ClassVar[tuple[str, ...]] = ("steps", "samples", "skipped_nonfinite", "worker_restarts", "syncs")

    def to_tensor(self) -> Tensor:
        return torch.tensor(astuple(self), dtype=torch.float64)

    @classmethod
    def from_tensor(cls, t: Tensor) -> "Counts":
        values = t.double().cpu().tolist()
        return cls(**{f.name: _typed(f.type, v) for f, v in zip(fields(cls), values)})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Counts":
        """A checkpoint's counters (missing keys are zero, unknown ones ignored)."""
        return cls(**{f.name: _typed(f.type, d[f.name]) for f in fields(cls) if f.name in d})

    def lineage(self) -> dict[str, Any]:
        """What a checkpoint stores."""
        return {name: getattr(self, name) for name in self.LINEAGE}

    def plus(self, job: "Counts", syncs: int) -> "Counts":
        """These restored lineage counts plus this run's job-wide counts, ``syncs`` rounds in all."""
        out = Counts(**{f.name: getattr(job, f.name) for f in fields(self)})
        for name in ("steps", "samples", "skipped_nonfinite", "worker_restarts"):
            setattr(out, name, getattr(self, name) + getattr(job, name))
        out.syncs = syncs
        return out

    def stall_s(self) -> float:
        """Extra time workers' steps took while a sync ran, beyond their usual step time."""
        other = max(self.pos - self.sync_steps, 1.0)
        return max(0.0, self.sync_s - self.sync_steps * (self.step_s - self.sync_s) / other)


class Board:
    """The leader's handle on the board; workers receive the same object (its tensors are
    shared, or it re-opens the same file mapping)."""

    def __init__(self, workers: int, path: Optional[Path] = None) -> None:
        self.workers, self.path = workers, path
        if path is None:
            self.stats_t = torch.zeros(workers, len(STATS.names), dtype=torch.float64).share_memory_()
            self.control_t = torch.zeros(len(CONTROL.names), dtype=torch.float64).share_memory_()
        else:
            self._map("w+")

    def _map(self, mode: str) -> None:
        assert self.path is not None
        n_stats = self.workers * len(STATS.names)
        size = (n_stats + len(CONTROL.names)) * 8
        # A board lives at run_dir/progress/<name>: neither progress/ nor the file may be a link.
        fd = open_nofollow(self.path, os.O_RDWR | (os.O_CREAT | os.O_TRUNC if mode == "w+" else 0),
                           root=self.path.parent.parent)
        with os.fdopen(fd, "r+b") as f:
            if mode == "w+":
                f.truncate(size)
                try:
                    # Every page now, not on first touch: a page a full disk cannot give kills the
                    # process that writes the board (SIGBUS) instead of one line with exit 5.
                    os.posix_fallocate(f.fileno(), 0, size)
                except OSError as e:
                    if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):  # a file system without it
                        raise OSError(e.errno, e.strerror, str(self.path)) from None
            mm = np.memmap(f, dtype=np.float64, mode="r+", shape=(size // 8,))
        flat = torch.from_numpy(mm)  # MAP_SHARED: every process that maps the file sees each write
        self.stats_t = flat[:n_stats].view(self.workers, len(STATS.names))
        self.control_t = flat[n_stats:]

    def __getstate__(self) -> dict[str, Any]:
        if self.path is None:
            return self.__dict__
        return {"workers": self.workers, "path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if "stats_t" not in state:
            self._map("r+")

    @property
    def stats(self) -> np.ndarray:
        """Structured view, shape (workers,): ``board.stats["pos"]`` is every worker's position."""
        return self.stats_t.numpy().view(STATS).reshape(-1)

    @property
    def control(self) -> np.void:
        """Structured record: ``board.control["stop"] = 1`` writes the shared cell."""
        return self.control_t.numpy().view(CONTROL)[0]

    def set_positions(self, pos: np.ndarray) -> None:
        """Every worker's data position (a slot that takes its shard's place from elsewhere)."""
        self.stats["pos"] = pos

    def set_base_steps(self, steps: int) -> None:
        """The job steps this attempt starts from (restored, or received from a peer)."""
        self.control["base_steps"] = steps

    def row(self, i: int) -> np.void:
        return self.stats[i]

    def busy_s(self) -> float:
        """The workers' seconds in steps, summed (waits for a round left out)."""
        return float(self.stats["step_s"].sum())

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

    def totals(self, restarts: int) -> Counts:
        return _counts(self.stats, restarts)

    def worker_counts(self, i: int) -> Counts:
        """Worker ``i``'s own counts, as :meth:`totals` gives the replica's."""
        return _counts(self.stats[i:i + 1], 0)


def _counts(s: np.ndarray, restarts: int) -> Counts:
    """The counts of the board rows ``s``."""
    return Counts(steps=int(s["applied"].sum()), samples=float(s["samples"].sum()),
                  skipped_nonfinite=int(s["skipped"].sum()), worker_restarts=restarts,
                  step_s=float(s["step_s"].sum()), sync_s=float(s["sync_s"].sum()),
                  sync_steps=float(s["sync_steps"].sum()), pos=float(s["pos"].sum()),
                  lag_wait_s=float(s["lag_wait_s"].sum()), wait_s=float(s["wait_s"].sum()),
                  data_s=float(s["data_s"].sum()), compute_s=float(s["compute_s"].sum()),
                  update_s=float(s["update_s"].sum()), cpu_s=float(s["cpu_s"].sum()),
                  batch_parts=float(s["parts"].sum()))


def _typed(kind: Any, value: Any) -> Any:
    return int(round(float(value))) if kind in (int, "int") else float(value)


def previous_attempt(path: Path) -> Optional[tuple[float, float]]:
    """(base steps, updates applied) of the attempt that last used this board file, read
    before this attempt overwrites it; None when there is none or it is not a board."""
    try:
        if path.is_symlink() or path.parent.is_symlink():  # not a board this run wrote (files.open_nofollow)
            return None
        size = path.stat().st_size
    except OSError:
        return None
    s, c = len(STATS.names), len(CONTROL.names)
    workers, rest = divmod(size // 8 - c, s)
    if size % 8 or rest or workers < 1:
        return None
    data = np.fromfile(path, dtype=np.float64)
    stats, control = data[:workers * s].view(STATS), data[workers * s:].view(CONTROL)[0]
    return float(control["base_steps"]), float(stats["applied"].sum())
