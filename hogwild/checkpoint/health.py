"""Is the model worth a checkpoint? A diverged model must never overwrite a good file
(docs/design.md, rule 18). The writer and report/verdict.py (the run's verdict) ask the same
question, of the live buffer: :func:`model_trouble`.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Optional, Sequence

import torch
from torch import Tensor, nn

from hogwild.errors import user_call
from hogwild.replica.shared import Slot, layout, release_pages

logger = logging.getLogger(__name__)

NOWHERE = "outside the model's parameters"

# Slots named in a non-finite model's message: enough to say where, one line still.
WHERE_SHOWN = 3

# Values judged at a time: torch.isfinite on a whole buffer makes temporaries of its size (an abs
# and two masks: 1.6x a 610 MiB table, measured), which was most of the leader's peak at a checkpoint.
FINITE_CHUNK = 1 << 20

# Cross-entropy of a model that has learned nothing is about ln(classes); a loss this many
# times above the larger of that and the starting loss means the updates blew the model up.
DIVERGE_FACTOR = 10.0


def loss_bar(initial_loss: float, num_classes: int) -> float:
    """Training loss above which the model counts as diverged."""
    base = math.log(max(num_classes, 2))
    if math.isfinite(initial_loss):
        base = max(base, initial_loss)
    return DIVERGE_FACTOR * base


def diverged(model_finite: bool, loss: float, bar: float) -> Optional[str]:
    """Why the model is not worth a checkpoint, or None when it is."""
    if not model_finite:
        return "the model holds non-finite values"
    if math.isnan(loss):
        return None  # no update measured yet (a NaN from the model itself shows as non-finite values)
    if math.isinf(loss) or loss > bar:
        return f"the loss diverged ({loss:.4g}, above {bar:.4g})"
    return None


def nonfinite_where(flat: Tensor, slots: Sequence[Slot]) -> str:
    """Which parameters or buffers hold the NaN/Inf values, and how many each: a model that went
    bad in one layer (a BatchNorm variance, an embedding row) reads differently from one that
    blew up everywhere."""
    bad = [(s.name, s.numel - finite_count(s.view(flat).reshape(-1)), s.numel) for s in slots]
    bad = [b for b in bad if b[1]]
    shown = ", ".join(f"{name} {n:,} of {total:,}" for name, n, total in bad[:WHERE_SHOWN])
    more = f" and {len(bad) - WHERE_SHOWN} more" if len(bad) > WHERE_SHOWN else ""
    return f"in {shown}{more}" if bad else NOWHERE


def all_finite(flat: Tensor, release: bool = False) -> bool:
    """No NaN or Inf in ``flat``, judged a bounded chunk at a time (:data:`FINITE_CHUNK`);
    ``release``: each chunk's pages are let go once judged (a memory-mapped file's)."""
    for chunk in flat.split(FINITE_CHUNK):
        finite = bool(torch.isfinite(chunk).all())
        if release:
            release_pages(chunk)
        if not finite:
            return False
    return True


def finite_count(values: Tensor) -> int:
    """How many of ``values`` (one dimension) are finite, a bounded chunk at a time."""
    return sum(int(torch.isfinite(c).sum()) for c in values.split(FINITE_CHUNK))


def nonfinite(flat: Tensor, slots: Sequence[Slot]) -> Optional[str]:
    """Where ``flat`` holds NaN or Inf values (:func:`nonfinite_where`), or None when it is finite.
    The live buffer is read while workers write it: a non-finite value that the second, per-slot
    look no longer finds was not the model's (seen once, in an elastic job under load), and the
    buffer counts as finite."""
    if all_finite(flat):
        return None
    where = nonfinite_where(flat, slots)
    if where != NOWHERE:
        return where
    logger.warning("the model read non-finite while the workers wrote it, and finite on a second look")
    return None


def written_nonfinite(flat: Tensor, slots: Sequence[Slot]) -> Optional[str]:
    """:func:`nonfinite` for a checkpoint's ``flat`` as the file holds it (memory-mapped), judged a
    chunk at a time, each chunk's pages let go once judged: the file is read once and never held."""
    return None if all_finite(flat, release=True) else nonfinite_where(flat, slots)


def model_trouble(flat: Tensor, slots: Sequence[Slot], loss: float, bar: float) -> Optional[str]:
    """:func:`diverged` for a model held in ``flat``, saying where its non-finite values are."""
    where = nonfinite(flat, slots)
    bad = diverged(where is None, loss, bar)
    return bad if bad is None or where is None else f"{bad} ({where})"


def probe_loss(model: nn.Module, flat: Tensor, inputs: Any, labels: Optional[Tensor], step: Any) -> float:
    """The loss of the values in ``flat`` (the shared buffer, or values of its layout)
    on one fixed training batch, in ``eval()`` mode, under the run's step contract (``step``, a
    replica.step.Step); NaN when the values give NaN.

    The workers' loss average lags the model by an update: it holds the loss measured *before*
    the last step, so a step that blew the model up (optim.lr=1e6) still shows the good loss
    until the next one is measured. A checkpoint written in that moment would replace the last
    good file with garbage (with checkpoint.keep=1, the only one). This loss is of the
    very values the file will hold."""
    values = {s.name: s.view(flat) for s in layout(model)}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), user_call("model, loss: the forward pass and loss on a checkpoint's probe batch"):
            value = float(step.run(_Bound(model, values), inputs, labels)[0])
    finally:
        model.train(was_training)
    return value


class _Bound:
    """``model`` called with other values (``torch.func.functional_call``), its attributes its own:
    what a step function that reads ``model.config`` or calls ``model(**batch)`` needs."""

    def __init__(self, model: nn.Module, values: dict[str, Tensor]) -> None:
        self._model, self._values = model, values

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return torch.func.functional_call(self._model, self._values, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)
