"""What every dataset becomes: a train and a test split with labels, and their shape.

A :class:`Split` holds tensors (the in-memory path, moved to shared memory); mapdata.MapSplit
has the same interface over a map-style dataset read by index.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class Split:
    """Inputs as a tuple (dense: ``(X,)``; sparse: ``(indices, values)``) and int64 labels."""

    inputs: tuple[Tensor, ...]
    targets: Tensor

    def __len__(self) -> int:
        return int(self.targets.shape[0])

    def batch(self, idx: Tensor) -> tuple[tuple[Tensor, ...], Tensor]:
        return tuple(t[idx] for t in self.inputs), self.targets[idx]

    def share_memory_(self) -> "Split":
        for t in (*self.inputs, self.targets):
            t.share_memory_()
        return self


@dataclass
class Dataset:
    train: Split
    test: Split
    num_classes: int
    input_shape: tuple[int, ...]
    """Per-sample shape of a dense input; ``(num_features,)`` for sparse data."""
    sparse: bool = False

    def share_memory_(self) -> "Dataset":
        self.train.share_memory_()
        self.test.share_memory_()
        return self
