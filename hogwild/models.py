"""Model registry. Models take the dataset's input tuple and return logits.

Models hold parameters only (no buffers): everything a worker updates lives in the flat
shared buffer, so nothing model-specific escapes the sharing.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hogwild.config import ModelConfig
from hogwild.data import Dataset
from hogwild.errors import ConfigError


class MLP(nn.Module):
    def __init__(self, in_features: int, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class ConvNet(nn.Module):
    """The MNIST net of PyTorch's parameter-server tutorial, sized from the input."""

    def __init__(self, channels: int, side: int, num_classes: int, dropout: float) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout2d(dropout)
        self.dropout2 = nn.Dropout(min(0.5, 2 * dropout))
        pooled = (side - 4) // 2
        self.fc1 = nn.Linear(64 * pooled * pooled, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = self.dropout1(x).flatten(1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return self.fc2(x)


class SparseLinear(nn.Module):
    """Softmax (logistic for 2 classes) regression over sparse features.

    ``EmbeddingBag(sparse=True)`` yields a sparse gradient whose rows are the features in
    the batch; ``weight.add_(grad, alpha=-lr)`` then touches only those rows (design rule 7 in docs/design.md).
    """

    def __init__(self, num_features: int, num_classes: int) -> None:
        super().__init__()
        self.weight = nn.EmbeddingBag(num_features, num_classes, mode="sum", sparse=True)
        nn.init.zeros_(self.weight.weight)
        self.bias = nn.Parameter(torch.zeros(num_classes))

    def forward(self, idx: Tensor, val: Tensor) -> Tensor:
        return self.weight(idx, per_sample_weights=val) + self.bias


def _mlp(cfg: ModelConfig, ds: Dataset) -> nn.Module:
    if ds.sparse:
        raise ConfigError("model: mlp needs dense data; use model=sparse_linear for sparse data")
    return MLP(math.prod(ds.input_shape), cfg.hidden, ds.num_classes)


def _convnet(cfg: ModelConfig, ds: Dataset) -> nn.Module:
    shape = ds.input_shape
    if ds.sparse or len(shape) != 3 or shape[1] != shape[2] or shape[1] < 6:
        raise ConfigError(f"model: convnet needs square images of side >= 6, got input shape {shape}")
    return ConvNet(shape[0], shape[1], ds.num_classes, cfg.dropout)


def _sparse_linear(cfg: ModelConfig, ds: Dataset) -> nn.Module:
    if not ds.sparse:
        raise ConfigError("model: sparse_linear needs sparse data (data=sparse_synthetic)")
    return SparseLinear(ds.input_shape[0], ds.num_classes)


MODELS: dict[str, Callable[[ModelConfig, Dataset], nn.Module]] = {
    "mlp": _mlp, "convnet": _convnet, "sparse_linear": _sparse_linear,
}


def build_model(cfg: ModelConfig, ds: Dataset, seed: int) -> nn.Module:
    """Same seed, same initial weights: every replica and the equivalence test agree."""
    if cfg.name not in MODELS:
        raise ConfigError(f"model.name: unknown model {cfg.name!r}; choose one of {', '.join(MODELS)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MODELS[cfg.name](cfg, ds)
    if any(True for _ in model.buffers()):
        raise ConfigError(f"model: {cfg.name} has buffers, which the flat shared buffer cannot hold")
    return model
