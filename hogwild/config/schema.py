"""Structured configuration: the dataclass schema behind every Hydra override.

Every field carries its meaning in the docstring below it; every check lives in a
``__post_init__`` and raises :class:`ConfigError` naming the offending key, so a bad
value fails in one line before any process is spawned (design rule 9 in docs/design.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hogwild.config.elastic import ElasticConfig
from hogwild.config.registry import DATASETS, MODELS, TASKS
from hogwild.config.pace import PaceConfig
from hogwild.config.sync import SyncConfig
from hogwild.config.train import LossConfig, OptimConfig, SchedConfig, StepConfig, TrainConfig
from hogwild.config.validate import at_most, choice, positive, require
from hogwild.errors import ConfigError
from hogwild.files import writable_dir

MAX_LOADER_WORKERS = 64
TOKEN_DTYPES = ("uint16", "uint32", "int32", "int64")
STREAM_SPLITS = ("auto", "round_robin", "worker_info")
DEVICES = ("cpu", "cuda")


@dataclass
class ModelConfig:
    name: str = "mlp"
    """Model architecture: mlp | convnet | sparse_linear (ignored when _target_ is set)."""
    _target_: Optional[str] = None
    """Import path of any callable returning an nn.Module (torchvision.models.resnet18,
    mynets.Net); its keyword arguments are the other keys under model (+model.key=value)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """The _target_'s keyword arguments, gathered from the keys under model."""
    hidden: int = 128
    """Hidden width of the mlp."""
    dropout: float = 0.25
    """Dropout of the convnet (the parameter-server tutorial's net)."""

    def __post_init__(self) -> None:
        MODELS.check(self.name)
        positive(self.hidden, "model.hidden")
        require(0.0 <= self.dropout < 1.0, "model.dropout", f"must be in [0, 1), got {self.dropout}")


@dataclass
class DataConfig:
    name: str = "digits"
    """Dataset: digits | mnist | fashion_mnist | cifar10 | npz | sparse_synthetic | image_folder | tokens."""
    _target_: Optional[str] = None
    """Import path of a callable returning (train, test) datasets of (inputs..., label) or dicts:
    map-style, or streams (torch IterableDataset, a Hugging Face datasets stream); a schema field
    set here (data.path=...) is passed to it when its signature takes it."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """The data _target_'s keyword arguments, gathered from the keys under data."""
    root: str = "data"
    """Folder of torchvision datasets (mnist, fashion_mnist, cifar10), or DIR of image_folder."""
    augment: bool = False
    """image_folder: random crop and horizontal flip of training images."""
    loader_workers: int = 0
    """Map-style data: DataLoader processes per worker that read and transform batches ahead."""
    download: bool = False
    """Let torchvision download into ``root``; never done unless asked."""
    path: Optional[str] = None
    """The .npz file of ``data=npz`` (arrays X, y and optionally X_test, y_test); the .bin token
    file(s) of ``data=tokens`` (comma-separated paths or a glob); passed to a data._target_ that takes it."""
    test_fraction: float = 0.2
    """Held-out share where a dataset has no test split of its own (digits, npz, sparse)."""
    split_seed: int = 0
    """Seed of the train/test split; fixed apart from train.seed so sweeps share a test set."""
    image_size: int = 0
    """Resize digits images to this side (e.g. 28 for the convnet); 0 keeps 8x8."""
    channels: int = 1
    """Digits as 1 (gray) or 3 channels (RGB copies, for torchvision models such as resnet18)."""
    num_samples: int = 20000
    """sparse_synthetic: number of samples."""
    num_features: int = 2**18
    """sparse_synthetic: feature space size (the RCV1-like 2^18)."""
    active_features: int = 32
    """sparse_synthetic: non-zeros per sample."""
    num_classes: int = 2
    """sparse_synthetic: classes of the hidden linear model."""
    labels_key: str = "auto"
    """Dict items: the key holding the labels (auto: the first of labels, label, targets,
    target, y that an item has). The key stays in the batch, so a model that takes it (a Hugging
    Face model's ``labels``) computes its own loss."""

    dtype: str = "uint16"
    """tokens: the dtype of the token ids in the .bin files (nanoGPT writes uint16)."""
    block_size: int = 256
    """tokens: tokens per sample (the model's context); the labels are the same block shifted by one."""
    sampling: str = "random"
    """tokens: random (blocks at seeded random offsets, nanoGPT's get_batch) | sequential
    (consecutive non-overlapping blocks, each read once per epoch)."""
    test_samples: int = 4096
    """Streams and token files: the test split holds at most this many samples (the first of a
    test stream, read once into memory; the held-out token blocks)."""
    stream_split: str = "auto"
    """Streams: how the training stream is split among every worker of every replica. auto: a
    Hugging Face datasets stream by split_dataset_by_node, any other by round_robin; round_robin:
    each worker keeps every N-th sample; worker_info: the dataset splits itself by
    torch.utils.data.get_worker_info(), as under a DataLoader (hogwild sets each worker's place)."""

    def __post_init__(self) -> None:
        DATASETS.check(self.name)
        require(0.0 < self.test_fraction < 1.0, "data.test_fraction",
                 f"must be in (0, 1), got {self.test_fraction}")
        positive(self.image_size, "data.image_size", allow_zero=True)
        require(self.channels in (1, 3), "data.channels", f"must be 1 or 3, got {self.channels}")
        positive(self.loader_workers, "data.loader_workers", allow_zero=True)
        # Each is a process with its own semaphores and shared-memory queues, per worker: a
        # thousand of them filled /dev/shm with semaphores before anything said no.
        at_most(self.loader_workers, MAX_LOADER_WORKERS, "data.loader_workers", " DataLoader processes per worker")
        positive(self.num_samples, "data.num_samples")
        positive(self.num_features, "data.num_features")
        positive(self.active_features, "data.active_features")
        require(self.active_features <= self.num_features, "data.active_features",
                 "must not exceed data.num_features")
        require(self.num_classes >= 2, "data.num_classes", f"must be >= 2, got {self.num_classes}")
        if self.name == "npz":
            require(bool(self.path), "data.path", "required for data=npz (a .npz with X and y)")
        choice(self.dtype, "data.dtype", TOKEN_DTYPES)
        positive(self.block_size, "data.block_size")
        choice(self.sampling, "data.sampling", ("random", "sequential"))
        positive(self.test_samples, "data.test_samples")
        choice(self.stream_split, "data.stream_split", STREAM_SPLITS)


