"""Faults are real here: workers are SIGKILLed, leaders SIGTERMed, files truncated (slow tier)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hogwild import checkpoint
from hogwild.leader import run
from tests.conftest import clean_env, compose_cfg, free_port, metrics, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def _workers(leader: int) -> list[int]:
    out = []
    for c in _children(leader):
        try:
            cmd = Path(f"/proc/{c}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "multiprocessing.spawn" in cmd and "resource_tracker" not in cmd:
            out.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text() if Path(f"/proc/{pid}/stat").exists() else ""
    return " Z " not in stat


def _start(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "hogwild.train", *args], cwd=tmp_path,
                            env=env or clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _wait_training(proc: subprocess.Popen[str], n: int, timeout: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ws = _workers(proc.pid)
        if len(ws) == n:
            return ws
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("workers never started")


def test_kill9_worker_is_respawned_and_run_meets_bar(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _start(tmp_path, "workers=2", "train.epochs=150", f"run_dir={out}")
    victim = _wait_training(proc, 2)[0]
    while not (out / "progress.json").exists():  # training, not just spawning
        time.sleep(0.1)
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
    assert proc.returncode == 3 and "fault.max_nonfinite=1" in proc.stderr


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_checkpoints_exits_on_time_and_leaves_nothing(tmp_path: Path, sig: int, code: int) -> None:
    out = tmp_path / "run"
    shm_before = _shm()
    proc = _start(tmp_path, "workers=2", "train.epochs=100000", f"run_dir={out}")
    workers = _wait_training(proc, 2)
    while not (out / "progress.json").exists():
        time.sleep(0.1)
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
    assert not {s for s in _shm() - shm_before if "torch" in s}, "shared memory segment left behind"


def test_corrupt_newest_checkpoint_falls_back_to_previous(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run(compose_cfg(["workers=1", "train.max_steps=40", f"run_dir={out}"]), str(out))
    run(compose_cfg(["workers=1", "train.max_steps=80", f"run_dir={out}", "resume=true"]), str(out))
    newest = checkpoint.candidates(out)[0]
    assert newest.name == "step_000000080.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated mid-write by a crash
    proc = run_cli(["workers=1", "train.max_steps=100", f"run_dir={out}", "resume=true"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "falling back to an older checkpoint" in proc.stdout + proc.stderr
    m = metrics(out)
    assert m["resumed_from"].endswith("step_000000040.pt") and m["steps"] == 100


def test_torchrun_restart_after_leader_kill_resumes_and_finishes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
           "--max-restarts=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
           "--rdzv-id=restart-test", "-m", "hogwild.train", "workers=1", "train.epochs=200",
           "checkpoint.every_s=1", "sync.interval=20", "sync.timeout_s=30", f"run_dir={out}"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=clean_env(OMP_NUM_THREADS="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not list((out / "checkpoints").glob("step_*.pt")) if out.exists() else True:
        assert time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.2)
    time.sleep(1.0)
    leaders = [c for c in _children(proc.pid) if "hogwild.train" in Path(f"/proc/{c}/cmdline").read_text()]
    assert leaders
    os.kill(leaders[-1], signal.SIGKILL)
    log, _ = proc.communicate(timeout=280)
    assert proc.returncode == 0, log[-4000:]
    m = metrics(out)
    assert m["resumed_from"], "the restarted job did not resume from a checkpoint"
    assert m["test_accuracy"] >= 0.95
    # Lost work is bounded by checkpoint.every_s (1 s here) of training plus the kill latency.
    assert m["steps_lost_on_resume"] < 0.5 * m["steps"], m


def test_second_ctrl_c_forces_exit_without_traceback(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _start(tmp_path, "workers=2", "train.epochs=100000", f"run_dir={out}")
    workers = _wait_training(proc, 2)
    while not (out / "progress.json").exists():
        time.sleep(0.1)
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
    """Workers that cannot be ready within sync.timeout_s: a fault (exit 3), not a traceback."""
    out = tmp_path / "run"
    proc = run_cli(["workers=2", "sync.timeout_s=0.05", f"run_dir={out}"], cwd=tmp_path)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hogwild: error:")]
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert lines == [lines[0]] and "workers not ready after" in lines[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout
