"""Quality as the replica count R grows, at equal total samples: the samples a job needs to reach a
test accuracy on the digits MLP (SGD), for R = 2 to 16, under each sync rule (docs/scale.md,
"Quality as R grows").

    python scripts/races/quality_by_replicas.py --replicas 2 4 8 16 --repeats 2 --out bench_results/quality_by_r

Every run has the same budget of batches in all (``--batches``, split over the R replicas of one
worker each) and stops at ``--target`` test accuracy; every step is slowed ``--step-ms`` and rank 0
evaluates every 0.1 s, so evaluations land a few steps apart, and the samples to the target are its
worker's steps then x batch size x R (the replicas step at the same time). Arms: the family's
default rule (``sync.mode=auto``: SlowMo for SGD), plain averaging every 10 steps, and DiLoCo every
10 steps (its default outer rate 0.7, Nesterov 0.9); ``--variant`` adds one. ``--global-batch G``
gives each of R replicas a batch of G / R instead of 32: the same samples a round at every R, as a
user who adds machines to a job of fixed global batch would.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts.harness, examples
from scripts.harness.common import clean_env, metrics, table_head, train_cmd, write_results  # noqa: E402

logger = logging.getLogger("quality_by_r")
REPO = Path(__file__).resolve().parents[2]
ARMS: dict[str, list[str]] = {
    "default": [],
    "average/10": ["sync.mode=average", "sync.interval=10"],
    "diloco/10": ["sync.mode=diloco", "sync.interval=10"],
}
BATCH = 32


def one(arm: list[str], replicas: int, batches: int, target: float, work: Path, step_ms: int,
        batch: int = BATCH) -> dict[str, Any]:
    run_dir = work / "run"
    args = ["workers=1", f"train.max_steps={batches // replicas}", f"train.batch_size={batch}",
            f"train.target_accuracy={target}", "eval.every_s=0.1", "eval.max_fraction=0.5",
            "checkpoint.every_s=100000", f"run_dir={run_dir}", "resume=false", *arm]
    # Every step slowed (HOGWILD_FAULT): the MLP's own steps take a millisecond, so evaluations
    # every 0.1 s would land hundreds of steps apart; slowed, a few steps apart.
    slow = ",".join(f"slow:{g}:{step_ms}" for g in range(replicas))
    proc = subprocess.run(train_cmd(args, replicas), cwd=REPO, capture_output=True, text=True, timeout=900,
                          env=clean_env(OMP_NUM_THREADS="1", HOGWILD_FAULT=slow))
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"}
    m = metrics(run_dir)
    steps: Optional[float] = m.get("worker_steps_to_target")
    return {"samples_to_target": None if steps is None else steps * batch * replicas, "syncs": m["syncs"],
            "test_accuracy": m["test_accuracy"], "wall_s": m["wall_s"], "sync_mode": m["sync_mode"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, from {', '.join(ARMS)}")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=OVERRIDE[,OVERRIDE...]",
                    help="one more arm")
    ap.add_argument("--batches", type=int, default=3200, help="batches in all, split over the replicas")
    ap.add_argument("--target", type=float, default=0.93, help="test accuracy to reach")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--step-ms", type=int, default=20,
                    help="every step slowed this long (evaluations a few steps apart)")
    ap.add_argument("--global-batch", type=int, default=0,
                    help="a batch of this over R a replica (default: 32 a replica, whatever R)")
    ap.add_argument("--out", type=Path, default=Path("bench_results/quality_by_r"))
    args = ap.parse_args()
    if args.global_batch and any(args.global_batch % r for r in args.replicas):  # 0 < G < R: G % R is G
        ap.error(f"--global-batch {args.global_batch}: not a multiple of every --replicas count")
    for v in args.variant:
        name, _, overrides = v.partition("=")
        ARMS[name] = [o for o in overrides.split(",") if o]
    arms = [a for a in args.arms.split(",") if a] + [v.partition("=")[0] for v in args.variant]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or min(args.replicas) < 2 or args.repeats < 1 or not 0 < args.target <= 1:
        ap.error(f"--arms: unknown {unknown}" if unknown else "--replicas at least 2, --repeats at least 1, "
                 "--target in (0, 1]")
    logging.basicConfig(level=logging.INFO, format="[quality] %(asctime)s %(message)s", datefmt="%H:%M:%S")
    results: dict[str, dict[int, list[dict[str, Any]]]] = {a: {r: [] for r in args.replicas} for a in arms}
    with tempfile.TemporaryDirectory(prefix="hogwild-quality-") as tmp:
        for i in range(args.repeats):  # interleaved: a busy spell slows every arm alike
            for r in args.replicas:
                for a in arms:
                    got = one(ARMS[a], r, args.batches, args.target, Path(tmp), args.step_ms,
                              args.global_batch // r if args.global_batch else BATCH)
                    results[a][r].append(got)
                    logger.info("%s R=%d run %d: %s", a, r, i + 1, got)

    def cell(rs: list[dict[str, Any]]) -> str:
        reached = [x["samples_to_target"] for x in rs if x.get("samples_to_target") is not None]
        if not reached:
            return "not reached"
        med = statistics.median(reached)
        return f"{med / 1000:.1f}k" + ("" if len(reached) == len(rs) else f" ({len(reached)} of {len(rs)})")

    batch = f"global batch {args.global_batch}" if args.global_batch else f"batch {BATCH}"
    lines = [f"Samples to {args.target} test accuracy on the digits MLP (SGD, 1 worker a replica, {batch}, "
             f"{args.batches} batches in all; median of {args.repeats})", "",
             *table_head("rule", *(f"R = {r}" for r in args.replicas), f"R = {args.replicas[-1]} / R = "
                         f"{args.replicas[0]}")]
    for a in arms:
        meds = [statistics.median([x["samples_to_target"] for x in results[a][r] if x.get("samples_to_target")]
                                  or [float("nan")]) for r in args.replicas]
        cells = " | ".join(cell(results[a][r]) for r in args.replicas)
        lines.append(f"| {a} | {cells} | {meds[-1] / meds[0]:.2f} |")
    write_results(args.out, "quality_by_r", {"args": {k: str(v) for k, v in vars(args).items()}, "results": results},
                  "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
