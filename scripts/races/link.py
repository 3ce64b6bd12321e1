"""Rounds over a slow link: time to a stated quality, and bytes per replica per step, for DDP,
hogwild's wires and fragments, and torchft's DiLoCo, side by side in one run.

N simulated machines live in network namespaces, each pinned to one core (with more machines
than cores, each gets an equal CFS share of them instead), each with one
veth into a bridge (a switch) and its egress shaped with ``tbf`` to the rate, plus ``netem``
delay where the kernel has it. Needs root and iproute2; anywhere else it says why and exits 0.

    python scripts/races/link.py --machines 2 --rate 100mbit --workload resnet --repeats 3 \
        --out bench_results/link
    python scripts/races/link.py --machines 2 --rate 1gbit --workload mlp --methods ddp,fp32,int8
    python scripts/races/link.py --loopback --workload mlp --target 0.96 --repeats 11 --vary-seed

``--vary-seed`` gives repeat i seed i in every method (initial weights, shards, data order):
torchft's script and DDP are deterministic, so without it their repeats are one run, one draw of
the seed, while hogwild's lock-free runs differ. A missed target counts as infinitely slow in
the median.

Results: ``<out>/<label>.json`` (every run's metrics.json or baseline record), ``<out>/<label>.md``
and, with matplotlib, ``<out>/<label>.png``. Bytes per replica step come from two sources: the
rounds' own count (``sync_bytes_per_step``, from the collectives' payloads; DDP's from the same
ring model) and the machine's interface counter (``tx_bytes``, everything it sent: handshakes,
heartbeats, evaluation broadcasts, TCP headers).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # scripts.harness, examples

from scripts.harness import links  # noqa: E402
from scripts.harness.arms import LM_ARMS, LM_DEFAULT  # noqa: E402
from scripts.harness.arms import SIZES as LM_SIZES  # noqa: E402
from scripts.harness.baselines import WORKLOADS, Workload, workload_from_args  # noqa: E402
from scripts.harness.common import metrics, put_result, pyplot, reached, result_line  # noqa: E402

from hogwild.bench import round_rules  # noqa: E402

logger = logging.getLogger("link")
# Each method: hogwild's overrides on top of the defaults (None: not a hogwild run). The wires and
# fragments run under the default rule, which is what a user gets; `diloco` is the rule torchft has.
METHODS: dict[str, Optional[list[str]]] = {
    "ddp": None,
    "fp32": [],
    "bf16": ["sync.dtype=bf16"],
    "int8": ["sync.dtype=int8"],
    "fragments": ["sync.fragments=4"],
    "fragments_int8": ["sync.fragments=4", "sync.dtype=int8"],
    "diloco": ["sync.mode=diloco"],
    "torchft_diloco": None,
}


def hogwild(w: Workload, machines: int, interval: int, extra: list[str], root: Path) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(dir=root))
    # A method may set its own interval (fragments with a shorter one), which Hydra would refuse twice.
    interval_arg = [] if any(o.startswith("sync.interval=") for o in extra) else [f"sync.interval={interval}"]
    cmds = links.torchrun_on_machines(machines, [*w.hydra(), "workers=1", f"train.target_accuracy={w.target}",
                                                 *interval_arg, f"run_dir={run_dir}", "checkpoint.every_s=3600",
                                                 *extra])
    _, sent = links.on_machines(cmds, links.RUN_TIMEOUT_S)
    m = metrics(run_dir)
    steps = max(m["steps"], 1) / machines
    return {"time_to_target_s": m["time_to_target_s"], "test_accuracy": m["test_accuracy"],
            "bytes_per_step": m["sync_bytes_per_step"], "tx_bytes_per_step": sent / steps,
            "steps_per_replica": steps, "syncs": m["syncs"], "link_s": m["sync_link_s"],
            "wall_s": m["wall_s"], "target_held": m.get("target_held")}


def _baseline(cmds: list[list[str]], bytes_per_step: float) -> dict[str, Any]:
    """A baseline's ranks, one a machine: rank 0's ``RESULT`` and the bytes a replica step sent."""
    logs, sent = links.on_machines(cmds, links.RUN_TIMEOUT_S)
    r = result_line(logs[0])
    steps = r["steps"] / len(cmds)
    return {**r, "bytes_per_step": bytes_per_step, "tx_bytes_per_step": sent / steps, "steps_per_replica": steps}


def ddp(w: Workload, machines: int, params: int) -> dict[str, Any]:
    port = links.port()
    cmds = [[sys.executable, str(Path(__file__).resolve()), "--ddp-rank", str(i), "--machines", str(machines),
             "--port", str(port), "--workload", key(w), "--target", str(w.target),
             "--epochs", str(w.max_epochs), "--seed", str(w.seed), "--split-seed", str(w.split_seed),
             *(["--loopback"] if links.LOOPBACK else [])]
            for i in range(machines)]
    return _baseline(cmds, round_rules()["ring_bytes"](4 * params, machines))  # every step's gradients


def torchft(w: Workload, machines: int, interval: int, params: int) -> dict[str, Any]:
    script = Path(__file__).resolve().parent / "torchft_diloco.py"
    port = links.port()
    cmds = [[sys.executable, str(script), "--replica", str(i), "--replicas", str(machines), "--host", links.addr(i),
             "--lighthouse-host", links.addr(0), "--lighthouse-port", str(port), "--workload",
             key(w), "--interval", str(interval), "--target", str(w.target), "--epochs", str(w.max_epochs),
             "--seed", str(w.seed), "--split-seed", str(w.split_seed)]
            for i in range(machines)]
    return _baseline(cmds, round_rules()["ring_bytes"](4 * params, machines) / interval)  # fp32 pseudo-gradients


def key(w: Workload) -> str:
    return next(k for k, v in WORKLOADS.items() if v.name == w.name)


def w_params(w: Workload) -> int:
    return sum(p.numel() for p in w.build(w.data()).parameters())


def _ddp_rank(rank: int, machines: int, port: int, w: Workload) -> None:
    from scripts.harness.baselines import _ddp_rank as run_rank

    out: dict[str, Any] = {}
    run_rank(rank, machines, port, out, w, addr=links.addr(0))
    if rank == 0:
        put_result(out["r"])
    sys.stdout.flush()
    # The result is out. torch 2.14's exit, after a Gloo DDP run, sometimes aborts in a C++
    # destructor ("terminate called without an active exception", 1 in 6 on loopback): skip it.
    os._exit(0)


def report(res: dict[str, Any], label: str, out: Path) -> None:
    lines = [f"{res['machines']} machines, link: {res['shaping']}, {res['workload']} "
             f"({res['params']:,} parameters) to {res['target']}, interval {res['interval']}", "",
             "| method | median s to target | missed | median final acc | bytes/replica/step (rounds) "
             "| tx bytes/replica/step | DDP time / this | final below target |", "|---|---|---|---|---|---|---|---|"]
    d = res["methods"].get("ddp", {}).get("median_s")
    for k, v in res["methods"].items():
        finite = d is not None and math.isfinite(d) and math.isfinite(v["median_s"])
        speed = f"{d / v['median_s']:.1f}x" if finite else "-"
        lines.append(f"| {k} | {v['median_s']:.2f} | {v['missed']} | {v['accuracy']:.4f} | "
                     f"{v['bytes_per_step']:,.0f} | {v['tx_bytes_per_step']:,.0f} | {speed} | "
                     f"{v.get('final_below_target', 0)} |")
    (out / f"{label}.md").write_text("\n".join(lines) + "\n")
    sys.stdout.write("\n".join(lines) + "\n")
    plt = pyplot()
    if plt is None or not any(reached(r.get("time_to_target_s")) for v in res["methods"].values() for r in v["runs"]):
        return  # a budget run (no target reached): nothing to plot
    fig, ax = plt.subplots(figsize=(7, 4))
    for k, v in res["methods"].items():
        xs = [r["bytes_per_step"] for r in v["runs"]]
        ys = [r["time_to_target_s"] if reached(r["time_to_target_s"]) else float("nan") for r in v["runs"]]
        ax.scatter(xs, ys, label=k)
    ax.set_xscale("log")
    ax.set_xlabel("bytes per replica per step (rounds)")
    ax.set_ylabel(f"seconds to {res['target']}")
    ax.set_title(f"{res['workload']}, {res['machines']} machines, {res['shaping']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"{label}.png", dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--machines", type=int, default=2)
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--delay-ms", type=int, default=0)
    ap.add_argument("--workload", choices=sorted([*WORKLOADS, *LM_SIZES]), default="mlp",
                    help="gpt, gpt_large: the language-model race under AdamW (scripts/races/lm_race.py)")
    ap.add_argument("--target", type=float, default=None)
    ap.add_argument("--epochs", type=int, default=None,
                    help="the budget: passes of each replica over its shard")
    ap.add_argument("--interval", type=int, default=50)
    ap.add_argument("--methods", default=None, help=f"default: {','.join(METHODS)}; LM race: {','.join(LM_ARMS)}")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=OVERRIDE[,OVERRIDE...]",
                    help="one more hogwild method, e.g. mu9=sync.outer_momentum=0.9 (repeatable)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vary-seed", action="store_true",
                    help="repeat i runs every method with seed i (initial weights, shards, data order); "
                         "without it every repeat uses seed 0, and a deterministic baseline repeats one run")
    ap.add_argument("--split-seed", type=int, default=0,
                    help="the digits' train/test split (data.split_seed), the same in every method")
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--loopback", action="store_true",
                    help="processes on 127.0.0.1: no namespaces, no shaping")
    ap.add_argument("--run-timeout-s", type=float, default=3600.0)
    ap.add_argument("--out", type=Path, default=Path("bench_results/link"))
    lm = ap.add_argument_group("the language-model race (--workload gpt|gpt_large)")
    lm.add_argument("--budget", type=float, default=120.0, help="seconds of training per run, every arm")
    lm.add_argument("--eval-every-s", type=float, default=10.0, help="every arm's evaluations, on the clock")
    lm.add_argument("--lr", type=float, default=3e-3, help="the outside arms' peak AdamW rate (hogwild: its own)")
    lm.add_argument("--lrs", type=float, nargs="+", default=None,
                    help="each outside arm at each of these rates (ARM@LR), to race DDP at its best rate")
    lm.add_argument("--diloco-interval", type=int, default=30, help="torchft DiLoCo's inner steps per outer step")
    lm.add_argument("--name", default=None, help="the results' file name (default from the options)")
    lm.add_argument("--cores-per-machine", type=int, default=1,
                    help="C cores a machine: hogwild M x C (its barrier inside each), the outside arms C ranks a "
                         "machine (M*C in all)")
    ap.add_argument("--ddp-rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="[link] %(message)s")
    links.LOOPBACK, links.RUN_TIMEOUT_S, links.CORES = args.loopback, args.run_timeout_s, args.cores_per_machine
    cores = links.CORES
    if cores < 1 or args.machines * cores > (os.cpu_count() or 1) and cores > 1:
        raise SystemExit(f"--cores-per-machine {cores}: {args.machines} machines of {cores} cores need "
                         f"{args.machines * cores}, this host has {os.cpu_count()}")
    if args.workload in LM_SIZES:
        if links.cannot_run():
            return
        from scripts.races.lm_race import main_lm

        args.methods = args.methods or ",".join(LM_DEFAULT)
        main_lm(args)
        return
    args.methods = args.methods or ",".join(METHODS)
    w = workload_from_args(args)
    if args.ddp_rank is not None:
        _ddp_rank(args.ddp_rank, args.machines, args.port, w)
        return
    if links.cannot_run():
        return
    methods = links.known(links.chosen_methods(args.methods, args.variant, METHODS), METHODS, list(METHODS))
    root = links.runs_folder(args.out)
    params = w_params(w)
    shaping = "loopback" if links.LOOPBACK else links.setup(args.machines, args.rate, args.delay_ms)
    shares = links.cpu_shares(args.machines)
    if shares:
        shaping += f"; CPU: {shares}"
        logger.info("%d machines on %d cores: %s", args.machines, os.cpu_count(), shares)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    fns: dict[str, Callable[[Workload], dict[str, Any]]] = {
        m: (lambda wr, m=m: hogwild(wr, args.machines, args.interval, METHODS[m] or [], root)) for m in methods}
    fns["ddp"] = lambda wr: ddp(wr, args.machines, params)
    fns["torchft_diloco"] = lambda wr: torchft(wr, args.machines, args.interval, params)
    label = f"{w.name}_{args.machines}x_" + ("loopback" if links.LOOPBACK else args.rate) + (
        f"_{args.delay_ms}ms" if args.delay_ms and not links.LOOPBACK else "")
    head = {"machines": args.machines, "shaping": shaping, "workload": w.name, "params": params,
            "target": w.target, "interval": args.interval, "vary_seed": args.vary_seed, "split_seed": w.split_seed}
    try:
        for rep in range(args.repeats):  # interleaved: a slow spell of the host hits every method alike
            wr = dataclasses.replace(w, seed=rep) if args.vary_seed else w
            for m in methods:
                logger.info("repeat %d/%d: %s, seed %d", rep + 1, args.repeats, m, wr.seed)
                try:
                    runs[m].append({**fns[m](wr), "seed": wr.seed})
                except (RuntimeError, subprocess.TimeoutExpired, StopIteration) as e:
                    logger.error("%s failed: %s", m, str(e)[-500:])
                    runs[m].append({"time_to_target_s": None, "test_accuracy": float("nan"), "bytes_per_step":
                                    float("nan"), "tx_bytes_per_step": float("nan"), "error": str(e)[-2000:],
                                    "seed": wr.seed})
                # Hours of runs: what is done so far is on disk if the host or the operator stops it.
                (args.out / f"{label}.json").write_text(json.dumps(summary(head, runs), indent=2, default=str)
                                                        + "\n")
    finally:
        if not links.LOOPBACK:
            links.teardown(args.machines)
        links.drop_cpu_shares(args.machines)
    report(summary(head, runs), label, args.out)


def summary(head: dict[str, Any], runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    res: dict[str, Any] = {**head, "methods": {}}
    for m, rs in runs.items():
        if not rs:
            continue
        # A run that missed the target took longer than the budget, not no time: it counts as
        # infinitely slow, so a method that misses half its runs has no finite median.
        times = [r["time_to_target_s"] if reached(r.get("time_to_target_s")) else math.inf for r in rs]
        res["methods"][m] = {
            "median_s": statistics.median(times), "missed": sum(t == math.inf for t in times),
            "accuracy": statistics.median(r["test_accuracy"] for r in rs),
            "bytes_per_step": statistics.median(r["bytes_per_step"] for r in rs),
            "tx_bytes_per_step": statistics.median(r["tx_bytes_per_step"] for r in rs),
            # hogwild stops on rank 0's live model and ends on the replicas' mean; the baselines
            # stop on the model they end with, so only hogwild's runs can land below the target.
            "final_below_target": sum(r.get("target_held") is False for r in rs), "runs": rs}
    return res


if __name__ == "__main__":
    main()
