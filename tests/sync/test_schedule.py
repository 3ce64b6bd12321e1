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


def test_a_paced_interval_starts_at_ten_optimizer_steps_and_follows_the_link_and_the_busiest_leader() -> None:
    """sync.interval=auto: every round's cost sets the next interval. With intervals of equal steps
    (interval_by_speed off), a round's time is the shortest any replica saw (the others also waited
    for the last to arrive, a wait that grows with the interval), its CPU the busiest leader's;
    every leader sees the same asks, so all take the same interval, at most halving or
    doubling it per round, never below two optimizer steps."""
    s = SyncSchedule.from_config(SyncConfig(interval="auto"), per_step=4)  # 4 workers on the barrier
    assert s.paced and s.interval == 40 and s.next_sync_at == 40 and s.floor == 8
    s.record_pace([(0.0, 0.0), (0.0, 0.0)])  # nothing measured yet (the first round)
    assert s.interval == 40
    s.record_pace([(55.0, 1.0), (30.2, 2.0)])  # the first to arrive waited 25 steps for the other
    assert s.interval == 31
    s.record_pace([(20.0, 41.0), (30.0, 3.0)])  # a leader whose rounds take too much of its core
    assert s.interval == 41
    s.record_pace([(500.0, 1.0), (400.0, math.nan)])  # a hiccup: at most twice the interval per round
    assert s.interval == 82
    s.record_pace([(1.0, 1.0), (2.0, 1.0)])  # a fast link: at most half per round, never below the floor
    assert s.interval == 41
    for _ in range(10):
        s.record_pace([(1.0, 1.0), (2.0, 1.0)])
    assert s.interval == 8


def test_an_uneven_fleet_s_paced_interval_covers_the_longest_wait_for_the_last_to_arrive() -> None:
    """Under interval_by_speed the replicas reach a round together but for the slow ones' jitter.
    Where the slowest runs at 3/4 of the fastest's speed or less, the interval grows until the first
    to arrive has its round back within 3/4 of it, so its workers do not stop at sync.max_lag (a
    fleet at 1, 1/2 and 1/4 of a core rounded every 5 steps and its full-speed worker waited);
    between machines of one speed the shortest round counts, as with equal steps (above)."""
    even = SyncSchedule.from_config(SyncConfig(interval="auto", interval_by_speed="true"))
    uneven = SyncSchedule.from_config(SyncConfig(interval="auto", interval_by_speed="true"))
    for _ in range(3):
        even.record_speeds([10.0, 9.0], rank=0)  # one speed, but for noise
        uneven.record_speeds([10.0, 5.0, 2.5], rank=0)
    assert not even.uneven and uneven.uneven
    for s in (even, uneven):
        s.record_pace([(16.0, 1.0), (4.0, 1.0)])  # the first to arrive waited 3/4 of the interval
    assert even.interval == 5 and uneven.interval == 16
    uneven.record_pace([(40.0, 1.0), (4.0, 1.0)])  # a burst of waiting: at most twice per round
    assert uneven.interval == 32
    uneven.record_pace([(4.0, 1.0), (3.0, 1.0)])  # the jitter gone: back down, half per round at most
    assert uneven.interval == 16
    # One round of even speeds does not make the fleet even: the median of the last 5 rounds does.
    uneven.record_speeds([10.0, 10.0, 10.0], rank=0)
    assert uneven.uneven
    assert not SyncSchedule.from_config(SyncConfig(interval="auto", interval_by_speed="false")).uneven


def test_a_fixed_interval_ignores_the_paces_it_is_sent() -> None:
    s = SyncSchedule.from_config(SyncConfig(interval=40))
    s.record_pace([(5.0, 5.0), (500.0, 500.0)])
    assert not s.paced and s.interval == 40


def test_a_paced_round_stays_within_its_share_of_the_interval() -> None:
    from hogwild.sync.schedule import PACE_CPU, PACE_WALL, paced_interval

    # A slow link: 3 s on the wire, little CPU, 2 steps a second: the round needs 3 / 0.75 s.
    assert paced_interval(3.0, 0.01, 2.0) == pytest.approx(2.0 * 3.0 / PACE_WALL)
    # Loopback: a short round, but its leader's CPU would take more than its share of the core.
    assert paced_interval(0.01, 0.008, 8.0) == pytest.approx(8.0 * 0.008 / PACE_CPU)


