"""The language-model race of ``scripts/races/link.py --workload gpt|gpt_large``: hogwild R x 1 against
DDP (plain, fp16 hook, PowerSGD hook) and torchft's DiLoCo on the same machines and link, each arm
for the same wall-clock budget, every arm evaluated alike (``scripts/harness/arms.py``).

Per link: ``<out>/<label>.json`` (every run, curves included), ``<out>/<label>.md`` (the table) and
``<out>/<label>.png`` (test loss on the race's small split against seconds of training, every run).
The table's "time to the best other arm's loss" reads each hogwild run's curve: the first moment
(linear between evaluations) its loss is at or below the final loss of the best arm that is not
hogwild's, and that arm's training seconds over it.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

from scripts.harness import links
from scripts.harness.common import arm_summary, metrics, pyplot, result_line, table_head
from scripts.harness.arms import LM_ARMS, SIZES, Race, gpt, hogwild_overrides
from scripts.harness.arms import SCRIPT as ARMS_SCRIPT

import hogwild

logger = logging.getLogger("link")
REPO = Path(__file__).resolve().parents[2]


def hogwild_run(args: argparse.Namespace, extra: list[str], root: Path, seed: int) -> dict[str, Any]:
    """hogwild M x C on the machines (C: ``--cores-per-machine``), then its final checkpoint scored on
    the whole test split."""
    run_dir = Path(tempfile.mkdtemp(dir=root))
    cmds = links.torchrun_on_machines(args.machines, [*hogwild_overrides(args.workload, args.budget, args.eval_every_s),
                                                      f"workers={links.CORES}", f"train.seed={seed}",
                                                      f"run_dir={run_dir}", *extra])
    _, sent = links.on_machines(cmds, links.RUN_TIMEOUT_S)
    return {**hogwild_result(args.workload, run_dir, args.machines, sent), "seed": seed}


def hogwild_result(workload: str, run_dir: Path, replicas: int, sent: float = 0.0) -> dict[str, Any]:
    """A finished hogwild run of the race: its final model scored as the other arms score theirs,
    its curve, and what its ``metrics.json`` says of its rounds (``sent``: bytes a replica's link
    carried, measured outside it)."""
    m = metrics(run_dir)
    steps = max(m["steps"], 1) / replicas
    # The job's final model, scored as the other arms score theirs (scripts.harness.arms.Race.scores).
    model = hogwild.load_model(run_dir / "checkpoints" / "last.pt", model=gpt(workload))
    subset, loss = Race(argparse.Namespace(size=workload, seed=0, rank=0)).scores(model)
    curve = [{"s": e["s"], "step": e["step"], "loss": e["loss"]} for e in m["evaluations"]]
    curve.append({"s": m["train_s"], "step": m["steps"], "loss": subset})
    return {"loss": loss, "steps": m["steps"], "steps_per_replica": steps, "train_s": m["train_s"],
            "tokens_per_s": m["samples_per_s"] * 64, "curve": curve, "eval_fraction": m["eval_fraction"],
            "tx_bytes_per_step": sent / steps, "bytes_per_step": m["sync_bytes_per_step"], "syncs": m["syncs"],
            "link_s": m["sync_link_s"], "sync_cpu_s": m["sync_cpu_s"], "lag_wait_s": m["lag_wait_s"],
            "steps_per_sync": m["steps_per_sync"], "final_interval": m["final_interval"], "update": m.get("update"),
            "steps_per_sync_per_replica": m.get("steps_per_sync_per_replica"),
            "sync_mode": m.get("sync_mode"), "sync_wire": m.get("sync_wire"),
            "sync_wire_climbs": m.get("sync_wire_climbs"), "time_s": m.get("time_s"),
            "barrier_wait_fraction": m.get("barrier_wait_fraction"), "samples": m.get("samples"),
            "batch_parts": m.get("batch_parts"), "late_gradients": m.get("late_gradients"),
            "wait_bound": m.get("wait_bound")}


def arm_run(args: argparse.Namespace, arm: str, seed: int) -> dict[str, Any]:
    """One outside arm (scripts/harness/arms.py), a rank on each machine; ``arm`` may end in
    ``@LR``, its peak rate (else ``--lr``)."""
    port = links.port()
    arm, _, lr = arm.partition("@")
    name, rank = (arm[:-1], arm[-1]) if arm.startswith("ddp_powersgd") else (arm, "2")
    # C ranks a machine (--cores-per-machine), rank r on machine r // C.
    where = [i for i in range(args.machines) for _ in range(links.CORES)]
    cmds = [[sys.executable, str(ARMS_SCRIPT), "--arm", name, "--rank", str(r),
             "--world", str(len(where)), "--addr", links.addr(0), "--host", links.addr(i), "--port", str(port),
             "--size", args.workload, "--budget", str(args.budget), "--lr", lr or str(args.lr),
             "--eval-every-s", str(args.eval_every_s), "--seed", str(seed), "--powersgd-rank", rank,
             "--interval", str(args.diloco_interval)] for r, i in enumerate(where)]
    logs, sent = links.on_machines(cmds, links.RUN_TIMEOUT_S, where)
    r = result_line(logs[0])
    return {**r, "tx_bytes_per_step": sent / max(r["steps_per_replica"], 1), "seed": seed}


def time_to(curve: list[dict[str, float]], loss: float) -> float:
    """The first moment ``curve`` reads ``loss`` or less, linear between its points (inf: never)."""
    prev: Optional[dict[str, float]] = None
    for p in curve:
        if p["loss"] <= loss:
            if prev is None or prev["loss"] == p["loss"]:
                return p["s"]
            return prev["s"] + (p["s"] - prev["s"]) * (prev["loss"] - loss) / (prev["loss"] - p["loss"])
        prev = p
    return math.inf


def summary(runs: dict[str, list[dict[str, Any]]], ours: set[str]) -> dict[str, dict[str, Any]]:
    """Medians per arm; each of ``ours`` (hogwild's arms) also gets its time to the loss the best
    other arm ends with."""
    out = {arm: arm_summary(rs, ("loss", "train_s", "steps_per_replica", "tokens_per_s", "tx_bytes_per_step",
                                  "eval_fraction")) for arm, rs in runs.items()}
    others = {a: v for a, v in out.items() if a not in ours and "loss" in v}
    if others:
        best = min(others, key=lambda a: others[a]["curve_end"])
        bar = others[best]["curve_end"]
        for arm, v in out.items():
            if arm in ours and "loss" in v:
                times = [time_to(r["curve"], bar) for r in v["runs"] if "error" not in r]
                v["time_to_best_other"] = statistics.median(times)
                v["best_other"] = best
                v["sooner"] = others[best]["train_s"] / v["time_to_best_other"]
    return out


def report(head: dict[str, Any], res: dict[str, dict[str, Any]], label: str, out: Path) -> None:
    lines = [f"{head['machines']} machines, link: {head['shaping']}, {head['workload']} ({head['params']:,} "
             f"parameters), {head['budget']:.0f} s each, evaluation every {head['eval_every_s']:g} s on the clock "
             "for every arm", "",
             *table_head("arm", "median final test loss (whole split)", "runs", "median loss on the race's split",
                         "steps/replica", "tokens/s", "tx bytes/replica/step", "eval share",
                         "time to the best other arm's loss", "sooner than it")]
    for arm, v in res.items():
        if "loss" not in v:
            lines.append(f"| {arm} | failed ({v['failed']} runs) | | | | | | | | |")
            continue
        losses = ", ".join(f"{r['loss']:.4f}" for r in v["runs"] if "error" not in r)
        t = v.get("time_to_best_other")
        lines.append(f"| {arm} | {v['loss']:.4f} | {losses} | {v['curve_end']:.4f} | {v['steps_per_replica']:.0f} | "
                     f"{v['tokens_per_s']:,.0f} | {v['tx_bytes_per_step']:,.0f} | {v['eval_fraction']:.3f} | "
                     + (f"{t:.1f} s ({v['best_other']}) | {v['sooner']:.2f}x |" if t is not None else "– | – |"))
    (out / f"{label}.md").write_text("\n".join(lines) + "\n")
    sys.stdout.write("\n".join(lines) + "\n")
    plot(head, res, out / f"{label}.png")


def plot(head: dict[str, Any], res: dict[str, dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (arm, v) in enumerate(res.items()):
        runs = sorted((r for r in v["runs"] if "error" not in r), key=lambda r: r["loss"])
        for j, r in enumerate(runs):  # the median run drawn bold, the others faint
            xs, ys = [p["s"] for p in r["curve"]], [p["loss"] for p in r["curve"]]
            median = j == len(runs) // 2
            ax.plot(xs, ys, color=f"C{i}", alpha=0.9 if median else 0.3, lw=1.8 if median else 0.8,
                    label=f"{arm} ({v['loss']:.3f})" if median else None)
    ax.set_xlabel("seconds of training")
    ax.set_ylabel("test loss, first 128 test blocks")
    ends = [p["loss"] for v in res.values() for r in v["runs"] if "error" not in r for p in r["curve"][-1:]]
    if ends:  # the race is decided at the end: the first seconds' losses of 4 and more would flatten it
        ax.set_ylim(min(ends) - 0.05, max(ends) + 0.6)
    cores = head.get("cores_per_machine", 1)
    ax.set_title(f"{head['workload']}, {head['machines']} machines of {cores} core{'s' * (cores > 1)}, "
                 f"{head['shaping']}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main_lm(args: argparse.Namespace) -> None:
    """The race: ``--methods`` (and ``--variant`` hogwild runs), interleaved, ``--repeats`` each."""
    table: dict[str, Optional[list[str]]] = {a: ([] if a == "hogwild" else None) for a in LM_ARMS}
    methods = links.chosen_methods(args.methods, args.variant, table)
    # An outside arm at each rate of --lrs (DDP at its own best rate): "ddp@0.006".
    methods = [f"{m}@{lr:g}" if table.get(m, []) is None and args.lrs else m
               for m in methods for lr in (args.lrs if table.get(m, []) is None and args.lrs else [None])]
    table.update({m: None for m in methods if "@" in m})
    links.known(methods, table, list(LM_ARMS))
    root = links.runs_folder(args.out)
    shaping = "loopback" if links.LOOPBACK else links.setup(args.machines, args.rate, args.delay_ms)
    cores = f"{links.CORES}" if links.CORES > 1 else ""
    label = args.name or f"{args.workload}_{args.machines}x{cores}_" + ("loopback" if links.LOOPBACK else args.rate)
    from examples.gpt import GPT, GPTConfig

    head = {"machines": args.machines, "cores_per_machine": links.CORES, "shaping": shaping,
            "workload": args.workload, "budget": args.budget,
            "eval_every_s": args.eval_every_s, "lr": args.lr, "diloco_interval": args.diloco_interval,
            "params": sum(p.numel() for p in GPT(GPTConfig(**SIZES[args.workload])).parameters()),
            "command": sys.argv, "methods": {m: table[m] for m in methods}}
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    ours = {m for m in methods if table[m] is not None}
    fns: dict[str, Callable[[int], dict[str, Any]]] = {
        m: ((lambda seed, m=m: hogwild_run(args, table[m] or [], root, seed)) if table[m] is not None
            else (lambda seed, m=m: arm_run(args, m, seed))) for m in methods}
    try:
        for rep in range(args.repeats):  # interleaved: a slow spell of the host hits every arm alike
            seed = rep if args.vary_seed else 0
            for m in methods:
                logger.info("repeat %d/%d: %s", rep + 1, args.repeats, m)
                try:
                    r = fns[m](seed)
                    logger.info("%s: loss %.4f, %d steps a replica", m, r["loss"], r["steps_per_replica"])
                except (RuntimeError, subprocess.TimeoutExpired, StopIteration, KeyError) as e:
                    logger.error("%s failed: %s", m, str(e)[-800:])
                    r = {"error": str(e)[-2000:], "seed": seed}
                runs[m].append(r)
                (args.out / f"{label}.json").write_text(json.dumps({**head, "arms": summary(runs, ours)}, indent=1,
                                                                   default=str) + "\n")
    finally:
        if not links.LOOPBACK:
            links.teardown(args.machines)
    report(head, summary(runs, ours), label, args.out)
