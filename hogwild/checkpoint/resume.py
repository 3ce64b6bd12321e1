"""What a checkpoint holds, which checkpoint a run resumes from, and how it is restored.

:class:`~hogwild.replica.board.Counts` are the job-wide totals a checkpoint carries across restarts. A resumed
run starts from them and adds what its own workers do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from hogwild.checkpoint import store as checkpoint
from hogwild.config.schema import Config
from hogwild.errors import ConfigError
from hogwild.replica.board import Board, Counts
from hogwild.replica.build import Replica
from hogwild.replica.models import model_id
from hogwild.sync.comm import Comm
from hogwild.sync.group import agree_on_path
from hogwild.sync.rules import SyncRule

logger = logging.getLogger(__name__)


@dataclass
class Restored:
    path: str
    counters: Counts
    lineage: str
    """The run lineage this run continues: its checkpoints carry the same id."""
    positions: Optional[Tensor] = None
    """Every replica's data positions in the checkpoint (replicas x workers); None if its layout
    differs (each shard then starts over)."""
    steps_lost: Optional[int] = None
    """Steps the previous attempt in this run_dir made beyond the checkpoint's count (exact,
    from every replica's board file); None when unknown."""


def resume_path(resume: Any, run_dir: Path, is_rank0: bool, agree: Callable[[str], str]) -> Optional[str]:
    """The checkpoint to start from, the same on every leader; None to start fresh."""
    if isinstance(resume, str) and resume not in ("auto", "true", "false"):
        return resume
    if not (resume is True or resume in ("auto", "true")):
        return None
    found = checkpoint.load_latest(run_dir) if is_rank0 else None
    path = agree(str(found[1]) if found else "")
    if not path and (resume is True or resume == "true"):
        raise ConfigError(f"resume: no checkpoint in {checkpoint.ckpt_dir(run_dir)}")
    return path or None


def restore(path: str, model_name: str, rep: Replica, board: Board, rank: int,
            world: int) -> tuple[Restored, dict[str, Tensor]]:
    """Load ``path`` into the replica (its shared model, optimizer state and stream records) and
    the workers' positions. It takes the replica whole, not its parts, so that no caller can
    restore a run in part.

    Returns what was restored and the sync rule's saved state.
    """
    flat, opt_state, streams = rep.flat, rep.opt_state, rep.streams
    ckpt = checkpoint.load(path)
    checkpoint.check_compatible(ckpt, path, model_name, rep.shapes)
    with torch.no_grad():
        flat.copy_(ckpt["flat"].to(flat.device))
        for name, buf in (opt_state or {}).items():
            saved = ckpt.get("opt_state", {}).get(name)
            if saved is not None and saved.shape != buf.shape:
                # optim.rowwise changed since (one value per row, or per value): a state of the other
                # layout means nothing here.
                logger.warning("checkpoint: its optimizer state %r holds %d values, this run's %d (optim.rowwise "
                               "changed?); the optimizer state starts afresh", name, saved.numel(), buf.numel())
            elif saved is not None:
                buf.copy_(saved.to(buf.device))
    pos = ckpt.get("positions")
    # A copy: the file is memory-mapped, and a tensor kept from it keeps all of it mapped.
    pos = pos.clone() if isinstance(pos, torch.Tensor) else pos
    k = len(board.stats)
    if isinstance(pos, torch.Tensor) and tuple(pos.shape) == (world, k):
        board.set_positions(pos[rank].numpy())
        saved = ckpt.get("streams") or {}
        if streams is not None and saved.get("rank") == rank:
            for w, blob in saved.get("records", {}).items():  # each worker finds its state at its position
                streams.from_checkpoint(int(w), int(pos[rank][int(w)]), blob)
    else:
        pos = None
        logger.warning("checkpoint was made with another replicas x workers layout; "
                       "data positions restart from the beginning of each shard")
    counters = Counts.from_dict(ckpt.get("counters", {}))
    lineage = str(ckpt.get("lineage") or checkpoint.new_lineage())
    restored = Restored(path, counters, lineage, positions=pos)
    board.set_base_steps(counters.steps)
    logger.info("resumed from %s (step %d, %d syncs)", path, counters.steps, counters.syncs)
    return restored, ckpt.get("sync_state", {})


def steps_lost(previous: Optional[tuple[float, float]], path: str, run_dir: Path, ckpt_steps: int,
               comm_sum: Callable[[list[float]], list[float]]) -> Optional[int]:
    """Exactly how many steps the previous attempt in ``run_dir`` made that the checkpoint it
    resumes from does not hold: its base plus every replica's applied updates, minus the
    checkpoint's count. ``comm_sum`` sums a small vector over the leaders (collective)."""
    mine = [1.0, 1.0, previous[1], previous[0]] if previous else [1.0, 0.0, 0.0, 0.0]
    world, known, applied, base_sum = comm_sum(mine)
    here = Path(path).resolve().parent == checkpoint.ckpt_dir(run_dir).resolve()
    if known < world or not here:
        return None  # some replica has no record, or the checkpoint is from another run_dir
    return max(0, round(base_sum / world + applied - ckpt_steps))


def resume(cfg: Config, run_dir: Path, rep: Replica, board: Board, rule: SyncRule, comm: Comm,
           previous: Optional[tuple[float, float]]) -> Optional[Restored]:
    """Restore the checkpoint ``cfg.resume`` names (the same on every leader of ``comm``), if any,
    into the replica, the board and the sync rule; ``previous`` is this rank's last board record."""
    path = resume_path(cfg.resume, run_dir, comm.rank == 0, agree_on_path)
    if path is None:
        return None
    restored, sync_state = restore(path, model_id(cfg.model), rep, board, comm.rank, comm.world_size)
    restored.steps_lost = steps_lost(previous, path, run_dir, restored.counters.steps,
                                     lambda xs: comm.all_reduce(torch.tensor(xs, dtype=torch.float64)).tolist())
    rule.load_state_dict(sync_state)
    return restored
