"""The recipe through the real CLI (slow tier): a run stopped half-way and resumed continues its
learning-rate schedule where it stopped, instead of warming up again from the start."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from hogwild.checkpoint import store as checkpoint
from hogwild.config.train import SchedConfig
from hogwild.replica.board import previous_attempt
from hogwild.replica.lr_schedule import LRSchedule
from tests.conftest import clean_env, run_cli, zygote_of_this_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOTAL, LR = 1500, 0.05
ARGS = ["workers=1", f"train.max_steps={TOTAL}", "sched.name=cosine", f"optim.lr={LR}", "checkpoint.every_s=0.2",
        "eval.every_s=1"]


def _lr_points(run_dir: Path) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars("train/lr")]


def test_a_resumed_run_continues_its_schedule(tmp_path: Path) -> None:
    run = tmp_path / "run"
    log = tmp_path / "first.log"
    proc = zygote_of_this_process().start("hogwild.cli.train", [*ARGS, f"run_dir={run}"], tmp_path, clean_env(), log)
    try:
        deadline = time.monotonic() + 120
        while True:  # stop it once it is well into the cosine, where a restart would show
            seen = previous_attempt(run / "progress" / "rank0.board")
            if seen is not None and seen[1] >= 0.4 * TOTAL:
                break
            assert proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, "the run never got 40 % through"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 143
    finally:
        proc.kill()
    stopped_at = int(checkpoint.load(run / "checkpoints" / "last.pt")["counters"]["steps"])
    assert 0.4 * TOTAL <= stopped_at < TOTAL

    again = run_cli([*ARGS, "resume=true", f"run_dir={run}"], cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    sched = LRSchedule(SchedConfig(name="cosine"), LR, TOTAL)
    after = [(s, v) for s, v in _lr_points(run) if s > stopped_at]
    assert after, "the resumed run drew no learning-rate curve"
    for step, lr in after:
        # One worker: the job's step is the replica's step, within the few steps a TensorBoard
        # point may lag the position it was read at.
        assert sched.lr_at(step + 5) - 1e-6 <= lr <= sched.lr_at(max(step - 5, 0)) + 1e-6, (step, lr)
    assert after[0][1] < 0.8 * LR  # not back at the peak, as a schedule restarted from 0 would be
