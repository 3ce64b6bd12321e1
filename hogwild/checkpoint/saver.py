"""Rank 0's checkpoint writer: only a good model is written, a failed write is a fault.

A checkpoint is the one thing a crashed or stopped run leaves to resume from, so it must
never be worse than the one before it (docs/design.md, rule 18): a model with non-finite
values or a diverged loss is not written, and the last good file stays.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from torch import Tensor

from hogwild.checkpoint import store as checkpoint
from hogwild.checkpoint.health import diverged, model_trouble, probe_loss, written_nonfinite
from hogwild.errors import EXIT_FAILED, EXIT_WRITE
from hogwild.replica.board import Board, Counts
from hogwild.replica.build import Replica
from hogwild.replica.shared import layout, state_dict_of
from hogwild.replica.step import Inputs, to_device

logger = logging.getLogger(__name__)

# Samples of the training split whose loss judges each checkpoint before it is written: enough
# for a mean (one sample's loss may be large in a good model), one forward pass of a batch.
PROBE_SAMPLES = 64


@dataclass(frozen=True)
class Record:
    """What a checkpoint records of the job, beside the replica it is written from."""

    positions: Tensor
    """Every replica's data positions (replicas x workers)."""
    counters: Counts
    """The lineage's totals, this run's included."""
    sync_state: dict[str, Tensor]
    """The sync rule's own tensors."""
    config: dict[str, Any]


def stream_states(rep: Replica, positions: Tensor, rank: int) -> dict[str, Any]:
    """The writer's own workers' stream states at the positions this checkpoint records (the
    other replicas' are not here: theirs resume by skipping; data/streams.py)."""
    if rep.streams is None:
        return {}
    held: dict[int, Tensor] = {}
    for k, pos in enumerate(positions[rank].tolist()):
        saved = rep.streams.to_checkpoint(k, int(pos)) if pos > 0 else None
        if saved is not None:
            held[k] = saved
    return {"rank": rank, "records": held}


