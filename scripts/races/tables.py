"""Embedding tables on one machine with every core busy: hogwild 1 x W (W workers sharing one
table in shared memory) against DDP with W processes (each holding the whole table and its
Adagrad state, all-reducing each step's sparse gradients), on the clicks DLRM
(examples/clicks.py), side by side in one invocation.

Each run trains one pass over the click log and reports the time to a test log-loss (read off
evaluations during the run of the same first ``--eval-batches`` x 2048 test samples: hogwild's
TensorBoard ``test/logloss``, on its clock, at most ``--eval-fraction`` of it; DDP's rank 0 every
``--ddp-eval-every`` steps, off its clock), the final log-loss on the whole test split, and the
**machine-wide** peak
memory: the proportional set size (PSS) of every process of the run, summed, sampled four
times a second (for hogwild also ``metrics.json``'s breakdown, ``memory_mb``).

    python scripts/races/tables.py --rows 1000000 --tables 2 --target 0.611 --repeats 3
    python scripts/races/tables.py --rows 10000000 --tables 1 --target 0.5545 --repeats 3 --busy

``--busy``: a process spinning on core 0 for every run (one core shared with a busy process).
Methods run in turn within each repeat, so the medians compare runs made under the same load.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from scripts.harness import links  # noqa: E402
from scripts.races import rows  # noqa: E402
from scripts.harness.common import busy_core, metrics, names, result_line, train_cmd  # noqa: E402

from hogwild.bench import PeakPss  # noqa: E402

logger = logging.getLogger("tables")

# hogwild's variants: the clicks experiment's own settings (one row-wise Adagrad state in shared
# memory), per-worker elementwise state as mnist_hogwild keeps it (the log-loss comparison), and
# one elementwise state in shared memory.
HOGWILD = {"hogwild": [], "hogwild_worker_state": ["optim.state=worker", "optim.rowwise=false"],
           "hogwild_shared_state": ["optim.state=shared", "optim.rowwise=false"]}
METHODS = (*HOGWILD, "ddp_sparse")
DEFAULT_METHODS = ("hogwild", "hogwild_worker_state", "ddp_sparse")


def _run(cmds: list[list[str]], timeout: float, cores: int) -> tuple[list[str], float]:
    """Run ``cmds`` side by side on the first ``cores`` cores; their logs and the machine-wide peak
    PSS in MiB."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "GLOO_SOCKET_IFNAME": "lo"}
    # Both methods get W cores of a larger machine: hogwild sizes its workers' threads to the cores
    # it may use, DDP's ranks run one thread each.
    pin = ["taskset", "-c", f"0-{cores - 1}"] if cores < (os.cpu_count() or 1) else []
    procs = [subprocess.Popen([*pin, *c], env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for c in cmds]
    with PeakPss(*(p.pid for p in procs)) as peak:  # every process of the run, machine-wide
        try:
            logs = [p.communicate(timeout=timeout)[0] for p in procs]
        finally:
            for p in procs:
                p.kill()
    failed = [f"process {i} exit {p.returncode}: {log[-1500:]}" for i, (p, log) in enumerate(zip(procs, logs))
              if p.returncode != 0]
    if failed:
        raise RuntimeError(" | ".join(failed))
    return logs, peak.peak_mib


def hogwild(a: argparse.Namespace, extra: list[str], root: Path) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(dir=root))
    batches = [f"eval.max_batches={a.eval_batches}"] if a.eval_batches else []
    cmd = train_cmd([*rows.workload(a), f"workers={a.workers}", f"eval.every_s={a.eval_every_s}",
                     f"eval.max_fraction={a.eval_fraction}", *batches, "checkpoint.every_s=3600", f"run_dir={run_dir}",
                     *extra])
    _, peak = _run([cmd], a.run_timeout_s, a.workers)
    m = metrics(run_dir)
    curve = [(round(t, 3), round(v, 5)) for t, v in rows.evaluations(run_dir)]
    return {"time_to_target_s": rows.first_below(run_dir, a.target), "curve": curve,
            "final_logloss": m["test_logloss"], "auc": m["test_auc"], "machine_peak_mb": peak,
            "memory_mb": m.get("memory_mb"), "train_s": m["train_s"], "steps": m["steps"],
            "eval_fraction": m.get("eval_fraction")}


