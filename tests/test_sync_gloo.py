"""Sync rules on real gloo ranks over loopback: the same rules as test_sync.py, through
DistComm and spawned processes (slow tier)."""

from __future__ import annotations

import pytest
import torch

from hogwild.config import SyncConfig
from tests.conftest import free_port
from tests.dist_helpers import rule_target, spawn, writer_during_sync

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_snapshot_delta_sync_keeps_concurrent_updates_naive_in_place_loses_them() -> None:
    safe = spawn(writer_during_sync, 2, free_port(), False)
    mass, made = sum(r[0] for r in safe), sum(r[1] for r in safe)
    assert made > 0 and mass == made, "snapshot/delta sync lost or doubled concurrent updates"
    naive = spawn(writer_during_sync, 2, free_port(), True)
    mass, made = sum(r[0] for r in naive), sum(r[1] for r in naive)
    assert abs(mass - made) / made > 0.01, "in-place allreduce on a live buffer should corrupt the total"


def _targets(cfg: SyncConfig, values: list[list[float]], rounds: int = 1) -> list[list[float]]:
    return spawn(rule_target, len(values), free_port(), cfg, values, rounds)


def test_average_and_broadcast() -> None:
    vals = [[1.0, 2.0], [3.0, 6.0], [5.0, 1.0]]
    assert _targets(SyncConfig(mode="average"), vals) == [[3.0, 3.0]] * 3
    assert _targets(SyncConfig(mode="broadcast"), vals) == [[1.0, 2.0]] * 3


def test_nonfinite_replica_is_excluded_and_restored() -> None:
    vals = [[1.0, 2.0], [float("nan"), 0.0], [3.0, 4.0]]
    assert _targets(SyncConfig(mode="average"), vals) == [[2.0, 3.0]] * 3
    assert _targets(SyncConfig(mode="broadcast"), [vals[1], vals[0]]) == [[1.0, 2.0]] * 2


def test_diloco_with_one_replica_lr1_no_momentum_is_plain_averaging() -> None:
    cfg = SyncConfig(mode="diloco", outer_lr=1.0, outer_momentum=0.0)
    assert _targets(cfg, [[1.5, -2.0]], rounds=3) == [[1.5, -2.0]]
    vals = [[0.0, 4.0], [2.0, 0.0]]
    assert _targets(cfg, vals) == _targets(SyncConfig(mode="average"), vals)


def test_diloco_momentum_overshoots_in_the_agreed_direction() -> None:
    # Global starts at the replicas' first snapshot; held still, each round moves it further.
    cfg = SyncConfig(mode="diloco", outer_lr=0.5, outer_momentum=0.9)
    out = _targets(cfg, [[1.0], [3.0]], rounds=1)
    assert out[0] == out[1]


@pytest.mark.parametrize("mode", ["median", "trimmed_mean"])
def test_robust_rules_ignore_a_byzantine_replica(mode: str) -> None:
    honest = [[1.0, -1.0], [1.2, -0.8], [0.8, -1.2], [1.1, -0.9]]
    vals = honest + [[1e6, -1e6]]
    robust = _targets(SyncConfig(mode=mode, trim=1), vals)[0]
    lo = [min(v[i] for v in honest) for i in range(2)]
    hi = [max(v[i] for v in honest) for i in range(2)]
    assert all(lo[i] <= robust[i] <= hi[i] for i in range(2))
    mean = _targets(SyncConfig(mode="average"), vals)[0]
    assert mean[0] > hi[0] * 1000  # plain averaging is dragged away


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_compressed_average_tracks_fp32_with_error_feedback(dtype: str) -> None:
    # Replicas a sync apart differ by little: the delta to the last mean is what travels.
    vals = [[1.0 + 1e-3 * i for i in range(64)], [1.01 - 1e-3 * i for i in range(64)]]
    exact = torch.tensor(_targets(SyncConfig(mode="average"), vals)[0])
    low = torch.tensor(_targets(SyncConfig(mode="average", dtype=dtype), vals, rounds=4)[0])
    # Rounding the parameters (~1.0) to bf16 would err by up to 4e-3; rounding the delta,
    # with its error fed back, stays at the delta's own rounding step.
    assert (low - exact).abs().max() < 5e-4
    assert not torch.equal(low, exact)  # it really went through the reduced-precision wire
