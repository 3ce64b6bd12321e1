"""Side-by-side benchmarks: hogwild vs single process, DDP and an mnist_hogwild-style baseline.

    python scripts/races/bench.py --repeats 3 --out bench_results      # the full run behind BENCHMARKS.md
    python scripts/races/bench.py --tiny --out /tmp/b                  # smoke size
    python scripts/races/bench.py --tiny --only final,sync --out /tmp/b  # some sections (the smoke test)

Every comparison runs in the same invocation, repeated, and is reported as a ratio of
medians because the machine is shared and noisy. Results: ``<out>/results.json``, the
markdown tables ``<out>/table.md`` and, with matplotlib, ``<out>/scaling.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts.harness, examples
import torch  # noqa: E402

from scripts.harness.baselines import (  # noqa: E402
    CONVNET, MLP, RESNET, TINY, Workload, ddp, mnist_hogwild, single, sync_cost)
from scripts.harness.common import names, pyplot, reached, table_head, train_cmd  # noqa: E402

from hogwild.bench import PeakPss, available_cores  # noqa: E402

logger = logging.getLogger("bench")
SECTIONS = ("tta", "bn", "final", "scaling", "sync", "memory")
HERE = Path(__file__).resolve()


def _run(cmd: list[str], run_root: Path, env: dict[str, str] | None = None,
         measure_memory: bool = False) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(dir=run_root))
    cmd = [*cmd, f"run_dir={run_dir}", "checkpoint.every_s=3600"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})})
    peak = PeakPss(proc.pid, every_s=0.05)
    with peak if measure_memory else contextlib.nullcontext():
        log, _ = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{log[-3000:]}")
    m = json.loads((run_dir / "metrics.json").read_text())
    m["peak_pss_mib"] = peak.peak_mib
    return m


def hogwild(workers: int, w: Workload, target: float | None, run_root: Path, extra: tuple[str, ...] = (),
            measure_memory: bool = False) -> dict[str, Any]:
    return hogwild_torchrun(1, workers, w, run_root, extra, target, measure_memory=measure_memory)


def hogwild_torchrun(replicas: int, workers: int, w: Workload, run_root: Path, extra: tuple[str, ...] = (),
                     target: float | None = None, env: dict[str, str] | None = None,
                     measure_memory: bool = False) -> dict[str, Any]:
    """``replicas`` x ``workers`` on ``w`` (one replica: the CLI alone, more: under torchrun)."""
    args = [f"workers={workers}", *w.hydra(), *extra]
    args += [f"train.target_accuracy={target}"] if target is not None else []
    return _run(train_cmd(args, replicas), run_root, env=env, measure_memory=measure_memory)


def median_of(fn: Callable[[], dict[str, Any]], repeats: int, key: str) -> dict[str, Any]:
    runs = [fn() for _ in range(repeats)]
    vals = [float(r[key]) for r in runs if reached(r.get(key))]
    accs = [float(r["test_accuracy"]) for r in runs]
    return {"median": statistics.median(vals) if vals else float("nan"), "missed": len(runs) - len(vals),
            "accuracy": statistics.median(accs), "runs": runs}


def time_to_accuracy(w: Workload, procs: int, reps: int, runs: Path, rules: str) -> dict[str, Any]:
    """``rules``: "all" compares every sync rule, "one" only plain averaging, "none" skips them."""
    logger.info("time to %.2f on %s, %d processes, %d repeats", w.target, w.name, procs, reps)
    key = "time_to_target_s"
    out = {
        "single": median_of(lambda: single(w), reps, key),
        "ddp": median_of(lambda: ddp(procs, w), reps, key),
        "mnist_hogwild": median_of(lambda: mnist_hogwild(procs, w), reps, key),
        f"hogwild 1x{procs}": median_of(lambda: hogwild(procs, w, w.target, runs), reps, key),
    }
    if rules != "none" and procs >= 2:
        variants: dict[str, tuple[str, ...]] = {"slowmo (default)": (), "average": ("sync.mode=average",)}
        if rules == "all":
            variants.update({"broadcast": ("sync.mode=broadcast",), "diloco": ("sync.mode=diloco",),
                             "average bf16": ("sync.mode=average", "sync.dtype=bf16"),
                             "diloco bf16": ("sync.mode=diloco", "sync.dtype=bf16")})
        for label, extra in variants.items():
            out[f"hogwild {procs}x1 {label}"] = median_of(
                lambda extra=extra: hogwild_torchrun(procs, 1, w, runs, ("sync.interval=50", *extra), w.target),
                reps, key)
        # Robust rules need three replicas to differ from the mean.
        robust = {"average": ("sync.mode=average",), "median": ("sync.mode=median",),
                  "trimmed_mean": ("sync.mode=trimmed_mean",)}
        for label, extra in (robust if rules == "all" else {}).items():
            out[f"hogwild 3x1 {label}"] = median_of(
                lambda extra=extra: hogwild_torchrun(3, 1, w, runs, ("sync.interval=50", *extra), w.target),
                reps, key)
    return out


def final_accuracy(w: Workload, procs: int, reps: int, runs: Path, epochs: int) -> dict[str, Any]:
    """Same samples for everyone (``epochs`` passes over the data), no target: final accuracy."""
    logger.info("final accuracy after %d epochs on %s", epochs, w.name)
    budget = dataclasses.replace(w, target=1.01, max_epochs=epochs)
    # mnist_hogwild gives every process the full dataset: fewer epochs each for the same samples.
    per_proc = dataclasses.replace(budget, max_epochs=max(1, epochs // procs))
    key = "test_accuracy"
    return {"epochs": epochs,
            "single": median_of(lambda: single(budget), reps, key),
            "ddp": median_of(lambda: ddp(procs, budget), reps, key),
            "mnist_hogwild": median_of(lambda: mnist_hogwild(procs, per_proc), reps, key),
            f"hogwild 1x{procs}": median_of(lambda: hogwild(procs, budget, None, runs), reps, key),
            f"hogwild {procs}x1 average": median_of(
                lambda: hogwild_torchrun(procs, 1, budget, runs, ("sync.interval=50", "sync.mode=average")), reps, key),
            f"hogwild {procs}x1 slowmo": median_of(
                lambda: hogwild_torchrun(procs, 1, budget, runs, ("sync.interval=50",)), reps, key)}


def scaling(cores: int, reps: int, steps: int, runs: Path) -> dict[str, Any]:
    logger.info("intra-machine scaling, 1..%d workers", cores)
    res: dict[str, Any] = {}
    for name, extra in (("mlp_digits", ()), ("sparse_synthetic", ("+experiment=sparse",))):
        rates = {k: median_of(lambda k=k: _run(train_cmd([f"workers={k}", *extra, "eval.every_s=60",
                                                          f"train.max_steps={steps * k}"]), runs),
                              reps, "samples_per_s")["median"] for k in range(1, cores + 1)}
        res[name] = {str(k): {"samples_per_s": r, "efficiency": r / (k * rates[1])} for k, r in rates.items()}
    return res


def memory(procs: int, runs: Path, tiny: bool) -> dict[str, Any]:
    """Peak PSS of the whole process tree: hogwild (leader + K workers) vs DDP (launcher + K ranks)."""
    hidden = 4096 if tiny else 65536
    w = Workload("mlp_wide", "mlp", target=1.01, lr=0.01, max_epochs=1 if tiny else 2, eval_every=10**9,
                 eval_every_s=60, hidden=hidden)
    h = hogwild(procs, w, None, runs, measure_memory=True)
    proc = subprocess.Popen([sys.executable, str(HERE), "--ddp-child", str(procs), "--hidden", str(hidden),
                             "--epochs", str(w.max_epochs)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with PeakPss(proc.pid, every_s=0.05) as peak:
        proc.wait(900)
    params = 64 * hidden + hidden + hidden * 10 + 10
    return {"params": params, "model_mib": params * 4 / 2**20, "processes": procs,
            "hogwild_peak_pss_mib": h["peak_pss_mib"], "ddp_peak_pss_mib": peak.peak_mib}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench_results"))
    ap.add_argument("--tiny", action="store_true", help="smoke-test size: seconds, not minutes")
    ap.add_argument("--only", default=",".join(SECTIONS),
                    help=f"comma-separated sections to run, of: {', '.join(SECTIONS)} (default: all)")
    ap.add_argument("--ddp-child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--hidden", type=int, default=128, help=argparse.SUPPRESS)
    ap.add_argument("--epochs", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    only = set(names(ap, "--only", args.only, SECTIONS, "section(s) "))
    logging.basicConfig(level=logging.INFO, format="[bench] %(message)s")
    if args.ddp_child:  # memory run of the DDP baseline, measured from the parent
        ddp(args.ddp_child, Workload("mlp_wide", "mlp", 1.01, 0.01, args.epochs, 10**9, 60, hidden=args.hidden))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    runs = args.out / "runs"
    runs.mkdir(exist_ok=True)
    cores = available_cores()
    # Two processes whatever the cores: with one core, 1 x 1 against "2 x 1" of one replica would
    # compare a method with itself; on one core the two processes take turns, alike for every method.
    procs, reps = 2, (1 if args.tiny else args.repeats)
    res: dict[str, Any] = {"cores": cores, "processes": procs, "repeats": reps, "torch": torch.__version__,
                           "device": "cpu"}
    workloads = [TINY] if args.tiny else [MLP, CONVNET]
    plan = {TINY.name: "one", MLP.name: "all", CONVNET.name: "none"}
    if "tta" in only:
        res["time_to_accuracy"] = {
            w.name: {"target": w.target, **time_to_accuracy(w, procs, reps, runs, plan[w.name])} for w in workloads}
    if "bn" in only and not args.tiny:
        logger.info("time to %.2f on %s: DDP against hogwild, %d processes", RESNET.target, RESNET.name, procs)
        key = "time_to_target_s"
        res.setdefault("time_to_accuracy", {})[RESNET.name] = {
            "target": RESNET.target, "ddp": median_of(lambda: ddp(procs, RESNET), reps, key),
            f"hogwild 1x{procs}": median_of(lambda: hogwild(procs, RESNET, RESNET.target, runs), reps, key)}
    if "final" in only:
        res["final_accuracy"] = final_accuracy(TINY if args.tiny else MLP, procs, reps, runs, 3 if args.tiny else 30)
    if "scaling" in only:
        res["scaling"] = scaling(cores, reps, 200 if args.tiny else 3000, runs)
    if "sync" in only and procs >= 2:
        logger.info("sync cost vs bare all_reduce")
        res["sync"] = {}
        for label, n in (("mlp_digits", 9610), ("1M", 1_000_000), ("10M", 10_000_000)):
            if args.tiny and n > 9610:
                continue
            costs = sync_cost(n, reps=20 if args.tiny or n >= 10_000_000 else 100, modes=("average", "slowmo"))
            for mode, c in costs.items():
                res["sync"][f"{label} {mode}"] = {"floats": n, "rule": mode, **c,
                                                  "ratio": c["sync_round_s"] / c["bare_allreduce_s"]}
    if "memory" in only:
        logger.info("memory")
        res["memory"] = memory(procs, runs, args.tiny)
    (args.out / "results.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    text = table(res)
    (args.out / "table.md").write_text(text)
    plot(res, args.out)
    sys.stdout.write(text)


def table(res: dict[str, Any]) -> str:
    lines: list[str] = []
    for wname, t in res.get("time_to_accuracy", {}).items():
        ddp_s = t["ddp"]["median"]
        ref = next(v["median"] for k, v in t.items() if k.startswith("hogwild 1x"))
        lines += [f"### Time to {t['target']:.2f} test accuracy, {wname}, {res['processes']} processes "
                  f"(median of {res['repeats']}, training clock)", "",
                  *table_head("method", "median s", "missed", "median final acc", "DDP time / this",
                              "this / hogwild 1xK")]
        for k, v in t.items():
            if k == "target":
                continue
            lines.append(f"| {k} | {v['median']:.3f} | {v['missed']} | {v['accuracy']:.4f} | "
                         f"{ddp_s / v['median']:.2f}x | {v['median'] / ref:.2f}x |")
        starts = [r["startup_s"] for k, v in t.items() if k.startswith("hogwild 1x") for r in v["runs"]]
        lines += ["", f"hogwild startup (launch to first step, median): {statistics.median(starts):.2f} s", ""]
    if "final_accuracy" in res:
        fa = res["final_accuracy"]
        lines += [f"### Final test accuracy after {fa['epochs']} epochs' worth of samples, same for every method "
                  f"(median of {res['repeats']})", "", *table_head("method", "accuracy", "minus DDP, points")]
        lines += [f"| {k} | {v['median']:.4f} | {100 * (v['median'] - fa['ddp']['median']):+.2f} |"
                  for k, v in fa.items() if k != "epochs"]
        lines.append("")
    for name, rows in res.get("scaling", {}).items():
        lines += [f"### Scaling, {name}", "", *table_head("workers", "samples/s", "efficiency")]
        lines += [f"| {k} | {v['samples_per_s']:,.0f} | {v['efficiency']:.2f} |" for k, v in rows.items()]
        lines.append("")
    if "sync" in res:
        lines += ["### Sync cost, 2 ranks, Gloo on loopback (median; same processes)", "",
                  *table_head("buffer", "floats", "rule", "bare all_reduce ms", "sync round ms", "ratio")]
        lines += [f"| {k.rsplit(' ', 1)[0]} | {v['floats']:,} | {v['rule']} | {v['bare_allreduce_s'] * 1e3:.3f} | "
                  f"{v['sync_round_s'] * 1e3:.3f} | {v['ratio']:.2f}x |" for k, v in res["sync"].items()]
        lines.append("")
    if "memory" not in res:
        return "\n".join(lines)
    m = res["memory"]
    lines += [f"### Memory, {m['processes']} processes, mlp with {m['params']:,} parameters "
              f"({m['model_mib']:.1f} MiB)", "",
              "| | peak PSS of the process tree, MiB |", "|---|---|",
              f"| hogwild (leader + workers) | {m['hogwild_peak_pss_mib']:.0f} |",
              f"| DDP (launcher + ranks) | {m['ddp_peak_pss_mib']:.0f} |", ""]
    return "\n".join(lines)


def plot(res: dict[str, Any], out: Path) -> None:
    if "scaling" not in res or "time_to_accuracy" not in res:
        return  # nothing to draw: matplotlib (a second of imports) is not even loaded
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for name, rows in res["scaling"].items():
        ks = [int(k) for k in rows]
        axes[0].plot(ks, [rows[str(k)]["efficiency"] for k in ks], marker="o", label=name)
    top = max(v["efficiency"] for rows in res["scaling"].values() for v in rows.values())
    axes[0].set(xlabel="workers", ylabel="efficiency", ylim=(0, max(1.2, top + 0.1)), title="intra-machine scaling")
    axes[0].legend()
    t = next(iter(res["time_to_accuracy"].values()))
    names = [k for k in t if k != "target"]
    axes[1].barh(names, [t[k]["median"] for k in names])
    axes[1].set(xlabel="seconds to target (log; missing bar = target missed)", xscale="log",
                title="time to accuracy")
    fig.tight_layout()
    fig.savefig(out / "bench.png", dpi=100)


if __name__ == "__main__":
    main()
