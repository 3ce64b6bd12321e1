"""A regression task for ``hogwild-train data._target_=regression.diabetes`` (run from this folder).

scikit-learn's bundled diabetes data (442 patients, 10 features, a disease-progression score):
float labels make the task a regression, trained with MSE and scored by MSE, RMSE and R²
against predicting the training mean. Features and target are standardised with the training
split's statistics, so the model's output is in units of the target's standard deviation.
"""

from __future__ import annotations

import torch
from sklearn.datasets import load_diabetes
from torch import Tensor, nn
from torch.utils.data import TensorDataset


def diabetes(test_every: int = 5) -> tuple[TensorDataset, TensorDataset]:
    d = load_diabetes()
    x, y = torch.tensor(d.data, dtype=torch.float32), torch.tensor(d.target, dtype=torch.float32)
    test = torch.arange(len(y)) % test_every == 0
    mx, sx = x[~test].mean(0), x[~test].std(0)
    my, sy = y[~test].mean(), y[~test].std()
    x, y = (x - mx) / sx, (y - my) / sy
    return TensorDataset(x[~test], y[~test]), TensorDataset(x[test], y[test])


class Regressor(nn.Module):
    """A small MLP with one output; ``num_classes`` is the target's size (1 here). ``batchnorm``
    puts BatchNorm after the hidden layer (the optimizer-state benchmark, scripts/measures/optim_state.py)."""

    def __init__(self, num_classes: int = 1, width: int = 64, batchnorm: bool = False) -> None:
        super().__init__()
        norm = [nn.BatchNorm1d(width)] if batchnorm else []
        self.net = nn.Sequential(nn.Linear(10, width), *norm, nn.ReLU(), nn.Linear(width, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x).squeeze(-1)
