"""What hogwild is compared with, implemented on the same model, data and process count.

- ``single``: plain SGD, one process, one core.
- ``ddp``: DistributedDataParallel over Gloo, one process per core, all-reduce every step.
- ``mnist_hogwild``: pytorch/examples' recipe: ``model.share_memory()`` (one shared tensor per
  parameter), no thread pinning, the full dataset in every process, SGD per process.

Baselines evaluate every ``eval_every`` steps *off* the clock; hogwild evaluates in its leader
on the clock, as it does in real use. Also here: the bare-all_reduce floor of the sync cost.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from scripts.harness.common import free_port

from hogwild.bench import build_model, digits, evaluate, shard_sampler, sync_round, sync_rule


@dataclass(frozen=True)
class Workload:
    name: str
    model: str
    target: float
    lr: float
    max_epochs: int
    eval_every: int
    """Baselines: evaluate every this many steps (off the clock)."""
    eval_every_s: float
    """hogwild: leader evaluates this often (on the clock)."""
    image_size: int = 0
    hidden: int = 128
    bs: int = 32
    target_path: str = ""
    """A model._target_ (e.g. torchvision.models.resnet18) instead of the built-in ``model``."""
    channels: int = 1
    seed: int = 0
    """Initial weights, shards and data order, as hogwild's ``train.seed`` sets them. One seed is one
    draw: a deterministic baseline repeated on it gives the same run every time."""
    split_seed: int = 0
    """The digits' train/test split (``data.split_seed``): which 360 images are the test set."""

    def hydra(self) -> list[str]:
        model = ([f"model._target_={self.target_path}", "+model.num_classes=10"] if self.target_path
                 else [f"model={self.model}", f"model.hidden={self.hidden}"])
        return [*model, f"data.image_size={self.image_size}", f"data.channels={self.channels}",
                f"optim.lr={self.lr}", f"train.batch_size={self.bs}", f"train.epochs={self.max_epochs}",
                f"eval.every_s={self.eval_every_s}", f"train.seed={self.seed}",
                f"data.split_seed={self.split_seed}"]

    def data(self) -> Any:
        return digits(self.image_size, self.channels, self.split_seed)

    def sampler(self, ds: Any, shards: int, index: int) -> Any:
        """Worker ``index`` of ``shards``: its shard and data order as ``train.seed`` makes them in
        a hogwild job, so a baseline's rank or replica reads what hogwild's worker would."""
        return shard_sampler(len(ds.train), self.bs, self.seed, shards, index)

    def build(self, ds: Any) -> torch.nn.Module:
        return build_model(ds, self.seed, name=self.model, hidden=self.hidden, target=self.target_path or None)

    def accuracy(self, model: torch.nn.Module, ds: Any) -> float:
        return evaluate(model, ds.test)["accuracy"]


MLP = Workload("mlp_digits", "mlp", target=0.97, lr=0.1, max_epochs=60, eval_every=5, eval_every_s=0.02)
CONVNET = Workload("convnet_digits28", "convnet", target=0.97, lr=0.05, max_epochs=30, eval_every=25,
                   eval_every_s=1.0, image_size=28)
# A BatchNorm model from torchvision on RGB 32x32 digits: buffers shared, synced and evaluated.
RESNET = Workload("resnet18_digits32", "mlp", target=0.90, lr=0.05, max_epochs=20, eval_every=10, eval_every_s=2.0,
                  image_size=32, target_path="torchvision.models.resnet18", channels=3)
TINY = Workload("mlp_digits_tiny", "mlp", target=0.90, lr=0.1, max_epochs=3, eval_every=5, eval_every_s=0.02)
# The workloads a cross-machine script can name with --workload.
WORKLOADS = {"mlp": MLP, "resnet": RESNET}