def ddp(a: argparse.Namespace) -> dict[str, Any]:
    a.machines, a.loopback = 1, True  # rows.ddp_rank_cmd's world: W ranks on this machine
    a.eval_samples = a.eval_batches * 2048  # hogwild's evaluation batches
    port = links.port()
    logs, peak = _run([rows.ddp_rank_cmd(a, r, port, sparse=True, full_pass=True) for r in range(a.workers)],
                      a.run_timeout_s, a.workers)
    r = result_line(logs[0])
    return {"time_to_target_s": r["time_to_target_s"], "final_logloss": r["final_logloss"],
            "machine_peak_mb": peak, "steps": r["steps"] * a.workers, "train_s": r["step_s"] * r["steps"],
            "curve": r["curve"]}


def median(runs: list[dict[str, Any]], key: str) -> Optional[float]:
    vals = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
    return statistics.median(vals) if vals else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="hogwild workers of one replica; DDP processes")
    rows.click_args(ap, samples=800_000, test_fraction=0.05,
                    fraction_help="of the samples, held out (40,000 by default)")
    ap.add_argument("--eval-every-s", type=float, default=0.5)
    ap.add_argument("--eval-fraction", type=float, default=0.2, help="hogwild: eval.max_fraction")
    ap.add_argument("--eval-batches", type=int, default=0,
                    help="test batches of 2048 scored during training (0: the whole test split)")
    ap.add_argument("--ddp-eval-every", type=int, default=50, help="DDP steps between evaluations (off its clock)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS), help=f"of {','.join(METHODS)}")
    ap.add_argument("--busy", action="store_true", help="a process spinning on core 0 for every run")
    ap.add_argument("--retries", type=int, default=2, help="a failed run is made again up to this many times")
    ap.add_argument("--run-timeout-s", type=float, default=1800.0)
    ap.add_argument("--out", type=Path, default=Path("bench_results/tables"))
    ap.add_argument("--name", default=None)
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="[tables] %(message)s")
    os.chdir(REPO)  # +experiment=clicks imports examples/ from the working directory
    methods = names(ap, "--methods", a.methods, METHODS)
    a.out.mkdir(parents=True, exist_ok=True)
    root = a.out / "runs"
    root.mkdir(exist_ok=True)
    name = a.name or f"clicks_{a.tables}x{a.rows}_w{a.workers}{'_busy' if a.busy else ''}"
    res: dict[str, Any] = {"args": {k: str(v) for k, v in vars(a).items()}, "cores": os.cpu_count(),
                           "runs": {m: [] for m in methods}}
    for rep in range(a.repeats):
        for m in methods:
            r, crashes = {}, []
            for _ in range(1 + a.retries):
                try:
                    with busy_core(0 if a.busy else None):  # --busy: a process spinning on core 0
                        r = ddp(a) if m == "ddp_sparse" else hogwild(a, HOGWILD[m], root)
                    break
                except Exception as e:  # noqa: BLE001 - one failed run must not lose the others' figures
                    # DDP's Gloo thread on this host sometimes dies of a general protection fault in its
                    # sparse all-reduce (dmesg: pt_gloo_runloop); the run is counted and made again.
                    logger.error("%s failed: %s", m, str(e)[:400])
                    crashes.append(str(e)[:300])
                    r = {"error": str(e)[-1500:]}
            r["failed_runs"] = len(crashes)
            logger.info("repeat %d %s: %s", rep + 1, m, json.dumps(r))
            res["runs"][m].append(r)
            time.sleep(1.0)
        res["medians"] = {m: {k: median(res["runs"][m], k) for k in
                              ("time_to_target_s", "final_logloss", "machine_peak_mb", "train_s", "steps")}
                          for m in methods}
        (a.out / f"{name}.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    for m, med in res["medians"].items():
        logger.info("%s: %s", m, json.dumps(med))
    logger.info("results in %s", a.out / f"{name}.json")


if __name__ == "__main__":
    main()
