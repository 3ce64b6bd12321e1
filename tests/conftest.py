"""Shared helpers: free loopback ports, CLI runs in subprocesses, small configs."""

from __future__ import annotations

import atexit
import functools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.zygote import Zygote

REPO = Path(__file__).resolve().parent.parent
FAST = ["train.epochs=40", "eval.every_s=1", "train.log_every_s=1"]


def cores_of_this_test_process() -> list[int]:
    """The cores a pytest-xdist test process keeps to: an equal share of the machine's; when there
    are more test processes than cores, one core each for the first ones and every core for the
    rest, which run where the others leave a core idle; all of them outside xdist."""
    cores = sorted(os.sched_getaffinity(0))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or count < 2:
        return cores
    i = int(worker[2:])
    if len(cores) < count:
        return [cores[i]] if i < len(cores) else cores
    share = len(cores) // count
    return cores[i * share:(i + 1) * share]


def pytest_configure(config: pytest.Config) -> None:
    # A job sizes its threads to the cores it may use (replica/resources.py), and every process a
    # test starts inherits the test process's affinity. Unpinned, N test processes run N jobs that
    # each size their intra-op threads to the whole machine; those threads then wait on peers the
    # scheduler has preempted, and a test that takes 7 s alone took 50 s at -n 2 on 2 cores and
    # timed out at -n 6 there, and at -n 15 on a 16-core GPU machine. Pinned, each test runs on a
    # machine of its share of the cores.
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores_of_this_test_process())


# The longest tests (seconds on a 2-core host under -n 3, node-id prefixes; 2026-11-30) start first.
# pytest-xdist's worksteal hands each test process a contiguous share of the collection and lets an
# idle one take the back half of another's queue: long tests collected last (the root files are) left
# one core finishing them alone while the other idled. Longest first, what is left to share at the end
# is short. A stale figure only costs balance. Tests that share a module fixture keep one key, so they
# stay together (test_wheel.py builds its wheel and venv once per test process).
LONG = {
    "tests/elastic/test_elastic.py::test_kills_at_random_replicas": 55,
    "tests/test_bench.py::test_bench_sections_train_every": 47,
    "tests/cli/test_examples.py::test_resnet18_with_batchnorm_on": 45,
    "tests/elastic/test_elastic.py::test_every_replica_restarted_starts": 34,
    "tests/test_wheel.py::": 33,
    "tests/elastic/test_elastic.py::test_a_restarted_writer_and": 31,
    "tests/cli/test_hostile.py::test_a_second_job_on": 30,
    "tests/elastic/test_elastic.py::test_a_coordinator_killed_and": 27,
    "tests/leader/test_faults.py::test_torchrun_restart_after_leader": 26,
    "tests/data/test_streams.py::test_a_2_by_2": 24,
    "tests/replica/test_compile.py::test_the_cli_trains_the": 24,
    "tests/replica/test_barrier.py::test_a_dead_worker_holds": 23,
    "tests/cli/test_examples.py::test_char_language_model_two": 21,
    "tests/replica/test_recipe_runs.py::test_a_resumed_run_continues": 21,
    "tests/elastic/test_elastic.py::test_a_coordinator_that_stays": 21,
    "tests/leader/test_distributed.py::test_target_drift_adapts_interval": 21,
    "tests/cli/test_user_model.py::test_image_folder_of_digit": 20,
    "tests/cli/test_clients.py::test_hugging_face_models_built": 20,
    "tests/sync/test_buffers_sync.py::test_every_rule_keeps_batchnorm": 17,
    "tests/replica/test_compile.py::test_auto_on_a_broken": 17,
    "tests/data/test_streams.py::test_a_map_style_datasets": 17,
    "tests/elastic/test_elastic.py::test_a_stream_restored_in": 17,
    "tests/replica/test_compile.py::test_an_explicit_mode_on": 16,
    "tests/leader/test_distributed.py::test_drift_grows_with_the": 16,
    "tests/leader/test_distributed.py::test_max_lag_bounds_the": 15,
    "tests/elastic/test_elastic.py::test_a_writer_stopped_past": 14,
    "tests/replica/test_barrier.py::test_a_slow_worker_computes": 13,
    "tests/cli/test_clients.py::test_a_nanogpt_style_gpt": 13,
    "tests/leader/test_distributed.py::test_a_replica_done_first": 13,
    "tests/cli/test_hostile.py::test_hostile_case": 13,
    "tests/leader/test_group_sigterm.py::test_launch_local_sh_on": 13,
    "tests/replica/test_barrier.py::test_a_slow_worker_in": 13,
    "tests/test_bench.py::test_outer_rules_reports_each": 13,
    "tests/cli/test_bad_input.py::test_user_code_that_calls": 13,
    "tests/leader/test_group_sigterm.py::test_launch_local_sh_with": 13,
    "tests/elastic/test_jobs.py::test_the_elastic_roles_train": 12,
    "tests/replica/test_barrier.py::test_a_resumed_run_takes": 12,
    "tests/config/test_pace.py::test_the_documented_way_to": 12,
    "tests/leader/test_distributed.py::test_two_replicas_reach_bar": 12,
    "tests/leader/test_distributed.py::test_row_sparse_rounds_on": 12,
    "tests/config/test_properties.py::test_any_value_for_any": 11,
    "tests/leader/test_distributed.py::test_broadcast_mode": 11,
    "tests/data/test_streams.py::test_the_text_blocks_example": 11,
    "tests/leader/test_distributed.py::test_a_slower_replica_rounds": 11,
    "tests/elastic/test_elastic.py::test_a_minority_waits_writes": 11,
    "tests/replica/test_barrier.py::test_a_slow_worker_holds": 11,
    "tests/data/test_streams.py::test_a_run_killed_halfway": 11,
    "tests/elastic/test_signal_shm.py::": 9,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: -next((s for p, s in LONG.items() if item.nodeid.startswith(p)), 0))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC", "HOGWILD_"))}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@functools.cache
