"""The flat shared buffer (fast tier)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hogwild import shared
from hogwild.errors import UserError


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
