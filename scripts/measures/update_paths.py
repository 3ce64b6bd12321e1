"""The two update paths side by side (optim.update): what each holds in memory, and which trains
plain SGD faster.

``memory``: the GPT of ``+experiment=gpt`` (4 layers, 0.8M parameters) at 1, 2 and 4 workers,
40 batches a worker: the replica's peak memory (metrics.json's ``peak_memory_mb``: leader and
workers, the shared model once) under AdamW on the barrier (one state per replica, the default),
AdamW under Hogwild with per-worker state, and SGD under Hogwild, which keeps no state at all, so
its growth with the workers is the extra processes' own cost.

``sgd``: the digits MLP with plain SGD (the default run), 2 workers, time to a test accuracy of 0.95
under Hogwild (the default for SGD) and under the barrier, configurations interleaved, one seed per
repeat.

``small``: the workloads whose steps take a millisecond or two, where a step's meeting costs most:
the digits MLP under AdamW (lr 0.003, 2 workers, time to 0.95) and ``+experiment=clicks`` (Adagrad on
sparse tables and a small dense MLP, 2 workers, one pass: its seconds and final log-loss), each
under both paths.

    python scripts/measures/update_paths.py --repeats 3 --out bench_results
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts.harness, examples
from scripts.harness.common import table_head
from scripts.harness.common import train as run

logger = logging.getLogger("update_paths")

GPT = ["+experiment=gpt", "model.kwargs.config.n_layer=4", "+data.test_chars=120000", "eval.every_s=1000",
       "checkpoint.every_s=1000"]
MEMORY = {"AdamW, barrier (default)": ["optim=adamw"],
          "AdamW, hogwild, per-worker state": ["optim=adamw", "optim.update=hogwild"],
          "SGD, hogwild (no state)": ["optim=sgd", "optim.lr=0.1", "sched.name=constant"]}
SGD = {"hogwild (default)": [], "barrier": ["optim.update=barrier"]}


def memory(repeats: int, tmp: Path) -> dict[str, dict[int, list[float]]]:
    out: dict[str, dict[int, list[float]]] = {name: {w: [] for w in (1, 2, 4)} for name in MEMORY}
    for rep in range(repeats):
        for workers in (1, 2, 4):
            for name, extra in MEMORY.items():
                m = run([*GPT, *extra, f"workers={workers}", f"train.max_steps={40 * workers}", f"train.seed={rep}"],
                        tmp / "run")
                out[name][workers].append(float(m["peak_memory_mb"]))
                logger.info("%s, %d workers: peak %.0f MiB", name, workers, m["peak_memory_mb"])
    return out


def sgd(repeats: int, tmp: Path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {name: [] for name in SGD}
    for rep in range(repeats):
        for name, extra in SGD.items():
            m = run(["workers=2", "train.target_accuracy=0.95", "eval.every_s=0.1", f"train.seed={rep}", *extra],
                    tmp / "run")
            t = m["time_to_target_s"]
            out[name].append(float(t) if t is not None else float("inf"))
            logger.info("SGD %s, seed %d: %.2f s to 0.95", name, rep, out[name][-1])
    return out


SMALL = {"digits AdamW": ["optim=adamw", "optim.lr=0.003", "workers=2", "train.target_accuracy=0.95",
                          "eval.every_s=0.1"],
         "clicks Adagrad": ["+experiment=clicks", "workers=2", "eval.every_s=1000"]}


def small(repeats: int, tmp: Path) -> dict[str, dict[str, list[dict[str, float]]]]:
    out: dict[str, dict[str, list[dict[str, float]]]] = {w: {"hogwild": [], "barrier": []} for w in SMALL}
    for rep in range(repeats):
        for work, args in SMALL.items():
            for path in ("hogwild", "barrier"):
                m = run([*args, f"optim.update={path}", f"train.seed={rep}"], tmp / "run")
                out[work][path].append({"train_s": m["train_s"], "time_to_target_s": m["time_to_target_s"],
                                        "test_logloss": m.get("test_logloss"), "test_accuracy": m.get("test_accuracy"),
                                        "barrier_wait_fraction": m["barrier_wait_fraction"]})
                logger.info("%s, %s, seed %d: %s", work, path, rep, out[work][path][-1])
    return out


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parts", nargs="+", choices=("memory", "sgd", "small"), default=["memory", "sgd", "small"])
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    result: dict[str, Any] = {"command": sys.argv}
    with tempfile.TemporaryDirectory() as tmp:
        if "memory" in a.parts:
            mem = memory(a.repeats, Path(tmp))
            result["memory_mb"] = mem
            print(*table_head("optimizer, path", "1 worker", "2 workers", "4 workers", "4 workers - 1 worker"),
                  sep="\n")
            for name, by in mem.items():
                med = {w: statistics.median(v) for w, v in by.items()}
                print(f"| {name} | {med[1]:,.0f} | {med[2]:,.0f} | {med[4]:,.0f} | {med[4] - med[1]:,.0f} |")
        if "sgd" in a.parts:
            times = sgd(a.repeats, Path(tmp))
            result["sgd_time_to_0.95_s"] = times
            print(*table_head("SGD, 2 workers", "median s to 0.95", "runs"), sep="\n")
            for name, ts in times.items():
                print(f"| {name} | {statistics.median(ts):.2f} | {', '.join(f'{t:.2f}' for t in ts)} |")
        if "small" in a.parts:
            got = small(a.repeats, Path(tmp))
            result["small"] = got
            print("| workload | path | median s (digits: to 0.95; clicks: the pass) | clicks: median log-loss | "
                  "median wait share |\n|---|---|---|---|---|")
            for work, by in got.items():
                for path, rs in by.items():
                    key = "time_to_target_s" if work.startswith("digits") else "train_s"
                    t = statistics.median(r[key] if r[key] is not None else float("inf") for r in rs)
                    ll = [r["test_logloss"] for r in rs if r["test_logloss"] is not None]
                    print(f"| {work} | {path} | {t:.2f} | {statistics.median(ll):.4f} |" if ll else
                          f"| {work} | {path} | {t:.2f} | – |", end="")
                    print(f" {statistics.median(r['barrier_wait_fraction'] for r in rs):.2f} |")
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "update_paths.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
