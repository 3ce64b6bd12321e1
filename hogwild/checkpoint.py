"""Atomic checkpoints, pruning, and a loader that falls back past a corrupt newest file.

Writes go to a temporary file that is then renamed, so a crash mid-write never leaves a
half checkpoint under a real name; loads use ``weights_only=True`` so a checkpoint file
cannot run code (design rule 11 in docs/design.md).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any, Optional

import torch

from hogwild.errors import ConfigError

logger = logging.getLogger(__name__)

_STEP_RE = re.compile(r"^step_(\d+)\.pt$")
FORMAT = 1


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used: unreadable, or made for another model."""


def ckpt_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(run_dir: str | Path, payload: dict[str, Any], step: int, keep: int) -> Path:
    d = ckpt_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"step_{step:09d}.pt"
    _atomic_save(payload, path)
    # last.pt is a hard link to the newest file, swapped in atomically too.
    tmp_link = d / "last.pt.tmp"
    tmp_link.unlink(missing_ok=True)
    try:
        os.link(path, tmp_link)
        os.replace(tmp_link, d / "last.pt")
    except OSError:  # filesystems without hard links get a copy
        _atomic_save(payload, d / "last.pt")
    for old in candidates(run_dir)[keep:]:
        old.unlink(missing_ok=True)
    logger.info("checkpoint %s", path)
    return path


def candidates(run_dir: str | Path) -> list[Path]:
    """Step checkpoints, newest first."""
    d = ckpt_dir(run_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _STEP_RE.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def load(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint: no such file {str(path)!r}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - truncated, corrupt or foreign files all land here
        raise CheckpointError(f"checkpoint: {path} is unreadable ({type(e).__name__})") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT or "flat" not in obj:
        raise CheckpointError(f"checkpoint: {path} is not a hogwild checkpoint")
    return obj


def load_latest(run_dir: str | Path) -> Optional[tuple[dict[str, Any], Path]]:
    """The newest readable checkpoint; corrupt newer ones are skipped with a warning."""
    for path in candidates(run_dir):
        try:
            return load(path), path
        except CheckpointError as e:
            logger.warning("%s; falling back to an older checkpoint", e)
    return None


def check_compatible(ckpt: dict[str, Any], path: str | Path, model_name: str,
                     shapes: list[tuple[int, ...]]) -> None:
    theirs = [tuple(s) for s in ckpt.get("shapes", [])]
    if ckpt.get("model") != model_name or theirs != shapes:
        raise CheckpointError(
            f"checkpoint: {path} holds a {ckpt.get('model')!r} model with shapes {theirs}, "
            f"which does not fit model={model_name} with shapes {shapes}")
