"""Faults are real here: workers are SIGKILLed, leaders SIGTERMed, files truncated (slow tier)."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from hogwild.checkpoint import store as checkpoint
from tests.conftest import (child_pids, clean_env, compose_cfg, free_port, leaked_torch_shm, metrics, run_cli,
                            torch_shm, wait_training, zygote_of_this_process)
from tests.conftest import cmdline as _cmdline
from tests.conftest import worker_pids as _workers
from tests.conftest import run_metrics as run
from tests.zygote import Forked

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text() if Path(f"/proc/{pid}/stat").exists() else ""
    return " Z " not in stat


def _start(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Forked:
    """The CLI forked from this test process's zygote (tests/zygote.py), stdout and stderr in one
    file, as ``Popen(stderr=STDOUT)`` gives them."""
    return zygote_of_this_process().start("hogwild.cli.train", list(args), tmp_path, env or clean_env(),
                                          tmp_path / "cli.log")


def _wait_training(proc: subprocess.Popen[str], n: int, timeout: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ws = _workers(proc.pid)
        if len(ws) == n:
            return ws
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("workers never started")


def _ready(run_dir: Path) -> list[bool]:
    """Which of replica 0's workers have finished their warm-up, as its board says (none yet
    while the board is not there)."""
    from hogwild.replica.board import CONTROL, STATS

    try:
        data = np.fromfile(run_dir / "progress" / "rank0.board", dtype=np.float64)
    except OSError:
        return []
    n = len(data) - len(CONTROL.names)
    return [bool(r > 0) for r in data[:n - n % len(STATS.names)].view(STATS)["ready"]] if n > 0 else []


@pytest.mark.parametrize("phase", ["training", "waiting for the others to warm up"])
def test_no_worker_outlives_a_leader_killed_with_sigkill(tmp_path: Path, phase: str) -> None:
    """A worker's parent is the fork server, which lives while any worker does: workers that
    watched their parent pid outlived a SIGKILLed leader, and kept counting steps on its progress
    board, which a restarted replica then counted again. They watch the leader itself now."""
    out = tmp_path / "run"
    warming = phase != "training"
    # Worker 0 warms up 4 s longer: worker 1 is ready and waits for the start signal meanwhile.
    # The kill waits until the board says so (worker 1 ready, worker 0 not), so the phase is the
    # one named whatever the load; a longer warm-up only makes worker 0 check on its leader later.
    proc = _start(tmp_path, "workers=2", "train.epochs=100000", f"run_dir={out}",
                  env=clean_env(HOGWILD_FAULT="warm:0:4000") if warming else None)
    workers = _wait_training(proc, 2)
    if warming:
        marker = Path(tempfile.gettempdir()) / f"hogwild-fault-{proc.pid}-0.warm"
        deadline = time.monotonic() + 60
        while not (marker.exists() and _ready(out) == [False, True]):
            assert _ready(out) != [True, True], "worker 0 was ready before worker 1 waited: no waiting phase"
            assert time.monotonic() < deadline and proc.poll() is None, "worker 0 never began to warm up"
            time.sleep(0.02)
        marker.unlink()
    else:
        wait_training(out, proc)
    proc.kill()
    proc.communicate(timeout=30)
    # A worker checks on its leader at every step and every 5 ms while it waits; one in warm-up
    # looks once it is done (8 s here).
    deadline = time.monotonic() + 30
    while [w for w in workers if _alive(w)] and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [w for w in workers if _alive(w)]
    for w in left:
        os.kill(w, signal.SIGKILL)
    assert not left, "a worker outlived its leader"


def test_kill9_worker_is_respawned_and_run_meets_bar(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # The kill lands at the first applied update: 50 epochs (1,100 steps a worker) keep the victim
    # training well past it on a fast machine and meet the bar as the default 40 do; 150 trained
    # three times as long under load for the same assertions.
    proc = _start(tmp_path, "workers=2", "train.epochs=50", f"run_dir={out}")
    victim = _wait_training(proc, 2)[0]
    wait_training(out, proc)  # training, not just spawning
    os.kill(victim, signal.SIGKILL)
    log, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, log[-3000:]
    m = metrics(out)
    assert m["worker_restarts"] >= 1 and m["test_accuracy"] >= 0.95
    assert "respawning on the same shard" in log


def test_crashing_worker_past_restart_bound_stops_with_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = clean_env(HOGWILD_FAULT="crash:0:5")
    proc = run_cli(["workers=2", "fault.max_worker_restarts=2", f"run_dir={out}"], cwd=tmp_path, env=env)
    assert proc.returncode == 3
    assert "fault.max_worker_restarts=2" in proc.stderr
    assert metrics(out)["worker_restarts"] == 2
    assert (out / "checkpoints" / "last.pt").exists()
    # Each death is one line naming the error and the file with its traceback, never the
    # traceback itself (it used to be printed once per death, three times here).
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    deaths = re.findall(r"hogwild: worker 0: RuntimeError: injected crash at step 5 \(traceback in (\S+)\)",
                        proc.stderr)
    assert len(deaths) == 3, proc.stderr[-3000:]
    assert all(Path(f).parent == out and "Traceback" in Path(f).read_text() for f in deaths)


def test_injected_nan_gradient_is_skipped_and_model_stays_finite(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = clean_env(HOGWILD_FAULT="nan:0:10,nan:1:20")
    proc = run_cli(["workers=2", f"run_dir={out}"], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = metrics(out)
    assert m["skipped_nonfinite"] == 2 and m["test_accuracy"] >= 0.95
    assert torch.isfinite(checkpoint.load(out / "checkpoints" / "last.pt")["flat"]).all()


def test_too_many_nonfinite_updates_stop_the_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = clean_env(HOGWILD_FAULT="nan:0:3,nan:0:4,nan:0:5")
    proc = run_cli(["workers=1", "fault.max_nonfinite=1", f"run_dir={out}"], cwd=tmp_path, env=env)
    assert proc.returncode == 4 and "fault.max_nonfinite=1" in proc.stderr  # a failed training run
    assert metrics(out)["status"] == "training_failed"


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_checkpoints_exits_on_time_and_leaves_nothing(tmp_path: Path, sig: int, code: int) -> None:
    out = tmp_path / "run"
    shm_before = torch_shm()
    proc = _start(tmp_path, "workers=2", "train.epochs=100000", f"run_dir={out}")
    workers = _wait_training(proc, 2)
    wait_training(out, proc)
    t0 = time.monotonic()
    proc.send_signal(sig)
    log, _ = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 30, "shutdown took longer than 30 s"
    assert proc.returncode == code, log[-3000:]
    ck = checkpoint.load(out / "checkpoints" / "last.pt")
    assert ck["counters"]["steps"] > 0
    assert metrics(out)["status"] == signal.Signals(sig).name
    time.sleep(0.5)
    assert not [w for w in workers if _alive(w)], "a worker outlived its leader"
    assert not leaked_torch_shm(shm_before), "shared memory segment left behind"


def test_corrupt_newest_checkpoint_falls_back_to_previous(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run(compose_cfg(["workers=1", "train.max_steps=40", f"run_dir={out}"]), str(out))
    run(compose_cfg(["workers=1", "train.max_steps=80", f"run_dir={out}", "resume=true"]), str(out))
    newest = checkpoint.candidates(out)[0]
    assert newest.name.startswith("step_000000080-")
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated mid-write by a crash
    proc = run_cli(["workers=1", "train.max_steps=100", f"run_dir={out}", "resume=true"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "falling back to an older checkpoint" in proc.stdout + proc.stderr
    m = metrics(out)
    assert Path(m["resumed_from"]).name.startswith("step_000000040-") and m["steps"] == 100


def test_torchrun_restart_after_leader_kill_resumes_and_loses_at_most_one_checkpoint_interval(
        tmp_path: Path) -> None:
    """A leader is killed at a random moment; torchrun restarts the job, which resumes and
    counts the steps it lost exactly. They are bounded by checkpoint.every_s of training plus
    a write, plus what the survivor may run past a round that never completes (sync.max_lag)."""
    out, every_s, interval, batch = tmp_path / "run", 1.0, 20, 32
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
           "--max-restarts=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
           "--rdzv-id=restart-test", "-m", "hogwild.cli.train", "workers=1", "train.epochs=200",
           f"checkpoint.every_s={every_s}", f"sync.interval={interval}", "sync.timeout_s=30",
           f"train.batch_size={batch}", f"run_dir={out}"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=clean_env(OMP_NUM_THREADS="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # Watch checkpoints as they come: their steps and write times give the job's speed just
    # before the kill, and the kill comes at a random moment after the second one.
    seen: list[tuple[float, int]] = []
    kill_at, deadline = None, time.monotonic() + 120
    while kill_at is None or time.monotonic() < kill_at:
        assert time.monotonic() < deadline and proc.poll() is None, "checkpoints did not come"
        try:
            ck = checkpoint.load(out / "checkpoints" / "last.pt")
        except checkpoint.CheckpointError:
            ck = None  # not written yet, or swapped right now
        if ck is not None and (not seen or ck["written_at"] > seen[-1][0]):
            seen.append((ck["written_at"], ck["counters"]["steps"]))
            if len(seen) == 2:
                kill_at = time.monotonic() + random.uniform(0.0, 2 * every_s)
        time.sleep(0.02)
    leaders = [c for c in child_pids(proc.pid) if "hogwild.cli.train" in _cmdline(c)]
    assert leaders
    os.kill(leaders[-1], signal.SIGKILL)
    log, _ = proc.communicate(timeout=280)
    assert proc.returncode == 0, log[-4000:]
    m = metrics(out)
    assert m["resumed_from"], "the restarted job did not resume from a checkpoint"
    assert m["test_accuracy"] >= 0.95
    lost = m["steps_lost_on_resume"]
    assert lost is not None, "the restarted job did not count its lost steps"
    (t1, s1), (t2, s2) = seen[-2], seen[-1]
    assert t2 - t1 <= every_s + 1.0, f"checkpoints {t2 - t1:.2f}s apart with checkpoint.every_s={every_s}"
    # Steps per second of the job just before the kill (or after, if faster): 1.5 x that for a
    # machine whose speed changes while other work runs beside it.
    rate = max((s2 - s1) / (t2 - t1), m["samples_per_s"] / batch)
    bound = 1.5 * rate * (every_s + 1.0) + 2 * interval + 10
    assert lost <= bound, f"lost {lost} steps, bound {bound:.0f} at {rate:.0f} steps/s; checkpoints {seen}"


def test_second_ctrl_c_forces_exit_without_traceback(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _start(tmp_path, "workers=2", "train.epochs=100000", f"run_dir={out}")
    workers = _wait_training(proc, 2)
    wait_training(out, proc)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    log, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and time.monotonic() - t0 < 10, log[-3000:]
    assert "Traceback" not in log
    time.sleep(0.5)
    assert not [w for w in workers if _alive(w)]


def test_a_fault_at_startup_is_one_line_and_exit_3(tmp_path: Path) -> None:
    """Workers that cannot be ready within fault.startup_timeout_s: a fault (exit 3), not a traceback."""
    out = tmp_path / "run"
    # Worker 0 takes 5 s longer to warm up than the bound allows. (A bare 0.05 s bound is no
    # longer enough: a worker forked from the fork server is ready within it.)
    proc = run_cli(["workers=2", "fault.startup_timeout_s=1", f"run_dir={out}"], cwd=tmp_path,
                   env=clean_env(HOGWILD_FAULT="warm:0:5000"))
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hogwild: error:")]
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert lines == [lines[0]] and "workers not ready after" in lines[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout
