"""Atomic checkpoints, pruning within one run lineage, and a loader that picks the newest
readable checkpoint of that lineage.

Writes go to a unique temporary file that is then renamed (files.py), so a crash mid-write
never leaves a half checkpoint under a real name; loads use ``weights_only=True`` so a
checkpoint file cannot run code (design rule 11 in docs/design.md). Which file is newest is
read from the counters inside, never from a file name (rule 17).
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from hogwild.errors import EXIT_WRITE, ConfigError, Fault, first_line
from hogwild.files import atomic_link, atomic_write, open_dir

logger = logging.getLogger(__name__)

# step_<steps>-<lineage>-q<seq>.pt; files of older versions lack the sequence (0) or the lineage.
_STEP_RE = re.compile(r"^step_(\d+)(?:-([A-Za-z0-9]+))?(?:-q(\d+))?\.pt$")
FORMAT = 1
WRITE_TRIES = 2  # a failed write is retried once, then it is a fault


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used: unreadable, or made for another model."""


class CheckpointRefused(Exception):
    """A written checkpoint failed the writer's check (``written``): removed, nothing replaced."""


class CheckpointWriteError(Fault):
    """A checkpoint could not be written, twice: the run stops rather than go on unprotected."""

    exit_code = EXIT_WRITE


def ckpt_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def new_lineage() -> str:
    """The id a fresh run gives its checkpoints; a resumed run keeps the one it resumed."""
    return uuid.uuid4().hex[:12]


def step_name(steps: int, lineage: str, seq: int) -> str:
    # The lineage in the name: a resume=false run in the same run_dir never overwrites the
    # files of an earlier run that reached the same step count. The sequence: see save().
    return f"step_{steps:09d}-{lineage}-q{seq:09d}.pt"


def save(run_dir: str | Path, payload: dict[str, Any], keep: int,
         written: Optional[Callable[[Path], Optional[str]]] = None) -> Path:
    """Write ``payload`` (retried once), point ``last.pt`` at it, prune its lineage's older files.
    ``written``: asked of the written file before it replaces anything; a reason it returns
    removes the file and raises :class:`CheckpointRefused`.

    Files are ordered by a write sequence that only grows within a lineage, never by their step
    count: in elastic mode the job's steps are a sum over the current members, which drops when
    a replica is lost for good, and ordering by it made resume pick (and pruning keep) files
    older than the newest. The sequence is one more than the highest of the lineage on disk,
    so a new writer (another slot, another attempt) continues it. Only this lineage's files
    are pruned: a foreign file never pushes a new checkpoint out.
    """
    d = ckpt_dir(run_dir)
    lineage, steps = str(payload["lineage"]), int(payload["counters"]["steps"])
    ours = [(q, p) for _, lin, q, p in _scanned(d) if lin == lineage]
    seq = 1 + max((q for q, _ in ours), default=int(payload.get("seq", 0)))
    payload = {**payload, "seq": seq}
    path = d / step_name(steps, lineage, seq)
    for attempt in range(1, WRITE_TRIES + 1):
        try:
            os.close(open_dir(run_dir, d.name))  # made as needed; a link there is refused, not followed
            atomic_write(path, lambda f: torch.save(payload, f), root=run_dir)
            why = written(path) if written is not None else None
            if why is not None:
                path.unlink(missing_ok=True)
                raise CheckpointRefused(why)
            try:
                atomic_link(path, d / "last.pt", root=run_dir)
            except OSError:  # filesystems without hard links get a copy
                atomic_write(d / "last.pt", lambda f: torch.save(payload, f), root=run_dir)
            break
        except (OSError, RuntimeError) as e:  # torch's zip writer reports a full disk as RuntimeError
            if attempt == WRITE_TRIES:
                raise CheckpointWriteError(f"checkpoint: could not write {path}: {first_line(e)}"
                                           f" ({_free(d)} free there)") from None
            logger.warning("checkpoint: writing %s failed (%s); retrying once", path, first_line(e))
    for _, old in sorted(ours, reverse=True)[max(keep - 1, 0):]:
        if old != path:
            old.unlink(missing_ok=True)
    logger.info("checkpoint %s", path)
    return path


def _free(d: Path) -> str:
    """Free space where a write failed: torch's zip writer hides ENOSPC behind its own message."""
    try:
        return f"{shutil.disk_usage(d if d.exists() else d.parent).free / 2**20:.1f} MiB"
    except OSError:
        return "unknown space"


def _scanned(d: Path) -> list[tuple[int, str, int, Path]]:
    """(steps, lineage, write sequence, path) of every step file, read from the names."""
    if not d.is_dir():
        return []
    return [(int(m.group(1)), m.group(2) or "", int(m.group(3) or 0), p)
            for p in d.iterdir() if (m := _STEP_RE.match(p.name))]


