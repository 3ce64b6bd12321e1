"""The step contract: how a batch reaches the model, and the loss and logits that come back.

A batch is ``(inputs, labels)``: ``inputs`` a tuple (tuple items, ``model(*inputs)``) or a dict
(dict items, ``model(**inputs)`` with the keys its forward takes, as Hugging Face's Trainer
drops the columns a model does not name). A tuple item's labels go to the forward too when it
names ``targets`` or ``labels`` (nanoGPT's ``forward(idx, targets=None)``, whose logits are
cut to the last position without them). The model may return a tensor (the logits), a
tuple or list, a mapping or a ``ModelOutput``: its own loss is used when it returns one, else
the task's loss (or ``loss._target_``) on its logits. ``step._target_`` replaces all of it
with a function ``(model, batch) -> loss | (loss, outputs)``. The worker's step, evaluation,
the preflight and the checkpoint probe all go through :class:`Step`, so they agree.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple, Optional, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hogwild.config.targets import import_target, signature_of
from hogwild.config.train import LossConfig, StepConfig
from hogwild.data.items import Inputs
from hogwild.errors import ConfigError

logger = logging.getLogger(__name__)

LossFn = Callable[[Tensor, Tensor], Tensor]
IGNORE_INDEX = -100  # token labels the loss skips (padding, prompts): torch's and Hugging Face's default


class Computed(NamedTuple):
    """What one call of a :class:`StepFn` computed a gradient on."""

    loss: Tensor
    samples: int
    """The samples of the batch (or of its part) the gradient was computed on."""
    left: int
    """The batch's samples still to come in later parts (0: it is done)."""
    whole: int
    """The batch's samples in all."""


class StepFn(Protocol):
    def __call__(self, index: int, share: float = 1.0, summed: bool = False) -> Computed:
        """Computes batch ``index``'s gradients into the parameters' ``.grad``: on the whole batch,
        or (``share`` < 1, pace.balance and pace.chunks) on its next ``share`` of samples, the batch
        computed in parts over as many calls. ``summed``: the gradient of the loss times the samples
        (chunks add up, and the caller divides by all of their samples)."""


@dataclass
class Output:
    """What a forward pass gave: the model's own loss (or the step function's), and its logits."""

    loss: Optional[Tensor]
    logits: Optional[Tensor]


def to_device(inputs: Inputs, y: Optional[Tensor], device: torch.device, non_blocking: bool = False
              ) -> tuple[Inputs, Optional[Tensor]]:
    if device.type == "cpu":
        return inputs, y
    move = lambda t: t.to(device, non_blocking=non_blocking) if isinstance(t, Tensor) else t  # noqa: E731
    moved: Inputs = {k: move(v) for k, v in inputs.items()} if isinstance(inputs, dict) else tuple(map(move, inputs))
    return moved, None if y is None else move(y)


def batch_len(inputs: Inputs, y: Optional[Tensor]) -> int:
    """Samples in a batch: its labels' first dimension, else its first input's."""
    if y is not None:
        return int(y.shape[0])
    first = next(iter(inputs.values())) if isinstance(inputs, dict) else inputs[0]
    return int(first.shape[0])


def batch_slice(inputs: Inputs, y: Optional[Tensor], start: int, end: int) -> tuple[Inputs, Optional[Tensor]]:
    """Samples ``start`` to ``end`` of a batch: every tensor whose first dimension is the batch's is
    cut there (an input of another shape, or not a tensor, passes whole)."""
    size = batch_len(inputs, y)
    cut = lambda t: t[start:end] if isinstance(t, Tensor) and t.dim() > 0 and t.shape[0] == size else t  # noqa: E731
    head: Inputs = {k: cut(v) for k, v in inputs.items()} if isinstance(inputs, dict) else tuple(map(cut, inputs))
    return head, None if y is None else cut(y)


def _position(text: str) -> Optional[int]:
    return int(text) if text.strip().lstrip("-").isdigit() else None


