"""``train.max_time``: a wall-clock budget that stops the job cleanly (final round and checkpoint,
exit 0), and learning-rate schedules that reach their end when it is spent."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from hogwild.errors import ConfigError
from hogwild.replica.board import Board
from hogwild.replica.worker import schedule_position
from tests.conftest import compose_cfg, metrics, run_cli


@pytest.mark.parametrize("given,seconds", [("90", 90.0), ("00:01:30", 90.0), ("1:00:00:00", 86400.0), ("2.5", 2.5)])
def test_max_time_takes_seconds_or_hh_mm_ss(given: str, seconds: float, tmp_path: Path) -> None:
    assert compose_cfg([f"train.max_time={given}", f"run_dir={tmp_path}"]).train.max_time == seconds


@pytest.mark.parametrize("given", ["soon", "1:99", "-3", "0", "nan", "1e300"])
def test_a_bad_max_time_is_one_line_naming_the_key(given: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^train.max_time: must be"):
        compose_cfg([f"train.max_time={given}", f"run_dir={tmp_path}"])


def test_the_schedule_follows_the_budget_or_the_steps_whichever_is_further() -> None:
    board = Board(2)
    stats, ctrl = board.stats, board.control
    stats["pos"][:] = [10, 10]
    ctrl["go_at"] = time.monotonic() - 5.0  # half of a 10 s budget spent
    assert schedule_position(stats, ctrl, 100, None) == 20
    assert 49 <= schedule_position(stats, ctrl, 100, 10.0) <= 51
    stats["pos"][:] = [40, 40]
    assert schedule_position(stats, ctrl, 100, 10.0) == 80
    ctrl["go_at"] = time.monotonic() - 50.0
    assert schedule_position(stats, ctrl, 100, 10.0) == 100  # never past the end
    assert isinstance(schedule_position(stats, ctrl, 100, 10.0), int) and np.isfinite(ctrl["go_at"])


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_run_stops_cleanly_when_its_time_is_spent(tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = run_cli(["train.max_steps=100000000", "train.max_time=3", "workers=2", "sched.name=cosine",
                   f"run_dir={run}"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    m = metrics(run)
    assert m["status"] == "ok" and m["max_time_reached"] is True, m
    # Stopped at its budget, not after a hundred million steps; the slack is a loaded machine's.
    assert 3.0 <= m["train_s"] < 30.0, m["train_s"]
    assert (run / "checkpoints" / "last.pt").is_file()
    assert "train.max_time=3s spent" in out.stderr + out.stdout
