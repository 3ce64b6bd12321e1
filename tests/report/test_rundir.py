"""A fresh run in a run_dir that holds an earlier run keeps the earlier run's record: its
metrics.json and config copy are set aside, never overwritten (issue 24, item 14)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import hogwild

QUICK = ["workers=1", "eval.every_s=100"]


@pytest.mark.slow  # three trainings in a row
def test_a_fresh_run_sets_the_earlier_runs_metrics_and_config_aside(tmp_path: Path) -> None:
    run = tmp_path / "run"
    hogwild.train([*QUICK, "train.max_steps=30", f"run_dir={run}"])
    first = json.loads((run / "metrics.json").read_text())
    assert yaml.safe_load((run / ".hydra" / "config.yaml").read_text())["train"]["max_steps"] == 30
    assert "train.max_steps=30" in yaml.safe_load((run / ".hydra" / "overrides.yaml").read_text())

    hogwild.train([*QUICK, "train.max_steps=40", "resume=false", f"run_dir={run}"])
    assert json.loads((run / "metrics.json").read_text())["steps"] == 40
    kept = list(run.glob("metrics-*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text()) == first, "the earlier run's metrics were lost"
    old_cfg = list(run.glob(".hydra-*/config.yaml"))
    assert len(old_cfg) == 1 and yaml.safe_load(old_cfg[0].read_text())["train"]["max_steps"] == 30
    assert yaml.safe_load((run / ".hydra" / "config.yaml").read_text())["train"]["max_steps"] == 40

    # Resuming continues the same run: its record is updated in place, nothing more set aside.
    hogwild.train([*QUICK, "train.max_steps=50", "resume=true", f"run_dir={run}"])
    assert json.loads((run / "metrics.json").read_text())["steps"] == 50
    assert len(list(run.glob("metrics-*.json"))) == 1