def candidates(run_dir: str | Path) -> list[Path]:
    """Step checkpoints of every lineage, newest first (by name: cheap, not trusted)."""
    return [p for _, _, _, p in sorted(_scanned(ckpt_dir(run_dir)), key=lambda t: (t[2], t[0]), reverse=True)]


def load(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint: no such file {str(path)!r}")
    try:
        # Memory-mapped: choosing the newest reads every candidate, and read whole, keep=3 checkpoints
        # of a 610 MiB table were 1.8 GB in the leader at a resume. Only what is used is read.
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - a file torch cannot map (an older format) is read whole
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - truncated, corrupt or foreign files all land here
            raise CheckpointError(f"checkpoint: {path} is unreadable ({type(e).__name__})") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT or not isinstance(obj.get("flat"), torch.Tensor):
        raise CheckpointError(f"checkpoint: {path} is not a hogwild checkpoint")
    if not _fits(obj):
        raise CheckpointError(f"checkpoint: {path} is damaged "
                              "(its flat tensor, shapes or counters do not fit together)")
    return obj


def _fits(obj: dict[str, Any]) -> bool:
    """The flat tensor, shapes and counters agree: a damaged or hand-made file is refused here,
    in one line, not by a failed copy deep inside restore."""
    try:
        shapes = obj.get("shapes")
        return (isinstance(shapes, list) and obj["flat"].dim() == 1
                and sum(math.prod(int(n) for n in s) for s in shapes) == obj["flat"].numel()
                and isinstance(obj.get("counters", {}), dict) and isinstance(obj.get("config", {}), dict)
                and _typed(obj))
    except (TypeError, ValueError, AttributeError):
        return False


def _typed(obj: dict[str, Any]) -> bool:
    """The fields that resume and export read as numbers, strings and tensors are of those types,
    so a file that is not (``seq: "x"``, a string in its ``state_dict``) is skipped by resume and
    refused by export in one line, never read into a crash."""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))

    counters = obj.get("counters", {})
    state = obj.get("state_dict", {})
    return (number(obj.get("seq", 0)) and number(obj.get("written_at", 0.0))
            and isinstance(obj.get("lineage", ""), str) and isinstance(obj.get("model", ""), str)
            and all(isinstance(k, str) and number(v) for k, v in counters.items())
            and isinstance(state, dict) and all(isinstance(v, torch.Tensor) for v in state.values())
            and isinstance(obj.get("opt_state", {}), dict)
            and all(isinstance(v, torch.Tensor) for v in obj.get("opt_state", {}).values()))


def load_latest(run_dir: str | Path) -> Optional[tuple[dict[str, Any], Path]]:
    """The newest readable checkpoint of the run lineage ``last.pt`` points at, judged by the
    counters recorded inside (not the file name). Without a readable ``last.pt``, the lineage of
    the most recently written readable file. Unreadable files are skipped with a warning."""
    readable: list[tuple[dict[str, Any], Path]] = []
    for path in candidates(run_dir):
        try:
            readable.append((load(path), path))
        except CheckpointError as e:
            logger.warning("%s; falling back to an older checkpoint", e)
    if not readable:
        return None
    last = ckpt_dir(run_dir) / "last.pt"
    lineage: Optional[str] = None
    if last.is_file():
        try:
            lineage = str(load(last).get("lineage", ""))
        except CheckpointError as e:
            logger.warning("%s; choosing the most recently written checkpoint", e)
    if lineage is None or not any(c.get("lineage", "") == lineage for c, _ in readable):
        lineage = str(max(readable, key=lambda cp: float(cp[0].get("written_at", 0.0)))[0].get("lineage", ""))
    ours = [cp for cp in readable if cp[0].get("lineage", "") == lineage]
    return max(ours, key=lambda cp: (_order(cp[0]), float(cp[0].get("written_at", 0.0))))


def _order(ckpt: dict[str, Any]) -> tuple[int, int, int]:
    """Within a lineage: the write sequence first (files of older versions have none: 0)."""
    counters = ckpt.get("counters", {})
    return int(ckpt.get("seq", 0)), int(counters.get("steps", 0)), int(counters.get("syncs", 0))


def check_compatible(ckpt: dict[str, Any], path: str | Path, model_name: str,
                     shapes: list[tuple[int, ...]]) -> None:
    theirs = [tuple(s) for s in ckpt.get("shapes", [])]
    if ckpt.get("model") != model_name or theirs != shapes:
        raise CheckpointError(
            f"checkpoint: {path} holds a {ckpt.get('model')!r} model with shapes {theirs}, "
            f"which does not fit model={model_name} with shapes {shapes}")
