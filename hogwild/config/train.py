"""The training recipe's part of the schema: loss, optimizer, learning-rate schedule and the
``train.*`` keys (imported into config/schema.py, where the whole schema is assembled).

Each field's docstring is its documentation; each check raises :class:`ConfigError` naming the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from hogwild.config.registry import OPTIMIZERS, SCHEDULES, TASKS
from hogwild.config.validate import at_most, choice, duration, positive, require

PRECISIONS = ("fp32", "bf16")
COMPILE_MODES = ("off", "auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
COMPILE_BOOLEANS = {"true": "default", "false": "off"}
OPTIM_STATES = ("auto", "worker", "shared")
UPDATES = ("auto", "hogwild", "barrier")
TARGET_MODES = ("auto", "max", "min")


@dataclass
class OptimConfig:
    name: str = "sgd"
    """Update rule applied in place: sgd | adam | adamw | adagrad (ignored when _target_ is set)."""
    _target_: Optional[str] = None
    """Import path of any torch.optim.Optimizer class (torch.optim.AdamW, torch.optim.RMSprop,
    torch.optim.Adafactor), built over views of the shared parameters; its keyword arguments are
    optim.lr, optim.weight_decay and further keys (+optim.alpha=0.9)."""
    update: str = "auto"
    """How gradients reach the shared model. hogwild: each worker steps the weights itself as soon
    as its gradient is ready, lock-free (mnist_hogwild). barrier: the workers' gradients meet in
    shared memory and one optimizer state per replica steps on their mean, as DDP does, waiting for
    a late worker as the pace.* settings say (a later gradient joins the next step). auto: hogwild for
    SGD (optim=sgd, or a _target_ class named SGD) and SparseAdam, barrier for every other optimizer,
    whose adaptive steps a stale gradient costs most (docs/models.md has the figures). auto is
    decided once, when the config is composed: the run's .hydra/config.yaml names the path taken."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """The optimizer _target_'s keyword arguments, gathered from the keys under optim."""
    lr: float = 0.1
    """Learning rate (the peak of the schedule, sched.*)."""
    momentum: float = 0.0
    """SGD momentum (sgd only)."""
    weight_decay: float = 0.0
    """sgd, adam, adagrad: L2 penalty added to the gradient; adamw: decoupled decay of the weights."""
    decay_norm_and_bias: bool = True
    """false: biases and normalisation weights (every parameter of one dimension) get no weight
    decay, as AdamW recipes expect."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """Adam's betas."""
    eps: float = 1e-8
    """Adam/Adagrad epsilon."""
    state: str = "auto"
    """Where momentum/Adam/Adagrad state lives under optim.update=hogwild: worker (private, as
    mnist_hogwild) or shared (one copy every worker updates, as A3C's SharedAdam). auto: worker
    under hogwild; barrier always keeps one shared state per replica (worker is refused there, auto's barrier
    included)."""
    rowwise: bool = False
    """adagrad: one accumulator per row of each embedding table (nn.Embedding, nn.EmbeddingBag
    weights) instead of one per value, as FBGEMM's and TorchRec's row-wise Adagrad: the state of a
    table of dimension D takes 1/D of its size. Every other parameter keeps one per value. Steps
    under optim.update=hogwild (auto picks it)."""
    clip_grad_norm: Optional[float] = None
    """Scale each worker's gradient (its mean over train.accumulate batches) down to this total L2
    norm before it is applied (hogwild) or before it meets the others (barrier)."""

    def __post_init__(self) -> None:
        OPTIMIZERS.check(self.name)
        positive(self.lr, "optim.lr")
        if self.clip_grad_norm is not None:
            positive(self.clip_grad_norm, "optim.clip_grad_norm")
        require(0.0 <= self.momentum < 1.0, "optim.momentum", f"must be in [0, 1), got {self.momentum}")
        positive(self.weight_decay, "optim.weight_decay", allow_zero=True)
        require(len(self.betas) == 2 and all(0.0 <= b < 1.0 for b in self.betas), "optim.betas",
                 f"must be two numbers in [0, 1), got {list(self.betas)}")
        positive(self.eps, "optim.eps")
        choice(self.state, "optim.state", OPTIM_STATES)
        choice(self.update, "optim.update", UPDATES)
        require(not self.rowwise or (self.name == "adagrad" and not self._target_), "optim.rowwise",
                "row-wise state is Adagrad's: set optim=adagrad (without optim._target_), or optim.rowwise=false")
        require(not (self.rowwise and self.update == "barrier"), "optim.rowwise",
                "row-wise Adagrad steps under optim.update=hogwild (or auto), not barrier")
        require(not (self.update == "barrier" and self.state == "worker"), "optim.state",
                "worker cannot combine with optim.update=barrier, which keeps one state per replica in shared "
                "memory; use optim.state=auto, or optim.update=hogwild")


