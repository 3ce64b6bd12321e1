"""A Ctrl-C at any phase of an elastic job leaves nothing in /dev/shm: no named semaphore of
multiprocessing's (``sem.mp-*``) and no torch segment (``torch_*``). One left two ``sem.mp-*``
entries after a SIGINT during warm-up on a busy host, in 1 of 3 tries.

Each slot runs in a session of its own (forked from the test process's zygote, tests/zygote.py) and
the signal goes to the whole process group, as a terminal's Ctrl-C does: the leader, its fork
server, its workers and multiprocessing's resource tracker all receive it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Callable

import pytest

from hogwild.replica.board import previous_attempt
from tests.conftest import REPO, clean_env, session, zygote_of_this_process
from tests.elastic.helpers import coordinator_thread
from tests.zygote import Forked

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

WORKERS = 2
ARGS = ["elastic.replicas=2", f"workers={WORKERS}", "sync.interval=10", "train.max_steps=1000000",
        "elastic.peer_timeout_s=2", "sync.timeout_s=60", "eval.every_s=1000"]


def shm() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(("sem.mp-", "torch_"))}


def left_behind(before: set[str]) -> set[str]:
    """New entries that no live process holds: called once every process of the job is gone, so
    what a live process holds is a neighbour's (a test beside this one, on a shared host). A torch
    segment names its creator's pid; a semaphore names nobody, but its holders map its inode (under
    the temporary name glibc created it with, so by inode, not by name)."""
    held = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            held |= {int(line.split()[4]) for line in maps.read_text().splitlines() if "/dev/shm/" in line}
        except OSError:
            continue

    def live(name: str) -> bool:
        pid = name.split("_")[1] if name.startswith("torch_") and name.count("_") else ""
        try:
            inode = (Path("/dev/shm") / name).stat().st_ino
        except OSError:
            return True  # gone meanwhile
        return inode in held or (pid.isdigit() and Path(f"/proc/{pid}").exists())

    return {s for s in shm() - before if not live(s)}


def applied(run_dir: Path, slot: int) -> float:
    seen = previous_attempt(run_dir / "progress" / f"rank{slot}.board")
    return seen[1] if seen else 0.0


def wait_for(what: str, ok: Callable[[], bool], procs: list[Forked], logs: list[Path],
             timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        for p, log in zip(procs, logs):
            assert p.poll() is None, f"ended before {what}: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} in {timeout}s: {logs[0].read_text()[-3000:]}"
        time.sleep(0.02)


def joining(run_dir: Path, procs: list[Forked], logs: list[Path]) -> None:
    """Slot 0 alone, waiting for a quorum that never comes."""
    wait_for("wait for a quorum", lambda: "needed: waiting" in logs[0].read_text(), procs, logs)


def warming_up(run_dir: Path, procs: list[Forked], logs: list[Path]) -> None:
    """Both leaders are up and slot 0's workers are starting: they build their model and shard.
    Slot 1's leader is waited for too: a leader still starting up (a loaded host's CI once had one
    still importing) is not in the phase this case is about."""
    # The leader, its resource tracker and its fork server, then the workers.
    wait_for("workers", lambda: len(session(procs[0].pid)) >= 3 + WORKERS, procs, logs)
    wait_for("both leaders", lambda: all(f"replica {s}/{len(logs)}:" in log.read_text() for s, log in enumerate(logs)),
             procs, logs)
    assert applied(run_dir, 0) == 0, "slot 0 trained already: not its warm-up"


def training(run_dir: Path, procs: list[Forked], logs: list[Path]) -> None:
    wait_for("training", lambda: all(applied(run_dir, s) > 0 for s in range(len(procs))), procs, logs)


PHASES = {"waiting for a group": (1, joining), "warm-up": (2, warming_up), "training": (2, training)}


@pytest.mark.parametrize("phase", list(PHASES))
def test_ctrl_c_leaves_nothing_in_dev_shm(tmp_path: Path, phase: str) -> None:
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm here")
    slots, reach = PHASES[phase]
    before = shm()
    env = clean_env(OMP_NUM_THREADS="1", LOCAL_WORLD_SIZE="2", PYTHONPATH=str(REPO))
    run_dir = tmp_path / "run"
    logs = [tmp_path / f"slot{s}.log" for s in range(slots)]
    procs: list[Forked] = []
    with coordinator_thread() as port:
        try:
            for s in range(slots):
                procs.append(zygote_of_this_process().start(
                    "hogwild.cli.train", [f"elastic.slot={s}", f"elastic.coordinator=127.0.0.1:{port}",
                                          f"run_dir={run_dir}", *ARGS], tmp_path, env, logs[s], session=True))
            reach(run_dir, procs, logs)
            for p in procs:
                os.killpg(p.pid, signal.SIGINT)
            codes = [p.wait(90) for p in procs]
            # What the leaders leave to others (the fork server, the resource tracker) ends on its own.
            deadline = time.monotonic() + 30
            while any(session(p.pid) for p in procs) and time.monotonic() < deadline:
                time.sleep(0.1)
            lingering = {p.pid: session(p.pid) for p in procs if session(p.pid)}
        finally:
            for p in procs:
                for pid in session(p.pid):
                    os.kill(pid, signal.SIGKILL)
    out = [log.read_text()[-3000:] for log in logs]
    assert codes == [130] * slots, out
    assert "Traceback" not in "".join(log.read_text() for log in logs), out
    assert not lingering, f"processes outlived their leader: {lingering}"
    assert not left_behind(before), f"left in /dev/shm after Ctrl-C during {phase}: {sorted(left_behind(before))}"
