"""Losing a replica: elastic mode (survivors go on, the replica heals on restart) against a
torchrun job (everyone restarts from the last checkpoint), side by side in one run.

    python scripts/chaos/failover.py --repeats 3 --out bench_results     # the run behind benchmarks/faults.md §8
    python scripts/chaos/failover.py --repeats 1 --out /tmp/f            # quick look

3 replicas x 1 worker on this host (Gloo on loopback), mlp on digits, every worker slowed 10 ms a
step so a run lasts long enough to kill one leader (SIGKILL) at a chosen step. Per scenario: job
wall time from launch to the last exit, and steps lost. Results: ``<out>/failover.json``/``.md``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts.harness, examples
from scripts.harness.common import free_port, metrics, table_head, train_cmd, write_results  # noqa: E402

from hogwild.bench import Coordinator, read_board  # noqa: E402

logger = logging.getLogger("failover")
REPLICAS, KILL_AT = 3, 200
COMMON = ["workers=1", "train.epochs=40", "sync.interval=20", "checkpoint.every_s=2", "eval.every_s=5",
          "train.log_every_s=5"]
# LOCAL_WORLD_SIZE: the elastic replicas share this host's cores (torchrun tells its ranks itself).
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "LOCAL_WORLD_SIZE": str(REPLICAS),
       "HOGWILD_FAULT": ",".join(f"slow:{g}:10" for g in range(REPLICAS))}


def _applied(run_dir: Path, slot: int) -> float:
    board = read_board(run_dir, slot)
    return board.applied if board is not None else 0.0


def _wait_step(run_dir: Path, slot: int, steps: float, procs: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 300
    while _applied(run_dir, slot) < steps:
        if time.monotonic() > deadline or all(p.poll() is not None for p in procs):
            raise RuntimeError(f"slot {slot} never reached step {steps}")
        time.sleep(0.02)


def _children_with_rank(pid: int, rank: int) -> Optional[int]:
    for task in Path(f"/proc/{pid}/task").glob("*"):
        for child in (task / "children").read_text().split():
            env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            if f"RANK={rank}".encode() in env and b"TORCHELASTIC_RUN_ID" in b"".join(env):
                return int(child)
    return None


def torchrun_job(kill: bool, root: Path) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(dir=root))
    cmd = train_cmd([*COMMON, f"run_dir={run_dir}"], REPLICAS, "--max-restarts=1")
    t0 = time.monotonic()
    agent = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    if kill:
        _wait_step(run_dir, 2, KILL_AT, [agent])
        leader = _children_with_rank(agent.pid, 2)
        assert leader is not None, "rank 2's leader not found"
        os.kill(leader, signal.SIGKILL)
    agent.wait(600)
    m = metrics(run_dir)
    return {"wall_s": time.monotonic() - t0, "steps_lost": m.get("steps_lost_on_resume") or 0,
            "test_accuracy": m["test_accuracy"], "stall_s": float("nan")}


def elastic_job(kill: bool, root: Path) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(dir=root))
    port = free_port()
    stop = Coordinator.serve(port)
    args = [*COMMON, f"elastic.coordinator=127.0.0.1:{port}", f"elastic.replicas={REPLICAS}", f"run_dir={run_dir}",
            "elastic.peer_timeout_s=2"]

    def start(slot: int) -> subprocess.Popen[str]:
        return subprocess.Popen(train_cmd([f"elastic.slot={slot}", *args]), env=ENV, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, text=True)
    t0 = time.monotonic()
    procs = [start(s) for s in range(REPLICAS)]
    lost = 0.0
    if kill:
        _wait_step(run_dir, 2, KILL_AT, procs)
        procs[2].kill()
        procs[2].wait()
        published = Coordinator(port, timeout_s=300).position(2) or 0.0
        lost = _applied(run_dir, 2) - published  # made after its last round: redone after the heal
        procs[2] = start(2)
    for p in procs:
        p.wait(600)
    stop.set()
    m = metrics(run_dir)
    return {"wall_s": time.monotonic() - t0, "steps_lost": lost, "test_accuracy": m["test_accuracy"],
            "stall_s": m.get("survivor_stall_s", 0.0), "heal_s": m.get("heal_s", 0.0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench_results"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="[failover] %(message)s")
    root = args.out / "runs"
    root.mkdir(parents=True, exist_ok=True)
    configs = {"torchrun, no failure": (torchrun_job, False), "elastic, no failure": (elastic_job, False),
               "torchrun, leader 2 killed": (torchrun_job, True), "elastic, leader 2 killed": (elastic_job, True)}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in configs}
    for rep in range(args.repeats):  # interleaved: slow phases of a shared host hit all alike
        for label, (fn, kill) in configs.items():
            r = fn(kill, root)
            runs[label].append(r)
            logger.info("rep %d %-26s %6.1f s, %5.0f steps lost, accuracy %.3f", rep + 1, label, r["wall_s"],
                        r["steps_lost"], r["test_accuracy"])
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in runs.items()}
    lines = [f"3 replicas x 1 worker, mlp on digits, workers slowed 10 ms/step, leader of slot 2 SIGKILLed at its "
             f"step {KILL_AT}; medians of {args.repeats}", "",
             *table_head("scenario", "job wall s", "steps lost", "survivor stall s", "heal s", "accuracy")]
    for k, v in med.items():
        lines.append(f"| {k} | {v['wall_s']:.1f} | {v['steps_lost']:.0f} | {v['stall_s']:.2f} | "
                     f"{v.get('heal_s', float('nan')):.2f} | {v['test_accuracy']:.3f} |")
    write_results(args.out, "failover", {"runs": runs, "median": med}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