@dataclass
class LossConfig:
    _target_: Optional[str] = None
    """Import path of any callable ``(output, target) -> scalar tensor`` (a function, or a class
    such as torch.nn.SmoothL1Loss that is built first); its keyword arguments are the other keys
    under loss (+loss.beta=0.5). None: the task's own loss (cross-entropy, MSE, token cross-entropy)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """The loss _target_'s keyword arguments, gathered from the keys under loss."""


@dataclass
class StepConfig:
    """How a batch reaches the model and what is learned from what comes back (the step contract,
    docs/step.md). The defaults fit a plain ``model(x) -> logits``, a nanoGPT-style
    ``model(idx, targets) -> (logits, loss)`` and a Hugging Face ``model(**batch) -> ModelOutput``."""

    _target_: Optional[str] = None
    """Import path of a function ``(model, batch) -> loss`` or ``-> (loss, outputs)`` that replaces the
    whole step, as HF Trainer's ``compute_loss`` or Lightning's ``training_step``; ``batch`` is what the
    data yields, collated (a dict, or a tuple ``(inputs..., label)``). Its keyword arguments are the
    other keys under step."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """The step _target_'s keyword arguments, gathered from the keys under step."""
    logits: str = "logits"
    """Where the logits are in the model's output: the field of a mapping or ModelOutput, or a
    position in a tuple (a digit; a tuple's logits are at position 0 unless this is a digit)."""
    loss: str = "loss"
    """Where the model's own loss is in its output: a field, or a tuple position (a digit; by
    default the first scalar tensor after the logits), or ``none`` to ignore it. The model's loss
    is used when it returns one and ``loss._target_`` is unset."""
    labels_arg: str = "auto"
    """The forward's keyword that takes the labels of a tuple item: auto (``targets`` or
    ``labels``, when the forward names one), a name, or ``none``. Dict items pass their labels
    key like any other key the forward takes."""

    def __post_init__(self) -> None:
        require(bool(self.logits.strip()), "step.logits", "must name a field or a position")
        require(bool(self.loss.strip()), "step.loss", "must name a field, a position or none")
        require(bool(self.labels_arg.strip()), "step.labels_arg", "must be auto, none or a keyword name")


def _metric_range(metric: str) -> tuple[float, float]:
    """Where ``metric`` can lie, as the task kinds that report it declare (replica/tasks.py)."""
    for kind in TASKS.names():
        found = TASKS.get(kind).metrics.get(metric)  # type: ignore[attr-defined]
        if found is not None:
            return found.low, found.high
    return -math.inf, math.inf


@dataclass
class TargetConfig:
    metric: Optional[str] = None
    """Stop once the rank-0 evaluation reaches ``value`` on this test metric (any the task
    reports: loss, accuracy, mse, rmse, r2, token_ce, perplexity, logloss, auc)."""
    value: Optional[float] = None
    """The value to reach."""
    mode: str = "auto"
    """max (higher is better) | min | auto (the metric's own direction)."""

    def __post_init__(self) -> None:
        choice(self.mode, "train.target.mode", TARGET_MODES)
        require((self.metric is None) == (self.value is None), "train.target",
                "set both train.target.metric and train.target.value, or neither")
        if self.value is not None:
            require(math.isfinite(self.value), "train.target.value", f"must be a finite number, got {self.value}")
            low, high = _metric_range(str(self.metric))
            require(low <= self.value <= high, "train.target.value",
                    f"{self.metric} can never reach {self.value}: it lies in [{low:g}, {high:g}]")

    @property
    def is_set(self) -> bool:
        return self.metric is not None and self.value is not None


@dataclass
class SchedConfig:
    name: str = "constant"
    """Learning-rate schedule over the replica's steps: constant | cosine (to min_lr at the end of
    the run) | step (times gamma every step_size steps). Ignored when _target_ is set."""
    _target_: Optional[str] = None
    """Import path of any torch.optim.lr_scheduler class (or factory taking the optimizer first),
    e.g. torch.optim.lr_scheduler.OneCycleLR; its keyword arguments are further keys (+sched.max_lr=0.1)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """The scheduler _target_'s keyword arguments, gathered from the keys under sched."""
    warmup_steps: int = 0
    """Linear warm-up from optim.lr / warmup_steps to optim.lr over the replica's first steps (a run
    that ends inside it never decays: the leader warns)."""
    min_lr: float = 0.0
    """cosine: the learning rate at the last step."""
    step_size: int = 1000
    """step: replica steps between decays."""
    gamma: float = 0.1
    """step: the factor of each decay."""

    def __post_init__(self) -> None:
        SCHEDULES.check(self.name)
        positive(self.warmup_steps, "sched.warmup_steps", allow_zero=True)
        positive(self.min_lr, "sched.min_lr", allow_zero=True)
        positive(self.step_size, "sched.step_size")
        positive(self.gamma, "sched.gamma")