def workload_from_args(args: Any) -> Workload:
    """``--workload`` with the command line's ``--target``, ``--epochs``, ``--seed`` and
    ``--split-seed`` applied: the one reading of them every cross-machine script shares."""
    w = WORKLOADS[args.workload]
    if args.target is not None:
        w = dataclasses.replace(w, target=args.target)
    if args.epochs is not None:
        w = dataclasses.replace(w, max_epochs=args.epochs)
    return dataclasses.replace(w, seed=args.seed, split_seed=args.split_seed)


class RankResults:
    """What a rank reports (``out[key] = value``), carried home on a queue. A Manager's dict
    would cost a server process, and under spawn that is one more interpreter importing torch."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def __setitem__(self, key: str, value: Any) -> None:
        self.queue.put((key, value))


def rank_context() -> Any:
    """Where the baselines' ranks start: a fork server that imported torch once (each rank a fork
    of it, as the trainer's workers are), else spawn. Every clock here starts after the ranks are
    up (DDP's after its first barrier, mnist_hogwild's at its first step), so this saves the
    interpreters' start-up and changes no figure."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch"])
    return ctx


def spawn_ranks(fn: Callable[..., None], world: int, *args: Any) -> dict[Any, Any]:
    """Run ``fn(rank, world, port, out, *args)`` in ``world`` processes (:func:`rank_context`)."""
    ctx = rank_context()
    queue = ctx.SimpleQueue()
    port = free_port()
    ps = [ctx.Process(target=fn, args=(r, world, port, RankResults(queue), *args)) for r in range(world)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(900)
    out: dict[Any, Any] = {}
    while not queue.empty():  # a few small dicts: they fit in the pipe, so joining first cannot block
        key, value = queue.get()
        out[key] = value
    return out


def sgd_step(model: torch.nn.Module, opt: torch.optim.Optimizer, ds: Any, idx: torch.Tensor) -> None:
    """One step of the baselines' recipe (cross-entropy, the optimizer given) on training rows ``idx``."""
    (x,), y = ds.train.batch(idx)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


def _sgd_until(model: torch.nn.Module, ds: Any, sampler: Any, w: Workload,
               reached: Callable[[], tuple[bool, float]]) -> tuple[float, int, float]:
    """SGD steps until ``reached()`` says so; returns (training clock, steps, last accuracy)."""
    opt = torch.optim.SGD(model.parameters(), lr=w.lr)
    clock, steps, acc = 0.0, 0, 0.0
    for step in range(w.max_epochs * sampler.batches_per_epoch):
        t0 = time.perf_counter()
        sgd_step(model, opt, ds, sampler.batch(step))
        clock += time.perf_counter() - t0
        steps += 1
        if step % w.eval_every == 0:
            done, acc = reached()
            if done:
                return clock, steps, acc
    return clock, steps, reached()[1]  # budget spent: the accuracy of the final model


def _result(clock: float, steps: int, acc: float, w: Workload, procs: int) -> dict[str, float]:
    return {"time_to_target_s": clock if acc >= w.target else float("nan"), "test_accuracy": acc,
            "samples_per_s": steps * w.bs * procs / clock, "steps": steps * procs}


def single(w: Workload) -> dict[str, float]:
    torch.set_num_threads(1)
    ds = w.data()
    model = w.build(ds)

    def reached() -> tuple[bool, float]:
        acc = w.accuracy(model, ds)
        return acc >= w.target, acc

    sampler = shard_sampler(len(ds.train), w.bs, w.seed)
    return _result(*_sgd_until(model, ds, sampler, w, reached), w, 1)


def _ddp_rank(rank: int, world: int, port: int, out: Any, w: Workload, addr: str = "127.0.0.1") -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    ds = w.data()
    model = DDP(w.build(ds))

    def reached() -> tuple[bool, float]:
        flag, acc = torch.zeros(1), 0.0
        if rank == 0:  # rank 0 evaluates, everyone learns the verdict
            acc = w.accuracy(model.module, ds)
            flag[0] = float(acc >= w.target)
        dist.broadcast(flag, 0)
        return bool(flag[0] > 0), acc

    sampler = w.sampler(ds, world, rank)
    dist.barrier()
    res = _sgd_until(model, ds, sampler, w, reached)
    if rank == 0:
        out["r"] = _result(*res, w, world)
    # Rank 0 serves the store: leaving while another rank still tears its process group down
    # kills that rank in C++ ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


def ddp(procs: int, w: Workload) -> dict[str, float]:
    return dict(spawn_ranks(_ddp_rank, procs, w)["r"])


def _mh_worker(rank: int, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, w: Workload,
               stop: Any, started: torch.Tensor) -> None:
    torch.manual_seed(rank)
    opt = torch.optim.SGD(model.parameters(), lr=w.lr)
    started[rank] = 1.0
    for _ in range(w.max_epochs):
        perm = torch.randperm(len(y))
        for i in range(0, len(y), w.bs):
            if stop.is_set():
                return
            idx = perm[i:i + w.bs]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()


def mnist_hogwild(procs: int, w: Workload) -> dict[str, float]:
    """Clock from the first step; the parent evaluates the shared model every 20 ms."""
    ctx = rank_context()
    ds = w.data()
    model = w.build(ds)
    model.share_memory()
    stop = ctx.Event()
    started = torch.zeros(procs).share_memory_()
    # Plain (non-shared) tensors are pickled: every process gets its own full copy.
    x, y = ds.train.inputs[0].clone(), ds.train.targets.clone()
    ps = [ctx.Process(target=_mh_worker, args=(r, model, x, y, w, stop, started)) for r in range(procs)]
    for p in ps:
        p.start()
    while started.sum() < procs and any(p.is_alive() for p in ps):
        time.sleep(0.001)
    t_start, acc = time.perf_counter(), 0.0
    while any(p.is_alive() for p in ps):
        time.sleep(0.02)
        acc = w.accuracy(model, ds)
        if acc >= w.target:
            break
    elapsed = time.perf_counter() - t_start
    if acc < w.target:
        acc = w.accuracy(model, ds)  # budget spent: the accuracy of the final model
    stop.set()
    for p in ps:
        p.join(30)
    return {"time_to_target_s": elapsed if acc >= w.target else float("nan"), "test_accuracy": acc}


def _sync_cost_rank(rank: int, world: int, port: int, out: Any, n: int, reps: int, modes: tuple[str, ...]) -> None:
    """Bare all_reduce of an n-float buffer vs hogwild's sync round (each rule of ``modes``) on
    one, interleaved in the same processes."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    flat = torch.randn(n)
    for mode in modes:
        bare, ours = time_bare_and_round(flat, sync_rule(flat, mode), reps)
        if rank == 0:
            out[mode] = {"bare_allreduce_s": bare, "sync_round_s": ours}
    dist.destroy_process_group()


def time_bare_and_round(flat: torch.Tensor, rule: Any, reps: int, warmup: int = 0,
                        settle: Callable[[], None] = lambda: None) -> tuple[float, float]:
    """Medians of a bare all_reduce of a copy of ``flat`` and of hogwild's sync round on ``flat``,
    interleaved in the same processes. ``settle`` waits for queued device work (CUDA's kernels
    run after the call returns); the first ``warmup`` pairs are not counted."""
    buf = flat.clone()
    bare, ours = [], []
    for i in range(warmup + reps):
        buf.copy_(flat)
        settle()
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        settle()
        t1 = time.perf_counter()
        dist.barrier()
        t2 = time.perf_counter()
        sync_round(flat, rule)
        settle()
        t3 = time.perf_counter()
        if i >= warmup:
            bare.append(t1 - t0)
            ours.append(t3 - t2)
    return statistics.median(bare), statistics.median(ours)


def sync_cost(n: int, world: int = 2, reps: int = 100, modes: tuple[str, ...] = ("average",)
              ) -> dict[str, dict[str, float]]:
    """Per rule of ``modes``: the median bare all_reduce and sync round, in seconds. One process
    group for all of them (each start of ``world`` interpreters costs seconds)."""
    return spawn_ranks(_sync_cost_rank, world, n, reps, tuple(modes))
