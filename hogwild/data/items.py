"""What a dataset item is to hogwild: ``(inputs..., label)`` or a mapping of named fields (the
Hugging Face convention), where the labels sit, and how items collate into a batch. Shared by the
map-style path (data/mapped.py) and streams (data/streams.py)."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Union

import torch
from torch import Tensor
from torch.utils.data import default_collate

from hogwild.errors import ConfigError

LABEL_KEYS = ("labels", "label", "targets", "target", "y")
Inputs = Union[tuple[Tensor, ...], dict[str, Tensor]]

# Training runs in float32 (the shared buffer never holds anything else, and bf16 has its range): a
# float64 value past this becomes inf there, and the model NaN a few steps later (exit 4, where the
# data was at fault).
FLOAT32_MAX = float(torch.finfo(torch.float32).max)
# Values read at a time when a large float64 tensor is checked: no full-size copy is ever made.
CHECK_CHUNK = 1 << 20


def beyond_float32(t: Tensor) -> Optional[float]:
    """The first finite value of a float64 tensor that float32 cannot hold, else None (any other
    dtype fits, or is not a float)."""
    if t.dtype != torch.float64 or t.numel() == 0:
        return None
    parts = t.split(max(1, CHECK_CHUNK // max(1, t[0].numel()))) if t.dim() else (t,)
    for part in parts:  # views along the first dimension: one chunk's temporaries at a time
        over = part.abs() > FLOAT32_MAX
        over &= part.isfinite()
        if bool(over.any()):
            return float(part[over][0])
    return None


def check_fits(tensors: Mapping[str, Any], where: str) -> None:
    """Refuse a float64 input or label that training's float32 cannot hold, naming ``where`` and
    which tensor (in a worker this ends the run as the user's data error, exit 2)."""
    for name, t in tensors.items():
        if isinstance(t, Tensor):
            bad = beyond_float32(t)
            if bad is not None:
                raise ConfigError(too_large(where, name, bad))


def too_large(where: str, name: str, value: float) -> str:
    return (f"{where}: {name} holds {value:g}, past float32's largest value ({FLOAT32_MAX:.3g}), in which "
            "training computes; scale or clip those values")


def batch_tensors(inputs: Inputs, y: Optional[Tensor]) -> dict[str, Any]:
    """A batch's tensors by name: ``input 0``, ``input 1``..., a dict's keys, and ``the labels``."""
    named: dict[str, Any] = ({f"{k!r}": v for k, v in inputs.items()} if isinstance(inputs, dict)
                             else {f"input {i}": v for i, v in enumerate(inputs)})
    if y is not None:
        named["the labels"] = y
    return named


def labels_key_of(item: Mapping[str, Any], configured: str) -> Optional[str]:
    """The key of a dict item that holds its labels: ``data.labels_key``, or the first of
    :data:`LABEL_KEYS` the item has (``auto``); None when it has none."""
    if configured != "auto":
        return configured if configured in item else None
    return next((k for k in LABEL_KEYS if k in item), None)


def label_of(item: Any, labels_key: str = "auto") -> Any:
    """An item's label: the last element of a tuple, the labels key of a mapping (None if it has none)."""
    if isinstance(item, Mapping):
        key = labels_key_of(item, labels_key)
        return None if key is None else item[key]
    return item[-1]


def collate(items: list[Any], labels_key: str = "auto") -> tuple[Inputs, Optional[Tensor]]:
    """A batch: ``(inputs tuple, labels)`` of tuple items, ``(dict, labels)`` of dict items (the
    labels also stay in the dict, under their key)."""
    if isinstance(items[0], Mapping):
        batch = {k: torch.as_tensor(v) if not isinstance(v, Tensor) else v for k, v in default_collate(items).items()}
        key = labels_key_of(batch, labels_key)
        if key is None:
            return batch, None
        y = batch[key]
        if not y.is_floating_point():
            batch[key] = y = y.long()
        return batch, y
    *inputs, y = default_collate(items)
    y = torch.as_tensor(y)
    return tuple(inputs), y if y.is_floating_point() else y.long()


def stack_labels(labels: Any) -> Tensor:
    """Labels as one tensor: int64 for class labels and token sequences, float32 for regression."""
    if isinstance(labels, Tensor):
        y = labels
    else:
        y = torch.stack([torch.as_tensor(t) for t in labels]) if len(labels) else torch.zeros(0, dtype=torch.int64)
    return y.float() if y.is_floating_point() else y.long()
