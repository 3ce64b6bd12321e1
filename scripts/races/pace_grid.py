"""The pacing grid (issue 68): hogwild against DDP at every point of step time x straggler x
optimizer, the limit written beside each figure.

A point is a model size (its step time: ``gpt_tiny`` about 10 ms, ``gpt_small`` 40 ms, ``gpt`` a few
hundred, ``gpt_large`` about a second on this host), a straggler (scripts/races/straggler_race.py's
``--slow``: ``throttle:F``, ``stalls``, ``busy``, ``none``), W workers and an optimizer:

- ``adamw``: hogwild 1 x W on the barrier (its defaults, and every ``--variant``) against DDP on W
  processes, both under the race's AdamW recipe (scripts/harness/arms.py), every arm evaluated alike;
  ``--ddp-schedule clock steps`` races DDP under its cosine on the clock (``ddp``) and under hogwild's
  own schedule function (``ddp_steps``);
- ``sgd``: hogwild 1 x W on the Hogwild path (``optim.name=sgd``), where a slow worker should cost the
  others nothing; its samples a second against the limit is the whole figure.

The limit: the sum of each worker's standalone rate, in samples a second: a W-th of what hogwild's W
workers train with nobody slowed (one run per size and optimizer, before the points), ``W - 1 + F``
of it with one worker at F of a core (with more workers than cores, F against the worker's share of
them: W = 4 on two cores, a quarter of a core is half a worker), ``W - 1/3`` for a worker stopped 1 s
every 3 s, ``W x 2/3`` beside the busy process (three processes on two cores). A worker alone would run its leader's
evaluations without a peer, so the balanced run is the fairer unit (as the issue's own figure: 954
samples a second unthrottled, 715 the limit with one worker at half a core).

Every arm warms its rate up over the same optimizer steps: the recipe's 100 (the default), or under
``--warmup auto`` a fifth of the steps the balanced run would make in the budget, if fewer. At the 1 s step
a 120 s run makes 75-95 steps: inside a warm-up of 100, hogwild's schedule (warm-up, then a cosine over
the steps the budget allows) never reaches its cosine, while the outside arms' (warm-up times a cosine
over the budget's seconds) anneals anyway, which the grid's figures there before 2026-11-29 carry. Under
a fifth of that (``auto``: 18 steps) 6e-3 stalled both arms (benchmarks/stragglers.md §23), the rate
having been chosen under the recipe's 100: so 100 stays, and ``--ddp-schedule clock steps`` races DDP
under hogwild's schedule too.

Each hogwild run also records where its workers' seconds went (metrics.json's ``time_s.per_worker``:
forward and backward, barrier wait, update), so a gap to the limit is traced, not guessed.

Output: ``bench_results/pace_grid/<name>.json`` (every run), ``.md`` (one row a point and arm) and
``.png`` (fraction of the limit against step time, one line a straggler).

    python scripts/races/pace_grid.py --sizes gpt_tiny gpt_small --slow none throttle:0.5 --repeats 3
    python scripts/races/pace_grid.py --sizes gpt_small --slow throttle:0.5 --variant backup=pace.policy=backup
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts.harness, examples
from scripts.harness.arms import BATCH, LR, SIZES, WARMUP  # noqa: E402
from scripts.harness.common import arm_summary, busy_core, pyplot, table_head  # noqa: E402
from scripts.races.lm_race import time_to  # noqa: E402
from scripts.races.straggler_race import ddp_arm, hogwild_arm, slowed_ranks, slowing  # noqa: E402

logger = logging.getLogger("pace_grid")
REPO = Path(__file__).resolve().parents[2]
BLOCK = 64
"""Tokens a sample (the race's context)."""
# optim.name, not optim=sgd: +experiment=gpt is applied after a group choice and would keep its AdamW.
SGD = ("optim.name=sgd", "optim.lr=0.5", "optim.momentum=0.0", "optim.weight_decay=0.0")


def share(slow: str, workers: int, cores: int = os.cpu_count() or 1) -> float:
    """The limit in standalone workers: what the ``slow`` straggler leaves of ``workers``. More
    workers than ``cores`` (W = 4 on two) each have cores / W of a core to begin with, so a quota
    of F of a core leaves F / (cores / W) of a worker's rate, at most all of it."""
    if slow.startswith("throttle:"):
        each = min(1.0, cores / workers)
        return workers - 1 + min(float(slow.split(":", 1)[1]), each) / each
    return {"stalls": workers - 1 / 3, "busy": workers * 2 / 3, "none": float(workers)}[slow]


def _run_args(args: argparse.Namespace, size: str, workers: int, override: tuple[str, ...],
              warmup: int = WARMUP, schedule: str = "clock") -> argparse.Namespace:
    return argparse.Namespace(workers=workers, machines=1, stragglers=1, slowed=slowed_ranks(1, workers, 1), size=size,
                              budget=args.budget, eval_every_s=args.eval_every_s, override=list(override),
                              lr=args.ddp_lr, warmup=warmup, schedule=schedule)


def warmup_steps(spec: str, unit: float, budget: float) -> int:
    """``--warmup``: a number of optimizer steps, or ``auto``: a fifth of the steps a balanced run
    makes in ``budget`` (``unit`` samples a second a worker, a step a batch of every worker's), at most
    the recipe's 100."""
    if spec != "auto":
        return int(spec)
    return max(1, min(WARMUP, round(unit * budget / BATCH / 5)))


def _hogwild(args: argparse.Namespace, size: str, workers: int, slow: str, root: Path,
             override: tuple[str, ...], warmup: int, checkout: Path = REPO) -> dict[str, Any]:
    """A hogwild run; ``checkout``: the source tree whose hogwild runs (``--baseline``'s, an earlier commit)."""
    r = hogwild_arm(_run_args(args, size, workers, override, warmup), slowing(slow)[0], root, 0, checkout=checkout)
    per = (r.get("time_s") or {}).get("per_worker") or []
    r["samples_per_s"] = r["tokens_per_s"] / BLOCK
    r["per_worker"] = [{k: round(w.get(k, 0.0), 2) for k in ("forward_backward", "barrier_wait", "update", "train")}
                       for w in per]
    return r


def standalone(args: argparse.Namespace, size: str, optim: str, workers: int, root: Path) -> float:
    """Samples a second of one worker, unthrottled (the limit's unit): a ``workers``-th of a balanced run."""
    extra = SGD if optim == "sgd" else ()
    r = hogwild_arm(_run_args(args, size, workers, extra), None, root, 0)
    return r["tokens_per_s"] / BLOCK / workers


def point(args: argparse.Namespace, size: str, slow: str, optim: str, workers: int, unit: float,
          root: Path) -> dict[str, Any]:
    """Every arm at one point, interleaved repeat by repeat (a slow spell of the host hits all alike)."""
    own = (f"optim.lr={args.hogwild_lr}",) if args.hogwild_lr is not None else ()
    arms: dict[str, tuple[str, ...]] = {"hogwild": SGD if optim == "sgd" else own}
    if args.baseline is not None:
        arms["before"] = arms["hogwild"]
    if optim == "adamw":
        arms.update({name: tuple(o.split(",")) for name, _, o in (v.partition("=") for v in args.variant)})
        for i, schedule in enumerate(args.ddp_schedule):  # the first is "ddp", every arm's reference
            arms["ddp" if i == 0 else f"ddp_{schedule}"] = (schedule,)
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    _, core, label = slowing(slow)
    warmup = warmup_steps(args.warmup, unit, args.budget)
    with busy_core(core):
        for rep in range(args.repeats):
            for arm, override in arms.items():
                logger.info("%s %s %s W=%d, repeat %d/%d: %s", size, optim, slow, workers, rep + 1, args.repeats, arm)
                try:
                    if arm.startswith("ddp"):
                        r = ddp_arm(_run_args(args, size, workers, (), warmup, override[0]), slowing(slow)[0], 0)
                        r["samples_per_s"] = r["tokens_per_s"] / BLOCK
                    else:
                        checkout = args.baseline if arm == "before" else REPO
                        r = _hogwild(args, size, workers, slow, root, override, warmup, checkout)
                except Exception as e:  # noqa: BLE001 - a failed run is a row that says so
                    logger.error("%s failed: %s", arm, str(e)[-800:])
                    r = {"error": str(e)[-2000:]}
                runs[arm].append(r)
    limit = unit * share(slow, workers)
    return {"size": size, "slow": slow, "label": label, "optim": optim, "workers": workers, "unit": unit,
            "limit": limit, "warmup": warmup, "arms": _summary(runs, limit)}


def _summary(runs: dict[str, list[dict[str, Any]]], limit: float) -> dict[str, Any]:
    out = {arm: arm_summary(rs, ("loss", "samples_per_s", "train_s")) for arm, rs in runs.items()}
    for v in out.values():
        if "loss" in v:
            v["of_limit"] = v["samples_per_s"] / limit
    ddp = out.get("ddp", {})
    if "curve_end" in ddp:
        for arm, v in out.items():
            if arm != "ddp" and "loss" in v:
                times = [time_to(r["curve"], ddp["curve_end"]) for r in v["runs"] if "error" not in r]
                v["time_to_ddp"] = statistics.median(times)
                v["sooner"] = ddp["train_s"] / v["time_to_ddp"] if v["time_to_ddp"] > 0 else None
    return out


def table(points: list[dict[str, Any]]) -> str:
    lines = table_head("step", "straggler", "optim", "W", "limit (samples/s)", "arm", "samples/s", "of the limit",
                       "final loss", "runs", "time to DDP's loss", "sooner", "waits a worker (s), fast / slow")
    for p in points:
        for arm, v in p["arms"].items():
            if "loss" not in v:
                lines.append(f"| {p['size']} | {p['slow']} | {p['optim']} | {p['workers']} | {p['limit']:.0f} | {arm} "
                             f"| failed | | | | | | |")
                continue
            runs = ", ".join(f"{r['loss']:.3f}" for r in v["runs"] if "error" not in r)
            waits = _waits(v["runs"])
            t, x = v.get("time_to_ddp"), v.get("sooner")
            lines.append(f"| {p['size']} | {p['slow']} | {p['optim']} | {p['workers']} | {p['limit']:.0f} | {arm} | "
                         f"{v['samples_per_s']:.0f} | {v['of_limit']:.2f} | {v['loss']:.4f} | {runs} | "
                         + (f"{t:.1f} s | {x:.2f}x" if t is not None and x is not None else "– | –") + f" | {waits} |")
    return "\n".join(lines) + "\n"


def _waits(runs: list[dict[str, Any]]) -> str:
    """The median barrier wait of the fast workers (the first is the straggler) and of the slow one."""
    per = [r["per_worker"] for r in runs if "error" not in r and r.get("per_worker")]
    if not per:
        return "–"
    slow = statistics.median(w[0]["barrier_wait"] for w in per)
    fast = statistics.median(statistics.mean(x["barrier_wait"] for x in w[1:]) for w in per)
    return f"{fast:.1f} / {slow:.1f}"


def plot(points: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4.2))
    order = [s for s in SIZES if any(p["size"] == s for p in points)]
    for slow in sorted({p["slow"] for p in points}):
        for optim in sorted({p["optim"] for p in points}):
            xs = [p for p in points if p["slow"] == slow and p["optim"] == optim and "of_limit" in p["arms"]["hogwild"]]
            xs.sort(key=lambda p: order.index(p["size"]))
            if xs:
                ax.plot([p["size"] for p in xs], [p["arms"]["hogwild"]["of_limit"] for p in xs], marker="o",
                        label=f"hogwild, {optim}, {slow}")
            if optim == "adamw":
                ds = [p for p in xs if "of_limit" in p["arms"].get("ddp", {})]
                if ds:
                    ax.plot([p["size"] for p in ds], [p["arms"]["ddp"]["of_limit"] for p in ds], marker="x",
                            linestyle=":", label=f"DDP, {slow}")
    ax.axhline(0.9, color="grey", linewidth=0.8)
    ax.set_xlabel("model (step time grows to the right)")
    ax.set_ylabel("samples a second / the limit")
    ax.set_ylim(0, 1.1)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["gpt_tiny", "gpt_small", "gpt"], choices=sorted(SIZES))
    ap.add_argument("--slow", nargs="+", default=["none", "throttle:0.5"],
                    help="throttle:F | stalls | busy | none, each a point")
    ap.add_argument("--optim", nargs="+", default=["adamw"], choices=("adamw", "sgd"))
    ap.add_argument("--workers", nargs="+", type=int, default=[2])
    ap.add_argument("--budget", type=float, default=40.0)
    ap.add_argument("--eval-every-s", type=float, default=5.0)
    ap.add_argument("--ddp-lr", type=float, default=2 * LR, help="DDP's peak rate (its best on the GPT: 6e-3)")
    ap.add_argument("--hogwild-lr", type=float, default=None,
                    help="hogwild's peak rate under AdamW (default: the recipe's, 3e-3; its best on the GPT: 6e-3)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=OVERRIDE[,OVERRIDE...]",
                    help="one more hogwild arm under AdamW, e.g. backup=pace.policy=backup (repeatable)")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="a checkout of an earlier commit (git worktree add DIR REV): its hogwild is the arm 'before'")
    ap.add_argument("--warmup", default=str(WARMUP),
                    help="every arm's warm-up in optimizer steps (the recipe's 100), or auto: a fifth of a balanced "
                         "run's, at most 100")
    ap.add_argument("--ddp-schedule", nargs="+", choices=("clock", "steps"), default=["clock"],
                    help="DDP's schedule, an arm each (scripts/harness/arms.py's rate): the first is the arm 'ddp'")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "bench_results" / "pace_grid")
    ap.add_argument("--name", default="grid")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="[pace_grid] %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    points: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            for optim in args.optim:
                for workers in args.workers:
                    unit = standalone(args, size, optim, workers, Path(tmp))
                    logger.info("%s %s W=%d: a worker trains %.0f samples/s, nobody slowed", size, optim, workers, unit)
                    for slow in args.slow:
                        points.append(point(args, size, slow, optim, workers, unit, Path(tmp)))
                        head = {"command": sys.argv, "budget": args.budget, "ddp_lr": args.ddp_lr,
                                "hogwild_lr": args.hogwild_lr}
                        (args.out / f"{args.name}.json").write_text(
                            json.dumps({**head, "points": points}, indent=1, default=str) + "\n")
    text = table(points)
    (args.out / f"{args.name}.md").write_text(text)
    sys.stdout.write(text)
    plot(points, args.out / f"{args.name}.png")


if __name__ == "__main__":
    main()
