"""The task kinds (``task=``): each one's metrics, headline, default loss, baseline predictor
and scoring, declared together and registered by name (``config/registry.py``), so a new kind
is one class here instead of a branch in every function of task.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from hogwild.config.registry import TASKS
from hogwild.data.splits import Dataset
from hogwild.errors import ConfigError
from hogwild.replica.step import IGNORE_INDEX, LossFn, Output, Step


def _as_target(out: Tensor, y: Tensor) -> Tensor:
    """A regression output of shape (B, 1) against labels (B,): the same values, one shape."""
    return out.reshape(y.shape) if out.shape != y.shape and out.numel() == y.numel() else out


def mse_loss(out: Tensor, y: Tensor) -> Tensor:
    return F.mse_loss(_as_target(out, y), y)


def token_cross_entropy(logits: Tensor, y: Tensor) -> Tensor:
    """(B, T, V) logits against (B, T) next tokens: the mean over every token."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def chance_accuracy(targets: Tensor) -> float:
    """The accuracy of always guessing the most frequent test label."""
    if targets.numel() == 0:
        return math.nan
    return float(torch.bincount(targets.long().reshape(-1)).max()) / targets.numel()


@dataclass
class Sums:
    """One evaluation's running totals over its batches."""

    correct: int = 0
    squared: float = 0.0
    ce: float = 0.0
    counted: int = 0
    """Labels scored: samples (classification), values (regression) or tokens (language model)."""

    def add(self, correct: int = 0, squared: float = 0.0, ce: float = 0.0, counted: int = 0) -> None:
        self.correct += correct
        self.squared += squared
        self.ce += ce
        self.counted += counted

    def ratio(self, value: float) -> float:
        return value / self.counted if self.counted else math.nan


class TaskKind:
    name: ClassVar[str]
    metrics: ClassVar[dict[str, bool]]
    """Each test metric, and whether higher is better; "loss" (the configured loss) is always there."""
    headline: ClassVar[str]
    """The metric the verdict and the progress line show."""
    float_labels: ClassVar[bool] = False

    @staticmethod
    def default_loss(out: Tensor, y: Tensor) -> Tensor:
        raise NotImplementedError

    def check_labels(self, test_y: Tensor) -> None:
        floats = test_y.is_floating_point()
        if floats != self.float_labels:
            given = "float" if floats else "integer"
            raise ConfigError(f"task: {self.name} needs {'float' if self.float_labels else 'integer'} labels, and "
                              f"the data gives {given} labels (task=auto picks the task from them)")

    def baseline(self, ds: Dataset, task: Any) -> dict[str, float]:
        """The baseline predictor's test metrics (what it needs of the training set kept on ``task``)."""
        raise NotImplementedError

    def count(self, step: Step, out: Output, y: Tensor, sums: Sums) -> None:
        """Add one batch's counts to ``sums``."""
        raise NotImplementedError

    def scores(self, sums: Sums, baseline: dict[str, float]) -> dict[str, float]:
        """The metrics besides loss, from the totals."""
        raise NotImplementedError


@TASKS.register("classification")
class Classification(TaskKind):
    name, headline = "classification", "accuracy"
    metrics = {"loss": False, "accuracy": True}
    default_loss = staticmethod(F.cross_entropy)

    def baseline(self, ds: Dataset, task: Any) -> dict[str, float]:
        return {"accuracy": chance_accuracy(ds.test.targets)}

    def count(self, step: Step, out: Output, y: Tensor, sums: Sums) -> None:
        assert out.logits is not None
        sums.add(correct=int((out.logits.argmax(-1) == y).sum()), counted=len(y))

    def scores(self, sums: Sums, baseline: dict[str, float]) -> dict[str, float]:
        return {"accuracy": sums.ratio(sums.correct)}


@TASKS.register("regression")
class Regression(TaskKind):
    name, headline = "regression", "r2"
    metrics = {"loss": False, "mse": False, "rmse": False, "r2": True}
    float_labels = True
    default_loss = staticmethod(mse_loss)

    def baseline(self, ds: Dataset, task: Any) -> dict[str, float]:
        task.train_mean = ds.train.targets.float().mean(0)
        mse = float(((ds.test.targets.float() - task.train_mean) ** 2).mean())
        return {"mse": mse, "rmse": math.sqrt(mse), "r2": 0.0}

    def count(self, step: Step, out: Output, y: Tensor, sums: Sums) -> None:
        assert out.logits is not None
        sums.add(squared=float(((_as_target(out.logits, y).float() - y) ** 2).sum()), counted=y.numel())

    def scores(self, sums: Sums, baseline: dict[str, float]) -> dict[str, float]:
        mse = sums.ratio(sums.squared)
        base = baseline.get("mse", math.nan)
        return {"mse": mse, "rmse": math.sqrt(mse), "r2": 1.0 - mse / base if base > 0 else math.nan}


@TASKS.register("language_model")
class LanguageModel(TaskKind):
    name, headline = "language_model", "perplexity"
    metrics = {"loss": False, "token_ce": False, "perplexity": False, "accuracy": True}
    default_loss = staticmethod(token_cross_entropy)

    def check_labels(self, test_y: Tensor) -> None:
        if test_y.dim() < 2:
            raise ConfigError("task: language_model needs a sequence of token labels per sample (N x T), and the "
                              f"data gives one label per sample (shape {tuple(test_y.shape)}); use "
                              "task=classification or auto")
        super().check_labels(test_y)

    def baseline(self, ds: Dataset, task: Any) -> dict[str, float]:
        train_y, test_tokens = ds.train.targets.reshape(-1), ds.test.targets.reshape(-1)
        train_y, test_tokens = train_y[train_y >= 0], test_tokens[test_tokens >= 0]  # not the ignore index
        counts = torch.bincount(train_y, minlength=ds.num_classes).double() + 1.0
        task.unigram = counts / counts.sum()
        ce = float(-task.unigram.log()[test_tokens.clamp(max=len(counts) - 1)].mean())
        return {"token_ce": ce, "perplexity": math.exp(ce)}

    def count(self, step: Step, out: Output, y: Tensor, sums: Sums) -> None:
        assert out.logits is not None
        logits, y = step.aligned(out.logits, y, out.loss if step.use_model_loss else None)
        flat, labels = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
        keep = labels != IGNORE_INDEX
        ce = float(F.cross_entropy(flat.float(), labels, ignore_index=IGNORE_INDEX, reduction="sum"))
        sums.add(correct=int((flat.argmax(1)[keep] == labels[keep]).sum()), ce=ce, counted=int(keep.sum()))

    def scores(self, sums: Sums, baseline: dict[str, float]) -> dict[str, float]:
        ce = sums.ratio(sums.ce)
        return {"token_ce": ce, "perplexity": math.exp(min(ce, 700.0)), "accuracy": sums.ratio(sums.correct)}


def kind_of(name: str) -> TaskKind:
    kind = TASKS.get(name)
    assert isinstance(kind, type) and issubclass(kind, TaskKind)
    return kind()


def default_loss(name: str) -> LossFn:
    return kind_of(name).default_loss

