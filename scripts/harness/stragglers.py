"""Stragglers that behave the same in every run, for hogwild's arms and DDP's alike.

- :func:`throttled`: processes held to a fraction of one core by a cgroup's CPU quota (v2's
  ``cpu.max`` where the unified hierarchy has the cpu controller, else v1's ``cpu.cfs_quota_us``,
  as on a host where ``/sys/fs/cgroup/cpu`` is writable by root). It says which one ran.
- :func:`stalled`: a process stopped (SIGSTOP) for ``stop_s`` every ``every_s``, as a page-out, a
  noisy neighbour's burst or a preempted VM stops one.
- :func:`busy_core` (scripts/harness/common.py): a core shared with a spinning process.
- :func:`worker_pids`: the spawned workers of a hogwild leader, so one of them can be picked.

Needs root for the cgroup; :func:`throttled` raises ``PermissionError`` with the path it could not
write elsewhere, and a caller says so and skips the arm.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

logger = logging.getLogger(__name__)

CGROUP = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
"""The quota's period: short enough that a half-core process runs every 0.1 s, as a slow core would."""


def cgroup_version(root: Path = CGROUP) -> str:
    """``v2`` where the unified hierarchy offers the cpu controller, else ``v1``."""
    controllers = root / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return "v2"
    return "v1"


@contextlib.contextmanager
def throttled(pids: Sequence[int], fraction: float, name: str = "hogwild_straggler",
              root: Path = CGROUP) -> Iterator[str]:
    """``pids`` (and the threads they start) held to ``fraction`` of one core while the block runs;
    yields the cgroup version used. Each process goes back to the root group afterwards (one that
    has exited is skipped), and the group is removed."""
    if not 0 < fraction:
        raise ValueError(f"fraction must be positive, got {fraction}")
    version = cgroup_version(root)
    group = root / name if version == "v2" else root / "cpu" / name
    group.mkdir(exist_ok=True)
    quota = max(1000, int(fraction * PERIOD_US))
    if version == "v2":
        # A child has cpu.max only where its parent hands the controller down (v2's subtree_control).
        control = root / "cgroup.subtree_control"
        if not control.exists() or "cpu" not in control.read_text().split():
            control.write_text("+cpu\n")
        (group / "cpu.max").write_text(f"{quota} {PERIOD_US}\n")
    else:
        (group / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
        (group / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    logger.info("cgroup %s: %s held to %.2f of a core (%s)", version, list(pids), fraction, group)
    for pid in pids:
        (group / "cgroup.procs").write_text(f"{pid}\n")
    try:
        yield version
    finally:
        home = group.parent / "cgroup.procs"
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):  # it exited meanwhile
                home.write_text(f"{pid}\n")
        with contextlib.suppress(OSError):
            group.rmdir()


@contextlib.contextmanager
def stalled(pid: int, stop_s: float = 1.0, every_s: float = 3.0) -> Iterator[None]:
    """``pid`` stopped for ``stop_s`` at the end of every ``every_s`` while the block runs; it is
    always left running."""
    done = threading.Event()

    def loop() -> None:
        while not done.wait(every_s - stop_s):
            try:
                os.kill(pid, signal.SIGSTOP)
                done.wait(stop_s)
            except ProcessLookupError:
                return
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    thread = threading.Thread(target=loop, name="stalls", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def children(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """The processes whose parent is ``pid``, in start order."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after the command, which may hold spaces
        if int(fields[1]) == pid:
            found.append((int(fields[19]), int(entry.name)))  # starttime, pid
    return [p for _, p in sorted(found)]


def worker_pids(leader: int, proc: Path = Path("/proc")) -> list[int]:
    """A hogwild leader's workers, in start order: the children of its fork server (a fork of the
    leader with the leader's command line, replica/start.py), or its own multiprocessing spawn
    children where there is none; not its resource tracker."""
    def cmdline(pid: int) -> list[bytes]:
        try:
            return (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            return []

    out: list[int] = []
    mine = cmdline(leader)
    for pid in children(leader, proc):
        cmd = cmdline(pid)
        if cmd and cmd == mine:  # the fork server: its children are the workers
            out += [w for w in children(pid, proc) if cmdline(w)]
        elif any(b"spawn_main" in part for part in cmd):
            out.append(pid)
    return out


def wait_for(find: Callable[[], list[int]], proc: subprocess.Popen[str], what: str,
             timeout: float = 300.0) -> list[int]:
    """The processes ``find`` names once it names any, while ``proc`` (the job that starts them)
    lives; RuntimeError naming ``what`` if they never appear."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        pids = find()
        if pids:
            return pids
        time.sleep(0.2)
    raise RuntimeError(f"{what} never started")