def test_a_round_asks_for_an_interval_from_its_cost_and_the_workers_busy_time() -> None:
    """What a paced round sends the others: its cost against the replica's pace, where the pace
    is steps over the workers' busy seconds, so time spent waiting for a slow round does not make
    steps look slower (and rounds cheaper, and the interval shorter, and the wait longer)."""
    from hogwild.sync.comm import LocalComm
    from hogwild.sync.rounds import RoundFlags, Rounds
    from hogwild.sync.rules import make_rule
    from hogwild.sync.schedule import paced_interval

    cfg = SyncConfig(mode="average", interval="auto")
    flat, board = torch.zeros(10), Board(2)
    rounds = Rounds(flat, make_rule(cfg, LocalComm(), 10), LocalComm(), board, SyncSchedule.from_config(cfg))
    # Two workers made 20 steps between rounds in 5 busy seconds each (they also waited 50 s for
    # the round, which step_s leaves out): 4 replica steps a second of their compute.
    board.stats["pos"] = [10.0, 10.0]
    board.stats["step_s"] = [5.0, 5.0]
    board.stats["lag_wait_s"] = [50.0, 50.0]
    out = rounds.run(RoundFlags(), timeout_s=5.0)
    assert out.speeds == [pytest.approx(4.0)]  # its speed travels with the round (sync.interval_by_speed)
    time_ask, cpu_ask = rounds.asking
    assert time_ask == pytest.approx(paced_interval(rounds.times[-1], 0.0, 4.0))
    assert 0 < time_ask < 1 and 0 < cpu_ask < 10  # a round in memory costs far less than 10 steps
    fixed = Rounds(flat, make_rule(cfg, LocalComm(), 10), LocalComm(), board,
                   SyncSchedule.from_config(SyncConfig(mode="average", interval=10)))
    board.stats["pos"] = [20.0, 20.0]
    board.stats["step_s"] = [10.0, 10.0]
    fixed.run(RoundFlags(), timeout_s=5.0)
    assert fixed.asking == (0.0, 0.0)  # a fixed interval asks for nothing


def test_a_slower_replica_s_interval_shrinks_to_its_speed() -> None:
    """sync.interval_by_speed: a replica half as fast as the fastest makes half the interval's steps
    before its next round, so both reach it at about the same time (the fast one's workers do not wait at
    sync.max_lag for it); its share is the median of its last rounds, so one slow round (a hiccup)
    does not move it, and the fastest replica keeps the whole interval."""
    slow, fast = (SyncSchedule.from_config(SyncConfig(interval=40, interval_by_speed=True)) for _ in range(2))
    speeds = [5.0, 10.0]  # replica 0's steps a second, replica 1's
    for _ in range(3):
        slow.record_speeds(speeds, 0)
        fast.record_speeds(speeds, 1)
    assert slow.after_round(100) == 120 and slow.lag_limit == 140
    assert fast.after_round(100) == 140 and fast.lag_limit == 180
    fast.record_speeds([20.0, 2.0], 1)  # one round where it crawled (a stall, a busy core)
    assert fast.after_round(100) == 140
    slow.record_speeds([0.0, 10.0], 0)  # measured nothing (no steps since the last round): kept as is
    assert slow.share == pytest.approx(0.5)
    assert slow.after_round(0) == 20
    crawl = SyncSchedule.from_config(SyncConfig(interval=40, interval_by_speed=True))
    crawl.record_speeds([0.1, 100.0], 0)  # a thousand times slower: a fault for the timeouts, not a pace
    assert crawl.after_round(0) == 4
    off = SyncSchedule.from_config(SyncConfig(interval=40))
    off.record_speeds(speeds, 0)
    assert off.after_round(100) == 140  # off (the default): every replica makes the whole interval


def test_the_final_gather_tells_whether_the_replicas_end_on_one_model() -> None:
    """metrics.json's replica_final_state: a digest of each replica's model, rule state and rounds.
    Two replicas apart differ in it; after a final round that averages them they agree."""
    from hogwild.sync.rounds import RoundFlags, Rounds
    from hogwild.sync.rules import make_rule
    from tests.fake_comm import run_ranks

    cfg = SyncConfig(mode="slowmo", interval=10)  # an outer rule: a state that must agree too

    def replica(comm):  # type: ignore[no-untyped-def]
        flat = torch.full((10,), float(comm.rank))
        rounds = Rounds(flat, make_rule(cfg, comm, 10), comm, Board(1), SyncSchedule.from_config(cfg))
        apart = rounds.close().final_state
        rounds.run(RoundFlags(done=True, final=True), timeout_s=5.0)
        return apart, rounds.close().final_state

    (apart, together), _ = run_ranks(2, replica)
    assert apart[0]["model"] != apart[1]["model"] and apart[0]["syncs"] == apart[1]["syncs"] == 0
    assert together[0] == together[1] and together[0]["syncs"] == 1, together
    assert together[0]["model"] != apart[0]["model"] and len(together[0]["model"]) == 12