@dataclass
class EvalConfig:
    every_s: float = 5.0
    """Evaluate the (live) shared model on the test split this often, in the rank-0 leader, as far
    as eval.max_fraction allows."""
    max_fraction: float = 0.1
    """The most of the leader's training time evaluations may take: after an evaluation of d
    seconds, the next starts no sooner than d / max_fraction seconds after it began. Evaluation
    runs on the leader's core beside the workers; unbounded, a slow one starves them."""
    max_batches: Optional[int] = None
    """Score at most this many test batches (of eval.batch_size samples) during training, a fixed
    subset; the final evaluation always scores the whole test split. None: the whole split every time."""
    batch_size: int = 2048
    """Test samples scored in one forward pass: lower it for a model whose activations for 2048
    samples do not fit, or to make eval.max_batches a smaller subset."""

    def __post_init__(self) -> None:
        positive(self.every_s, "eval.every_s")
        require(0.0 < self.max_fraction <= 1.0, "eval.max_fraction", f"must be in (0, 1], got {self.max_fraction}")
        if self.max_batches is not None:
            positive(self.max_batches, "eval.max_batches")
        positive(self.batch_size, "eval.batch_size")


@dataclass
class CheckpointConfig:
    every_s: float = 30.0
    """Write checkpoints/step_*.pt (and last.pt) this often; bounds the work a crash loses."""
    keep: int = 3
    """How many step checkpoints to keep."""

    def __post_init__(self) -> None:
        positive(self.every_s, "checkpoint.every_s")
        positive(self.keep, "checkpoint.keep")


@dataclass
class FaultConfig:
    max_worker_restarts: int = 3
    """Respawns allowed per replica before the run stops (with a final checkpoint)."""
    max_nonfinite: int = 100
    """Skipped non-finite updates allowed per replica before the run stops."""
    shutdown_timeout_s: float = 20.0
    """How long a stopping leader waits for workers before killing them."""
    startup_timeout_s: float = 300.0
    """How long workers may take to spawn and build their model and shard."""

    def __post_init__(self) -> None:
        positive(self.max_worker_restarts, "fault.max_worker_restarts", allow_zero=True)
        positive(self.max_nonfinite, "fault.max_nonfinite", allow_zero=True)
        positive(self.shutdown_timeout_s, "fault.shutdown_timeout_s")
        positive(self.startup_timeout_s, "fault.startup_timeout_s")


@dataclass
class Config:
    workers: Any = "auto"
    """Hogwild processes per replica; auto = the cores this process may use / local replicas."""
    force: bool = False
    """Skip the shared-memory and memory estimates that refuse a run too big for the machine."""
    device: str = "cpu"
    """cpu, or cuda: the shared model lives on the GPU and workers reach it via CUDA IPC."""
    run_dir: str = "outputs/${hogwild_run_id:}"
    """Output folder; shared by all ranks of one torchrun job (one id per job)."""
    resume: Any = "auto"
    """auto (resume if run_dir has checkpoints) | true (must resume) | false | a checkpoint path."""
    task: str = "auto"
    """classification | regression | language_model | binary | auto (from the labels: float labels
    are a regression, a sequence of integer labels per sample language modelling, one integer
    classification; binary, one logit per sample scored by log-loss and AUC, is never picked by
    auto). Picks the default loss, the test metrics and the baseline of the verdict."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    step: StepConfig = field(default_factory=StepConfig)
    sched: SchedConfig = field(default_factory=SchedConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    pace: PaceConfig = field(default_factory=PaceConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)

    def __post_init__(self) -> None:
        w = self.workers
        if isinstance(w, str) and w != "auto":
            try:
                w = int(w)
            except ValueError:
                raise ConfigError(f"workers: must be a positive integer or 'auto', got {w!r}") from None
        require(w == "auto" or (isinstance(w, int) and not isinstance(w, bool) and w > 0),
                 "workers", f"must be a positive integer or 'auto', got {self.workers!r}")
        self.workers = w
        require(writable_dir(self.run_dir), "run_dir",
                f"cannot create {self.run_dir!r}: no writable folder on its path")
        choice(self.device, "device", DEVICES)
        kinds = ["auto", *TASKS.names()]
        require(self.task in kinds, "task", f"unknown value {self.task!r}; choose one of {', '.join(kinds)}")
        r = self.resume
        require(isinstance(r, (bool, str)), "resume", f"must be auto, true, false or a path, got {r!r}")
        if self.device == "cpu":
            require(self.sync.backend != "nccl", "sync.backend",
                     "nccl needs device=cuda (NCCL runs on GPUs only); use gloo or auto")


def register() -> None:
    """Register the schema so ``conf/config.yaml`` can extend it (Hydra's structured-config way)."""
    # Imported here, not at the top: every spawned worker imports this module for Config, and
    # Hydra (with OmegaConf) costs it about 0.3 s of start-up that only the CLI needs.
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