class Saver:
    def __init__(self, run_dir: Path, keep: int, lineage: str, model_name: str,
                 last_good: Optional[str] = None) -> None:
        self.run_dir, self.keep, self.lineage, self.model_name = run_dir, keep, lineage, model_name
        self.last_good = last_good
        self.loss_bar = float("inf")
        """Set once the starting loss is known (checkpoint/health.py: loss_bar)."""
        self._seen: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None
        self._probe: Optional[tuple[Inputs, Optional[Tensor]]] = None

    def gathered(self, positions: torch.Tensor, job: Counts, own: Counts) -> None:
        """Every replica's positions and the job totals, as a collective just saw them, with
        this replica's own totals at that moment."""
        self._seen = (positions.clone(), job.to_tensor(), own.to_tensor())

    @property
    def has_view(self) -> bool:
        """Whether the other replicas' positions are known (gathered, or restored with this one)."""
        return self._seen is not None

    def forget(self) -> None:
        """This replica's state came from a peer: what it restored says nothing of the others now."""
        self._seen = None

    def adopt(self, lineage: str) -> None:
        """Healed from a peer: one lineage for the job, whichever slot writes, so a slot that
        becomes the writer goes on with the sequence of the checkpoints before it instead of
        starting its own at 1; what it gathered before says nothing of the others now."""
        self.lineage = lineage
        self.forget()

    def set_loss_bar(self, bar: float) -> None:
        """The loss past which a model is diverged, once the starting loss is known."""
        self.loss_bar = bar

    def local_view(self, board: Board, rank: int, world: int, own: Counts) -> tuple[torch.Tensor, Counts]:
        """Positions and job totals for a checkpoint written between rounds, without a
        collective: the other replicas as last gathered, this one as it is now. Their steps
        since then are not in this checkpoint, and a resumed run counts them as lost."""
        if self._seen is None:  # nothing gathered yet: only this replica's part is known
            positions = torch.zeros(world, len(board.stats), dtype=torch.float64)
            positions[rank] = torch.from_numpy(board.stats["pos"].copy())
            return positions, own
        positions, job, own_then = self._seen
        positions = positions.clone()
        positions[rank] = torch.from_numpy(board.stats["pos"].copy())
        return positions, Counts.from_tensor(job + own.to_tensor() - own_then)

    def _probe_batch(self, rep: Replica) -> tuple[Inputs, Optional[Tensor]]:
        """The first samples of the training split, on the model's device, kept for every write."""
        if self._probe is None:
            idx = torch.arange(min(PROBE_SAMPLES, len(rep.ds.train)))
            self._probe = to_device(*rep.ds.train.batch(idx), rep.flat.device)
        return self._probe

    def kept(self) -> str:
        return f"kept the last good checkpoint {self.last_good}" if self.last_good else "no good checkpoint to keep"

    def payload(self, rep: Replica, record: Record, rank: int = 0) -> dict[str, Any]:
        """A checkpoint: tensors and plain values only, so it loads with ``weights_only=True``.
        ``state_dict`` (the module's names, views of the same ``flat`` copy, stored once) is the
        part that leaves hogwild: ``torch.load(path, weights_only=True)["state_dict"]`` (design rule 22).
        ``rank``: the writer, whose own workers' stream states it holds.

        ``flat`` and the optimizer state are held as they are when they are on the CPU, never copied:
        ``torch.save`` then writes straight from the shared buffers, and a model of embedding tables
        costs no second copy at its checkpoint (a copy was hundreds of MB at the replica's peak). While
        the workers train, what is written is a racy read of the live buffer (docs/outputs.md,
        "What a checkpoint holds"); a buffer on the GPU is copied to the CPU once."""
        cpu = rep.flat.detach().to("cpu")
        return {
            "format": checkpoint.FORMAT,
            "lineage": self.lineage,
            "written_at": time.time(),
            "model": self.model_name,
            "shapes": [list(s) for s in rep.shapes],
            "flat": cpu,
            "state_dict": state_dict_of(rep.model, cpu),
            "opt_state": {k: v.detach().to("cpu") for k, v in (rep.opt_state or {}).items()},
            "positions": record.positions,
            "counters": record.counters.lineage(),
            "sync_state": record.sync_state,
            "config": record.config,
            "streams": stream_states(rep, record.positions, rank),
        }

    def write(self, rep: Replica, record: Record, *, loss: float, stopped: bool = False, rank: int = 0
              ) -> Optional[tuple[str, int]]:
        """Write a checkpoint of ``rep`` if it is good. Returns (why not, exit code) when the
        run must stop: the model went bad, or the disk refused the file twice. ``stopped``: the
        workers have stopped (the buffer is still, and judged once).

        The live buffer is judged and written without a copy. While the workers write on, what the
        file took is judged again, read back from the file a chunk at a time, before it replaces
        anything."""
        flat, slots = rep.flat.detach(), layout(rep.model)
        bad = model_trouble(flat, slots, loss, self.loss_bar)
        if bad is None:  # finite: the probe batch's loss says whether it diverged
            probe = probe_loss(rep.model, flat, *self._probe_batch(rep), rep.task.step_for(rep.model))
            # A NaN here is measured (unlike the workers' average before any update): say it is one.
            bad = "the loss is NaN on a fixed training batch" if math.isnan(probe) else \
                diverged(True, probe, self.loss_bar)
        if bad is not None:
            return f"{bad}: not checkpointed; {self.kept()}", EXIT_FAILED
        data = self.payload(rep, record, rank)

        def written(path: Path) -> Optional[str]:
            if stopped:  # the buffer judged above is what the file holds
                return None
            try:
                where = written_nonfinite(checkpoint.load(path)["flat"], slots)
            except checkpoint.CheckpointError as e:
                return str(e)
            return None if where is None else f"the model went non-finite while it was written ({where})"
        try:
            self.last_good = str(checkpoint.save(self.run_dir, data, self.keep, written=written))
        except checkpoint.CheckpointWriteError as e:
            return str(e), EXIT_WRITE
        except checkpoint.CheckpointRefused as e:
            return f"{e}: not checkpointed; {self.kept()}", EXIT_FAILED
        return None
