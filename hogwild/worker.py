"""The Hogwild worker: read a batch of its own shard, compute a gradient privately, and
write the update straight into the shared parameters, in place, without a lock.

Workers talk to their leader only through shared tensors (progress counters, a control
block) and one pipe used to wake the leader; they never import the leader.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from hogwild.config import Config
from hogwild.data import Dataset, ShardSampler, shard
from hogwild.models import build_model
from hogwild.optim import FlatOptimizer, grads_finite
from hogwild.shared import bind, layout

logger = logging.getLogger(__name__)

# Columns of the per-worker stats row (float64, shared; each worker writes only its row).
POS, APPLIED, SAMPLES, LOSS, SKIPPED, DONE, STEP_S, SYNC_S, SYNC_STEPS, READY = range(10)
NUM_STATS = 10
# Cells of the control block (written by the leader, read by workers).
STOP, NEXT_SYNC_AT, SYNCING, NOTIFIED, GO = range(5)
NUM_CONTROL = 5

FAULT_ENV = "HOGWILD_FAULT"
WORKER_NICENESS = 5


@dataclass(frozen=True)
class WorkerSpec:
    local_index: int
    """Index among this replica's workers (its stats row)."""
    global_index: int
    """Index among all workers of all replicas: picks the shard and the seed offset."""
    num_global: int
    threads: int
    quota: int
    """Batches this worker processes in the whole run."""


def _injected_faults(global_index: int) -> dict[str, set[int]]:
    """Test hook, e.g. ``HOGWILD_FAULT=nan:0:20,crash:1:50`` (kind:global_worker:step)."""
    faults: dict[str, set[int]] = {}
    for item in filter(None, os.environ.get(FAULT_ENV, "").split(",")):
        kind, who, step = item.split(":")
        if int(who) == global_index:
            faults.setdefault(kind, set()).add(int(step))
    return faults


def worker_main(cfg: Config, spec: WorkerSpec, ds: Dataset, flat: Tensor,
                opt_state: Optional[dict[str, Tensor]], stats: Tensor, control: Tensor,
                wake: Connection) -> None:
    # Oversubscribed intra-op threads make Hogwild slower than one process (DESIGN rule 4).
    torch.set_num_threads(spec.threads)
    # Lower priority than the leader: its short sync bursts then preempt workers at once
    # instead of queueing behind them for a scheduler tick on a fully loaded machine.
    os.nice(WORKER_NICENESS)
    # The leader owns Ctrl-C/SIGTERM and stops workers through the control block.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    logging.basicConfig(level=logging.INFO, format=f"[worker {spec.global_index}] %(message)s")
    torch.manual_seed(cfg.train.seed + spec.global_index)

    model = build_model(cfg.model, ds, cfg.train.seed)
    bind(model, flat)
    model.train()
    slots = layout(model)
    if opt_state is None:
        opt_state = FlatOptimizer.new_state(cfg.optim, flat.numel(),
                                            lambda n: torch.zeros(n, device=flat.device))
    opt = FlatOptimizer(cfg.optim, flat, slots, opt_state)
    sampler = ShardSampler(shard(len(ds.train), spec.num_global, spec.global_index, cfg.train.seed),
                           cfg.train.batch_size, cfg.train.seed + spec.global_index)
    run_loop(model, opt, sampler, ds, spec, stats.numpy(), control.numpy(), wake,
             _injected_faults(spec.global_index), flat.device)


def _backward(model: torch.nn.Module, params: list[Tensor], ds: Dataset, sampler: ShardSampler,
              step: int, device: torch.device) -> tuple[Tensor, int]:
    """Fresh private gradients of batch ``step`` in ``p.grad``; returns (loss, batch size)."""
    inputs, y = ds.train.batch(sampler.batch(step))
    if device.type != "cpu":
        inputs = tuple(t.to(device, non_blocking=True) for t in inputs)
        y = y.to(device, non_blocking=True)
    for p in params:
        p.grad = None
    loss = F.cross_entropy(model(*inputs), y)
    loss.backward()
    return loss, len(y)


def run_loop(model: torch.nn.Module, opt: FlatOptimizer, sampler: ShardSampler, ds: Dataset,
             spec: WorkerSpec, stats_all: np.ndarray, ctrl: np.ndarray, wake: Optional[Connection],
             faults: dict[str, set[int]], device: torch.device) -> None:
    row = stats_all[spec.local_index]
    step = int(row[POS])  # a respawned worker resumes where its predecessor stopped
    parent = os.getppid()
    params = list(model.parameters())
    # One throw-away forward/backward: the allocator's and autograd's first-call costs land
    # in startup (reported as such), not in the first training steps.
    _backward(model, params, ds, sampler, step, device)
    row[READY] = 1.0
    if wake is not None:
        wake.send_bytes(b"r")
    # Replicas start together once every worker everywhere is up (spawn takes seconds).
    while not ctrl[GO] and not ctrl[STOP]:
        if os.getppid() != parent:
            return
        time.sleep(0.005)
    loss_ema = float(row[LOSS]) if row[LOSS] > 0 else 0.0
    while step < spec.quota and not ctrl[STOP]:
        if os.getppid() != parent:  # leader gone (kill -9): never outlive it
            return
        t0 = time.perf_counter()
        syncing = bool(ctrl[SYNCING])
        loss, batch = _backward(model, params, ds, sampler, step, device)
        grads = [p.grad for p in params]
        if step in faults.get("nan", ()):
            grads[0] = torch.full_like(grads[0], float("nan")) if not grads[0].is_sparse else grads[0] * float("nan")
        if step in faults.get("crash", ()):
            raise RuntimeError(f"injected crash at step {step}")
        lval = float(loss.detach())
        if np.isfinite(lval) and grads_finite(grads):
            opt.step(grads)
            row[APPLIED] += 1
            loss_ema = lval if loss_ema == 0.0 else 0.98 * loss_ema + 0.02 * lval
            row[LOSS] = loss_ema
        else:
            row[SKIPPED] += 1  # a poisoned update never reaches the shared model
        step += 1
        row[POS] = step
        row[SAMPLES] += batch
        dt = time.perf_counter() - t0
        row[STEP_S] += dt
        if syncing:
            row[SYNC_S] += dt
            row[SYNC_STEPS] += 1
        target = ctrl[NEXT_SYNC_AT]
        if wake is not None and ctrl[NOTIFIED] < target <= stats_all[:, POS].sum():
            ctrl[NOTIFIED] = target
            wake.send_bytes(b"s")
    row[DONE] = 1.0
    if wake is not None:
        wake.send_bytes(b"d")
