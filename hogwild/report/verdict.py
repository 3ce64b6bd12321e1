"""Did the run train? A run that diverged, or whose updates were mostly skipped, must not
end with status ok and exit 0, and must not overwrite a good checkpoint with a bad model
(docs/design.md, rule 18). Pure functions: the leader supplies the numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from hogwild.checkpoint.health import model_trouble
from hogwild.replica.build import Replica
from hogwild.replica.shared import layout
from hogwild.replica.task import Task

# More than this share of update attempts skipped as non-finite: the run did not train.
MAX_SKIPPED_SHARE = 0.5


@dataclass
class Verdict:
    failure: Optional[str]
    """Why training failed (exit 4), or None."""
    summary: str
    """One line on what happened, for metrics.json."""


# The headline metric must beat the baseline's by this margin for the run to count as learned:
# absolute where higher is better (accuracy, R², AUC), relative where lower is (perplexity).
MARGIN = 0.01


def _beats(task: Task, value: float) -> bool:
    base = task.baseline[task.headline]
    if not math.isfinite(value):
        return False
    return value > base + MARGIN if task.metrics[task.headline].higher else value < base * (1.0 - MARGIN)


def judge(rep: Replica, scores: dict[str, float], bar: float, applied: int, skipped: int) -> Verdict:
    """The final model after the last round, its test metrics, this run's updates; the verdict
    compares the task's headline metric with its own baseline (the most frequent label, the
    training mean, the training tokens' frequencies)."""
    task, attempts = rep.task, applied + skipped
    test_loss = scores["loss"]
    failure = model_trouble(rep.flat, layout(rep.model), test_loss if not math.isnan(test_loss) else math.inf, bar)
    if failure is None and attempts > 0 and skipped > MAX_SKIPPED_SHARE * attempts:
        failure = f"{skipped} of {attempts} updates were skipped as non-finite"
    if failure is not None:
        return Verdict(failure, f"training failed: {failure}")
    head = task.headline
    base_name = "chance" if head == "accuracy" else "baseline"
    line = f"{head} {scores[head]:.4f}, {base_name} {task.baseline[head]:.4f}"
    if not _beats(task, scores[head]):
        return Verdict(None, f"no better than the baseline: {line}")
    return Verdict(None, f"learned: {line}")
