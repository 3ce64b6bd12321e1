"""The benchmarks' reproducible stragglers (scripts/harness/stragglers.py), on a fake /proc and cgroup tree:
the right worker is picked, the quota written where the host's cgroup version reads it, and the
process sent home afterwards (fast tier)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

_spec = importlib.util.spec_from_file_location("stragglers", REPO / "scripts" / "harness" / "stragglers.py")
assert _spec is not None and _spec.loader is not None
stragglers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stragglers)


def _proc(root: Path, pid: int, ppid: int, start: int, cmd: list[str]) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    # The command in parentheses may hold spaces and ")" (a process may name itself anything).
    rest = ["S", str(ppid)] + ["0"] * 17 + [str(start)]
    (d / "stat").write_text(f"{pid} (python x) y) {' '.join(rest)}\n")
    (d / "cmdline").write_bytes(b"\0".join(c.encode() for c in cmd) + b"\0")


def test_the_leaders_spawned_workers_are_found_in_start_order(tmp_path: Path) -> None:
    spawn = [sys.executable, "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)"]
    _proc(tmp_path, 100, 1, 10, [sys.executable, "-m", "hogwild.cli.train"])
    _proc(tmp_path, 103, 100, 30, spawn)
    _proc(tmp_path, 101, 100, 20, [sys.executable, "-c", "from multiprocessing.resource_tracker import main"])
    _proc(tmp_path, 102, 100, 25, spawn)
    _proc(tmp_path, 104, 1, 26, spawn)  # someone else's
    (tmp_path / "self").mkdir()
    assert stragglers.children(100, tmp_path) == [101, 102, 103]
    assert stragglers.worker_pids(100, tmp_path) == [102, 103]


def test_the_workers_of_a_leader_s_fork_server_are_found(tmp_path: Path) -> None:
    """Workers start from a fork of the leader (replica/start.py): its children, not the fork."""
    leader = [sys.executable, "-m", "hogwild.cli.train", "+experiment=gpt"]
    _proc(tmp_path, 200, 1, 10, leader)
    _proc(tmp_path, 201, 200, 20, [sys.executable, "-c", "from multiprocessing.resource_tracker import main"])
    _proc(tmp_path, 202, 200, 21, leader)  # the fork server
    _proc(tmp_path, 204, 202, 40, leader)
    _proc(tmp_path, 203, 202, 30, leader)
    (tmp_path / "self").mkdir()
    assert stragglers.worker_pids(200, tmp_path) == [203, 204]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_throttled_process_gets_the_quota_of_its_cgroup_version_and_goes_home(tmp_path: Path,
                                                                               version: str) -> None:
    if version == "v2":
        (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory\n")
        group, home = tmp_path / "slow", tmp_path
    else:
        (tmp_path / "cpu").mkdir()
        group, home = tmp_path / "cpu" / "slow", tmp_path / "cpu"
    with stragglers.throttled([4242], 0.5, name="slow", root=tmp_path) as used:
        assert used == version
        if version == "v2":
            assert (group / "cpu.max").read_text().split() == ["50000", "100000"]
            assert (tmp_path / "cgroup.subtree_control").read_text().split() == ["+cpu"]  # handed down
        else:
            assert (group / "cpu.cfs_quota_us").read_text().strip() == "50000"
            assert (group / "cpu.cfs_period_us").read_text().strip() == "100000"
        assert (group / "cgroup.procs").read_text().split() == ["4242"]
    assert (home / "cgroup.procs").read_text().split() == ["4242"]


def test_a_stalled_process_stops_and_is_always_left_running() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    try:
        with stragglers.stalled(proc.pid, stop_s=0.5, every_s=0.6):
            deadline = time.monotonic() + 30
            while _state(proc.pid) != "T":  # stopped, at some moment of its cycle
                assert time.monotonic() < deadline, "never stopped"
                time.sleep(0.02)
        assert _state(proc.pid) != "T"
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def _straggler_race() -> object:
    import importlib

    return importlib.import_module("scripts.races.straggler_race")


def test_a_fleet_slows_each_machine_to_its_own_fraction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    race = _straggler_race()
    monkeypatch.setattr(race, "cgroup_version", lambda: "v1")
    seen: list[tuple[list[int], float, str]] = []
    monkeypatch.setattr(race, "throttled", lambda pids, f, name: seen.append((pids, f, name)) or name)
    slow, slowed, label = race.fleet_slowing([1.0, 0.5, 0.25])  # type: ignore[attr-defined]
    assert slowed == [1, 2] and "1, 0.5, 0.25 of a core" in label
    slow([11, 12], 0), slow([21, 22], 1)
    # Machine 1 (its leader and worker) at half a core, machine 2 at a quarter, each in a group of its own.
    assert seen == [([11, 12], 0.5, "hogwild_straggler0"), ([21, 22], 0.25, "hogwild_straggler1")]


def test_a_fleet_s_machines_are_each_credited_their_own_samples() -> None:
    race = _straggler_race()
    # 30 rounds; the fast replica stepped 20 a round, the slow one 10; 32 samples a step, 30 s.
    run = {"samples": 900 * 32, "steps": 900, "syncs": 30, "train_s": 30.0, "steps_per_sync_per_replica": [20.0, 10.0]}
    assert race.machine_rates(run) == pytest.approx([640.0, 320.0])  # type: ignore[attr-defined]
    # DDP's runs (lockstep: no rounds to count) and a failed run are left out of the table.
    arms = {"hogwild": {"runs": [run, {"error": "timeout"}]}, "ddp": {"runs": [{"loss": 1.8, "steps": 400}]}}
    lines = race.fleet_lines([1.0, 0.5], arms)  # type: ignore[attr-defined]
    assert lines[-1] == "| hogwild | 640, 640 | 320, 640 |"  # per core: both machines at the same pace


@pytest.mark.parametrize("fleet, says", [("1,x", "fractions of a core, comma-separated"),
                                         ("1,1.5", "two machines or more")])
def test_a_bad_fleet_is_one_line(fleet: str, says: str) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "races" / "straggler_race.py"), "--fleet", fleet],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and proc.stderr.strip() == f"--fleet {fleet}: " + (
        "fractions of a core, comma-separated (1,0.5,0.25)" if "fractions" in says
        else "two machines or more, each at a fraction in (0, 1]"), proc.stderr


def test_the_pace_grid_holds_back_ddp_s_last_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    # The grid builds the race's arguments itself; it once lacked the ranks to slow and every DDP
    # run of the grid failed ('Namespace' object has no attribute 'slowed').
    import argparse
    import contextlib
    import importlib

    race = _straggler_race()
    grid = importlib.import_module("scripts.races.pace_grid")

    class FakeRank:
        def __init__(self, cmd: list[str], **_: object) -> None:
            self.pid = 1000 + int(cmd[cmd.index("--rank") + 1])
            warmups.append(cmd[cmd.index("--warmup") + 1])

        def communicate(self, timeout: float) -> tuple[str, None]:
            return 'RESULT {"loss": 1.8, "tokens_per_s": 6400.0}\n', None

        def poll(self) -> int:
            return 0

    held: list[list[int]] = []
    warmups: list[str] = []
    monkeypatch.setattr(race.subprocess, "Popen", FakeRank)  # type: ignore[attr-defined]
    slow = lambda pids, i: contextlib.nullcontext(held.append(pids))  # noqa: E731
    opts = argparse.Namespace(budget=30.0, eval_every_s=3.0, ddp_lr=0.006)
    for workers in (2, 4):
        held.clear()
        r = race.ddp_arm(grid._run_args(opts, "gpt_tiny", workers, (), 23), slow, 0)  # type: ignore[attr-defined]
        assert held == [[1000 + workers - 1]] and r["loss"] == 1.8
    assert warmups == ["23"] * 6  # every rank warms up as the point says


def test_every_arm_of_the_pace_grid_warms_up_alike_and_a_short_run_s_warm_up_fits_it() -> None:
    # At the 1 s step a 120 s run makes about 90 optimizer steps: inside the recipe's warm-up of 100
    # hogwild's rate never reached its cosine while DDP's annealed with the clock: half of DDP's lead of
    # 0.118 in the final loss at three quarters of a core was the schedule's, not the pacing's.
    import importlib

    grid = importlib.import_module("scripts.races.pace_grid")
    arms = importlib.import_module("scripts.harness.arms")
    assert grid.warmup_steps("auto", 31.0, 120.0) == 23  # type: ignore[attr-defined]
    assert grid.warmup_steps("auto", 500.0, 60.0) == 100 and grid.warmup_steps("7", 500.0, 60.0) == 7  # type: ignore[attr-defined]
    assert "sched.warmup_steps=23" in arms.hogwild_overrides("gpt_xl", 120.0, 10.0, 23)  # type: ignore[attr-defined]
    lr = arms.rate(6e-3, 120.0, 23)  # type: ignore[attr-defined]
    assert lr(22, 0.0) == 6e-3 and lr(88, 119.0) < 1e-5  # warmed up by step 23, annealed by the budget's end
    # DDP under hogwild's own schedule function: the same rate at every step and second.
    from hogwild.config.train import SchedConfig
    from hogwild.replica.lr_schedule import LRSchedule

    hogwild = LRSchedule(SchedConfig(name="cosine", warmup_steps=100), 6e-3, 10**8)
    steps = arms.rate(6e-3, 120.0, 100, "steps")  # type: ignore[attr-defined]
    for step, spent in ((0, 0.0), (50, 30.0), (88, 119.0), (150, 60.0), (250, 100.0), (400, 130.0)):
        # the run's length as a worker projects it (hogwild.replica.worker.schedule_length)
        total = min(10**8, int(step / min(spent / 120.0, 1.0))) if spent > 0 and step > 0 else 10**8
        assert steps(step, spent) == pytest.approx(hogwild.lr_at(step, total), rel=1e-2, abs=1e-9), (step, spent)
    assert steps(88, 119.0) > 5e-3  # inside its warm-up at the budget's end: never decayed


def test_a_fleet_s_machines_are_read_against_their_own_standalone_rate() -> None:
    race = _straggler_race()
    run = {"samples": 900 * 32, "steps": 900, "syncs": 30, "train_s": 30.0, "steps_per_sync_per_replica": [20.0, 10.0]}
    # Alone, the full-core machine trains 700 samples a second and the half-core one 300 (a quota's
    # bursts give less than half of a core's 700): the fleet's 640 and 320 are 0.91 and 1.07 of them.
    alone = {0: [{"samples_per_s": 700.0}, {"samples_per_s": 690.0}, {"samples_per_s": 710.0}],
             1: [{"samples_per_s": 300.0}]}
    lines = race.fleet_lines([1.0, 0.5], {"hogwild": {"runs": [run]}}, alone)  # type: ignore[attr-defined]
    assert lines[-2] == "| standalone (1 x 1 alone) | 700, 700 | 300, 600 |"
    assert lines[-1] == "| hogwild | 640, 640, **0.91** of standalone | 320, 640, **1.07** of standalone |"


def test_the_pace_grid_s_limit_counts_a_quota_against_a_worker_s_share_of_the_cores() -> None:
    import importlib

    share = importlib.import_module("scripts.races.pace_grid").share  # type: ignore[attr-defined]
    assert share("throttle:0.5", 2, cores=2) == 1.5 and share("throttle:0.5", 16, cores=16) == 15.5
    # Four workers on two cores have half a core each: a quarter of a core is half a worker's rate,
    # and three quarters of a core holds nothing back.
    assert share("throttle:0.25", 4, cores=2) == 3.5 and share("throttle:0.75", 4, cores=2) == 4.0
