"""Stragglers raced: hogwild against DDP on this host's two cores, one of each arm's processes made
slow the same way, every arm evaluated alike on the clock (issue 56).

The GPT of benchmarks/one-machine.md §15 (``--size gpt``, 0.8M parameters) under the race's AdamW recipe
(scripts/harness/arms.py: warm-up, a cosine over the budget, the same 128 test blocks scored every
``--eval-every-s`` of training on the clock by hogwild's leader and DDP's rank 0, the final model on
the whole split off the clock). Arms:

- ``hogwild``: 1 x 2 (one replica, two workers on the barrier); its first worker is the straggler.
  ``--machines 2``: 2 x 1 under torchrun on this host, replica 1's leader and worker the straggler.
  ``--workers W --stragglers K``: 1 x W, its first K workers each slowed alike (a lent 16-core machine).
  ``--fleet 1,0.5,0.25``: a fleet of machines of one worker each under torchrun, replica r (its
  leader and worker) held to the r-th fraction of a core (1: not held).
- ``ddp``: DDP on two processes (W with ``--workers``); its last rank (K ranks) the straggler; under
  ``--fleet``, rank r held as replica r is.
- ``standalone`` (with ``--fleet``): each machine alone, 1 x 1, its leader and worker held to its
  fraction as in the fleet, and evaluating only where it does in the fleet (rank 0; a quarter of a
  core spends most of itself on the race's evaluations otherwise), interleaved with the arms: each
  machine's rate in the fleet is then also given as a share of its standalone rate (the fleet's bar).

Stragglers (scripts/harness/stragglers.py): ``--slow throttle:F`` (a cgroup CPU quota of F of a core),
``stalls`` (stopped 1 s every 3 s), ``busy`` (a busy process pinned to core 0 the whole run: §17's
shared core), ``none`` (balanced). Output as scripts/races/lm_race.py's: JSON, table, PNG.

    python scripts/races/straggler_race.py --slow throttle:0.5 --repeats 3 --name straggler_throttle
    python scripts/races/straggler_race.py --slow stalls --repeats 3
    python scripts/races/straggler_race.py --machines 2 --slow throttle:0.5 --repeats 3
    python scripts/races/straggler_race.py --fleet 1,0.5,0.25 --size gpt_small --budget 30 --repeats 3
    python scripts/races/straggler_race.py --fleet 1,0.5,0.25 --size gpt_small --budget 30 --methods standalone hogwild
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts.harness, examples
from scripts.harness.common import busy_core, clean_env, free_port, result_line, train_cmd
from scripts.harness.arms import LR, SIZES, WARMUP, hogwild_overrides
from scripts.harness.arms import SCRIPT as ARMS_SCRIPT
from scripts.races.lm_race import hogwild_result, report, summary
from scripts.harness.stragglers import cgroup_version, stalled, throttled, wait_for, worker_pids

logger = logging.getLogger("straggler_race")
REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 900.0
Slow = Callable[[list[int], int], contextlib.AbstractContextManager[Any]]
"""Slows one straggler: its processes (a worker, or a machine's leader and worker) together."""


def slowing(spec: str) -> tuple[Optional[Slow], Optional[int], str]:
    """``--slow``: what slows a straggler's processes, the core a busy process holds, and a label."""
    if spec.startswith("throttle:"):
        f = float(spec.split(":", 1)[1])
        label = f"one process at {f:g} of a core (cgroup {cgroup_version()})"
        return (lambda pids, i=0: throttled(pids, f, name=f"hogwild_straggler{i}")), None, label
    if spec == "stalls":
        return (lambda pids, i=0: _stalled_all(pids)), None, "one process stopped 1 s every 3 s"
    if spec == "busy":
        return None, 0, "a busy process on core 0"
    if spec == "none":
        return None, None, "balanced"
    raise SystemExit(f"--slow: unknown {spec!r}; choose throttle:F, stalls, busy or none")


@contextlib.contextmanager
def _stalled_all(pids: list[int]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for pid in pids:
            stack.enter_context(stalled(pid, 1.0, 3.0))
        yield


@contextlib.contextmanager
def _each(slow: Slow, stragglers: list[list[int]]) -> Iterator[None]:
    """Every straggler slowed on its own (two workers at half a core each, not one half core shared)."""
    with contextlib.ExitStack() as stack:
        for i, pids in enumerate(stragglers):
            stack.enter_context(slow(pids, i))
        yield


def fleet_slowing(fleet: list[float]) -> tuple[Slow, list[int], str]:
    """``--fleet``: what holds the i-th slowed machine to its fraction, the ranks slowed, and a label."""
    slowed = [r for r, f in enumerate(fleet) if f < 1]
    label = "machines at " + ", ".join(f"{f:g}" for f in fleet) + f" of a core (cgroup {cgroup_version()})"
    return (lambda pids, i=0: throttled(pids, fleet[slowed[i]], name=f"hogwild_straggler{i}")), slowed, label


def _replica_pids(launcher: int, rank: int) -> list[int]:
    """Under torchrun on this host: replica ``rank``'s leader and its spawned workers."""
    from scripts.harness.stragglers import children

    for pid in children(launcher):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            workers = worker_pids(pid)
            return [pid, *workers] if workers else []
    return []


def slowed_ranks(machines: int, workers: int, stragglers: int) -> list[int]:
    """The DDP ranks (and, across machines, the replicas) held back: 2 x 1 its replica 1; 1 x W the
    last ``stragglers`` ranks (hogwild's first workers are found in start order instead)."""
    return [1] if machines == 2 else list(range(workers - stragglers, workers))


def hogwild_arm(args: argparse.Namespace, slow: Optional[Slow], root: Path, seed: int,
                extra: tuple[str, ...] = (), checkout: Optional[Path] = None) -> dict[str, Any]:
    """A hogwild run; ``checkout``: the source tree it runs from (its working directory, whose hogwild
    ``python -m`` imports; default this one)."""
    run_dir = Path(tempfile.mkdtemp(dir=root))
    workers = args.workers // args.machines
    warmup = getattr(args, "warmup", WARMUP)
    cmd = train_cmd([*hogwild_overrides(args.size, args.budget, args.eval_every_s, warmup), f"workers={workers}",
                     f"train.seed={seed}", f"run_dir={run_dir}", *args.override, *extra], args.machines,
                    launcher="hogwild.cli.launch")
    # A process group of its own (to kill the job's tree), not a session: with the kernel's
    # autogroup a new session is a scheduling group that shares CPU as one process against the
    # busy process, while DDP's ranks shared the busy process's group task by task (benchmarks/stragglers.md §22).
    # A machine of a fleet raced alone sizes its threads as it does in the fleet (cores // machines).
    sized = {"LOCAL_WORLD_SIZE": str(args.local_world)} if getattr(args, "local_world", None) else {}
    proc = subprocess.Popen(cmd, cwd=checkout or REPO, env=clean_env(OMP_NUM_THREADS="1", **sized),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, process_group=0)
    try:
        if slow is None:
            err = proc.communicate(timeout=TIMEOUT_S)[1]
        else:
            def replicas() -> list[list[int]]:  # every slowed replica's processes, once all are up
                found = [_replica_pids(proc.pid, r) for r in args.slowed]
                return found if all(found) else []

            def alone() -> list[list[int]]:  # a machine alone: its leader and worker held together
                workers = worker_pids(proc.pid)
                return [[proc.pid, *workers]] if workers else []

            def first_workers() -> list[list[int]]:  # 1 x W: its first K workers, each on its own
                return [[p] for p in worker_pids(proc.pid)[:args.stragglers]]

            # A fleet's machine raced alone is the run that carries its fleet's size (standalone()).
            find = alone if getattr(args, "local_world", None) else first_workers if args.machines == 1 else replicas
            with _each(slow, wait_for(find, proc, "the straggler")):
                err = proc.communicate(timeout=TIMEOUT_S)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    if proc.returncode != 0:
        raise RuntimeError(err[-2000:])
    return {**hogwild_result(args.size, run_dir, args.machines), "seed": seed}


def ddp_arm(args: argparse.Namespace, slow: Optional[Slow], seed: int) -> dict[str, Any]:
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(ARMS_SCRIPT), "--arm", "ddp", "--rank", str(r),
                               "--world", str(args.workers), "--port", str(port), "--size", args.size,
                               "--budget", str(args.budget), "--warmup", str(getattr(args, "warmup", WARMUP)),
                               "--schedule", getattr(args, "schedule", "clock"),
                               "--lr", str(args.lr), "--eval-every-s", str(args.eval_every_s), "--seed", str(seed)],
                              cwd=REPO, env=clean_env(OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(args.workers)]
    try:
        slowed = [[procs[r].pid] for r in args.slowed] if slow is not None else []
        with _each(slow, slowed) if slow is not None else contextlib.nullcontext():
            logs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    r = result_line(logs[0])
    return {**r, "tx_bytes_per_step": 0.0, "seed": seed}


def standalone(args: argparse.Namespace, fleet: list[float], machine: int, root: Path) -> dict[str, Any]:
    """``--methods standalone`` with ``--fleet``: the fleet's ``machine`` alone (1 x 1), its leader and
    worker held together to its fraction of a core, evaluating only if it is rank 0 (the fleet's
    evaluator): the rate the fleet's bar counts from."""
    fraction = fleet[machine]
    quiet = [] if machine == 0 else ["eval.every_s=1e9"]
    # Its threads as in the fleet: a job sizes them to its cores at start, before the quota lands, and
    # alone on this host's 2 cores it ran 2 threads against half a core's quota (233 samples a second
    # where the fleet's machine trained 427).
    one = argparse.Namespace(**{**vars(args), "machines": 1, "workers": 1, "stragglers": 1,
                                "local_world": len(fleet), "override": [*args.override, *quiet]})
    slow = (lambda pids, i=0: throttled(pids, fraction, name="hogwild_alone")) if fraction < 1 else None
    r = hogwild_arm(one, slow, root, 0)
    return {**r, "machine": machine, "fraction": fraction, "samples_per_s": r["samples"] / r["train_s"]}


def machine_rates(run: dict[str, Any]) -> list[float]:
    """A hogwild run's samples a second by replica: its mean steps between rounds times its rounds
    (metrics.json's ``steps_per_sync_per_replica``, ``syncs``), over the run's training seconds."""
    batch = run["samples"] / max(run["steps"], 1)
    return [gap * run["syncs"] * batch / run["train_s"] for gap in run.get("steps_per_sync_per_replica") or []]


def fleet_lines(fleet: list[float], res: dict[str, dict[str, Any]],
                standalone_runs: Optional[dict[int, list[dict[str, Any]]]] = None) -> list[str]:
    """Each machine's samples a second (medians over the runs) by hogwild arm, and per core it holds;
    with ``standalone_runs`` (a machine's runs of :func:`standalone`), each also of its standalone rate."""
    lines = ["", "| arm | " + " | ".join(f"machine {r} ({f:g} core): samples/s, per core" for r, f in enumerate(fleet))
             + " |", "|---|" + "---|" * len(fleet)]
    alone = {m: statistics.median(r["samples_per_s"] for r in rs) for m, rs in (standalone_runs or {}).items() if rs}
    if alone:
        lines.append("| standalone (1 x 1 alone) | " + " | ".join(
            f"{alone[m]:,.0f}, {alone[m] / f:,.0f}" if m in alone else "–" for m, f in enumerate(fleet)) + " |")
    for arm, v in res.items():
        rates = [machine_rates(r) for r in v.get("runs", []) if "samples" in r]  # hogwild's, finished
        rates = [r for r in rates if len(r) == len(fleet)]
        if rates:
            cells = [statistics.median(r[i] for r in rates) for i in range(len(fleet))]
            lines.append(f"| {arm} | " + " | ".join(
                f"{c:,.0f}, {c / f:,.0f}" + (f", **{c / alone[m]:.2f}** of standalone" if m in alone else "")
                for m, (c, f) in enumerate(zip(cells, fleet))) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slow", default="throttle:0.5", help="throttle:F | stalls | busy | none")
    ap.add_argument("--machines", type=int, choices=(1, 2), default=1,
                    help="hogwild 1 x 2 (a slow worker) or 2 x 1 (a slow machine: replica 1's leader and worker)")
    ap.add_argument("--fleet", default=None, metavar="F0,F1,...",
                    help="a fleet of one-worker machines, machine r at the r-th fraction of a core (overrides "
                         "--slow, --machines, --workers and --stragglers)")
    ap.add_argument("--workers", type=int, default=2, help="hogwild's workers in all, DDP's ranks")
    ap.add_argument("--stragglers", type=int, default=1, help="how many of them are slowed (--machines 1)")
    ap.add_argument("--size", choices=sorted(SIZES), default="gpt")
    ap.add_argument("--budget", type=float, default=120.0)
    ap.add_argument("--eval-every-s", type=float, default=10.0)
    ap.add_argument("--lr", type=float, default=LR, help="DDP's peak rate (hogwild: the experiment's, or --override)")
    ap.add_argument("--override", action="append", default=[], help="a Hydra override for hogwild's runs")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--methods", nargs="+", default=["hogwild", "ddp"], help="hogwild, ddp, and --variant names")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=OVERRIDE[,OVERRIDE...]",
                    help="one more hogwild arm, e.g. nobalance=optim.balance=false (repeatable)")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="a checkout of an earlier commit whose hogwild runs as one more arm, 'before'")
    ap.add_argument("--out", type=Path, default=REPO / "bench_results" / "stragglers")
    ap.add_argument("--name", default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="[straggler_race] %(message)s")
    slow, core, label = slowing(args.slow)
    fleet: list[float] = []
    if args.fleet is not None:
        try:
            fleet = [float(f) for f in args.fleet.split(",")]
        except ValueError:
            raise SystemExit(f"--fleet {args.fleet}: fractions of a core, comma-separated (1,0.5,0.25)") from None
        if len(fleet) < 2 or not all(0 < f <= 1 for f in fleet):
            raise SystemExit(f"--fleet {args.fleet}: two machines or more, each at a fraction in (0, 1]")
        fleet_slow, args.slowed, label = fleet_slowing(fleet)
        slow = fleet_slow if args.slowed else None
        args.machines = args.workers = len(fleet)
        args.stragglers = max(len(args.slowed), 1)
    else:
        # 2 x 1: replica 1 (DDP's rank 1); 1 x W: DDP's last K ranks (hogwild's first K workers, above)
        args.slowed = slowed_ranks(args.machines, args.workers, args.stragglers)
    if not 1 <= args.stragglers <= args.workers or args.workers % args.machines:
        raise SystemExit(f"--workers {args.workers} --stragglers {args.stragglers} --machines {args.machines}: "
                         "the workers split evenly over the machines and the stragglers are some of them")
    name = args.name or f"{args.size}_{args.machines}x_" + (
        f"fleet{args.fleet.replace(',', '_')}" if args.fleet else args.slow.replace(':', '')) + (
        f"_w{args.workers}s{args.stragglers}" if args.workers != 2 and not args.fleet else "")
    args.out.mkdir(parents=True, exist_ok=True)
    from examples.gpt import GPT, GPTConfig

    head = {"machines": args.machines, "shaping": f"this host's {os.cpu_count()} cores, {label}" + (
                f", {args.stragglers} of {args.workers} so" if args.stragglers > 1 and not args.fleet else ""),
            "fleet": args.fleet, "workload": args.size,
            "budget": args.budget, "eval_every_s": args.eval_every_s, "lr": args.lr, "command": sys.argv,
            "params": sum(p.numel() for p in GPT(GPTConfig(**SIZES[args.size])).parameters())}
    variants = {name: tuple(o.split(",")) for name, _, o in (v.partition("=") for v in args.variant)}
    arms = {"hogwild": (), **variants, **({"before": ()} if args.baseline else {})}
    unknown = [m for m in args.methods if m not in arms and m != "ddp" and not (m == "standalone" and fleet)]
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; choose from hogwild, ddp, or a --variant's name"
                         " (standalone: with --fleet)")
    alone: dict[int, list[dict[str, Any]]] = {m: [] for m in range(len(fleet))} if "standalone" in args.methods else {}
    methods = [m for m in args.methods if m != "standalone"]
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    with tempfile.TemporaryDirectory() as tmp, busy_core(core):
        for rep in range(args.repeats):  # interleaved: a slow spell of the host hits both arms alike
            for m in alone:
                logger.info("repeat %d/%d: machine %d (%g of a core), alone", rep + 1, args.repeats, m, fleet[m])
                try:
                    alone[m].append(standalone(args, fleet, m, Path(tmp)))
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    logger.error("machine %d alone failed: %s", m, str(e)[-800:])
            for m in methods:
                logger.info("repeat %d/%d: %s", rep + 1, args.repeats, m)
                try:
                    r = (hogwild_arm(args, slow, Path(tmp), 0, arms[m], args.baseline if m == "before" else REPO)
                         if m in arms else ddp_arm(args, slow, 0))
                    logger.info("%s: loss %.4f, %d steps", m, r["loss"], r["steps"])
                except (RuntimeError, subprocess.TimeoutExpired, StopIteration) as e:
                    logger.error("%s failed: %s", m, str(e)[-800:])
                    r = {"error": str(e)[-2000:], "seed": 0}
                runs[m].append(r)
                (args.out / f"{name}.json").write_text(json.dumps(
                    {**head, "arms": summary(runs, set(arms)), "standalone": {str(m): rs for m, rs in alone.items()}},
                    indent=1, default=str) + "\n")
    res = summary(runs, set(arms))
    report(head, res, name, args.out)
    if fleet:
        with (args.out / f"{name}.md").open("a") as f:
            f.write("\n".join(fleet_lines(fleet, res, alone)) + "\n")


if __name__ == "__main__":
    main()
