"""A user's own dataset for ``hogwild-train data._target_=mydata.digits`` (run from this folder).

Any callable that returns (train, test) map-style datasets whose items are (input, label)
works. Items are read by index inside each worker, so the per-sample augmentation below runs
in the workers, in parallel.
"""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits
from torch import Tensor
from torch.utils.data import Dataset


class Digits(Dataset):
    def __init__(self, images: Tensor, labels: Tensor, noise: float) -> None:
        self.images, self.targets, self.noise = images, labels, noise

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        x = self.images[i]
        if self.noise:
            x = x + self.noise * torch.randn_like(x)
        return x, int(self.targets[i])


def digits(noise: float = 0.1, test_every: int = 5) -> tuple[Dataset, Dataset]:
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 8.0 - 1.0
    y = torch.tensor(d.target)
    test = torch.arange(len(y)) % test_every == 0
    return Digits(x[~test], y[~test], noise), Digits(x[test], y[test], 0.0)
