"""torch.compile against eager (``train.compile``): training steps/s and start-up seconds.

Two workloads, each hogwild 1 replica x 2 workers: the GPT of ``+experiment=gpt`` (examples/gpt.py,
AdamW on the barrier; its test split cut to 120,000 characters so the final evaluation stays short)
and the digits MLP of the default config (SGD, Hogwild). Each runs eager (``train.compile=off``)
and compiled (``train.compile=default``, or ``--mode``), the two alternately (eager, compiled,
eager, compiled, ...) so a change in the host's load hits both alike; medians of ``--repeats``.
Evaluation and checkpoints are kept off the training clock (``eval.every_s`` and
``checkpoint.every_s`` past the run).

From each run's metrics.json: steps/s is ``steps / train_s`` (worker updates of both workers over
the training wall time, first step to last, which includes any recompile during training: the
short last batch of an epoch, a new shape); start-up is ``startup_s`` (the leader's start to the
first step: for compiled runs the leader's compiler probe and each worker's compile of the model
in its warm-up step). ``process_s`` is the whole command, interpreter start to exit.

Before the timed runs each workload runs compiled once, briefly and untimed, so that inductor's
on-disk cache is warm as on any run after a machine's first (``--cold`` skips it: the first
compiled run then pays the cold cache, tens of seconds).

    python scripts/measures/compile_bench.py --repeats 3 --out bench_results
    python scripts/measures/compile_bench.py --workloads digits --steps 100 --repeats 1   # a quick check
"""

from __future__ import annotations

import argparse
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts.harness, examples
from scripts.harness.common import REPO, metrics, table_head, train_cmd, write_results

logger = logging.getLogger("compile_bench")

WORKLOADS = {"gpt": ["+experiment=gpt", "+data.test_chars=120000"], "digits": []}
STEPS = {"gpt": 600, "digits": 3000}
COMMON = ["workers=2", "eval.every_s=100000", "checkpoint.every_s=100000", "resume=false"]
PRIME_STEPS = 40


def run(args: list[str], run_dir: Path, timeout: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    proc = subprocess.run(train_cmd([*COMMON, *args, f"run_dir={run_dir}"]), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    process_s = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"compile_bench: {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    m = metrics(run_dir)
    return {"steps": m["steps"], "train_s": m["train_s"], "steps_per_s": m["steps"] / m["train_s"],
            "startup_s": m["startup_s"], "process_s": process_s, "test_loss": m.get("test_loss"),
            "test_accuracy": m.get("test_accuracy")}


def table(runs: dict[str, dict[str, list[dict[str, Any]]]], repeats: int) -> str:
    lines = table_head("workload", "mode", f"steps/s (median of {repeats})", "start-up s (median)",
                       "process s (median)", "test loss (median)", "steps/s, runs")
    for work, by in runs.items():
        for mode, rs in by.items():
            med = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731
            each = ", ".join(f"{r['steps_per_s']:.1f}" for r in rs)
            lines.append(f"| {work} | {mode} | {med('steps_per_s'):.1f} | {med('startup_s'):.1f} | "
                         f"{med('process_s'):.1f} | {med('test_loss'):.4f} | {each} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workloads", nargs="+", choices=tuple(WORKLOADS), default=list(WORKLOADS))
    ap.add_argument("--steps", type=int, default=None,
                    help=f"train.max_steps of every run (default: {', '.join(f'{k} {v}' for k, v in STEPS.items())})")
    ap.add_argument("--mode", default="default", choices=("default", "reduce-overhead", "max-autotune",
                                                          "max-autotune-no-cudagraphs"),
                    help="the compiled runs' train.compile")
    ap.add_argument("--cold", action="store_true", help="no untimed compiled run first: a cold inductor cache")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds one run may take")
    ap.add_argument("--out", type=Path, default=REPO / "bench_results")
    ap.add_argument("--name", default="compile_bench", help="the results' file name")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    modes = {"eager": ["train.compile=off"], f"compiled ({args.mode})": [f"train.compile={args.mode}"]}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {w: {m: [] for m in modes} for w in args.workloads}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.cold:
            for work in args.workloads:
                r = run([*WORKLOADS[work], *modes[f"compiled ({args.mode})"], f"train.max_steps={PRIME_STEPS}"],
                        Path(tmp) / "prime", args.timeout)
                logger.info("%s: untimed compiled run (warms inductor's cache): start-up %.1f s", work, r["startup_s"])
        for rep in range(args.repeats):
            for work in args.workloads:
                steps = args.steps or STEPS[work]
                for mode, extra in modes.items():  # alternately: eager, compiled, eager, compiled, ...
                    r = run([*WORKLOADS[work], *extra, f"train.max_steps={steps}", f"train.seed={rep}"],
                            Path(tmp) / f"{work}_{rep}_{mode.split()[0]}", args.timeout)
                    runs[work][mode].append(r)
                    logger.info("repeat %d/%d %s %s: %.1f steps/s, start-up %.1f s, process %.1f s, test loss %.4f",
                                rep + 1, args.repeats, work, mode, r["steps_per_s"], r["startup_s"], r["process_s"],
                                r["test_loss"])
    write_results(args.out, args.name, {"command": sys.argv, "steps": args.steps, "mode": args.mode, "cold": args.cold,
                                        "runs": runs}, table(runs, args.repeats), indent=1)


if __name__ == "__main__":
    main()
