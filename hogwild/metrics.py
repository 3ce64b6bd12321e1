"""Metrics sinks: TensorBoard and metrics.json from the rank-0 leader, no-ops elsewhere,
and a progress line that stays one live line on a terminal and is rate-limited otherwise."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

logger = logging.getLogger(__name__)


class Metrics:
    """TensorBoard writer of one rank; the others get the same calls as no-ops."""

    def __init__(self, run_dir: str | Path, enabled: bool) -> None:
        self._tb: Any = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(Path(run_dir) / "tb"))

    def scalar(self, tag: str, value: float, step: int) -> None:
        if self._tb is not None:
            self._tb.add_scalar(tag, value, step)

    def hparams(self, hparams: dict[str, Any], final: dict[str, float]) -> None:
        if self._tb is not None:
            self._tb.add_hparams(hparams, {f"hparam/{k}": v for k, v in final.items()},
                                 run_name="hparams")

    def close(self) -> None:
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def flatten(prefix: str, obj: Any, out: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """``{"optim": {"lr": 0.1}}`` -> ``{"optim.lr": 0.1}`` with TensorBoard-safe values."""
    out = {} if out is None else out
    if isinstance(obj, dict):
        for k, v in obj.items():
            flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(obj, (int, float, str, bool)):
        out[prefix] = obj
    else:
        out[prefix] = str(obj)
    return out


class Progress:
    """One live line on a terminal; a log line every ``every_s`` when output is a file."""

    def __init__(self, every_s: float, enabled: bool = True) -> None:
        self.tty = sys.stderr.isatty()
        self.every_s = 0.5 if self.tty else every_s
        self.enabled = enabled
        self._last = 0.0

    def update(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < self.every_s):
            return
        self._last = now
        if self.tty:
            sys.stderr.write("\r\033[K" + text)
            sys.stderr.flush()
        else:
            logger.info(text)

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()
