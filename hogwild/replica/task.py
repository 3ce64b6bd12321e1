"""What is learned and how it is scored: the loss, the test metrics, and the baseline a run
must beat, per task (classification, regression, language modelling).

The task is named by ``task=`` or read off the labels (``auto``): floating-point labels are a
regression, a sequence of integer labels per sample (a language model's next tokens) is
language modelling, one integer label is classification. ``loss._target_`` replaces the
task's default loss with any callable ``(output, target) -> scalar tensor``; the metrics stay
the task's own, so a custom loss is still judged by accuracy, R² or perplexity.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import warnings
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hogwild.config.schema import Config
from hogwild.config.targets import call_target, import_target
from hogwild.config.train import LossConfig, TargetConfig
from hogwild.data.splits import Dataset, Split
from hogwild.errors import ConfigError, first_line

logger = logging.getLogger(__name__)

LossFn = Callable[[Tensor, Tensor], Tensor]

# Each task's metrics, and whether higher is better; "loss" (the configured loss) is always there.
METRICS: dict[str, dict[str, bool]] = {
    "classification": {"loss": False, "accuracy": True},
    "regression": {"loss": False, "mse": False, "rmse": False, "r2": True},
    "language_model": {"loss": False, "token_ce": False, "perplexity": False, "accuracy": True},
}
HEADLINE = {"classification": "accuracy", "regression": "r2", "language_model": "perplexity"}


def _as_target(out: Tensor, y: Tensor) -> Tensor:
    """A regression output of shape (B, 1) against labels (B,): the same values, one shape."""
    return out.reshape(y.shape) if out.shape != y.shape and out.numel() == y.numel() else out


def mse_loss(out: Tensor, y: Tensor) -> Tensor:
    return F.mse_loss(_as_target(out, y), y)


def token_cross_entropy(logits: Tensor, y: Tensor) -> Tensor:
    """(B, T, V) logits against (B, T) next tokens: the mean over every token."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


DEFAULT_LOSS: dict[str, LossFn] = {"classification": F.cross_entropy, "regression": mse_loss,
                                   "language_model": token_cross_entropy}


def chance_accuracy(targets: Tensor) -> float:
    """The accuracy of always guessing the most frequent test label."""
    if targets.numel() == 0:
        return math.nan
    return float(torch.bincount(targets.long().reshape(-1)).max()) / targets.numel()


def infer_kind(split: Split) -> str:
    """The task the labels ask for (``task=auto``), read off one sample."""
    _, y = split.batch(torch.tensor([0]))
    if y.is_floating_point():
        return "regression"
    return "language_model" if y.dim() >= 2 else "classification"


def make_loss(cfg: LossConfig, kind: str) -> LossFn:
    """The task's default loss, or ``loss._target_``: a class (``torch.nn.SmoothL1Loss``) is built
    with the keys under ``loss``; a function gets them as keyword arguments on every call."""
    if not cfg._target_:
        return DEFAULT_LOSS[kind]
    path = str(cfg._target_)
    fn = import_target(path, "loss._target_")
    if inspect.isclass(fn):
        obj = call_target(fn, path, "loss", dict(cfg.kwargs), cfg.kwargs)
        if not callable(obj):
            raise ConfigError(f"loss._target_: {path}(...) built a {type(obj).__name__}, which is not callable")
        return obj  # type: ignore[no-any-return]
    if not callable(fn):
        raise ConfigError(f"loss._target_: {path} is a {type(fn).__name__}, not a callable")
    return functools.partial(fn, **cfg.kwargs) if cfg.kwargs else fn  # type: ignore[no-any-return]


@dataclass
class Task:
    kind: str
    loss: LossFn
    num_classes: int = 2
    train_mean: Optional[Tensor] = None
    """Regression: the mean training label, the predictor R² is measured against."""
    unigram: Optional[Tensor] = None
    """Language modelling: the training tokens' frequencies (add-one), the baseline model."""
    baseline: dict[str, float] = field(default_factory=dict)
    """The baseline predictor's test metrics (filled by :func:`build_task`)."""

    @property
    def metrics(self) -> dict[str, bool]:
        return METRICS[self.kind]

    @property
    def headline(self) -> str:
        return HEADLINE[self.kind]

    @property
    def classes(self) -> int:
        """Choices per prediction of a cross-entropy task (its loss starts near ln of it); 2 otherwise."""
        return len(self.unigram) if self.unigram is not None else self.num_classes


def reached(task: Task, target: TargetConfig, scores: dict[str, float]) -> bool:
    """``train.target`` is met by these test scores, in the metric's direction (or the one
    ``train.target.mode`` names)."""
    if not target.is_set:
        return False
    value = scores[target.metric]
    higher = task.metrics[target.metric] if target.mode == "auto" else target.mode == "max"
    return math.isfinite(value) and (value >= target.value if higher else value <= target.value)


def task_kind(cfg: Config, ds: Dataset) -> str:
    return infer_kind(ds.train) if cfg.task == "auto" else cfg.task


