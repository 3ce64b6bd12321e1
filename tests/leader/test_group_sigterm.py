"""A SIGTERM to the whole process group (``timeout``, Slurm's ``scancel``, ``kill -TERM -PGID``)
is one clean stop: no worker is respawned, the final checkpoint is written, exit 143, status
SIGTERM; and ``launch/local.sh`` on SIGTERM leaves with the job's code and no traceback (slow tier)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, clean_env, metrics, wait_training

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _sigterm_once_training(cmd: list[str], run: Path, cwd: Path, env: dict[str, str], group: bool
                           ) -> tuple[subprocess.Popen, str]:
    """Start ``cmd`` in a session of its own, SIGTERM it (its whole process group, or the process)
    once replica 0 has trained a step; the process and everything it printed."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        wait_training(run, proc, timeout=180)
        if group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc, out + err


def test_a_process_group_sigterm_stops_cleanly_without_respawns(tmp_path: Path) -> None:
    run = tmp_path / "run"
    # The leader and its four workers at once.
    proc, logs = _sigterm_once_training([sys.executable, "-m", "hogwild.cli.train", "workers=4",
                                         "train.max_steps=1000000", "checkpoint.every_s=1000", f"run_dir={run}"],
                                        run, tmp_path, clean_env(), group=True)
    assert proc.returncode == 143, logs[-3000:]
    assert "respawn" not in logs and "died" not in logs, logs[-3000:]
    assert "Traceback" not in logs
    m = metrics(run)
    assert m["status"] == "SIGTERM" and m["steps"] > 0
    assert (run / "checkpoints" / "last.pt").is_file()


def test_launch_local_sh_on_sigterm_leaves_with_the_job_s_code_and_no_traceback(tmp_path: Path) -> None:
    run = tmp_path / "run"
    env = clean_env(OMP_NUM_THREADS="1")
    # To the script alone, as a user's kill or a scheduler would.
    proc, logs = _sigterm_once_training(["bash", str(REPO / "launch" / "local.sh"), "2", "1", "train.max_steps=1000000",
                                         "checkpoint.every_s=1000", f"run_dir={run}"], run, REPO, env, group=False)
    assert proc.returncode == 143, logs[-3000:]
    assert "Traceback" not in logs and "SignalException" not in logs, logs[-3000:]
    assert metrics(run)["status"] == "SIGTERM"


def test_launch_local_sh_with_a_bad_setting_leaves_with_exit_2_and_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(REPO / "launch" / "local.sh"), "2", "1", "optim.lr=-1",
                           f"run_dir={tmp_path / 'run'}"], cwd=REPO, env=clean_env(OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr, proc.stderr[-3000:]
    assert "hogwild: error: optim.lr" in proc.stderr
