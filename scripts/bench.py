"""Side-by-side benchmarks: hogwild vs single process, DDP and an mnist_hogwild-style baseline.

    python scripts/bench.py --repeats 3 --out bench_results      # full run, writes BENCHMARKS.md data
    python scripts/bench.py --tiny --out /tmp/b                  # smoke size (used by the tests)

Every comparison runs in the same invocation, repeated, and is reported as a ratio of
medians because the machine is shared and noisy. Results: ``<out>/results.json``, a
markdown table ``<out>/table.md`` and, with matplotlib, ``<out>/scaling.png``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hogwild.config import DataConfig, ModelConfig, available_cores  # noqa: E402
from hogwild.data import Dataset, ShardSampler, load_dataset, shard  # noqa: E402
from hogwild.evaluate import evaluate  # noqa: E402
from hogwild.models import build_model  # noqa: E402

logger = logging.getLogger("bench")
CPU = torch.device("cpu")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _data() -> Dataset:
    return load_dataset(DataConfig(name="digits"))


# ------------------------------------------------------------------ baselines
def _sgd_until(model: torch.nn.Module, ds: Dataset, sampler: ShardSampler, lr: float, max_epochs: int,
               eval_every: int, reached: Callable[[], tuple[bool, float]]) -> tuple[float, int, float]:
    """SGD steps until ``reached()`` says so; returns (training clock, steps, last accuracy)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    clock, steps, acc = 0.0, 0, 0.0
    for step in range(max_epochs * sampler.batches_per_epoch):
        t0 = time.perf_counter()
        (x,), y = ds.train.batch(sampler.batch(step))
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        clock += time.perf_counter() - t0  # evaluation stays off the clock
        steps += 1
        if step % eval_every == 0:
            done, acc = reached()
            if done:
                break
    return clock, steps, acc


def single(target: float, lr: float, bs: int, max_epochs: int, eval_every: int) -> dict[str, float]:
    """Plain SGD in one process on one core."""
    torch.set_num_threads(1)
    ds = _data()
    model = build_model(ModelConfig(), ds, 0)

    def reached() -> tuple[bool, float]:
        acc = evaluate(model, ds.test, CPU)[1]
        return acc >= target, acc

    sampler = ShardSampler(torch.arange(len(ds.train)), bs, 0)
    clock, steps, acc = _sgd_until(model, ds, sampler, lr, max_epochs, eval_every, reached)
    return {"time_to_target_s": clock if acc >= target else float("nan"), "test_accuracy": acc,
            "samples_per_s": steps * bs / clock}


def _ddp_rank(rank: int, world: int, port: int, out: Any, target: float, lr: float, bs: int,
              max_epochs: int, eval_every: int) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    ds = _data()
    model = DDP(build_model(ModelConfig(), ds, 0))

    def reached() -> tuple[bool, float]:
        flag, acc = torch.zeros(1), 0.0
        if rank == 0:  # rank 0 evaluates, everyone learns the verdict
            acc = evaluate(model.module, ds.test, CPU)[1]
            flag[0] = float(acc >= target)
        dist.broadcast(flag, 0)
        return bool(flag[0] > 0), acc

    sampler = ShardSampler(shard(len(ds.train), world, rank, 0), bs, rank)
    dist.barrier()
    clock, steps, acc = _sgd_until(model, ds, sampler, lr, max_epochs, eval_every, reached)
    if rank == 0:
        out["r"] = {"time_to_target_s": clock if acc >= target else float("nan"), "test_accuracy": acc,
                    "samples_per_s": steps * bs * world / clock}
    dist.destroy_process_group()


