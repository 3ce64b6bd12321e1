"""Models: the built-in registry, or any ``model._target_`` callable returning an nn.Module.
Models take the dataset's input tuple and return logits.

Parameters and float buffers live in the flat shared buffer (replica/shared.py); a model that cannot
(float16 parameters, say) is refused in one line before anything starts.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hogwild.config.registry import MODELS
from hogwild.config.schema import ModelConfig
from hogwild.config.targets import call_target, import_target, schema_kwargs, signature_of
from hogwild.data.datasets import Dataset
from hogwild.errors import ConfigError, first_line
from hogwild.replica.shared import check_dtypes


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


for _name, _build in (("mlp", _mlp), ("convnet", _convnet), ("sparse_linear", _sparse_linear)):
    MODELS.register(_name)(_build)  # model.name; the config check reads the same registry


def model_id(cfg: ModelConfig) -> str:
    """What a checkpoint records as its model: the import path, or the built-in name."""
    return cfg._target_ or cfg.name


def _from_target(cfg: ModelConfig, ds: Dataset) -> nn.Module:
    """Call ``cfg._target_`` with ``cfg.kwargs`` (nested ``_target_`` nodes built first) and the
    schema's fields the user changed (``model.dropout``). Unless given, ``num_classes`` comes from
    the dataset, and the input channels, where the signature names them (``num_classes``,
    ``in_channels``/``in_chans``): a ``**kwargs`` factory is handed nothing it was not asked for
    (a config class would refuse it), so torchvision's builders take ``model.num_classes=10``."""
    target = str(cfg._target_)
    fn = import_target(target, "model._target_")
    kwargs = {**schema_kwargs(cfg, fn, target, "model"), **cfg.kwargs}
    names, open_kw = signature_of(fn)
    fill = {"num_classes": ds.num_classes}
    if len(ds.input_shape) == 3:
        fill.update(in_channels=ds.input_shape[0], in_chans=ds.input_shape[0])
    for key, value in fill.items():
        if key not in kwargs and key in names:
            kwargs[key] = value
    unknown = [k for k in cfg.kwargs if k not in names] if not open_kw else []
    if unknown:
        raise ConfigError(f"model.{unknown[0]}: {target} takes no argument {unknown[0]!r}")
    model = call_target(fn, target, "model", kwargs, {**cfg.kwargs, **kwargs})
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model._target_: {target} returned a {type(model).__name__}, not an nn.Module")
    return model


def build_model(cfg: ModelConfig, ds: Dataset, seed: int) -> nn.Module:
    """Same seed, same initial weights: every replica and the equivalence test agree."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = _from_target(cfg, ds) if cfg._target_ else MODELS.get(cfg.name)(cfg, ds)
        except (RuntimeError, MemoryError) as e:  # a built-in too large to allocate (model.hidden=1e11)
            raise ConfigError(f"model: building {cfg.name} raised {type(e).__name__}: {first_line(e)}") from None
    bad = check_dtypes(model)
    if bad:
        raise ConfigError(f"model: {bad}")
    meta = next((n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta), None)
    if meta is not None:
        raise ConfigError(f"model: {meta} is on the meta device (no values); build the model with real tensors, "
                          "or load its weights before handing it over")
    return model
