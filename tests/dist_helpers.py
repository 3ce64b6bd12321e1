"""Rank entry points for multi-process sync tests (importable by spawned children)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from hogwild.config.schema import SyncConfig
from hogwild.replica.start import worker_context
from hogwild.sync.comm import DistComm
from hogwild.sync.rounds import sync_round
from hogwild.sync.rules import Average, SyncContext, make_rule
from tests.writer import Writer


def _init(rank: int, world: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))


def spawn(fn: Callable[..., None], world: int, port: int, *args: Any) -> list[Any]:
    """Run ``fn(rank, world, port, out, *args)`` on ``world`` gloo ranks; collect ``out``. The
    ranks start from the trainer's fork server, which has imported torch once, as its workers do."""
    ctx = worker_context()
    out = ctx.Manager().dict()
    procs = [ctx.Process(target=fn, args=(r, world, port, out, *args)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        if p.is_alive():
            p.kill()
            raise TimeoutError("rank did not finish in 120 s")
        assert p.exitcode == 0, f"rank exited with {p.exitcode}"
    return [out[r] for r in range(world)]


def writer_during_sync(rank: int, world: int, port: int, out: Any) -> None:
    """A writer thread adds +1 to the whole buffer while the leader syncs it, once through
    ``sync_round`` and once by a naive in-place all_reduce, each on a fresh buffer and writer.

    Average preserves total mass: the sum over replicas of all values after the sync
    must equal every increment ever made. Returns {naive: (mass after, increments made)}.
    """
    # Both cases in one process group: a second spawn only repeats the ranks' start-up.
    _init(rank, world, port)
    torch.set_num_threads(1)
    results = {}
    for naive in (False, True):
        flat = torch.zeros(4_000_000)
        writer = Writer(flat)
        if naive:
            dist.all_reduce(flat)  # in place on the live buffer: design rule 2's bug
            writer.stop()
            flat.div_(world)
        else:
            class Rule(Average):
                # The writer stops once the collective is over, so the test isolates what the
                # collective does to concurrent writes (the final add_ is one in-place op).
                def exchange(self, *a: Any, **k: Any) -> Any:
                    result = super().exchange(*a, **k)
                    writer.stop()
                    return result

            sync_round(flat, Rule(SyncConfig(), DistComm(flat.device)))
        dist.barrier()
        results[naive] = (float(flat.double().sum()), writer.increments)
    out[rank] = results
    dist.destroy_process_group()


def rule_targets(rank: int, world: int, port: int, out: Any,
                 cases: list[tuple[SyncConfig, list[list[float]], int]]) -> None:
    """For each case (rule, every rank's values, rounds): this rank's target after the rounds,
    all in one process group."""
    _init(rank, world, port)
    results = []
    for cfg, values, rounds in cases:
        results.append(target_after(make_rule(cfg, DistComm(torch.device("cpu"))), values, rounds, rank, world))
    out[rank] = results
    dist.destroy_process_group()


def start_from(values: list[list[float]]) -> torch.Tensor:
    """The model every replica starts from, as one seed makes it in a job: here the first healthy
    rank's values, which a rule is primed with (as ``Rounds`` primes it) before its first round."""
    return torch.tensor(next((v for v in values if torch.isfinite(torch.tensor(v)).all()), values[0]))


def target_after(rule: Any, values: list[list[float]], rounds: int, rank: int, world: int) -> list[float]:
    healthy = [bool(torch.isfinite(torch.tensor(v)).all()) for v in values]
    rule.prime(start_from(values))
    snap = torch.tensor(values[rank])
    result = snap
    for _ in range(rounds):
        result = rule.target(snap.clone(), SyncContext(rank, world, healthy))
    return result.tolist()
