"""The flat shared buffer (fast tier)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hogwild.errors import UserError
from hogwild.replica import shared


def test_parameters_are_views_of_one_buffer() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    values = [p.detach().clone() for p in model.parameters()]
    flat = shared.share_model(model, "cpu")
    assert flat.is_shared() and flat.numel() == shared.numel(model)
    for p, v in zip(model.parameters(), values):
        assert torch.equal(p, v)  # values survive the move
        assert p.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
    flat.add_(1.0)
    assert torch.equal(next(model.parameters()), values[0] + 1.0)


def test_too_little_shm_says_how_much_is_needed(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(shared.shutil, "disk_usage", lambda p: type("U", (), {"free": 1024})())
    with pytest.raises(UserError, match=r"needs 40\.0 MiB .* only 0\.0 MiB is free.*shm-size"):
        shared.check_shm(40 * 2**20, str(tmp_path))


class _Frozen(nn.Module):
    """A frozen parameter, two tied layers and BatchNorm: what user models bring."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight  # tied
        self.scale = nn.Parameter(torch.full((4,), 2.0), requires_grad=False)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.bn(self.a(x))) * self.scale


def test_frozen_tied_and_buffer_values_share_one_flat_buffer() -> None:
    from hogwild.config.schema import OptimConfig
    from hogwild.replica.optim import FlatOptimizer

    model = _Frozen()
    layout = shared.layout
    names = [s.name for s in layout(model)]
    assert names == ["scale", "a.weight", "a.bias", "b.bias", "bn.weight", "bn.bias",
                     "bn.running_mean", "bn.running_var"], "tied weight bound once, buffers after parameters"
    flat = shared.share_model(model, "cpu")
    assert model.b.weight.data_ptr() == model.a.weight.data_ptr()
    before = flat.clone()
    cfg = OptimConfig(name="sgd", lr=0.1, weight_decay=0.1)
    opt = FlatOptimizer(cfg, flat, shared.param_slots(model), {})
    model.train()
    model(torch.randn(8, 4)).sum().backward()
    opt.step([p.grad for p in model.parameters()])
    scale = dict((s.name, s) for s in layout(model))["scale"]
    assert torch.equal(scale.view(flat), scale.view(before)), "a frozen parameter was updated"
    tied = dict((s.name, s) for s in layout(model))["a.weight"]
    assert not torch.equal(tied.view(flat), tied.view(before)), "the tied, trainable weight did not move"
    mean = dict((s.name, s) for s in layout(model))["bn.running_mean"]
    assert not torch.equal(mean.view(flat), mean.view(before)), "the forward pass did not move the shared statistics"
    assert model.bn.num_batches_tracked.item() == 1  # private integer buffer, outside the flat buffer
