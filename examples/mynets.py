"""A user's own model for ``hogwild-train model._target_=mynets.Net`` (run from this folder).

BatchNorm's running statistics live in the shared buffer with the parameters: the workers'
forward passes update them in place and sync rounds average them across machines.
"""

from __future__ import annotations

from torch import Tensor, nn


class Net(nn.Module):
    def __init__(self, num_classes: int, in_channels: int = 1, width: int = 16, dropout: float = 0.1) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Dropout(dropout))
        self.head = nn.Linear(width * 16, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))

