"""What a dataset item is to hogwild: ``(inputs..., label)`` or a mapping of named fields (the
Hugging Face convention), where the labels sit, and how items collate into a batch. Shared by the
map-style path (data/mapped.py) and streams (data/streams.py)."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Union

import torch
from torch import Tensor
from torch.utils.data import default_collate

LABEL_KEYS = ("labels", "label", "targets", "target", "y")
Inputs = Union[tuple[Tensor, ...], dict[str, Tensor]]


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
