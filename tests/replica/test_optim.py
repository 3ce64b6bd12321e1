"""The in-place flat update rules equal torch.optim step for step (fast tier)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hogwild.config.schema import OptimConfig
from hogwild.replica.optim import FlatOptimizer, grads_finite
from hogwild.replica.shared import bind, layout, numel


def _pair() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    b = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize("cfg,ref", [
    (OptimConfig(name="sgd", lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    (OptimConfig(name="sgd", lr=0.1, momentum=0.9, weight_decay=0.01),
     lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01)),
    (OptimConfig(name="adam", lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    (OptimConfig(name="adagrad", lr=0.1, eps=1e-10), lambda p: torch.optim.Adagrad(p, lr=0.1, eps=1e-10)),
])
def test_matches_torch_optim(cfg: OptimConfig, ref) -> None:
    ours, theirs = _pair()
    flat = torch.zeros(numel(ours))
    bind(ours, flat, copy_values=True)
    opt = FlatOptimizer(cfg, flat, layout(ours), FlatOptimizer.new_state(cfg, flat.numel(), torch.zeros))
    topt = ref(theirs.parameters())
    for step in range(5):
        x, y = torch.randn(8, 5), torch.randint(0, 3, (8,))
        for m in (ours, theirs):
            m.zero_grad()
            nn.functional.cross_entropy(m(x), y).backward()
        opt.step([p.grad for p in ours.parameters()])
        topt.step()
    for p, q in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_sparse_sgd_touches_only_used_rows() -> None:
    emb = nn.EmbeddingBag(100, 2, mode="sum", sparse=True)
    flat = torch.zeros(numel(emb))
    bind(emb, flat, copy_values=True)
    before = flat.clone()
    out = emb(torch.tensor([[3, 7]]), per_sample_weights=torch.ones(1, 2))
    out.sum().backward()
    FlatOptimizer(OptimConfig(lr=0.5), flat, layout(emb), {}).step([emb.weight.grad])
    changed = (flat != before).view(100, 2).any(1).nonzero().flatten().tolist()
    assert changed == [3, 7]


def test_nonfinite_gradients_are_detected() -> None:
    assert grads_finite([torch.ones(3), None])
    assert not grads_finite([torch.tensor([1.0, float("nan")])])
    assert not grads_finite([torch.tensor([float("inf")])])
