"""A recommendation workload, offline: a DLRM-style click model and a synthetic click log drawn
from a known model, so quality is measurable (``task=binary``: log-loss and AUC).

Each sample has ``dense`` numeric features and, for each of ``tables`` categorical fields,
``lookups`` row ids into that field's table. Row popularity follows a power law (Zipf, as in
real click logs: a few hot rows, a long cold tail), so a batch touches few rows of a large
table, and two Hogwild workers rarely write the same row.

    hogwild-train +experiment=clicks                     # run from the repository root
    hogwild-train +experiment=clicks data.kwargs.rows=1000000 model.kwargs.rows=1000000
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

# Rank k of a field maps to row (k * STRIDE + offset) % rows: hot rows are spread over the
# table instead of packed at its start (STRIDE is prime, so the map is a permutation).
STRIDE = 1_000_003


class ClickLog(Dataset):
    """Items ``(dense, ids, click)``: float ``(dense,)``, int64 ``(tables, lookups)``, 0 or 1."""

    def __init__(self, dense: Tensor, ids: Tensor, clicks: Tensor, oracle: Tensor) -> None:
        self.dense, self.ids, self.clicks = dense, ids, clicks
        self.oracle = oracle
        """The true model's logit of each sample: the best any model can score (its AUC, log-loss)."""

    def __len__(self) -> int:
        return len(self.clicks)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor, Tensor]:
        return self.dense[i], self.ids[i], self.clicks[i]


def zipf_rows(n: int, rows: int, exponent: float, g: torch.Generator) -> Tensor:
    """``n`` row ranks in ``[0, rows)`` with P(rank k) about proportional to 1/(k+1)^exponent."""
    u = torch.rand(n, generator=g, dtype=torch.float64)
    if abs(exponent - 1.0) < 1e-9:
        k = torch.exp(u * math.log(rows + 1)) - 1
    else:  # the inverse of the continuous power law's distribution function on [1, rows + 1]
        a = 1.0 - exponent
        k = (1 + u * ((rows + 1) ** a - 1)) ** (1 / a) - 1
    return k.long().clamp_(0, rows - 1)


def click_log(samples: int = 40_000, tables: int = 4, rows: int = 100_000, lookups: int = 10, dense: int = 8,
              exponent: float = 1.05, noise: float = 0.05, test_fraction: float = 0.2,
              seed: int = 0) -> tuple[ClickLog, ClickLog]:
    """Train and test splits of one click log. The true model: a bias, a linear term in the dense
    features, each looked-up row's own effect (rows drawn more often have larger effects, so the
    signal sits where the data is) and pairwise products of the fields' mean row vectors;
    ``noise``: the share of labels flipped."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, dense, generator=g)
    ranks = zipf_rows(samples * tables * lookups, rows, exponent, g).view(samples, tables, lookups)
    offsets = torch.randint(0, rows, (tables, 1, 1), generator=g)
    ids = (ranks.permute(1, 0, 2) * STRIDE + offsets).remainder(rows).permute(1, 0, 2).contiguous()
    w = torch.randn(dense, generator=g) / math.sqrt(dense)
    logit = torch.full((samples,), -1.0) + x @ w
    vectors = []
    for t in range(tables):
        rank_of = torch.empty(rows, dtype=torch.long)
        rank_of[(torch.arange(rows) * STRIDE + offsets[t, 0, 0]).remainder(rows)] = torch.arange(rows)
        scale = (1.0 / (rank_of.double() + 1) ** 0.25).float()  # hot rows matter more
        effect = torch.randn(rows, generator=g) * scale
        logit += effect[ids[:, t]].mean(1) * 2.0
        vectors.append((torch.randn(rows, 4, generator=g) * scale[:, None])[ids[:, t]].mean(1))
    for t in range(tables):
        for s in range(t + 1, tables):
            logit += (vectors[t] * vectors[s]).sum(1)
    clicks = torch.bernoulli(torch.sigmoid(logit), generator=g).long()
    flip = torch.rand(samples, generator=g) < noise
    clicks[flip] = 1 - clicks[flip]
    cut = samples - max(1, int(samples * test_fraction))
    return (ClickLog(x[:cut], ids[:cut], clicks[:cut], logit[:cut]),
            ClickLog(x[cut:], ids[cut:], clicks[cut:], logit[cut:]))


class DLRM(nn.Module):
    """DLRM's shape (Naumov et al. 2019): dense features through a bottom MLP, each field's rows
    through a sparse ``EmbeddingBag`` (mean of its lookups), the pairwise dot products of all of
    them, and a top MLP to one click logit. The tables' gradients are sparse: an update writes
    only the rows its batch looked up."""

    def __init__(self, dense: int = 8, tables: int = 4, rows: int = 100_000, dim: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(dense, hidden), nn.ReLU(), nn.Linear(hidden, dim), nn.ReLU())
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="mean", sparse=True) for _ in range(tables))
        for table in self.tables:
            nn.init.uniform_(table.weight, -1 / math.sqrt(dim), 1 / math.sqrt(dim))
        fields = tables + 1
        self.pairs = torch.triu_indices(fields, fields, 1)  # not a buffer: no state to share or save
        self.top = nn.Sequential(nn.Linear(dim + fields * (fields - 1) // 2, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, dense: Tensor, ids: Tensor) -> Tensor:
        x = self.bottom(dense)
        z = torch.stack([x, *(table(ids[:, t]) for t, table in enumerate(self.tables))], 1)
        dots = z @ z.transpose(1, 2)
        return self.top(torch.cat([x, dots[:, self.pairs[0], self.pairs[1]]], 1)).squeeze(1)
