"""A two-input model whose dataset yields dicts: ``forward(x_num, x_cat)``, items
``{"x_num": ..., "x_cat": ..., "label": ...}``. hogwild collates the dicts key by key and calls
``model(x_num=..., x_cat=...)`` with the keys the forward names; ``label`` is the labels key.

    hogwild-train model._target_=examples.tabular.TwoInput data._target_=examples.tabular.clicks
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset


class Fields(Dataset):
    def __init__(self, x_num: Tensor, x_cat: Tensor, label: Tensor) -> None:
        self.x_num, self.x_cat, self.label = x_num, x_cat, label

    def __len__(self) -> int:
        return len(self.label)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {"x_num": self.x_num[i], "x_cat": self.x_cat[i], "label": self.label[i]}


def clicks(samples: int = 4000, categories: int = 50, seed: int = 0) -> tuple[Fields, Fields]:
    """Synthetic rows: 8 numeric features and one categorical; the class is a known function of both."""
    g = torch.Generator().manual_seed(seed)
    x_num = torch.randn(samples, 8, generator=g)
    x_cat = torch.randint(0, categories, (samples,), generator=g)
    effect = torch.randn(categories, generator=g)
    score = x_num[:, :4].sum(1) + 2.0 * effect[x_cat]
    label = (score > 0).long()
    cut = samples * 4 // 5
    return (Fields(x_num[:cut], x_cat[:cut], label[:cut]), Fields(x_num[cut:], x_cat[cut:], label[cut:]))


class TwoInput(nn.Module):
    def __init__(self, categories: int = 50, width: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(categories, 8)
        self.net = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 2))

    def forward(self, x_num: Tensor, x_cat: Tensor) -> Tensor:
        return self.net(torch.cat([x_num, self.emb(x_cat)], dim=1))
