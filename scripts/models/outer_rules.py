"""The outer rules alone, seed by seed: how many steps each needs to a target when nothing else
varies. R replicas train in one process in lockstep (no lock-free updates, no lag, no clock),
meet every ``--interval`` steps through hogwild's own rule classes, and the synced model is
evaluated right after each round, as torchft's DiLoCo script does. Seed s sets the initial
weights, the shards and the data order as ``train.seed=s`` does in a hogwild job, so seed 0 is
the run ``scripts/races/torchft_diloco.py`` makes.

    python scripts/models/outer_rules.py --seeds 16 --target 0.96 --out bench_results/outer_rules

A run that does not reach the target within ``--rounds`` rounds counts as infinitely slow in the
median. Results: ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts.harness, examples
import torch  # noqa: E402
from scripts.harness.baselines import MLP, Workload, sgd_step  # noqa: E402
from scripts.harness.common import names, table_head, write_results  # noqa: E402
from torch.nn.utils import parameters_to_vector, vector_to_parameters  # noqa: E402

from hogwild.bench import sync_round, sync_rule  # noqa: E402

logger = logging.getLogger("outer_rules")
RULES = ("slowmo", "diloco", "average")


def steps_to_target(w: Workload, mode: str, seed: int, replicas: int, interval: int,
                    rounds: int) -> tuple[Optional[int], float]:
    """(replica steps at the first round whose synced model reads ``w.target``, or None; the best
    accuracy any round's synced model read)."""
    torch.set_num_threads(1)
    w = dataclasses.replace(w, seed=seed)
    ds = w.data()
    models = [w.build(ds) for _ in range(replicas)]  # one seed: the same initial weights
    opts = [torch.optim.SGD(m.parameters(), lr=w.lr) for m in models]
    samplers = [w.sampler(ds, replicas, r) for r in range(replicas)]
    # The rule as an R-replica job gets it, fed the replicas' mean in one process.
    rule = sync_rule(parameters_to_vector(models[0].parameters()).detach().clone(), mode, lockstep=replicas)
    best = 0.0
    for k in range(1, rounds + 1):
        for r, (model, opt) in enumerate(zip(models, opts)):
            for step in range((k - 1) * interval, k * interval):
                sgd_step(model, opt, ds, samplers[r].batch(step))
        mean = torch.stack([parameters_to_vector(m.parameters()).detach() for m in models]).mean(0)
        sync_round(mean, rule)  # the replicas' mean in, the rule's synced model out
        for model in models:  # a copy each: vector_to_parameters makes the parameters views of its vector
            vector_to_parameters(mean.clone(), model.parameters())
        acc = w.accuracy(models[0], ds)
        best = max(best, acc)
        if acc >= w.target:
            return k * interval, best
    return None, best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rules", default=",".join(RULES))
    ap.add_argument("--seeds", type=int, default=16, help="seeds 0 .. N-1")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--interval", type=int, default=50)
    ap.add_argument("--target", type=float, default=0.96)
    ap.add_argument("--rounds", type=int, default=40, help="the budget, in rounds")
    ap.add_argument("--split-seed", type=int, default=0, help="the digits' train/test split (data.split_seed)")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("bench_results/outer_rules"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="[outer_rules] %(message)s")
    rules = names(ap, "--rules", args.rules, RULES)
    w = dataclasses.replace(MLP, target=args.target, split_seed=args.split_seed)
    jobs = [(m, s) for m in rules for s in range(args.seeds)]
    with ProcessPoolExecutor(args.procs) as pool:
        futs = {job: pool.submit(steps_to_target, w, job[0], job[1], args.replicas, args.interval, args.rounds)
                for job in jobs}
        res = {job: f.result() for job, f in futs.items()}
    table = {m: [{"seed": s, "steps": res[(m, s)][0], "best_accuracy": res[(m, s)][1]} for s in range(args.seeds)]
             for m in rules}
    lines = [f"{w.name} (split seed {args.split_seed}), {args.replicas} replicas in lockstep, interval "
             f"{args.interval}, target {args.target}, seeds 0-{args.seeds - 1}, budget {args.rounds} rounds", "",
             *table_head("rule", "median steps/replica", "missed", "seed 0", "every seed", "median best accuracy")]
    for m, runs in table.items():
        steps = [r["steps"] if r["steps"] is not None else math.inf for r in runs]
        med = statistics.median(steps)
        lines.append(f"| {m} | {med:g} | {sum(s == math.inf for s in steps)} | {steps[0]:g} | "
                     f"{', '.join(f'{s:g}' for s in steps)} | "
                     f"{statistics.median(r['best_accuracy'] for r in runs):.3f} |")
    write_results(args.out.parent, args.out.stem, {"args": {k: str(v) for k, v in vars(args).items()},
                                                   "runs": table}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