class Step:
    """One batch's loss and outputs under the step contract (see the module)."""

    def __init__(self, cfg: StepConfig, loss_fn: LossFn, model: nn.Module, user_loss: bool = False) -> None:
        self.cfg, self.loss_fn = cfg, loss_fn
        self.use_model_loss = not user_loss and cfg.loss.strip().lower() != "none"
        self.fn: Optional[Callable[..., Any]] = None
        if cfg._target_:
            fn = import_target(str(cfg._target_), "step._target_")
            if not callable(fn):
                raise ConfigError(f"step._target_: {cfg._target_} is a {type(fn).__name__}, not a callable")
            self.fn = fn
        self.names, self.open_kw = signature_of(model.forward)
        arg = cfg.labels_arg.strip()
        if arg == "auto":
            self.labels_arg = next((n for n in ("targets", "labels") if n in self.names), None)
        else:
            self.labels_arg = None if arg.lower() == "none" else arg
        self.shift: Optional[bool] = None
        """Language models: whether logits at t predict the label at t+1 (Hugging Face's causal
        LMs shift inside the model) or at t (pre-shifted targets); read off the model's own loss."""

    # -- calling the model -------------------------------------------------------------------

    def where(self, model_call: str) -> str:
        """The user call a failure names: the ``step._target_`` when set, else ``model_call``."""
        return f"step._target_: {self.cfg._target_}(model, batch)" if self.fn is not None else model_call

    def call(self, model: Callable[..., Any], inputs: Inputs, y: Optional[Tensor]) -> Any:
        if isinstance(inputs, dict):
            kwargs = inputs if self.open_kw else {k: v for k, v in inputs.items() if k in self.names}
            return model(**kwargs)
        if y is not None and self.labels_arg is not None:
            return model(*inputs, **{self.labels_arg: y})
        return model(*inputs)

    def parse(self, out: Any) -> Output:
        """The loss and logits of whatever the forward returned."""
        cfg = self.cfg
        if isinstance(out, Tensor):
            return Output(None, out)
        if isinstance(out, Mapping):  # a dict, or a Hugging Face ModelOutput (an OrderedDict)
            loss = out.get(cfg.loss) if self.use_model_loss else None
            logits = out.get(cfg.logits)
            if logits is None:
                logits = next((v for k, v in out.items() if k != cfg.loss and isinstance(v, Tensor) and v.dim() >= 1),
                              None)
            return Output(loss if isinstance(loss, Tensor) else None, logits if isinstance(logits, Tensor) else None)
        if isinstance(out, (tuple, list)) and out:
            at = _position(cfg.logits)
            logits = out[at if at is not None else 0]
            loss = None
            if self.use_model_loss:
                pos = _position(cfg.loss)
                if pos is not None:
                    loss = out[pos]
                else:
                    first = at if at is not None else 0
                    loss = next((v for v in out[first + 1:] if isinstance(v, Tensor) and v.numel() == 1), None)
            return Output(loss if isinstance(loss, Tensor) else None, logits if isinstance(logits, Tensor) else None)
        raise ConfigError(f"model: forward returned a {type(out).__name__}; return a tensor, a tuple, a dict or a "
                          "ModelOutput, or set step._target_")

    def forward(self, model: Callable[..., Any], inputs: Inputs, y: Optional[Tensor]) -> Output:
        """The model's (or the step function's) loss, if it gives one, and logits."""
        if self.fn is None:
            return self.parse(self.call(model, inputs, y))
        batch: Any = inputs if isinstance(inputs, dict) else (*inputs, y)
        got = self.fn(model, batch, **self.cfg.kwargs)
        loss, outputs = (got[0], got[1]) if isinstance(got, (tuple, list)) and len(got) == 2 else (got, None)
        return Output(loss, self.parse(outputs).logits if outputs is not None else None)

    def loss_of(self, out: Output, y: Optional[Tensor]) -> Tensor:
        """The loss to minimise: the one the forward gave, else the task's on the logits."""
        if out.loss is not None:
            return out.loss
        if out.logits is None:
            raise ConfigError(f"step.logits: the model's output has no {self.cfg.logits!r} and no loss")
        if y is None:
            raise ConfigError("data.labels_key: the batch has no labels and the model returned no loss")
        return self.loss_fn(out.logits, y)

    def run(self, model: Callable[..., Any], inputs: Inputs, y: Optional[Tensor]) -> tuple[Tensor, Output]:
        """The loss to minimise, and the outputs it came from."""
        out = self.forward(model, inputs, y)
        return self.loss_of(out, y), out

    # -- reading the logits against the labels (evaluation) ------------------------------------

    def aligned(self, logits: Tensor, y: Tensor, own_loss: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        """A language model's logits and token labels, position for position: shifted by one when
        the model shifts its labels itself, which the first batch tells by the loss it returned."""
        if self.shift is None:
            self.shift = False
            if own_loss is not None and logits.dim() == 3 and logits.shape[1] > 1:
                flat = lambda lg, t: F.cross_entropy(lg.reshape(-1, lg.shape[-1]).float(), t.reshape(-1),  # noqa: E731
                                                     ignore_index=IGNORE_INDEX)
                plain, shifted = flat(logits, y), flat(logits[:, :-1], y[:, 1:])
                self.shift = bool(abs(float(shifted) - float(own_loss)) < abs(float(plain) - float(own_loss)))
        return (logits[:, :-1], y[:, 1:]) if self.shift else (logits, y)


def make_step(cfg: StepConfig, loss_cfg: LossConfig, loss_fn: LossFn, model: nn.Module) -> Step:
    return Step(cfg, loss_fn, model, user_loss=bool(loss_cfg._target_))
