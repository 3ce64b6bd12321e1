"""Is the model worth a checkpoint? A diverged model must never overwrite a good file
(docs/design.md, rule 18). Pure functions: the writer supplies the numbers; report/verdict.py
reuses them for the run's verdict.
"""

from __future__ import annotations

import math
from typing import Optional

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
        return None  # no update measured yet: nothing to judge
    if not math.isfinite(loss) or loss > bar:
        return f"the loss diverged ({loss:.4g}, above {bar:.4g})"
    return None
