"""pytorch/examples' mnist_hogwild ``Net`` as it is: it returns ``log_softmax``, so its loss is
``nll_loss``, named on the command line (offline: on the bundled digits, upsampled to 28x28):

    hogwild-train model._target_=examples.mnist_hogwild.Net loss._target_=torch.nn.functional.nll_loss \\
        data.image_size=28 optim.lr=0.01 optim.momentum=0.5 train.epochs=5
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)
