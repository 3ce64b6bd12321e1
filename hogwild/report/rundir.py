"""The run directory's record of a run besides its checkpoints: the config copy in ``.hydra/``
and ``metrics.json``. Only the writer touches them, and only once it holds the run_dir lock
(a job refused on a live run_dir must leave it as it was).

A fresh run (``resume=false``, or no checkpoint to resume) in a run_dir that holds an earlier
run's record sets that record aside under a timestamped name instead of overwriting it: its
checkpoints already stay (each run has its own lineage), and so do its config and metrics.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from omegaconf import OmegaConf

from hogwild.files import atomic_write, open_dir

logger = logging.getLogger(__name__)

RECORD = ("metrics.json", ".hydra")


def set_aside_earlier_run(run_dir: Path, names: Sequence[str] = RECORD) -> list[Path]:
    """Rename an earlier run's ``metrics.json`` and ``.hydra/`` (or those of ``names``) to
    ``metrics-<time>.json`` and ``.hydra-<time>/`` (the time it wrote them); the new names."""
    # Only what a run writes: a folder named metrics.json is nobody's record, and stays in the
    # way (the write then fails as it would have, exit 5).
    found = [p for p in (run_dir / name for name in names)
             if (p.is_file() if p.suffix == ".json" else p.is_dir()) and not p.is_symlink()]
    if not found:
        return []
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(max(p.stat().st_mtime for p in found)))
    moved = []
    for path in found:
        stem, dot, suffix = path.name.partition(".json") if path.suffix == ".json" else (path.name, "", "")
        target = run_dir / f"{stem}-{stamp}{dot}{suffix}"
        n = 1
        while target.exists():
            target = run_dir / f"{stem}-{stamp}-{n}{dot}{suffix}"
            n += 1
        path.rename(target)
        moved.append(target)
    logger.info("run_dir holds an earlier run: kept its %s as %s", ", ".join(names),
                ", ".join(p.name for p in moved))
    return moved


def record_config(run_dir: Path, config: dict[str, Any], overrides: Optional[Sequence[str]]) -> None:
    """``.hydra/config.yaml`` (the resolved config) and ``.hydra/overrides.yaml``, as Hydra names them."""
    d = run_dir / ".hydra"
    os.close(open_dir(run_dir, d.name))  # made as needed; a link there is refused, not followed
    text = OmegaConf.to_yaml(OmegaConf.create(config)).encode()
    atomic_write(d / "config.yaml", lambda f: f.write(text), root=run_dir)
    if overrides is not None:
        listed = OmegaConf.to_yaml(OmegaConf.create(list(overrides))).encode()
        atomic_write(d / "overrides.yaml", lambda f: f.write(listed), root=run_dir)
