"""The sync schedule and the shared board, driven directly (fast tier)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hogwild.config.schema import SyncConfig
from hogwild.replica.board import CONTROL, STATS, Board, Counts
from hogwild.sync.schedule import SyncSchedule


def test_round_is_due_interval_steps_after_the_last_snapshot() -> None:
    s = SyncSchedule.from_config(SyncConfig(interval=50))
    assert not s.due(49) and s.due(50)
    # Workers kept going while the round ran: the next point counts from the snapshot.
    assert s.after_round(pos_at_snapshot=55) == 105
    assert not s.due(104) and s.due(105)


def test_one_replica_never_syncs() -> None:
    s = SyncSchedule.from_config(SyncConfig(interval=5), distributed=False)
    assert math.isinf(s.next_sync_at) and not s.due(10**9)


def test_drift_record_ignores_unhealthy_replicas_and_keeps_the_worst() -> None:
    s = SyncSchedule.from_config(SyncConfig())
    rec = s.record_drift([0.1, math.inf, 0.3])
    assert rec is not None and rec.mean == pytest.approx(0.2) and rec.max == 0.3
    assert s.record_drift([math.nan, math.inf]) is None
    s.record_drift([0.1])
    assert s.max_drift == 0.3 and s.mean_drift == pytest.approx(0.2)


def test_adaptive_interval_moves_towards_target_drift_within_bounds() -> None:
    s = SyncSchedule.from_config(SyncConfig(interval=100, target_drift=0.02, min_interval=10, max_interval=130))
    s.record_drift([0.08])  # 4x too much drift: the interval halves (the step is capped)
    assert s.interval == 50
    s.record_drift([0.001])  # far too little: grows by at most 1.5x
    assert s.interval == 75
    s.record_drift([0.001])
    assert s.interval == 112  # round(112.5)
    s.record_drift([0.001])
    assert s.interval == 130  # max_interval
    for _ in range(10):
        s.record_drift([10.0])
    assert s.interval == 10  # min_interval


def test_fixed_interval_does_not_adapt() -> None:
    s = SyncSchedule.from_config(SyncConfig(interval=40))
    s.record_drift([5.0])
    assert s.interval == 40


def test_board_fields_are_named_views_of_shared_memory() -> None:
    b = Board(3)
    assert b.stats_t.is_shared() and b.control_t.is_shared()
    assert b.stats_t.shape == (3, len(STATS.names)) and b.control_t.numel() == len(CONTROL.names)
    row = b.row(1)
    row["pos"] += 7
    row["applied"] = 5
    b.control["stop"] = 1.0
    assert b.stats_t[1, STATS.names.index("pos")] == 7 and b.replica_pos() == 7 and b.applied() == 5
    assert b.control_t[CONTROL.names.index("stop")] == 1.0
    b.stats["ready"] = 1.0
    assert b.all_ready() and not b.all_done()


def test_board_loss_averages_only_workers_that_trained() -> None:
    b = Board(2)
    assert math.isnan(b.loss())
    b.row(0)["loss"] = 0.5
    assert b.loss() == 0.5


def test_counts_round_trip_through_a_tensor_by_name() -> None:
    b = Board(2)
    b.stats["applied"] = np.array([3.0, 4.0])
    b.stats["skipped"] = np.array([0.0, 2.0])
    t = b.totals(restarts=1)
    assert (t.steps, t.skipped_nonfinite, t.worker_restarts) == (7, 2, 1)
    summed = Counts.from_tensor(t.to_tensor() * 2)  # what an all_reduce over 2 replicas gives
    assert (summed.steps, summed.worker_restarts, summed.skipped_nonfinite) == (14, 2, 4)
    assert isinstance(summed.steps, int), "metrics.json shows steps as an integer"


def test_a_lineage_adds_a_runs_counts_and_survives_a_checkpoint() -> None:
    restored = Counts.from_dict({"steps": 100, "samples": 3200.0, "syncs": 4, "worker_restarts": 1,
                                 "skipped_nonfinite": 0, "from_a_newer_version": 7})
    job = Counts(steps=50, samples=1600.0, worker_restarts=2, skipped_nonfinite=3, lag_wait_s=1.5)
    total = restored.plus(job, syncs=6)
    assert total.lineage() == {"steps": 150, "samples": 4800.0, "skipped_nonfinite": 3, "worker_restarts": 3,
                               "syncs": 6}
    assert total.lag_wait_s == 1.5, "this attempt's own measures come from the job"
    assert Counts.from_dict(total.lineage()).lineage() == total.lineage()


def test_stall_is_the_extra_step_time_during_syncs() -> None:
    # 100 steps of 10 ms, 10 of them during syncs at 30 ms: 10 x 20 ms of stall.
    t = Counts(step_s=0.9 + 0.3, sync_s=0.3, sync_steps=10, pos=100)
    assert t.stall_s() == pytest.approx(0.2)
    assert Counts(step_s=1.0, sync_s=0.0, sync_steps=0, pos=100).stall_s() == 0.0


def test_totals_tensor_is_float64() -> None:
    assert Counts().to_tensor().dtype == torch.float64


def test_lag_limit_is_one_interval_past_the_pending_round_by_default() -> None:
    s = SyncSchedule.from_config(SyncConfig(interval=20))
    assert s.lag_limit == 40
    s.after_round(pos_at_snapshot=25)
    assert s.lag_limit == 65
    assert SyncSchedule.from_config(SyncConfig(interval=20, max_lag=5)).lag_limit == 25
    assert math.isinf(SyncSchedule.from_config(SyncConfig(interval=20, max_lag=math.inf)).lag_limit)
    assert math.isinf(SyncSchedule.from_config(SyncConfig(), distributed=False).lag_limit)
