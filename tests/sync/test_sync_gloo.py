"""The sync rules on real gloo ranks over loopback, through DistComm and spawned processes
(slow tier). The rules' behaviour is tested on thread ranks in test_sync.py; here the real
collectives must give the same results, and the naive in-place collective shows its bug."""

from __future__ import annotations

import pytest
import torch

from hogwild.config.schema import SyncConfig
from hogwild.sync.rules import make_rule
from tests.conftest import free_port
from tests.dist_helpers import rule_targets, spawn, target_after, writer_during_sync
from tests.fake_comm import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

NAN = float("nan")
VALUES = [[1.0, -1.0, 0.5], [1.2, -0.8, 0.25], [0.8, -1.2, 1e3]]
CASES = [
    (SyncConfig(mode="average"), VALUES, 1),
    (SyncConfig(mode="average"), [VALUES[0], [NAN, 0.0, 0.0], VALUES[2]], 1),
    (SyncConfig(mode="broadcast"), VALUES, 1),
    (SyncConfig(mode="diloco", outer_lr=0.5, outer_momentum=0.9), VALUES, 2),
    (SyncConfig(mode="median"), VALUES, 1),
    (SyncConfig(mode="trimmed_mean", trim=1), VALUES, 1),
    (SyncConfig(mode="average", dtype="bf16"), VALUES, 3),
    (SyncConfig(mode="average", dtype="int8"), VALUES, 3),  # an all_gather of int8 bytes on Gloo
    (SyncConfig(mode="slowmo", dtype="int8"), [VALUES[0], [NAN, 0.0, 0.0], VALUES[2]], 2),
]


def test_snapshot_delta_sync_keeps_concurrent_updates_naive_in_place_loses_them() -> None:
    results = spawn(writer_during_sync, 2, free_port())
    mass, made = sum(r[False][0] for r in results), sum(r[False][1] for r in results)
    assert made > 0 and mass == made, "snapshot/delta sync lost or doubled concurrent updates"
    mass, made = sum(r[True][0] for r in results), sum(r[True][1] for r in results)
    assert abs(mass - made) / made > 0.01, "in-place allreduce on a live buffer should corrupt the total"


def test_gloo_ranks_give_the_same_targets_as_thread_ranks() -> None:
    gloo = spawn(rule_targets, 3, free_port(), CASES)
    for i, (cfg, values, rounds) in enumerate(CASES):
        threads = run_ranks(3, lambda comm, cfg=cfg, values=values, rounds=rounds: target_after(
            make_rule(cfg, comm), values, rounds, comm.rank, comm.world_size))
        for rank in range(3):
            torch.testing.assert_close(torch.tensor(gloo[rank][i]), torch.tensor(threads[rank]),
                                       rtol=1e-6, atol=1e-6, msg=f"{cfg.mode} {cfg.dtype}, rank {rank}")
        assert gloo[0][i] == gloo[1][i] == gloo[2][i], f"{cfg.mode}: replicas disagree"
