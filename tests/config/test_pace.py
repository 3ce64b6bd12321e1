"""The pace.* group: every pacing setting with a torch optimizer named by optim._target_ (its keyword
arguments never see them), the old optim.* spellings taken with one warning, and the policies."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from hogwild.config import moved
from hogwild.replica.optim import torch_optimizer
from tests.conftest import compose_cfg, run_cli

TORCH_ADAMW = ["optim=adamw", "optim._target_=torch.optim.AdamW", "optim.lr=0.01"]
SETTINGS = [("min_wait", "0.3", 0.3), ("max_wait", "1.5", 1.5), ("straggler_wait", "0.2", 0.2),
            ("balance", "false", False), ("chunks", "1", 1), ("policy", "backup", "backup"), ("backup", "2", 2)]


@pytest.mark.parametrize("key,text,value", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_a_torch_optimizer_takes_every_pacing_setting(tmp_cwd: Path, key: str, text: str, value: object) -> None:
    cfg = compose_cfg([*TORCH_ADAMW, f"pace.{key}={text}"])
    assert getattr(cfg.pace, key) == value
    assert cfg.optim.kwargs == {}  # nothing of the pace reaches AdamW's keyword arguments
    opt = torch_optimizer(cfg.optim, [torch.nn.Parameter(torch.zeros(3))]).opt
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["lr"] == 0.01


@pytest.mark.parametrize("key", ["min_wait", "max_wait", "straggler_wait", "balance", "chunks"])
def test_an_old_optim_key_is_taken_as_its_pace_key_with_one_warning(tmp_cwd: Path, key: str,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    value = {"balance": "false", "chunks": "2"}.get(key, "0.7")
    moved._warned.clear()
    with caplog.at_level(logging.WARNING, logger="hogwild.config.moved"):
        cfg = compose_cfg([*TORCH_ADAMW, f"optim.{key}={value}"])
        compose_cfg([*TORCH_ADAMW, f"optim.{key}={value}"])
    assert str(getattr(cfg.pace, key)).lower() == value
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"optim.{key} is deprecated: it moved to pace.{key} (the old key is taken until the next release)"]


def test_the_documented_way_to_turn_chunks_off_trains_with_a_torch_optimizer(tmp_cwd: Path) -> None:
    """The report of issue 68: ``optim._target_=torch.optim.AdamW optim.chunks=1`` was refused with
    "torch.optim.AdamW takes no argument 'chunks'". It trains two barrier workers now, with one line
    that names the key's new place (the new spelling composes alike: the tests above)."""
    out = tmp_cwd / "run"
    proc = run_cli([*TORCH_ADAMW, "workers=2", "train.max_steps=12", "optim.chunks=1", "pace.policy=backup",
                    "eval.every_s=1000", "checkpoint.every_s=1000", f"run_dir={out}"], cwd=tmp_cwd)
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["update"] == "barrier" and metrics["optimizer_steps"] > 0
    assert metrics["wait_bound"] == 0.0  # pace.policy=backup with one backup of two: nobody waited for
    assert "optim.chunks is deprecated: it moved to pace.chunks" in proc.stderr
