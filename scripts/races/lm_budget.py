"""A language model's test loss after a fixed wall-clock budget: hogwild 1 x 2 and 2 x 1, DDP on 2
processes, and one process using every core, side by side.

``--workload gpt`` (the default): the nanoGPT-style GPT of ``examples/gpt.py`` (4 layers, 0.8M
parameters) on the standard library's characters, with a 1,874-block test split whose one
evaluation takes seconds. hogwild runs ``+experiment=gpt`` on its **default** settings
(evaluation cadence and budget, checkpoints, the default sync rule) and stops itself with
``train.max_time``; its cosine schedule follows the budget. DDP and the single process train the
same model with the same recipe (AdamW lr 3e-3, weight decay 0.05 on matrices only, 100 warm-up
steps then a cosine over the budget, clipping at 1.0, batches of 32 per process) and evaluate
once, at the end. ``--workload charlm``: examples/charlm.py's transformer with a constant rate,
hogwild stopped by SIGTERM with evaluation off (the older table in BENCHMARKS.md).

The clock starts at each method's first training step (start-up is off the clock for all).
Repeats are interleaved so a change in the machine's load hits every method alike.
``--baseline-lrs`` runs DDP and the single process at each rate of a grid (hogwild stays on its
defaults); ``--straggler`` keeps a busy process pinned to core 0 for every run; ``--throttle F``
holds hogwild 1 x W's first worker and DDP's last rank to F of a core (a cgroup's CPU quota,
scripts/harness/stragglers.py) and ``--stalls`` stops them for 1 s every 3 s.

    python scripts/races/lm_budget.py --workload gpt --budget 120 --repeats 3 --out bench_results
    python scripts/races/lm_budget.py --baseline-lrs 1e-3 2e-3 3e-3 6e-3 --repeats 3 --name lm_budget_gpt_grid
    python scripts/races/lm_budget.py --methods hogwild_1x2 ddp_2 --straggler --repeats 3
    python scripts/races/lm_budget.py --methods hogwild_1x2 ddp_2 --throttle 0.5 --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from scripts.harness.common import busy_core, clean_env, free_port, metrics, table_head, train_cmd, write_results  # noqa: E402
from scripts.harness.stragglers import cgroup_version, stalled, throttled, wait_for, worker_pids  # noqa: E402

from hogwild.bench import evaluate, last_checkpoint, read_board  # noqa: E402

logger = logging.getLogger("lm_budget")
LR, WD, WARMUP, CLIP, BATCH = 3e-3, 0.05, 100, 1.0, 32
RECIPE = ["+experiment=charlm", "train.max_steps=1000000", "sched.name=constant", f"sched.warmup_steps={WARMUP}",
          "eval.every_s=1000", "checkpoint.every_s=1000"]
METHODS = ("hogwild_1x2", "hogwild_2x1", "ddp_2", "single")
GPT_SIZE = ["model.kwargs.config.n_layer=4", "+data.test_chars=120000"]
CONTEXT = 64


def _hogwild(replicas: int, budget: float, work: Path) -> dict[str, Any]:
    """Start the CLI, SIGTERM it ``budget`` s after its first step (its final round and checkpoint
    follow), then score the checkpoint with hogwild-eval."""
    run = work / f"hw{replicas}"
    cmd = train_cmd([*RECIPE, f"workers={2 // replicas}", f"run_dir={run}"], replicas)
    # Its own process group, not a session: a session is an autogroup that the kernel's scheduler
    # shares CPU with as one process, where the DDP arm's ranks count one by one (benchmarks/stragglers.md §22).
    proc = subprocess.Popen(cmd, cwd=REPO, env=clean_env(OMP_NUM_THREADS="1"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, process_group=0)
    try:
        while True:
            board = read_board(run)
            if board is not None and board.applied > 0:
                break
            if proc.poll() is not None:
                raise RuntimeError(f"hogwild {replicas} replicas ended before training (exit {proc.returncode})")
            time.sleep(0.01)
        time.sleep(budget)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    ckpt = last_checkpoint(run)
    if ckpt is None:
        raise RuntimeError(f"hogwild {replicas} replicas wrote no checkpoint")
    out = subprocess.run([sys.executable, "-m", "hogwild.cli.evaluate", f"checkpoint={ckpt.path}",
                          "model._target_=examples.charlm.CharTransformer",
                          "data._target_=examples.charlm.stdlib_text"],
                         cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    scores = json.loads(out.stdout.strip().splitlines()[-1])
    return {"perplexity": scores["test_perplexity"], "steps": ckpt.steps}


# A straggler made of one process: a context that slows ``pid`` while it is open (scripts/harness/stragglers.py).
Slow = Callable[[int], contextlib.AbstractContextManager[Any]]


def _hogwild_gpt(replicas: int, budget: float, work: Path, extra: tuple[str, ...] = (),
                 width: int = 2, slow: Optional[Slow] = None) -> dict[str, Any]:
    """``+experiment=gpt`` on hogwild's defaults (plus ``extra`` overrides, to try a change),
    stopped by its own ``train.max_time``: ``replicas`` x (``width`` / ``replicas``) workers;
    ``slow``: one worker made a straggler (1 x W only)."""
    run = work / f"hw{replicas}"
    args = ["+experiment=gpt", *GPT_SIZE, "train.max_steps=100000000", f"train.max_time={budget}",
            f"workers={width // replicas}", f"run_dir={run}", *extra]
    if slow is None:
        out = subprocess.run(train_cmd(args, replicas, launcher="hogwild.cli.launch"), cwd=REPO,
                             env=clean_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=budget + 900)
        code, err = out.returncode, out.stderr
    else:  # 1 x W: the leader is this process's child, and its first worker is the straggler
        proc = subprocess.Popen(train_cmd(args), cwd=REPO, env=clean_env(OMP_NUM_THREADS="1"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        with slow(wait_for(lambda: worker_pids(proc.pid)[:1], proc, "the leader's first worker")[0]):
            err = proc.communicate(timeout=budget + 900)[1]
        code = proc.returncode
    if code != 0:
        raise RuntimeError(err[-2000:])
    m = metrics(run)
    return {"loss": m["test_loss"], "perplexity": m["test_perplexity"], "steps": m["steps"],
            "tokens_per_s": m["samples_per_s"] * CONTEXT, "eval_fraction": m["eval_fraction"],
            "train_s": m["train_s"], "peak_memory_mb": m["peak_memory_mb"], "update": m.get("update"),
            "optimizer_steps": m.get("optimizer_steps"), "late_gradients": m.get("late_gradients"),
            "barrier_wait_fraction": m.get("barrier_wait_fraction"), "time_s": m.get("time_s")}


def _join(rank: int, world: int, port: int, threads: int) -> None:
    torch.set_num_threads(threads)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=120))


def _train(model: torch.nn.Module, world: int, rank: int, train: Any, budget: float,
           rate: Callable[[int, float], float], loss: Callable[..., torch.Tensor]) -> tuple[int, float]:
    """The baselines' shared recipe: DDP over ``world`` ranks, AdamW with decay on matrices only at
    ``rate(step, seconds)``, clipping, this rank's sample stream, until the budget is spent on some
    rank (the clock starts after the first step, as hogwild's). Returns (steps, seconds)."""
    net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    ps = list(model.parameters())
    groups = [{"params": [p for p in ps if p.dim() > 1], "weight_decay": WD},
              {"params": [p for p in ps if p.dim() <= 1], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=rate(0, 0.0))
    gen = torch.Generator().manual_seed(rank)
    x_all, y_all = torch.stack([train[i][0] for i in range(len(train))]), train.targets
    step, t0, spent = 0, None, 0.0
    while True:
        spent = 0.0 if t0 is None else time.monotonic() - t0
        if t0 is not None and _over(spent, budget, world):
            return step, spent
        idx = torch.randint(len(train), (BATCH,), generator=gen)
        for g in opt.param_groups:
            g["lr"] = rate(step, spent)
        opt.zero_grad(set_to_none=True)
        loss(net, x_all[idx], y_all[idx]).backward()
        torch.nn.utils.clip_grad_norm_(ps, CLIP)
        opt.step()
        step += 1
        if t0 is None:
            t0 = time.monotonic()


def _over(spent: float, budget: float, world: int) -> bool:
    """The budget is spent on some rank: every rank stops at the same step."""
    over = torch.tensor([float(spent >= budget)])
    if world > 1:
        dist.all_reduce(over, op=dist.ReduceOp.MAX)
    return bool(over.item())


def _gpt_rank(rank: int, world: int, port: int, budget: float, threads: int, out: Any, lr: float = LR) -> None:
    from examples.charlm import stdlib_text
    from examples.gpt import GPT, GPTConfig

    _join(rank, world, port, threads)
    train, test = stdlib_text(test_chars=120_000)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=4))
    # Warm-up, then a cosine over the budget, as hogwild's schedule under max_time.
    step, spent = _train(model, world, rank, train, budget, lambda step, spent: lr * min(1.0, (step + 1) / WARMUP)
                         * 0.5 * (1 + math.cos(math.pi * min(spent / budget, 1.0))), lambda net, x, y: net(x, y)[1])
    import resource

    out[f"peak_rss_mb{rank}"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the evaluation
    if rank == 0:
        model.eval()
        x_test, y_test = torch.stack([test[i][0] for i in range(len(test))]), test.targets
        with torch.no_grad():
            total = sum(float(model(x_test[i:i + 256], y_test[i:i + 256])[1]) * len(x_test[i:i + 256])
                        for i in range(0, len(x_test), 256))
        loss = total / len(x_test)
        out["result"] = {"loss": loss, "perplexity": math.exp(loss), "steps": step * world,
                         "tokens_per_s": step * world * BATCH * CONTEXT / max(spent, 1e-9), "eval_fraction": 0.0,
                         "train_s": spent}
    if world > 1:
        dist.destroy_process_group()


def _baseline_rank(rank: int, world: int, port: int, budget: float, threads: int, out: Any, lr: float = LR) -> None:
    from examples.charlm import CharTransformer, stdlib_text

    _join(rank, world, port, threads)
    train, test = stdlib_text()
    torch.manual_seed(0)
    model = CharTransformer()
    step, _ = _train(model, world, rank, train, budget, lambda step, _: lr * min(1.0, (step + 1) / WARMUP),
                     lambda net, x, y: F.cross_entropy(net(x).reshape(-1, 128), y.reshape(-1)))
    if rank == 0:
        split = (torch.stack([test[i][0] for i in range(len(test))]), test.targets)
        out["result"] = {"perplexity": evaluate(model, split, "language_model")["perplexity"], "steps": step * world}
    if world > 1:
        dist.destroy_process_group()


def _baseline(world: int, budget: float, target: Any = None, lr: float = LR,
              slow: Optional[Slow] = None) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Manager().dict()
    threads = max(1, (os.cpu_count() or 2) // world)
    port = free_port()
    procs = [ctx.Process(target=target or _baseline_rank, args=(r, world, port, budget, threads, out, lr))
             for r in range(world)]
    for p in procs:
        p.start()
    with slow(procs[-1].pid) if slow is not None else contextlib.nullcontext():  # the last rank straggles
        for p in procs:
            p.join(budget + 600)
    if "result" not in out:
        raise RuntimeError(f"baseline on {world} processes produced no result")
    rss = [out[k] for k in out.keys() if str(k).startswith("peak_rss_mb")]
    # Each rank's own peak resident set, summed: a DDP rank shares no tensors with another (the
    # libraries' pages, counted in each, are a few tens of MB).
    return {**dict(out["result"]), "peak_memory_mb": sum(rss) if len(rss) == world else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=("gpt", "charlm"), default="gpt")
    ap.add_argument("--budget", type=float, default=120.0, help="seconds of training per run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "bench_results")
    ap.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    ap.add_argument("--override", action="append", default=[],
                    help="a Hydra override added to hogwild's runs (gpt workload), to try a change")
    ap.add_argument("--lr", type=float, default=None,
                    help="peak learning rate of every method (gpt workload; default: the experiment's 3e-3)")
    ap.add_argument("--baseline-lrs", type=float, nargs="+", default=None,
                    help="gpt: DDP and the single process at each of these rates (hogwild stays on its own)")
    ap.add_argument("--straggler", action="store_true",
                    help="a busy process pinned to core 0 for every run: one core shared the whole run")
    ap.add_argument("--throttle", type=float, default=None, metavar="FRACTION",
                    help="one hogwild worker and one DDP rank held to FRACTION of a core by a cgroup quota")
    ap.add_argument("--stalls", action="store_true",
                    help="one hogwild worker and one DDP rank stopped for 1 s every 3 s")
    ap.add_argument("--name", default=None, help="the results' file name (default from the options)")
    ap.add_argument("--width", type=int, default=2,
                    help="gpt: W for hogwild 1 x W and W x 1 and DDP on W processes (a machine of W cores)")
    args = ap.parse_args()
    overrides = [*([f"optim.lr={args.lr}"] if args.lr is not None else []), *args.override]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    gpt = args.workload == "gpt"
    base_lr = args.lr if args.lr is not None else LR
    configs = [(m, None if m.startswith("hogwild") or args.baseline_lrs is None else lr)
               for m in args.methods for lr in (args.baseline_lrs or [base_lr])]
    configs = list(dict.fromkeys(configs))  # hogwild once, whatever the baselines' rates
    wide = {"hogwild_1x2": f"hogwild_1x{args.width}", "hogwild_2x1": f"hogwild_{args.width}x1",
            "ddp_2": f"ddp_{args.width}", "single": "single"}
    label = {c: wide[c[0]] + (f" lr {c[1]:g}" if c[1] is not None else "") for c in configs}
    runs: dict[str, list[dict[str, Any]]] = {label[c]: [] for c in configs}
    slow: Optional[Slow] = None
    if args.throttle is not None:
        slow = lambda pid: throttled([pid], args.throttle)  # noqa: E731
        logger.info("stragglers: cgroup %s, one process at %.2f of a core", cgroup_version(), args.throttle)
    elif args.stalls:
        slow = lambda pid: stalled(pid, 1.0, 3.0)  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp, busy_core(0 if args.straggler else None):
        for rep in range(args.repeats):
            for c in configs:
                method, lr = c
                work = Path(tmp) / f"{method}_{lr}_{rep}"
                work.mkdir()
                if method.startswith("hogwild"):
                    replicas = 1 if method == "hogwild_1x2" else args.width
                    r = (_hogwild_gpt(replicas, args.budget, work, tuple(overrides), args.width,
                                      slow if replicas == 1 else None) if gpt
                         else _hogwild(int(method[-3]), args.budget, work))
                else:
                    r = _baseline(args.width if method == "ddp_2" else 1, args.budget, _gpt_rank if gpt else None,
                                  lr if lr is not None else base_lr, slow if method == "ddp_2" else None)
                logger.info("repeat %d %s: %s", rep, label[c], json.dumps(r))
                runs[label[c]].append(r)
    name = args.name or (("lm_budget_gpt" + (f"_lr{args.lr:g}" if args.lr is not None else "")
                          + ("_straggler" if args.straggler else "")
                          + (f"_throttle{args.throttle:g}" if args.throttle is not None else "")
                          + ("_stalls" if args.stalls else "")) if gpt else "lm_budget")
    if gpt:
        lines = table_head("method", f"median test loss after {args.budget:.0f} s", "runs", "median tokens/s",
                           "median steps (all processes)", "median eval share", "median peak memory (MiB)")
        for method, rs in runs.items():
            med = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731
            losses = ", ".join(f"{r['loss']:.4f}" for r in rs)
            mem = [r["peak_memory_mb"] for r in rs if r.get("peak_memory_mb")]
            lines.append(f"| {method} | {med('loss'):.4f} | {losses} | {med('tokens_per_s'):,.0f} | "
                         f"{med('steps'):.0f} | {med('eval_fraction'):.3f} | "
                         + (f"{statistics.median(mem):,.0f} |" if mem else "– |"))
    else:
        lines = table_head("method", f"median test perplexity after {args.budget:.0f} s", "runs",
                           "median steps (all processes)")
        for method in runs:
            ppl = [r["perplexity"] for r in runs[method]]
            steps = statistics.median(r["steps"] for r in runs[method])
            lines.append(f"| {method} | {statistics.median(ppl):.3f} | {', '.join(f'{p:.3f}' for p in ppl)} | "
                         f"{steps:.0f} |")
    write_results(args.out, name, {"command": sys.argv, "budget_s": args.budget, "lr": args.lr,
                                   "straggler": args.straggler, "throttle": args.throttle,
                                   "cgroup": cgroup_version() if args.throttle is not None else None,
                                   "stalls": args.stalls, "runs": runs}, "\n".join(lines) + "\n", indent=1)
    if any(not math.isfinite(r["perplexity"]) for rs in runs.values() for r in rs):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
