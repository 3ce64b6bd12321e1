"""metrics.json is strict JSON (fast tier): a value that does not exist (no target reached, no
drift measured) is ``null``, never a bare ``NaN`` that strict readers (``jq``, JavaScript,
Go, ``json.loads(..., parse_constant=...)``) reject."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hogwild.report.metrics import write_json


def _strict(text: str) -> dict:
    def refuse(name: str) -> float:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_missing_values_are_null_and_the_file_is_strict_json(tmp_path: Path) -> None:
    path = tmp_path / "metrics.json"
    write_json(path, {"time_to_target_s": math.nan, "max_drift": math.inf, "nested": {"x": -math.inf},
                      "steps": 60, "test_accuracy": 0.93, "list": [1.0, math.nan]})
    m = _strict(path.read_text())
    assert m == {"time_to_target_s": None, "max_drift": None, "nested": {"x": None}, "steps": 60,
                 "test_accuracy": 0.93, "list": [1.0, None]}


def test_a_real_runs_metrics_are_strict_json(tmp_path: Path) -> None:
    import hogwild

    result = hogwild.train(["workers=1", "train.max_steps=30", "eval.every_s=100", f"run_dir={tmp_path / 'run'}"])
    m = _strict((tmp_path / "run" / "metrics.json").read_text())
    assert m["time_to_target_s"] is None, "no target was set: the time to it does not exist"
    assert m["target_held"] is None, "no target stopped the run: there is nothing to hold"
    assert result.metrics is not None and result.metrics["steps"] == m["steps"] == 30
    # The leader and its worker, each an interpreter with torch loaded: tens of MB at least.
    assert m["peak_memory_mb"] is not None and 20 < m["peak_memory_mb"] < 4096, m["peak_memory_mb"]
    # The evaluations during training, in order, each with its time, step and the task's scores: a
    # loss-against-time curve straight from the file.
    evals = m["evaluations"]
    assert evals and all({"s", "step", "loss", "accuracy"} <= set(e) for e in evals), evals
    assert [e["s"] for e in evals] == sorted(e["s"] for e in evals) and evals[-1]["s"] <= m["train_s"], evals
    assert [e["step"] for e in evals] == sorted(e["step"] for e in evals) and evals[-1]["step"] <= 30, evals
    with pytest.raises(ValueError):
        _strict('{"x": NaN}')  # the reader used here does refuse what the old files held


def test_the_time_breakdown_accounts_for_every_workers_steps(tmp_path: Path) -> None:
    """time_s says where training time went: each part of a worker's steps measured, none counted
    twice, and the leader's evaluation, rounds and chair (docs/outputs.md)."""
    import hogwild

    hogwild.train(["workers=2", "optim=adamw", "train.max_steps=40", "eval.every_s=0.2",
                   f"run_dir={tmp_path / 'run'}"])
    m = _strict((tmp_path / "run" / "metrics.json").read_text())
    t = m["time_s"]
    w = t["workers"]
    assert w["data"] > 0 and w["forward_backward"] > 0 and w["update"] > 0 and w["cpu_in_steps"] > 0, w
    named = w["data"] + w["forward_backward"] + w["update"] + w["barrier_wait"]
    assert named <= w["steps"] * 1.001 + 1e-6, w  # no second spent twice
    assert math.isclose(named + w["other_in_steps"], w["steps"], rel_tol=1e-6), w
    assert math.isclose(w["barrier_wait"], m["barrier_wait_s"], rel_tol=1e-6), (w, m["barrier_wait_s"])
    per = t["per_worker"]
    assert len(per) == 2 and math.isclose(sum(p["steps"] for p in per), w["steps"], rel_tol=1e-6), per
    lead = t["leader"]
    # Two workers under AdamW meet at the barrier, which the leader's chair thread runs.
    assert lead["chair_cpu"] > 0 and lead["evaluation"] > 0, lead
    assert lead["cpu"] >= lead["chair_cpu"], lead
    # One replica has no group to keep: nothing before its rounds (elastic members do; tests/elastic).
    assert 0 <= lead["group"] < 0.25 * t["per_worker"][0]["train"], lead
