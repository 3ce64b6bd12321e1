"""The task kinds (``task=``): each one's metrics, headline, default loss, baseline predictor
and scoring, declared together and registered by name (``config/registry.py``), so a new kind
is one class here instead of a branch in every function of task.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
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
    scores: list[Tensor] = field(default_factory=list)
    """Binary: each batch's logits, for the AUC (a rank statistic needs them all)."""
    labels: list[Tensor] = field(default_factory=list)

    def add(self, correct: int = 0, squared: float = 0.0, ce: float = 0.0, counted: int = 0) -> None:
        self.correct += correct
        self.squared += squared
        self.ce += ce
        self.counted += counted

    def ratio(self, value: float) -> float:
        return value / self.counted if self.counted else math.nan


@dataclass(frozen=True)
class Metric:
    """A test metric: its direction, and where it can lie (a target outside that is never met, and
    the run would never stop on it: train.target is refused)."""

    higher: bool
    """Higher is better."""
    low: float = -math.inf
    high: float = math.inf


# Declared once for every kind that reports them.
LOSS, ERROR, SHARE = Metric(higher=False), Metric(higher=False, low=0.0), Metric(higher=True, low=0.0, high=1.0)


class TaskKind:
    name: ClassVar[str]
    metrics: ClassVar[dict[str, Metric]]
    """Each test metric by name; "loss" (the configured loss) is always there."""
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
    metrics = {"loss": LOSS, "accuracy": SHARE}
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
    metrics = {"loss": LOSS, "mse": ERROR, "rmse": ERROR, "r2": Metric(higher=True, high=1.0)}
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
    metrics = {"loss": LOSS, "token_ce": ERROR, "perplexity": Metric(higher=False, low=1.0), "accuracy": SHARE}
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


def _click_logit(out: Tensor, y: Tensor) -> Tensor:
    """One logit per sample, (B,) or (B, 1), in the labels' shape."""
    if out.numel() != y.numel():
        raise ValueError(f"binary needs one logit per sample, got output {tuple(out.shape)} for {len(y)} labels")
    return _as_target(out, y)


def binary_cross_entropy(out: Tensor, y: Tensor) -> Tensor:
    """Log-loss of one logit per sample against 0/1 labels."""
    return F.binary_cross_entropy_with_logits(_click_logit(out, y).float(), y.float())


def auc(scores: Tensor, labels: Tensor) -> float:
    """Area under the ROC curve: the chance that a random positive scores above a random
    negative (Mann-Whitney, ties counted half); NaN when one class is missing."""
    pos = labels.bool()
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = scores.double().argsort()
    sorted_scores = scores.double()[order]
    ranks = torch.empty(len(scores), dtype=torch.float64)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=torch.float64)
    # Tied scores share the mean of their ranks.
    _, inverse, counts = torch.unique_consecutive(sorted_scores, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    mean_rank = ends - (counts.double() - 1) / 2
    ranks[order] = mean_rank[inverse]
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _logloss(p: float, labels: Tensor) -> float:
    """Log-loss of predicting probability ``p`` for every sample."""
    p = min(max(p, 1e-7), 1 - 1e-7)
    y = labels.double()
    return float(-(y * math.log(p) + (1 - y) * math.log(1 - p)).mean())


@TASKS.register("binary")
class Binary(TaskKind):
    """One logit per sample (a click, a match) against 0/1 labels, as recommendation models
    score: log-loss and AUC. Never picked by ``task=auto`` (0/1 labels are also a two-class
    classification): name it, ``task=binary``."""

    name, headline = "binary", "auc"
    metrics = {"loss": LOSS, "logloss": ERROR, "auc": SHARE, "accuracy": SHARE}
    default_loss = staticmethod(binary_cross_entropy)

    def check_labels(self, test_y: Tensor) -> None:
        if test_y.dim() != 1 or not bool(((test_y == 0) | (test_y == 1)).all()):
            raise ConfigError(f"task: binary needs one 0/1 label per sample, and the data gives labels of shape "
                              f"{tuple(test_y.shape)} with values {test_y.unique()[:5].tolist()}")

    def baseline(self, ds: Dataset, task: Any) -> dict[str, float]:
        rate = float(ds.train.targets.double().mean())
        test_y = ds.test.targets
        return {"logloss": _logloss(rate, test_y), "auc": 0.5,
                "accuracy": float(max(test_y.double().mean(), 1 - test_y.double().mean()))}

    def count(self, step: Step, out: Output, y: Tensor, sums: Sums) -> None:
        assert out.logits is not None
        logit = _click_logit(out.logits, y).detach().float()
        sums.scores.append(logit)
        sums.labels.append(y)
        yf = y.float()
        ce = float(F.binary_cross_entropy_with_logits(logit, yf, reduction="sum"))
        sums.add(correct=int(((logit > 0).float() == yf).sum()), ce=ce, counted=len(y))

    def scores(self, sums: Sums, baseline: dict[str, float]) -> dict[str, float]:
        area = auc(torch.cat(sums.scores), torch.cat(sums.labels)) if sums.scores else math.nan
        return {"logloss": sums.ratio(sums.ce), "auc": area, "accuracy": sums.ratio(sums.correct)}


def kind_of(name: str) -> TaskKind:
    kind = TASKS.get(name)
    assert isinstance(kind, type) and issubclass(kind, TaskKind)
    return kind()


def default_loss(name: str) -> LossFn:
    return kind_of(name).default_loss

