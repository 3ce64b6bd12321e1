"""Real 2-replica jobs: 2 simulated machines x 2 workers on loopback (slow tier), each rank
started with torchrun's environment (tests/conftest.py: ranks); the examples and the torchrun
restart test go through torchrun itself."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import pytest

from tests.conftest import assert_replicas_agree, clean_env, metrics, ranks, tb_scalars

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _job(tmp_path: Path, name: str, *args: str, workers: int = 2, fault: str = "", leader_fault: str = ""
         ) -> dict:
    """A 2-replica job's metrics.json, its replicas checked to end on one model."""
    out = tmp_path / name
    env = clean_env(OMP_NUM_THREADS="1", HOGWILD_FAULT=fault, HOGWILD_LEADER_FAULT=leader_fault)
    proc = ranks(2, [f"workers={workers}", f"run_dir={out}", *args], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    m = metrics(out)
    assert_replicas_agree(m, 2)
    return m


def _side_by_side(*jobs: Callable[[], dict]) -> list[dict]:
    """The jobs run at once, their metrics.json in order: where each mostly waits on a slowed
    worker's sleep, one job's wait is the other's compute."""
    with ThreadPoolExecutor(len(jobs)) as pool:
        return [f.result() for f in [pool.submit(job) for job in jobs]]


def test_two_replicas_reach_bar_and_agree_bit_for_bit(tmp_path: Path) -> None:
    """The default rule (slowmo) with 2 replicas x 2 workers. Replica 1 also comes 3 s late to the
    final round, as a large round over a slow link does, past the 2 s a stopping leader allows
    (``fault.shutdown_timeout_s``): a job that ended (not stopped) waits for its final round as
    long as for any round (that bound failed such jobs at their end with exit 3). The late round
    rides on this job rather than a job of its own: the fault touches the final round only."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    m = _job(tmp_path, "avg", "sync.interval=20", "fault.shutdown_timeout_s=2", leader_fault="late:1:3")
    assert m["status"] == "ok", f"a final round later than fault.shutdown_timeout_s ended the job as {m['status']}"
    assert m["sync_mode"] == "slowmo"
    assert m["replicas"] == 2 and m["workers"] == 2
    assert m["test_accuracy"] >= 0.95
    assert m["syncs"] > 0 and m["max_drift"] > 0  # and both replicas end on one model (_job)
    # The fault fired: replica 1's rounds took at least the 3 s it came late to the final one, so the
    # replicas' mean time in rounds is at least half that (each round's few ms add far less).
    assert m["mean_sync_s"] * m["syncs"] >= 1.5, m
    # Each replica's leader measured its own tree (a leader and 2 workers, each with torch loaded).
    per = m["peak_memory_mb_per_replica"]
    assert len(per) == 2 and all(v is not None and 50 < v < 8192 for v in per), per
    assert m["peak_memory_mb"] == max(per)
    acc = EventAccumulator(str(tmp_path / "avg" / "tb"))
    acc.Reload()
    assert {"sync/drift_mean", "sync/drift_max"} <= set(acc.Tags()["scalars"])
    assert len(list((tmp_path / "avg" / "checkpoints").glob("step_*.pt"))) >= 1
    assert not (tmp_path / "avg" / "checkpoints" / "rank1").exists()
    _assert_outer_state_checkpointed(tmp_path / "avg")


def _assert_outer_state_checkpointed(run_dir: Path) -> None:
    """The outer rule's parameters and momentum are in the checkpoint: a resume that lost them
    would restart the momentum from zero and the outer parameters from the replicas' model."""
    from hogwild.checkpoint import store as checkpoint

    state = checkpoint.load(run_dir / "checkpoints" / "last.pt")["sync_state"]
    assert set(state) == {"global_params", "momentum"} and state["momentum"].abs().sum() > 0


def test_broadcast_mode(tmp_path: Path) -> None:
    m = _job(tmp_path, "bc", "sync.mode=broadcast", "sync.interval=20")
    assert m["sync_mode"] == "broadcast" and m["syncs"] > 0 and m["test_accuracy"] >= 0.9


def test_drift_grows_with_the_interval(tmp_path: Path) -> None:
    """Mean and max drift rise with sync.interval: 5, 30, and one round at the end only.
    sync.max_lag=0 makes the real interval the configured one even on a loaded machine (with
    the default lag a round may come up to 2x late, and the max drift with it)."""
    jobs = [_job(tmp_path, f"i{iv}", f"sync.interval={iv}", "sync.max_lag=0", "train.epochs=10", workers=1)
            for iv in (5, 30, 100000)]
    assert [m["syncs"] for m in jobs] == sorted((m["syncs"] for m in jobs), reverse=True), jobs
    for near, far in zip(jobs, jobs[1:]):
        assert far["mean_drift"] > 1.4 * near["mean_drift"], (near, far)
        assert far["max_drift"] > 1.4 * near["max_drift"], (near, far)


def test_max_lag_bounds_the_real_interval_when_a_replica_is_slow(tmp_path: Path) -> None:
    """Replica 1's worker is slowed 10 ms a step. Replica 0 may run at most sync.max_lag (one
    interval by default) past a pending round; without the bound it runs far ahead. Enough
    epochs that the fast replica cannot finish its quota inside one slow interval: 15 epochs are
    690 steps, and unbounded it ran about 100 ahead of a round (2.5x the bound), with the bound
    at most 25; more epochs only lengthen the slowed replica's sleeping. The two jobs run side by
    side: each is mostly its slowed worker's sleep, and the other's load only slows a fast replica
    that the bound holds back anyway (on one core beside each other and a CPU hog, the free job's
    longest interval was 99-108 steps, the bounded one's at most 25, when measured)."""
    common = ("sync.interval=20", "train.epochs=15")
    bounded, free = _side_by_side(
        lambda: _job(tmp_path, "bounded", *common, workers=1, fault="slow:1:10"),
        lambda: _job(tmp_path, "free", *common, "sync.max_lag=inf", workers=1, fault="slow:1:10"))
    assert bounded["max_steps_per_sync"] <= 20 + 20, bounded
    assert bounded["lag_wait_s"] > 0 and bounded["steps_per_sync"] >= 20
    assert free["max_steps_per_sync"] > 20 + 20 and free["lag_wait_s"] == 0, free
    assert bounded["max_drift"] < free["max_drift"]


def test_checkpoints_keep_their_cadence_when_rounds_are_rare(tmp_path: Path) -> None:
    """sync.interval far beyond the run: no round brings a checkpoint, yet one is written
    every checkpoint.every_s (plus the grace a round gets to carry it, plus the write)."""
    from hogwild.checkpoint import store as checkpoint

    every_s = 0.5
    # A run of about 3 s of training on any machine (train.max_time ends it with its final round):
    # 400 epochs, sized for a fast machine, trained 37 s on a loaded core for the same checkpoints.
    m = _job(tmp_path, "rare", "sync.interval=1000000", f"checkpoint.every_s={every_s}",
                "checkpoint.keep=1000", "train.epochs=100000", "train.max_time=3", workers=1)
    cks = sorted((checkpoint.load(p) for p in (tmp_path / "rare" / "checkpoints").glob("step_*.pt")),
                 key=lambda c: c["written_at"])
    # Only rank 0 writes, and only its own replica between rounds. Once its workers are done it
    # waits in the final round for the other replica (slower on a loaded machine), with nothing
    # new to save: a gap that ends where rank 0 had already finished is not a missed checkpoint.
    done_at = float(cks[-1]["positions"][0].sum())
    training = [c for c in cks if float(c["positions"][0].sum()) < done_at]
    assert len(training) >= 3, f"{len(training)} checkpoints while rank 0 trained, {m['train_s']:.1f}s of training"
    times = [c["written_at"] for c in cks[:len(training)]]  # positions only grow: a prefix
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert max(gaps) <= 1.25 * every_s + 0.5, gaps


def test_target_drift_adapts_interval_to_hold_drift_near_epsilon(tmp_path: Path) -> None:
    eps = 0.02
    # Averaging: its drift at a fixed interval stays put over this run, so the controller has a
    # level to hold. slowmo trains this small problem so fast that its drift falls by 6x within
    # the run whatever the interval (0.10 -> 0.016 at a fixed 300), which tests the data, not
    # the controller; the controller is the same code for every rule.
    common = ("sync.interval=300", "train.epochs=60", "sync.mode=average")
    fixed = _job(tmp_path, "fixed", *common, workers=1)
    adaptive = _job(tmp_path, "adaptive", *common, f"sync.target_drift={eps}", workers=1)
    # Drop the final round (measured after training ends) and compare the medians of the
    # settled second halves. Not the minimum: a replica that finished its quota keeps joining
    # rounds until its peer is done, and such a round covers only the rest of the quota, so
    # its drift says nothing about the interval (seen: 0.025 after 0.05-0.1 at interval 300).
    def settled_median(drifts: list[float]) -> float:
        settled = sorted(drifts[len(drifts) // 2:])
        return settled[len(settled) // 2]

    fixed_drifts = tb_scalars(tmp_path / "fixed", "sync/drift_max")[:-1]
    drifts = tb_scalars(tmp_path / "adaptive", "sync/drift_max")[:-1]
    assert settled_median(fixed_drifts) > 1.5 * eps, fixed_drifts  # the fixed interval overshoots
    assert eps / 2 <= settled_median(drifts) <= 1.5 * eps, drifts
    # The controller cut the interval while drift was above the target. Its last value is no
    # evidence either way: drift falls as the model converges, the interval climbs back, and under
    # load it can land on 300 exactly (200 x 1.5; seen once in a full suite beside other jobs).
    intervals = tb_scalars(tmp_path / "adaptive", "sync/interval")
    assert intervals and min(intervals) <= 150, intervals
    assert adaptive["syncs"] > fixed["syncs"]


def test_diloco_job_learns_and_checkpoints_its_outer_state(tmp_path: Path) -> None:
    # slowmo, the default, is checked by test_two_replicas_reach_bar_and_agree_bit_for_bit.
    m = _job(tmp_path, "diloco", "sync.mode=diloco", "sync.interval=20", workers=1)
    assert m["sync_mode"] == "diloco" and m["test_accuracy"] >= 0.9
    _assert_outer_state_checkpointed(tmp_path / "diloco")


def test_a_slow_link_job_in_int8_fragments_weighted_by_work_learns_and_reports_bytes(tmp_path: Path) -> None:
    """Fragments, the int8 wire and weighting together on a real Gloo group: the job learns,
    ends on one model, and reports what its rounds sent: about 4 x 3 times fewer bytes per round
    than the whole-model fp32 round of this model (int8 at 2 replicas, 3 fragments; the final
    round syncs all three)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    m = _job(tmp_path, "slow", "sync.interval=20", "sync.dtype=int8", "sync.fragments=3",
             "sync.weighting=steps", "train.epochs=20")
    assert m["test_accuracy"] >= 0.93
    fp32_round = 4 * (9610 + 5 + 3 * 2)  # the mlp's values and the control vector, one ring all_reduce
    assert 9 < fp32_round / (m["sync_bytes_sent"] / m["syncs"]) < 13, m
    assert m["sync_bytes_received"] == pytest.approx(m["sync_bytes_sent"])
    assert m["sync_link_s"] > 0 and 0 < m["sync_bytes_per_step"] < fp32_round / 20 / 6
    acc = EventAccumulator(str(tmp_path / "slow" / "tb"))
    acc.Reload()
    assert {"sync/bytes_sent", "sync/bytes_received", "sync/link_s"} <= set(acc.Tags()["scalars"])


def test_row_sparse_rounds_on_embedding_tables_send_a_fraction_and_end_on_one_model(tmp_path: Path) -> None:
    """The clicks DLRM (4 sparse tables of 20,000 rows) with row-sparse rounds on a real Gloo
    group: the workers' stamps reach the rounds, which send a fraction of a dense round, and the
    job learns and ends bit-identical on both replicas."""
    from tests.conftest import REPO

    args = ["+experiment=clicks", "data.kwargs.samples=40000", "data.kwargs.rows=20000", "sync.interval=20",
            "sync.row_sparse=true", "sync.mode=slowmo"]  # an outer rule: its lazy momentum's state travels too
    from hogwild.checkpoint import store as checkpoint

    out = tmp_path / "rows"
    proc = ranks(2, ["workers=1", f"run_dir={out}", *args], cwd=REPO, env=clean_env(OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    m = metrics(out)
    assert_replicas_agree(m, 2)
    assert m["test_logloss"] < m["baseline_logloss"] and m["test_auc"] > 0.65, m
    final = checkpoint.load(out / "checkpoints" / "last.pt")  # the final round's model and rule state
    dense_round = final["flat"].numel() * 4  # a ring all_reduce of the model at 2 replicas sends it once
    assert m["syncs"] > 5 and m["sync_bytes_sent"] / m["syncs"] < 0.6 * dense_round, (m, dense_round)
    state = final["sync_state"]
    assert {"global_params", "momentum", "row_synced", "row_epoch"} <= set(state)
    assert int((state["row_synced"] > 0).sum()) > 0


def test_a_slower_replica_rounds_after_fewer_steps_when_intervals_follow_speed(tmp_path: Path) -> None:
    """sync.interval_by_speed: replica 1's worker is slowed 10 ms a step (several times the tiny
    model's step). Its interval shrinks to its speed, so its rounds come after a fraction of the
    steps of replica 0's (which keeps the whole interval and does not wait at sync.max_lag for it);
    weighted by steps, the job still ends on one model that learned. A time budget, so that both
    replicas train to the end (a replica done with its quota makes no steps, and the other's share
    goes back to the whole interval): 3 s of it, some 60 rounds (beside a CPU hog on one core,
    the fast replica's rounds came after 21 steps and the slow one's after 2.7, when measured)."""
    m = _job(tmp_path, "speed", "sync.interval=20", "train.epochs=1000", "train.max_time=3",
             "sync.interval_by_speed=true", "sync.weighting=steps", workers=1, fault="slow:1:10")
    fast, slow = m["steps_per_sync_per_replica"]
    assert slow < 0.7 * fast and fast >= 15, m["steps_per_sync_per_replica"]
    assert m["test_accuracy"] >= 0.9


def test_a_replica_done_first_keeps_the_others_interval(tmp_path: Path) -> None:
    """Replica 0 ends its 100 steps in a fraction of a second (sync.max_lag=inf: it never waits
    for a round); replica 1's worker is slowed 50 ms a step, so most of the job's rounds come
    after replica 0 is done. Each is due every 2 of replica 1's steps (100 ms), and replica 0's
    leader must come at once: one that slept between rounds (its workers, done, no longer wake
    it) came up to half a second late, and replica 1's rounds fell to one every 7 steps (in a
    job with sync.max_lag left at one interval, its worker waited those seconds instead)."""
    m = _job(tmp_path, "done_first", "sync.interval=2", "sync.max_lag=inf", "train.max_steps=100",
             "eval.every_s=1000", workers=1, fault="slow:1:50")
    _, slow = m["steps_per_sync_per_replica"]
    assert slow < 4, m["steps_per_sync_per_replica"]