def ddp(procs: int, **kw: Any) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    out = ctx.Manager().dict()
    port = _free_port()
    ps = [ctx.Process(target=_ddp_rank, args=(r, procs, port, out), kwargs=kw) for r in range(procs)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(600)
    return dict(out["r"])


def _mh_worker(rank: int, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float, bs: int,
               epochs: int, stop: Any, started: torch.Tensor) -> None:
    # mnist_hogwild: full dataset per process, torch.optim.SGD per process, no thread pinning.
    torch.manual_seed(rank)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    started[rank] = 1.0
    for _ in range(epochs):
        perm = torch.randperm(len(y))
        for i in range(0, len(y), bs):
            if stop.is_set():
                return
            idx = perm[i:i + bs]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()


def mnist_hogwild(procs: int, target: float, lr: float, bs: int, max_epochs: int, **_: Any) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    ds = _data()
    model = build_model(ModelConfig(), ds, 0)
    model.share_memory()  # per-tensor sharing, as the example does
    stop = ctx.Event()
    x, y = ds.train.inputs[0].clone(), ds.train.targets.clone()
    started = torch.zeros(procs).share_memory_()
    ps = [ctx.Process(target=_mh_worker, args=(r, model, x, y, lr, bs, max_epochs, stop, started))
          for r in range(procs)]
    for p in ps:
        p.start()
    while started.sum() < procs and any(p.is_alive() for p in ps):
        time.sleep(0.001)
    t_start = time.perf_counter()  # the clock starts at the first step, like the others'
    acc = 0.0
    while any(p.is_alive() for p in ps):
        time.sleep(0.02)
        acc = evaluate(model, ds.test, CPU)[1]
        if acc >= target:
            break
    elapsed = time.perf_counter() - t_start
    stop.set()
    for p in ps:
        p.join(30)
    return {"time_to_target_s": elapsed if acc >= target else float("nan"), "test_accuracy": acc}


def hogwild(workers: int, target: float | None, extra: list[str], run_root: Path) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(dir=run_root))
    args = [f"workers={workers}", f"run_dir={run_dir}", "eval.every_s=0.02", "checkpoint.every_s=3600", *extra]
    if target is not None:
        args.append(f"train.target_accuracy={target}")
    proc = subprocess.run([sys.executable, "-m", "hogwild.train", *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads((run_dir / "metrics.json").read_text())


def _sync_cost_rank(rank: int, world: int, port: int, out: Any, n: int, reps: int) -> None:
    """Bare all_reduce of an n-float buffer vs hogwild's sync round on one, same processes."""
    from hogwild.config import SyncConfig
    from hogwild.sync import make_rule, sync_round

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    flat, rule = torch.randn(n), make_rule(SyncConfig())
    bare, ours = [], []
    for _ in range(reps):
        buf = flat.clone()  # the floor gets its own copy too, so both move the same bytes
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        bare.append(time.perf_counter() - t0)
        dist.barrier()
        t0 = time.perf_counter()
        sync_round(flat, rule, rank, world)
        ours.append(time.perf_counter() - t0)
    if rank == 0:
        out["r"] = {"bare_allreduce_s": statistics.median(bare), "sync_round_s": statistics.median(ours)}
    dist.destroy_process_group()


def sync_cost(n: int, world: int = 2, reps: int = 100) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    out = ctx.Manager().dict()
    port = _free_port()
    ps = [ctx.Process(target=_sync_cost_rank, args=(r, world, port, out, n, reps)) for r in range(world)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(300)
    return dict(out["r"])


def hogwild_torchrun(nproc: int, extra: list[str], run_root: Path) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(dir=run_root))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={nproc}",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{_free_port()}", "-m", "hogwild.train",
           f"run_dir={run_dir}", "checkpoint.every_s=3600", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads((run_dir / "metrics.json").read_text())


# ------------------------------------------------------------------ driver
def median_of(fn: Callable[[], dict[str, Any]], repeats: int, key: str) -> tuple[float, list[dict[str, Any]]]:
    runs = [fn() for _ in range(repeats)]
    vals = [float(r[key]) for r in runs if r.get(key) == r.get(key)]  # drop NaN (target missed)
    return (statistics.median(vals) if vals else float("nan")), runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench_results"))
    ap.add_argument("--tiny", action="store_true", help="smoke-test size: seconds, not minutes")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="[bench] %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    runs_dir = args.out / "runs"
    runs_dir.mkdir(exist_ok=True)
    cores = available_cores()
    procs = min(2, cores)
    target = 0.90 if args.tiny else 0.97
    reps = 1 if args.tiny else args.repeats
    kw = dict(target=target, lr=0.1, bs=32, max_epochs=3 if args.tiny else 60, eval_every=5)
    res: dict[str, Any] = {"cores": cores, "processes": procs, "target_accuracy": target,
                           "repeats": reps, "torch": torch.__version__}

    logger.info("time-to-accuracy, mlp on digits to %.2f, %d processes, %d repeats", target, procs, reps)
    tta: dict[str, Any] = {}
    tta["single"] = median_of(lambda: single(**kw), reps, "time_to_target_s")
    tta["ddp"] = median_of(lambda: ddp(procs, **kw), reps, "time_to_target_s")
    tta["mnist_hogwild"] = median_of(lambda: mnist_hogwild(procs, **kw), reps, "time_to_target_s")
    extra = ["train.epochs=3"] if args.tiny else ["train.epochs=60"]
    tta["hogwild"] = median_of(lambda: hogwild(procs, target, extra, runs_dir), reps, "time_to_target_s")
    res["time_to_accuracy"] = {k: {"median_s": v[0], "runs": v[1]} for k, v in tta.items()}
    h = tta["hogwild"][0]
    res["ratios"] = {f"{k}_over_hogwild": tta[k][0] / h for k in ("single", "ddp", "mnist_hogwild")}
    res["hogwild_startup_s"] = statistics.median(r["startup_s"] for r in tta["hogwild"][1])

    logger.info("intra-machine scaling, 1..%d workers", cores)
    steps = 200 if args.tiny else 3000
    scaling: dict[str, Any] = {}
    for name, extra_s in (("mlp_digits", []), ("sparse_synthetic", ["+experiment=sparse"])):
        rates = {}
        for k in range(1, cores + 1):
            rates[k] = median_of(lambda: hogwild(k, None, [*extra_s, f"train.max_steps={steps * k}"], runs_dir),
                                 reps, "samples_per_s")[0]
        scaling[name] = {str(k): {"samples_per_s": r, "efficiency": r / (k * rates[1])} for k, r in rates.items()}
    res["scaling"] = scaling

    if procs >= 2:
        logger.info("sync cost: leader's round vs bare gloo allreduce of the same buffer")
        m = hogwild_torchrun(2, ["workers=1", "sync.interval=10",
                                 "train.epochs=3" if args.tiny else "train.epochs=20"], runs_dir)
        res["sync"] = {"in_run_mean_sync_s": m["mean_sync_s"], "worker_stall_s": m["worker_stall_s"],
                       "syncs": m["syncs"], "test_accuracy": m["test_accuracy"], "sizes": {}}
        n_mlp = sum(p.numel() for p in build_model(ModelConfig(), _data(), 0).parameters())
        for label, n in (("mlp_digits", n_mlp), ("1M", 1_000_000), ("10M", 10_000_000)):
            if args.tiny and n > n_mlp:
                continue
            c = sync_cost(n, reps=20 if args.tiny or n >= 10_000_000 else 100)
            c["ratio"] = c["sync_round_s"] / c["bare_allreduce_s"]
            res["sync"]["sizes"][label] = {"floats": n, **c}

    (args.out / "results.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    (args.out / "table.md").write_text(table(res))
    plot(res, args.out)
    sys.stdout.write(table(res))


def table(res: dict[str, Any]) -> str:
    t = res["time_to_accuracy"]
    lines = [f"Time to {res['target_accuracy']:.2f} test accuracy, mlp on digits, {res['processes']} processes "
             f"(median of {res['repeats']}; training clock)", "",
             "| method | median s | final acc | hogwild speed-up |", "|---|---|---|---|"]
    for k in ("single", "ddp", "mnist_hogwild", "hogwild"):
        accs = [r.get("test_accuracy", float("nan")) for r in t[k]["runs"]]
        ratio = res["ratios"].get(f"{k}_over_hogwild", 1.0)
        lines.append(f"| {k} | {t[k]['median_s']:.3f} | {statistics.median(accs):.4f} | {ratio:.2f}x |")
    lines += ["", f"hogwild startup (launch to first step): {res['hogwild_startup_s']:.2f} s", ""]
    for name, rows in res["scaling"].items():
        lines += [f"Scaling, {name}", "", "| workers | samples/s | efficiency |", "|---|---|---|"]
        lines += [f"| {k} | {v['samples_per_s']:,.0f} | {v['efficiency']:.2f} |" for k, v in rows.items()]
        lines.append("")
    if "sync" in res:
        s = res["sync"]
        lines += ["Sync cost, 2 ranks, gloo on loopback (median; same processes, idle machine)", "",
                  "| buffer | floats | bare all_reduce ms | sync round ms | ratio |", "|---|---|---|---|---|"]
        lines += [f"| {k} | {v['floats']:,} | {v['bare_allreduce_s'] * 1e3:.3f} | {v['sync_round_s'] * 1e3:.3f} "
                  f"| {v['ratio']:.2f}x |" for k, v in s["sizes"].items()]
        lines += ["", f"In a 2x1 torchrun run: mean round {s['in_run_mean_sync_s'] * 1e3:.2f} ms (includes "
                  f"waiting for the other replica), worker stall {s['worker_stall_s']:.3f} s over "
                  f"{s['syncs']} syncs", ""]
    return "\n".join(lines)


def plot(res: dict[str, Any], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib not installed (pip install -e '.[bench]'): no PNG")
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, rows in res["scaling"].items():
        ks = [int(k) for k in rows]
        ax.plot(ks, [rows[str(k)]["efficiency"] for k in ks], marker="o", label=name)
    ax.set_xlabel("workers")
    ax.set_ylabel("efficiency")
    ax.set_ylim(0, 1.2)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "scaling.png", dpi=100)


if __name__ == "__main__":
    main()