def zygote_of_this_process() -> Zygote:
    """This test process's zygote (tests/zygote.py), started at its first use."""
    home = Path(tempfile.mkdtemp(prefix="hogwild-zygote-"))
    zygote = Zygote(home, clean_env(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO)))
    atexit.register(zygote.close)
    return zygote


@pytest.fixture(scope="session")
def zygote() -> Zygote:
    return zygote_of_this_process()


def run_cli(args: list[str], cwd: Path, timeout: float = 180, module: str = "hogwild.cli.train",
            env: Optional[dict[str, str]] = None, fresh: bool = False) -> subprocess.CompletedProcess[str]:
    """``python -m module *args``, forked from the zygote (``fresh``: a new interpreter, where what a
    test sets in ``env`` is read as torch is imported)."""
    if fresh:
        return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True,
                              text=True, timeout=timeout, env=env or clean_env())
    return zygote_of_this_process().run(module, args, cwd, env or clean_env(), timeout)


def ranks(nproc: int, args: list[str], cwd: Path, env: dict[str, str], timeout: float = 240
          ) -> subprocess.CompletedProcess[str]:
    """``nproc`` leaders started as torchrun starts them (the same environment variables), minus
    the launcher: one process and one ``import torch`` less per job, where the launcher itself
    is not what a test is about. The first non-zero exit code, and every rank's stderr."""
    port = free_port()
    jobs = [(args, {**env, "RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(rank),
                    "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
            for rank in range(nproc)]
    done = zygote_of_this_process().run_many("hogwild.cli.train", jobs, cwd, timeout)
    code = next((d.returncode for d in done if d.returncode != 0), 0)
    return subprocess.CompletedProcess(done[0].args, code, "".join(d.stdout for d in done),
                                       "".join(d.stderr for d in done))


def session(sid: int) -> list[int]:
    """The live processes of session ``sid``: a job started in a session of its own
    (``Zygote.start(session=True)``, ``Popen(start_new_session=True)``) and everything it started,
    its fork server, workers and DataLoader processes (hogwild starts no session of its own). A
    zombie has ended: only its parent's reaping is left."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] not in "ZX" and int(fields[3]) == sid:
                out.append(int(d.name))
    return out


def wait_training(run_dir: Path, proc: subprocess.Popen, timeout: float = 120, rank: int = 0) -> None:
    """Until replica ``rank`` has applied an update (its board file says so)."""
    from hogwild.replica.board import previous_attempt

    deadline = time.monotonic() + timeout
    while True:
        seen = previous_attempt(run_dir / "progress" / f"rank{rank}.board")
        if seen is not None and seen[1] > 0:
            return
        assert proc.poll() is None, "the run ended before it trained"
        assert time.monotonic() < deadline, "no training step within the timeout"
        time.sleep(0.05)


def metrics(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "metrics.json").read_text())


def assert_replicas_agree(m: dict[str, Any], replicas: int) -> None:
    """Every replica of the job ended on one model, one sync-rule state and one round count, bit
    for bit: metrics.json's ``replica_final_state`` holds a digest of each, by rank."""
    states = m["replica_final_state"]
    assert len(states) == replicas, states
    assert all(s == states[0] for s in states[1:]), f"replicas differ after the final round: {states}"


def compose_cfg(overrides: list[str]) -> Any:
    """The validated Config for ``overrides``, composed the way hogwild-train does."""
    from hogwild.config.compose import preflight, register_resolvers

    register_resolvers()
    return preflight(overrides)


@pytest.fixture
def tmp_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def tb_scalars(run_dir: Path, tag: str) -> list[float]:
    """The values TensorBoard holds for ``tag`` in ``run_dir/tb``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars(tag)]


def run_metrics(cfg: Any, run_dir: str) -> dict[str, Any]:
    """One leader in this process (the public API's path); what its metrics.json holds."""
    from hogwild.leader.choose import run

    result = run(cfg, run_dir)
    assert result.metrics is not None, result
    return result.metrics


def child_pids(pid: int) -> list[int]:
    """The live children of ``pid`` (Linux, from /proc); none once it is gone."""
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def worker_pids(leader: int) -> list[int]:
    """The leader's workers: the children of its fork server (replica/start.py; the command
    line's server is a fork of the leader, with its command line), or its own spawned children
    where the platform has no fork server."""
    out = []
    for c in child_pids(leader):
        cmd = cmdline(c)
        if "multiprocessing.forkserver" in cmd or cmd == cmdline(leader):
            out += [w for w in child_pids(c) if cmdline(w)]
        elif "multiprocessing.spawn" in cmd and "resource_tracker" not in cmd:
            out.append(c)
    return out


def torch_shm() -> set[str]:
    """torch's shared-memory files in /dev/shm (``torch_<pid>_...``)."""
    return {p.name for p in Path("/dev/shm").glob("torch_*")} if Path("/dev/shm").is_dir() else set()


def leaked_torch_shm(before: set[str]) -> set[str]:
    """torch segments that appeared since ``before`` and whose creating process is gone: a
    leak. A live process's segment belongs to a run still going (a test beside this one)."""
    def owner_alive(name: str) -> bool:
        parts = name.split("_")
        return len(parts) > 1 and parts[1].isdigit() and Path(f"/proc/{parts[1]}").exists()

    return {s for s in torch_shm() - before if not owner_alive(s)}
