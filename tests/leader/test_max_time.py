"""``train.max_time``: a wall-clock budget that stops the job cleanly (final round and checkpoint,
exit 0), and learning-rate schedules that reach their end when it is spent."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hogwild.errors import ConfigError
from hogwild.replica.board import Board
from hogwild.replica.worker import schedule_length
from tests.conftest import compose_cfg, metrics, run_cli


@pytest.mark.parametrize("given,seconds", [("90", 90.0), ("00:01:30", 90.0), ("1:00:00:00", 86400.0), ("2.5", 2.5)])
def test_max_time_takes_seconds_or_hh_mm_ss(given: str, seconds: float, tmp_path: Path) -> None:
    assert compose_cfg([f"train.max_time={given}", f"run_dir={tmp_path}"]).train.max_time == seconds


@pytest.mark.parametrize("given", ["soon", "1:99", "-3", "0", "nan", "1e300"])
def test_a_bad_max_time_is_one_line_naming_the_key(given: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^train.max_time: must be"):
        compose_cfg([f"train.max_time={given}", f"run_dir={tmp_path}"])


def test_the_schedule_ends_with_the_budget_or_the_steps_whichever_comes_first() -> None:
    from hogwild.config.train import SchedConfig
    from hogwild.replica.lr_schedule import LRSchedule

    ctrl = Board(1).control
    ctrl["go_at"] = time.monotonic() - 5.0  # half of a 10 s budget spent, 20 steps made
    assert schedule_length(20, ctrl, 1000, None) == 1000
    assert 39 <= schedule_length(20, ctrl, 1000, 10.0) <= 41  # 20 steps in half the time: 40 in all
    assert schedule_length(20, ctrl, 30, 10.0) == 30  # the planned steps end sooner
    ctrl["go_at"] = time.monotonic() - 50.0
    assert schedule_length(20, ctrl, 1000, 10.0) == 20  # spent: the schedule is at its end
    sched = LRSchedule(SchedConfig(name="cosine", warmup_steps=10), 1.0, 1000)
    assert sched.lr_at(4, 40) == pytest.approx(sched.lr_at(4))  # warm-up counts steps either way
    assert sched.lr_at(40, 40) == pytest.approx(0.0) and sched.lr_at(40) > 0.9
    # A run that ends inside its warm-up is told so, naming the keys; one past it is not.
    said = sched.unfinished_warmup(8, "train.max_time=60s")
    assert said is not None and said.startswith("train.max_time=60s ends the run at optimizer step 8, inside "
                                                "sched.warmup_steps=10, so the learning rate climbs to 0.80")
    assert sched.unfinished_warmup(10, "train.max_time=60s") is None
    assert LRSchedule(SchedConfig(name="cosine"), 1.0, 5).unfinished_warmup(3, "x") is None


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_run_stops_cleanly_when_its_time_is_spent(tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = run_cli(["train.max_steps=100000000", "train.max_time=3", "workers=2", "sched.name=cosine",
                   "sched.warmup_steps=100000000", f"run_dir={run}"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    m = metrics(run)
    assert m["status"] == "ok" and m["max_time_reached"] is True, m
    # Stopped at its budget, not after a hundred million steps; the slack is a loaded machine's.
    assert 3.0 <= m["train_s"] < 30.0, m["train_s"]
    assert (run / "checkpoints" / "last.pt").is_file()
    assert "train.max_time=3s spent" in out.stderr + out.stdout
    # A warm-up the budget never finishes ends the run at its highest rate: said, with the key.
    assert "train.max_time=3s ends the run at optimizer step" in out.stderr + out.stdout
    assert "inside sched.warmup_steps=100000000" in out.stderr + out.stdout


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_planned_steps_shorter_than_the_warm_up_are_told_once_even_under_a_time_budget(tmp_path: Path) -> None:
    # train.max_time may end the run sooner, never later: the planned steps' warning holds either way,
    # said at the start, and not said again if the budget ends the run first.
    out = run_cli(["train.max_steps=6", "train.max_time=600", "workers=1", "sched.name=cosine",
                   "sched.warmup_steps=1000", f"run_dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    said = (out.stderr + out.stdout).count("inside sched.warmup_steps=1000")
    assert said == 1 and "train.max_steps=6 ends the run at optimizer step" in out.stderr + out.stdout, said
