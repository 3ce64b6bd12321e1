"""Stragglers raced: hogwild against DDP on this host's two cores, one of each arm's processes made
slow the same way, every arm evaluated alike on the clock (issue 56).

The GPT of benchmarks/one-machine.md §15 (``--size gpt``, 0.8M parameters) under the race's AdamW recipe
(scripts/harness/arms.py: warm-up, a cosine over the budget, the same 128 test blocks scored every
``--eval-every-s`` of training on the clock by hogwild's leader and DDP's rank 0, the final model on
the whole split off the clock). Arms:

- ``hogwild``: 1 x 2 (one replica, two workers on the barrier); its first worker is the straggler.
  ``--machines 2``: 2 x 1 under torchrun on this host, replica 1's leader and worker the straggler.
  ``--workers W --stragglers K``: 1 x W, its first K workers each slowed alike (a lent 16-core machine).
- ``ddp``: DDP on two processes (W with ``--workers``); its last rank (K ranks) the straggler.

Stragglers (scripts/harness/stragglers.py): ``--slow throttle:F`` (a cgroup CPU quota of F of a core),
``stalls`` (stopped 1 s every 3 s), ``busy`` (a busy process pinned to core 0 the whole run: §17's
shared core), ``none`` (balanced). Output as scripts/races/lm_race.py's: JSON, table, PNG.

    python scripts/races/straggler_race.py --slow throttle:0.5 --repeats 3 --name straggler_throttle
    python scripts/races/straggler_race.py --slow stalls --repeats 3
    python scripts/races/straggler_race.py --machines 2 --slow throttle:0.5 --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts.harness, examples
from scripts.harness.common import busy_core, clean_env, free_port, result_line, train_cmd
from scripts.harness.arms import LR, SIZES, hogwild_overrides
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


def hogwild_arm(args: argparse.Namespace, slow: Optional[Slow], root: Path, seed: int,
                extra: tuple[str, ...] = ()) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(dir=root))
    workers = args.workers // args.machines
    cmd = train_cmd([*hogwild_overrides(args.size, args.budget, args.eval_every_s), f"workers={workers}",
                     f"train.seed={seed}", f"run_dir={run_dir}", *args.override, *extra], args.machines,
                    launcher="hogwild.cli.launch")
    # A process group of its own (to kill the job's tree), not a session: with the kernel's
    # autogroup a new session is a scheduling group that shares CPU as one process against the
    # busy process, while DDP's ranks shared the busy process's group task by task (benchmarks/stragglers.md §22).
    proc = subprocess.Popen(cmd, cwd=REPO, env=clean_env(OMP_NUM_THREADS="1"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, process_group=0)
    try:
        if slow is None:
            err = proc.communicate(timeout=TIMEOUT_S)[1]
        else:
            find = ((lambda: worker_pids(proc.pid)[:args.stragglers]) if args.machines == 1
                    else (lambda: _replica_pids(proc.pid, 1)))
            pids = wait_for(find, proc, "the straggler")
            with _each(slow, [[p] for p in pids] if args.machines == 1 else [pids]):
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
                               "--budget", str(args.budget),
                               "--lr", str(args.lr), "--eval-every-s", str(args.eval_every_s), "--seed", str(seed)],
                              cwd=REPO, env=clean_env(OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(args.workers)]
    try:
        slowed = [[p.pid] for p in procs[-args.stragglers:]] if slow is not None else []
        with _each(slow, slowed) if slow is not None else contextlib.nullcontext():
            logs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    r = result_line(logs[0])
    return {**r, "tx_bytes_per_step": 0.0, "seed": seed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slow", default="throttle:0.5", help="throttle:F | stalls | busy | none")
    ap.add_argument("--machines", type=int, choices=(1, 2), default=1,
                    help="hogwild 1 x 2 (a slow worker) or 2 x 1 (a slow machine: replica 1's leader and worker)")
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
    ap.add_argument("--out", type=Path, default=REPO / "bench_results" / "stragglers")
    ap.add_argument("--name", default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="[straggler_race] %(message)s")
    slow, core, label = slowing(args.slow)
    if not 1 <= args.stragglers <= args.workers or args.workers % args.machines:
        raise SystemExit(f"--workers {args.workers} --stragglers {args.stragglers} --machines {args.machines}: "
                         "the workers split evenly over the machines and the stragglers are some of them")
    name = args.name or f"{args.size}_{args.machines}x_{args.slow.replace(':', '')}" + (
        f"_w{args.workers}s{args.stragglers}" if args.workers != 2 else "")
    args.out.mkdir(parents=True, exist_ok=True)
    from examples.gpt import GPT, GPTConfig

    head = {"machines": args.machines, "shaping": f"this host's {os.cpu_count()} cores, {label}" + (
                f", {args.stragglers} of {args.workers} so" if args.stragglers > 1 else ""), "workload": args.size,
            "budget": args.budget, "eval_every_s": args.eval_every_s, "lr": args.lr, "command": sys.argv,
            "params": sum(p.numel() for p in GPT(GPTConfig(**SIZES[args.size])).parameters())}
    variants = {name: tuple(o.split(",")) for name, _, o in (v.partition("=") for v in args.variant)}
    arms = {"hogwild": (), **variants}
    unknown = [m for m in args.methods if m not in arms and m != "ddp"]
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; choose from hogwild, ddp, or a --variant's name")
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in args.methods}
    with tempfile.TemporaryDirectory() as tmp, busy_core(core):
        for rep in range(args.repeats):  # interleaved: a slow spell of the host hits both arms alike
            for m in args.methods:
                logger.info("repeat %d/%d: %s", rep + 1, args.repeats, m)
                try:
                    r = hogwild_arm(args, slow, Path(tmp), 0, arms[m]) if m in arms else ddp_arm(args, slow, 0)
                    logger.info("%s: loss %.4f, %d steps", m, r["loss"], r["steps"])
                except (RuntimeError, subprocess.TimeoutExpired, StopIteration) as e:
                    logger.error("%s failed: %s", m, str(e)[-800:])
                    r = {"error": str(e)[-2000:], "seed": 0}
                runs[m].append(r)
                (args.out / f"{name}.json").write_text(
                    json.dumps({**head, "arms": summary(runs, set(arms))}, indent=1, default=str) + "\n")
    report(head, summary(runs, set(arms)), name, args.out)


if __name__ == "__main__":
    main()
