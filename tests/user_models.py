"""Model and data factories that go wrong, for the bad-input tests of ``_target_``."""

from __future__ import annotations

import sys

from torch import Tensor, nn


def broken(num_classes: int) -> nn.Module:
    raise RuntimeError("this factory always fails")


def exits(num_classes: int) -> nn.Module:
    sys.exit(0)  # a script's habit: it used to end the run with exit 0 and nothing trained


def not_a_module(num_classes: int) -> int:
    return num_classes


class Doubles(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(64, num_classes).double()

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x.flatten(1).double()).float()


def no_pair() -> list:
    return [1, 2, 3]


def wrong_items() -> tuple[list, list]:
    return [("not a tensor", 0)], [("not a tensor", 0)]


def float_labels() -> tuple[list, list]:
    import torch

    item = (torch.zeros(4), torch.tensor(0.5))
    return [item, item], [item, item]


def per_sample_loss(output: Tensor, target: Tensor) -> Tensor:
    """A loss that forgot its reduction: one value per sample."""
    return nn.functional.cross_entropy(output, target, reduction="none")
