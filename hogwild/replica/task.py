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
from torch import Tensor, nn

from hogwild.config.schema import Config
from hogwild.config.targets import call_target, import_target
from hogwild.config.train import LossConfig, StepConfig, TargetConfig
from hogwild.data.splits import Dataset, Split
from hogwild.errors import ConfigError, first_line, user_call
from hogwild.config.registry import TASKS
from hogwild.replica.step import Inputs, LossFn, Output, Step, to_device
from hogwild.replica.tasks import Metric, Sums, TaskKind, default_loss, kind_of

logger = logging.getLogger(__name__)


# Every kind's loss by name (the scripts' baselines use them); the kinds themselves: tasks.py.
DEFAULT_LOSS: dict[str, LossFn] = {name: default_loss(name) for name in TASKS.names()}


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
        return default_loss(kind)
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
    step_cfg: StepConfig = field(default_factory=StepConfig)
    user_loss: bool = False
    """``loss._target_`` is set: it is used on the logits even when the model returns a loss."""
    _step: Optional[Step] = field(default=None, repr=False)

    def step_for(self, model: nn.Module) -> Step:
        """The step contract for ``model`` (built once: it reads the forward's signature)."""
        if self._step is None:
            self._step = Step(self.step_cfg, self.loss, model, self.user_loss)
        return self._step

    @functools.cached_property
    def of_kind(self) -> TaskKind:
        return kind_of(self.kind)

    @property
    def metrics(self) -> dict[str, Metric]:
        return self.of_kind.metrics

    @property
    def headline(self) -> str:
        return self.of_kind.headline

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
    higher = task.metrics[target.metric].higher if target.mode == "auto" else target.mode == "max"
    return math.isfinite(value) and (value >= target.value if higher else value <= target.value)


def task_kind(cfg: Config, ds: Dataset) -> str:
    return infer_kind(ds.train) if cfg.task == "auto" else cfg.task


def build_task(cfg: Config, ds: Dataset) -> Task:
    """The task with its loss and its baseline's test metrics (the leader's; a worker needs
    only ``make_loss(cfg.loss, task_kind(cfg, ds))``)."""
    kind = task_kind(cfg, ds)
    task = Task(kind, make_loss(cfg.loss, kind), ds.num_classes if kind == "classification" else 2,
                step_cfg=cfg.step, user_loss=bool(cfg.loss._target_))
    task.of_kind.check_labels(ds.test.targets)
    task.baseline = task.of_kind.baseline(ds, task)
    target = cfg.train.target
    if target.metric is not None and target.metric not in task.metrics:
        raise ConfigError(f"train.target.metric: the {kind} task reports {', '.join(task.metrics)}; "
                          f"not {target.metric!r}")
    return task


@torch.no_grad()
def evaluate(model: nn.Module, split: Split, device: torch.device, task: Task,
             batch_size: int = 2048, on_batch: Callable[[], None] = lambda: None,
             max_batches: Optional[int] = None) -> dict[str, float]:
    """The task's metrics of ``model`` on ``split``, in ``eval()`` mode; reads live shared weights.
    The loss is the one training minimises (the model's own, when it returns one). ``max_batches``:
    the first that many batches only (the same subset every time)."""
    step = task.step_for(model)
    was_training = model.training
    model.eval()
    n = len(split) if max_batches is None else min(len(split), max_batches * batch_size)
    loss_sum, sums, kind = 0.0, Sums(), task.of_kind
    where = step.where("model, loss: the forward pass and loss on the test set")
    try:
        for start in range(0, n, batch_size):
            on_batch()
            idx = torch.arange(start, min(start + batch_size, n))
            # The leader's evaluation calls the user's code mid-run too: a failure there is the
            # user's, one line and exit 2, not an unexpected crash (the checkpoints so far stay).
            with user_call("data: reading a test batch"):
                inputs, y = to_device(*split.batch(idx), device)
            with user_call(where):
                loss, out = step.run(model, inputs, y)
            loss_sum += float(loss) * len(idx)
            if out.logits is None or y is None:
                continue
            kind.count(step, out, y, sums)
    finally:
        model.train(was_training)
    return {"loss": loss_sum / n, **kind.scores(sums, task.baseline)}


def preflight(model: nn.Module, ds: Dataset, task: Task, batch_size: int, device: torch.device) -> list[bool]:
    """One forward and backward pass on a training batch, in the leader, before any worker
    spawns: a model, data or loss that does not fit fails here in one line, not in every
    worker's traceback. Runs in ``eval()`` mode so BatchNorm's shared statistics stay put.
    Returns which parameters got a sparse gradient (the optimizer check steps with the same)."""
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError("model: it has no trainable parameters (every parameter has requires_grad=False)")
    step = task.step_for(model)
    n = min(max(batch_size, 2), len(ds.train))
    with user_call(f"data: reading the first {n} training items", errors=False):
        inputs, y = to_device(*ds.train.batch(torch.arange(n)), device)
    model.eval()
    try:
        # torch warns before it fails (mse_loss on mismatched shapes): held back, so a loss
        # that does not fit is one line, and said once as a warning when it does fit.
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            loss, out = _preflight_step(step, model, inputs, y, n, task)
        shape = lambda t: tuple(t.shape) if t is not None else None  # noqa: E731
        for w in said:
            logger.warning("loss: on output %s and labels %s: %s", shape(out.logits), shape(y),
                           first_line(w.message) if isinstance(w.message, Warning) else str(w.message))
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            what = f"shape {tuple(loss.shape)}" if isinstance(loss, Tensor) else type(loss).__name__
            raise ConfigError(f"{_loss_key(task, step, out)}: the loss must be a scalar tensor, got {what}")
        if not loss.requires_grad:
            raise ConfigError(f"{_loss_key(task, step, out)}: the loss does not depend on the model's parameters "
                              "(no gradient)")
        loss.backward()
        _warn_width(task, out)
        return [p.grad is not None and p.grad.is_sparse for p in model.parameters()]
    finally:
        for p in model.parameters():
            p.grad = None
        model.train()


def _loss_key(task: Task, step: Step, out: Output) -> str:
    if step.fn is not None:
        return "step._target_"
    return "loss._target_" if task.user_loss or out.loss is None else "step.loss"


def _preflight_step(step: Step, model: nn.Module, inputs: Inputs, y: Optional[Tensor], n: int, task: Task
                    ) -> tuple[Tensor, Output]:
    where = step.where(f"model: a forward pass on {n} training samples")
    with user_call(where):
        out = step.forward(model, inputs, y)
    try:
        with user_call(f"loss: the {task.kind} loss", errors=False):
            return step.loss_of(out, y), out
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - output and labels do not fit the loss
        shape = tuple(out.logits.shape) if out.logits is not None else None
        labels = tuple(y.shape) if y is not None else None
        raise ConfigError(f"loss: the {task.kind} loss of output {shape} and labels {labels} raised "
                          f"{type(e).__name__}: {first_line(e)}") from None


def _warn_width(task: Task, out: Output) -> None:
    """A classifier whose output width is not the data's class count (a factory that takes
    ``**kwargs`` is not handed ``num_classes``): it trains, but say so once."""
    if task.kind == "classification" and out.logits is not None and out.logits.dim() == 2 \
            and out.logits.shape[1] != task.num_classes:
        logger.warning("model: it outputs %d scores per sample and the data has %d classes; pass "
                       "model.num_classes=%d if the model takes it", out.logits.shape[1], task.num_classes,
                       task.num_classes)
