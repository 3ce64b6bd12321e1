"""Metrics sinks: TensorBoard and metrics.json from the rank-0 leader, no-ops elsewhere,
and progress: a tqdm bar on a terminal, rate-limited plain log lines otherwise."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

from tqdm import tqdm

from hogwild.files import atomic_write, open_dir

logger = logging.getLogger(__name__)


_thread_hook = threading.excepthook


def _quiet_tensorboard_thread(args: threading.ExceptHookArgs) -> None:
    """TensorBoard writes its event file from a thread of its own, which re-raises a failed
    write (a full disk) and would print its own traceback. The writer keeps the error and raises
    it again in the leader at its next call, where it ends the run in one line with exit code 5;
    so the thread's copy is only logged."""
    if isinstance(args.exc_value, OSError) and type(args.thread).__module__.startswith("tensorboard"):
        logger.debug("tensorboard writer thread: %s", args.exc_value)
        return
    _thread_hook(args)


class Metrics:
    """TensorBoard writer of one rank; the others get the same calls as no-ops."""

    def __init__(self, run_dir: str | Path, enabled: bool) -> None:
        self._tb: Any = None
        self._dir = Path(run_dir) / "tb"
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            # TensorBoard opens its own files; it gets a tb/ that is a real folder of the run.
            os.close(open_dir(run_dir, "tb"))
            threading.excepthook = _quiet_tensorboard_thread
            with self._named():
                self._tb = SummaryWriter(log_dir=str(self._dir))

    @contextlib.contextmanager
    def _named(self) -> Iterator[None]:
        """TensorBoard's failed writes (a full disk) name no file: the one line (exit 5) names tb/."""
        try:
            yield
        except OSError as e:
            if e.filename:
                raise
            raise OSError(e.errno, e.strerror or str(e), str(self._dir)) from None

    def scalar(self, tag: str, value: float, step: int) -> None:
        if self._tb is not None:
            with self._named():
                self._tb.add_scalar(tag, value, step)

    def hparams(self, hparams: dict[str, Any], final: dict[str, float]) -> None:
        if self._tb is not None:
            with self._named():
                self._tb.add_hparams(hparams, {f"hparam/{k}": v for k, v in final.items()},
                                     run_name="hparams")

    def close(self) -> None:
        if self._tb is not None:
            with self._named():
                self._tb.flush()
                self._tb.close()


def strict(obj: Any) -> Any:
    """``obj`` with every non-finite float as None: strict JSON has no NaN or Infinity, and a value
    that does not exist (no target reached, no drift measured) is ``null``."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    return obj


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    text = (json.dumps(strict(data), indent=2, sort_keys=True, allow_nan=False) + "\n").encode()
    atomic_write(Path(path), lambda f: f.write(text))


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


_PLAIN = "{percentage:3.0f}% {n_fmt}/{total_fmt} steps [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


class Progress:
    """A tqdm bar with rate and time left on a terminal; a plain log line every ``every_s``
    seconds when output goes to a file or a pipe."""

    def __init__(self, total: int, every_s: float, enabled: bool = True, initial: int = 0) -> None:
        self.enabled = enabled
        self.total = total
        self.every_s = every_s
        self._t0 = time.monotonic()
        self._initial = initial
        self._last = self._t0  # the first plain line after every_s, not at 0%
        self._bar: Optional[tqdm] = None
        if enabled and sys.stderr.isatty():
            self._bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                             file=sys.stderr, mininterval=0.5, smoothing=0.1)

    def update(self, n: int, postfix: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n - self._bar.n)
            self._bar.set_postfix_str(postfix, refresh=False)
            return
        now = time.monotonic()
        if now - self._last < self.every_s:
            return
        self._last = now
        elapsed = now - self._t0
        logger.info(tqdm.format_meter(n, self.total, elapsed, unit="step", bar_format=_PLAIN,
                                      postfix=postfix, rate=(n - self._initial) / max(elapsed, 1e-9)))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