@dataclass
class TrainConfig:
    epochs: int = 40
    """Passes of each worker over its own shard (ignored when max_steps is set)."""
    max_steps: Optional[int] = None
    """Total batches per replica, split evenly over its workers; overrides epochs. Under
    optim.update=hogwild each batch is an update (train.accumulate batches one, when set); under
    barrier the workers' batches of one round of arrivals make one optimizer step."""
    max_time: Any = None
    """A wall-clock budget for this attempt's training, in seconds or ``[DD:]HH:MM:SS``: the job
    stops cleanly when it is spent (a final round and checkpoint), or at the end of its steps if
    that comes first. The built-in schedules (sched.name) then end with the budget or the steps,
    whichever comes first; a sched._target_ keeps its own length."""
    batch_size: int = 32
    """Per-worker mini-batch size."""
    accumulate: int = 1
    """Batches whose mean gradient makes one update (Hugging Face's gradient_accumulation_steps):
    a larger batch without more memory. One optimizer step then takes batch_size x accumulate
    samples per worker (x workers under optim.update=barrier)."""
    seed: int = 0
    """Model init seed; worker w of the job is seeded with seed + w."""
    target_accuracy: Optional[float] = None
    """Stop once the rank-0 evaluation reaches this test accuracy (time-to-accuracy runs); the
    same as train.target.metric=accuracy train.target.value=X."""
    target: TargetConfig = field(default_factory=TargetConfig)
    """Stop on any reported test metric (time-to-quality runs)."""
    log_every_s: float = 10.0
    """Progress interval when the console is not a terminal (a terminal gets one live line)."""
    precision: str = "fp32"
    """fp32 | bf16: the workers' forward and loss under bf16 autocast (CPU and CUDA); the shared
    weights, their updates and the sync rounds stay float32."""
    compile: str = "off"
    """off | auto | default | reduce-overhead | max-autotune | max-autotune-no-cudagraphs: each
    worker compiles its model's forward (and so its backward) with torch.compile in that mode; the
    parameters stay the shared ones. A torch whose compiler does not work here is an error, except
    under auto, which then trains uncompiled and says so. true and false, the boolean a Trainer's
    ``torch_compile`` takes, mean default and off."""

    def __post_init__(self) -> None:
        positive(self.epochs, "train.epochs")
        at_most(self.epochs, 2**31, "train.epochs")
        if self.max_time is not None:
            self.max_time = duration(self.max_time, "train.max_time")
        if self.max_steps is not None:
            positive(self.max_steps, "train.max_steps")
            at_most(self.max_steps, 2**62, "train.max_steps", " (step counters are 64-bit)")
        positive(self.batch_size, "train.batch_size")
        at_most(self.batch_size, 2**31 - 1, "train.batch_size")
        require(isinstance(self.accumulate, int) and not isinstance(self.accumulate, bool) and self.accumulate > 0,
                "train.accumulate", f"must be a positive integer, got {self.accumulate!r}")
        at_most(self.accumulate, 2**31 - 1, "train.accumulate")
        positive(self.seed, "train.seed", allow_zero=True)
        # torch.manual_seed takes a signed 64-bit seed; each worker adds its index to it.
        require(self.seed < 2**63 - 2**20, "train.seed", f"must be below 2**63 - 2**20, got {self.seed}")
        positive(self.log_every_s, "train.log_every_s")
        choice(self.precision, "train.precision", PRECISIONS)
        # Hydra reads train.compile=true as a boolean, which the str field holds as 'True'.
        self.compile = COMPILE_BOOLEANS.get(str(self.compile).lower(), self.compile)
        choice(self.compile, "train.compile", COMPILE_MODES)
        if self.target_accuracy is not None:
            require(0.0 < self.target_accuracy <= 1.0, "train.target_accuracy",
                     f"must be in (0, 1], got {self.target_accuracy}")
            require(self.target.metric in (None, "accuracy"), "train.target_accuracy",
                    f"conflicts with train.target.metric={self.target.metric}; set one of them")
            self.target = TargetConfig("accuracy", self.target_accuracy, "max")
