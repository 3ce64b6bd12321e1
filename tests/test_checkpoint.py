"""Checkpoint files: atomic names, pruning, last.pt, safe loading (fast tier)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hogwild import checkpoint


def _payload(step: int) -> dict:
    return {"format": checkpoint.FORMAT, "model": "mlp", "shapes": [[2]], "flat": torch.full((2,), float(step))}


def test_keeps_last_n_and_points_last_at_newest(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        checkpoint.save(tmp_path, _payload(step), step, keep=2)
    names = sorted(p.name for p in checkpoint.ckpt_dir(tmp_path).iterdir())
    assert names == ["last.pt", "step_000000030.pt", "step_000000040.pt"]
    assert checkpoint.load(checkpoint.ckpt_dir(tmp_path) / "last.pt")["flat"][0] == 40


def test_refuses_code_in_a_checkpoint(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self):  # noqa: D105 - pickle payload that would run code
            return (print, ("pwned",))

    torch.save({"format": 1, "flat": torch.zeros(1), "x": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(checkpoint.CheckpointError, match="unreadable"):
        checkpoint.load(tmp_path / "evil.pt")