def build_task(cfg: Config, ds: Dataset) -> Task:
    """The task with its loss and its baseline's test metrics (the leader's; a worker needs
    only ``make_loss(cfg.loss, task_kind(cfg, ds))``)."""
    kind = task_kind(cfg, ds)
    task = Task(kind, make_loss(cfg.loss, kind), ds.num_classes if kind == "classification" else 2)
    test_y = ds.test.targets
    floats = test_y.is_floating_point()
    if floats != (kind == "regression"):
        given = "float" if floats else "integer"
        raise ConfigError(f"task: {kind} needs {'float' if kind == 'regression' else 'integer'} labels, and the "
                          f"data gives {given} labels (task=auto picks the task from them)")
    if kind == "classification":
        task.baseline = {"accuracy": chance_accuracy(test_y)}
    elif kind == "regression":
        task.train_mean = ds.train.targets.float().mean(0)
        mse = float(((test_y.float() - task.train_mean) ** 2).mean())
        task.baseline = {"mse": mse, "rmse": math.sqrt(mse), "r2": 0.0}
    else:
        counts = torch.bincount(ds.train.targets.reshape(-1), minlength=ds.num_classes).double() + 1.0
        task.unigram = counts / counts.sum()
        ce = float(-task.unigram.log()[test_y.reshape(-1)].mean())
        task.baseline = {"token_ce": ce, "perplexity": math.exp(ce)}
    target = cfg.train.target
    if target.metric is not None and target.metric not in task.metrics:
        raise ConfigError(f"train.target.metric: the {kind} task reports {', '.join(task.metrics)}; "
                          f"not {target.metric!r}")
    return task


@torch.no_grad()
def evaluate(model: nn.Module, split: Split, device: torch.device, task: Task,
             batch_size: int = 2048, on_batch: Callable[[], None] = lambda: None) -> dict[str, float]:
    """The task's metrics of ``model`` on ``split``, in ``eval()`` mode; reads live shared weights."""
    was_training = model.training
    model.eval()
    n = len(split)
    loss_sum, sq_sum, correct, tokens, ce_sum = 0.0, 0.0, 0, 0, 0.0
    try:
        for start in range(0, n, batch_size):
            on_batch()
            idx = torch.arange(start, min(start + batch_size, n))
            inputs, y = split.batch(idx)
            inputs = tuple(t.to(device) for t in inputs)
            y = y.to(device)
            out = model(*inputs)
            loss_sum += float(task.loss(out, y)) * len(idx)
            if task.kind == "classification":
                correct += int((out.argmax(1) == y).sum())
            elif task.kind == "regression":
                sq_sum += float(((_as_target(out, y).float() - y) ** 2).sum())
                tokens += y.numel()
            else:
                flat = out.reshape(-1, out.shape[-1])
                ce_sum += float(F.cross_entropy(flat.float(), y.reshape(-1), reduction="sum"))
                correct += int((flat.argmax(1) == y.reshape(-1)).sum())
                tokens += y.numel()
    finally:
        model.train(was_training)
    scores = {"loss": loss_sum / n}
    if task.kind == "classification":
        scores["accuracy"] = correct / n
    elif task.kind == "regression":
        mse = sq_sum / max(tokens, 1)
        base = task.baseline.get("mse", math.nan)
        scores.update(mse=mse, rmse=math.sqrt(mse), r2=1.0 - mse / base if base > 0 else math.nan)
    else:
        ce = ce_sum / max(tokens, 1)
        scores.update(token_ce=ce, perplexity=math.exp(min(ce, 700.0)), accuracy=correct / max(tokens, 1))
    return scores


def preflight(model: nn.Module, ds: Dataset, task: Task, batch_size: int, device: torch.device) -> None:
    """One forward and backward pass on a training batch, in the leader, before any worker
    spawns: a model, data or loss that does not fit fails here in one line, not in every
    worker's traceback. Runs in ``eval()`` mode so BatchNorm's shared statistics stay put."""
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError("model: it has no trainable parameters (every parameter has requires_grad=False)")
    n = min(max(batch_size, 2), len(ds.train))
    inputs, y = ds.train.batch(torch.arange(n))
    inputs, y = tuple(t.to(device) for t in inputs), y.to(device)
    model.eval()
    try:
        try:
            out = model(*inputs)
        except Exception as e:  # noqa: BLE001 - the user's forward failed: say where, in one line
            raise ConfigError(f"model: a forward pass on {n} training samples raised "
                              f"{type(e).__name__}: {first_line(e)}") from None
        if not isinstance(out, Tensor):
            raise ConfigError(f"model: forward must return one tensor, got a {type(out).__name__}")
        # torch warns before it fails (mse_loss on mismatched shapes): held back, so a loss
        # that does not fit is one line, and said once as a warning when it does fit.
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            try:
                loss = task.loss(out, y)
            except Exception as e:  # noqa: BLE001 - output and labels do not fit the loss
                raise ConfigError(f"loss: the {task.kind} loss of output {tuple(out.shape)} and labels "
                                  f"{tuple(y.shape)} raised {type(e).__name__}: {first_line(e)}") from None
        for w in said:
            logger.warning("loss: on output %s and labels %s: %s", tuple(out.shape), tuple(y.shape),
                           first_line(w.message) if isinstance(w.message, Warning) else str(w.message))
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            what = f"shape {tuple(loss.shape)}" if isinstance(loss, Tensor) else type(loss).__name__
            raise ConfigError(f"loss._target_: the loss must return a scalar tensor, got {what}")
        if not loss.requires_grad:
            raise ConfigError("loss._target_: the loss does not depend on the model's output (no gradient)")
        loss.backward()
    finally:
        for p in model.parameters():
            p.grad = None
        model.train()
