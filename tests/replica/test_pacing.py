"""How long a barrier step waits for its last workers (replica/pacing.py), driven through the chair with
an explicit clock (no processes, nothing timed): two workers, worker 0 the pivot, each gradient
taking 1 s, worker 1 a given lag behind it."""

from __future__ import annotations

import multiprocessing as mp
from typing import Optional

import numpy as np
import pytest
import torch
from torch import nn

from hogwild.config.pace import PaceConfig
from hogwild.errors import ConfigError
from hogwild.replica.meeting import Chair, Meeting
from hogwild.replica.pacing import MIN_LAGS, STALL_CHUNKS, BackupWorkers, Pacer
from hogwild.replica.shared import alloc, param_slots


def Deadline(min_wait: float, max_wait: float, straggler_wait: float) -> Pacer:  # noqa: N802 - reads as the rule
    return Pacer(PaceConfig(min_wait=min_wait, max_wait=max_wait, straggler_wait=straggler_wait))


def _chair(min_wait: float = 0.5, max_wait: float = 2.0, straggler_wait: float = 0.1) -> tuple[Chair, Meeting]:
    m = Meeting(2, param_slots(nn.Linear(4, 1)), [False, False], "cpu", alloc)
    m.cells["live"] = 1.0
    r, w = mp.get_context("spawn").Pipe(duplex=False)
    chair = Chair(m, Deadline(min_wait, max_wait, straggler_wait), torch.zeros(1, dtype=torch.float64),
                  lambda: None, r, w)
    return chair, m


def _arrive(m: Meeting, j: int, at: float, read: int) -> None:
    c = m.cells[j]
    c["arrived"], c["read"], c["at"], c["compute_s"], c["finite"] = int(m.head["open"]), read, at, 1.0, 1


def _steps(chair: Chair, m: Meeting, lags: list[Optional[float]]) -> list[bool]:
    """Worker 0 arrives first at each step; worker 1 ``lag`` seconds after it on the weights of the
    same step (None: it is stopped, and its gradient comes 3 s after the pivot). Whether each step
    had worker 1's fresh gradient: a late one joins the next step instead (that step's lag unused),
    whose workers then both start on its weights, as in a run."""
    made, t, pending = [], 0.0, None  # pending: worker 1's gradient still on its way (its step, its time)
    for lag in lags:
        k = int(m.head["open"])
        t += 1.0
        _arrive(m, 0, t, k)
        if pending is not None:  # a late gradient arrives during this step
            _arrive(m, 1, pending[1], pending[0])
            pending = None
            chair.tick(t)  # with worker 1 in, every live worker has arrived
            made.append(False)
        else:
            arrival = t + (3.0 if lag is None else lag)
            now = t
            while int(m.head["open"]) == k and now < arrival:  # the chair looks every 10 ms
                chair.tick(now)
                now += 0.01
            if int(m.head["open"]) == k:
                _arrive(m, 1, arrival, k)
                chair.tick(arrival)
                made.append(True)
            else:
                pending = (k, arrival)
                made.append(False)
        assert int(m.head["open"]) == k + 1
        m.cells["done"][:] = k
        chair.tick(t)
        assert int(m.head["applied"]) == k + 1
        t = max(t, float(m.cells["at"].max()))
    return made


def test_a_worker_cut_once_makes_the_steps_after_its_late_gradient_joined() -> None:
    """Worker 1 a third of a step behind, once 0.7 (past the half step it is waited for at least):
    that step closes without it, its gradient joins the next, and from the step after it computes
    on fresh weights and is waited for again (the rule before gave it a tenth of a step there, and
    it was cut step after step)."""
    chair, m = _chair()
    made = _steps(chair, m, [0.3, 0.35, 0.3, 0.35, 0.3, 0.7, 0.3, 0.35, 0.3, 0.35, 0.3, 0.35])
    assert made == [True] * 5 + [False, False] + [True] * 5


def test_a_worker_habitually_further_behind_is_waited_for_as_long_as_it_usually_takes() -> None:
    """Worker 1 on a slower core for a spell, about 0.7 of a step behind: a bound fixed at half a step
    cuts it every other step (its gradient then joins the next step, one update old); the default
    bound rises with its lags to wait for it once a few are known."""
    lags: list[Optional[float]] = [0.7, 0.65, 0.75, 0.7, 0.8, 0.7, 0.65, 0.7, 0.75, 0.7, 0.7, 0.65, 0.7, 0.75, 0.7, 0.7]
    chair, m = _chair(min_wait=0.5, max_wait=0.5)
    assert not any(_steps(chair, m, lags))
    assert PaceConfig().min_wait == 0.5 and PaceConfig().max_wait == 2.0
    chair, m = _chair()
    made = _steps(chair, m, lags)
    assert all(made[-6:]), made
    assert 0.7 < chair.pacer.last < 1.0


def test_a_stopped_worker_is_not_waited_for_past_the_least_bound() -> None:
    """Worker 1 a few hundredths of a step behind, then stopped for 3 s now and then: the step it
    misses waits pace.min_wait for it, not the ceiling (2 steps), and the stop does not raise the
    bound for the steps after it."""
    chair, m = _chair()
    lags: list[Optional[float]] = [0.02, 0.05, 0.03, 0.06, 0.04, 0.05, None, 0.03, 0.05, 0.04, None, 0.02]
    made = _steps(chair, m, lags)
    assert made[:MIN_LAGS] == [True] * MIN_LAGS
    assert made[6] is False and made[10] is False
    assert made[8:10] == [True, True]
    assert chair.pacer.bound(set()) == 0.5


def test_the_bound_stays_within_its_floor_and_ceiling() -> None:
    d = Deadline(0.5, 2.0, 0.1)
    assert d.bound({1}) == 0.5  # no lags known yet: the least
    d.heard([0.0] * 8)
    assert d.bound({1}) == 0.5  # never under pace.min_wait for a worker on the step's weights
    d.heard([3.0, 3.5, 2.5, 3.0] * 4)
    assert d.bound({1}) == 2.0  # never over pace.max_wait
    d.behind = {1}
    assert d.bound({1}) == 0.1  # a worker still on older weights: pace.straggler_wait
    assert Deadline(0.0, 0.0, 0.1).bound({1}) == 0.0  # pace.max_wait=0: never wait


def test_a_bad_bound_is_one_line_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="pace.min_wait"):
        PaceConfig(min_wait=3.0, max_wait=2.0)
    with pytest.raises(ConfigError, match="pace.min_wait"):
        PaceConfig(min_wait=-1.0)
    with pytest.raises(ConfigError, match="pace.backup"):
        PaceConfig(policy="backup", backup=0)
    with pytest.raises(ConfigError, match="pace.policy: unknown value 'fastest'; choose one of deadline, backup"):
        PaceConfig(policy="fastest")


def test_a_worker_still_on_older_weights_is_waited_for_only_the_floor() -> None:
    """A worker missing from the step before too computes on older weights, and its gradient is
    stale whenever it comes: the step waits only pace.straggler_wait for it, however late the
    recent gradients came; one that joined the step before late computes on fresh weights and gets
    the adaptive bound."""
    chair, m = _chair()
    made = _steps(chair, m, [0.4, 0.45, 0.35, 0.42, 0.38, 0.4])
    assert all(made)
    d = chair.pacer
    assert d.bound({1}) == 0.5
    k = int(m.head["open"])
    _arrive(m, 0, 100.0, k)
    chair.tick(100.0 + d.bound({1}) + 0.01)  # worker 1 stopped: the step closes without it
    assert m.members(k) == [0]
    assert d.bound({1}) == 0.1  # the next step, while its gradient of step k is still on its way
    m.cells["done"][0] = k
    chair.tick(101.0)
    _arrive(m, 1, 101.2, k)  # it joins step k + 1 late
    _arrive(m, 0, 101.5, k + 1)
    chair.tick(101.5)
    assert m.members(k + 1) == [0, 1]
    assert d.bound({1}) == 0.5  # it computes step k + 2 on fresh weights


def test_backup_workers_close_a_step_once_all_but_the_slowest_are_in_and_never_wait_past_that() -> None:
    """pace.policy=backup (Chen et al. 2016): of four workers with one backup, the step stays open
    with two in however long it waits, and closes the moment the third arrives; the fourth's gradient
    joins the next step."""
    m = Meeting(4, param_slots(nn.Linear(4, 1)), [False, False], "cpu", alloc)
    m.cells["live"] = 1.0
    r, w = mp.get_context("spawn").Pipe(duplex=False)
    chair = Chair(m, BackupWorkers(PaceConfig(policy="backup", backup=1)), torch.zeros(1, dtype=torch.float64),
                  lambda: None, r, w)
    c = m.cells
    for j in (0, 1):
        c[j]["arrived"], c[j]["read"], c[j]["at"], c[j]["compute_s"], c[j]["finite"] = 0, 0, 1.0, 1.0, 1
    chair.tick(1000.0)  # half are in, a thousand compute times later: still open (no bound)
    assert int(m.head["open"]) == 0
    c[2]["arrived"], c[2]["read"], c[2]["at"], c[2]["compute_s"], c[2]["finite"] = 0, 0, 2.0, 1.0, 1
    chair.tick(2.0)
    assert int(m.head["open"]) == 1 and m.members(0) == [0, 1, 2]
    assert chair.pacer.last == 0.0  # metrics.json's wait_bound: nobody is waited for


def _cells(workers: int) -> tuple[Meeting, np.ndarray]:
    m = Meeting(workers, param_slots(nn.Linear(4, 1)), [False, False], "cpu", alloc)
    m.cells["live"] = 1.0
    return m, m.cells


def test_a_member_much_slower_than_the_median_steps_no_shard_and_the_step_does_not_wait_for_it() -> None:
    """A worker at half a core is stopped 50 ms of every 100 by its quota, longer than a small model's
    step: the shard it owned held every worker's next read of the weights until it ran again. The
    chair excuses it (the others step the whole model); members of like speed all step a shard."""
    m, c = _cells(3)
    pacer = Pacer(PaceConfig())
    c["pace"] = [0.04, 0.08, 0.041]
    assert pacer.appliers([0, 1, 2], c) == [0, 2]
    c["pace"] = [0.04, 0.045, 0.041]  # within BALANCE_BAND of the median: jitter, every member steps
    assert pacer.appliers([0, 1, 2], c) == [0, 1, 2]
    c["pace"] = 0.0  # nothing measured yet: everyone steps
    assert pacer.appliers([0, 1], c) == [0, 1]
    c["member_of"], c["applies"], c["done"] = 5, [1.0, 0.0, 1.0], [5, -1, 5]
    assert m.all_done(5) and m.appliers(5) == [0, 2]  # the excused member's shard is nobody's to wait for


def test_a_step_stops_waiting_for_a_worker_in_chunks_that_has_stopped_finishing_them() -> None:
    """Worker 1 computes in chunks of 10 ms as it runs: the step waits for it while its chunks come
    (up to the bound), and no longer once it has finished none for STALL_CHUNKS chunk times; a worker
    in whole batches says nothing as it goes and gets the bound."""
    m, c = _cells(2)
    pacer = Pacer(PaceConfig(min_wait=2.0, max_wait=2.0))
    c[0]["arrived"], c[0]["read"], c[0]["at"], c[0]["compute_s"] = 0, 0, 100.0, 0.04
    c[1]["tick"], c[1]["chunk_s"] = 99.995, 0.01
    assert pacer.close_at(0, [0], [0, 1], c) == pytest.approx(99.995 + STALL_CHUNKS * 0.01)  # before the bound
    c[1]["tick"] = 100.07  # it is running: the bound, 2 of the pivot's 40 ms
    assert pacer.close_at(0, [0], [0, 1], c) == pytest.approx(100.08)
    c[1]["chunk_s"] = 0.0
    c[1]["tick"] = 50.0
    assert pacer.close_at(0, [0], [0, 1], c) == pytest.approx(100.08)


def test_a_worker_in_chunks_hands_in_before_the_pivot_it_expects_within_its_next_chunk(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker 1 (a chunk takes it 10 ms, 3 more to do) expects worker 0, which read the weights at
    t=100 and takes 40 ms a batch, at t=100.04: it hands in at t=100.035 (the pivot comes before its
    next chunk would end, and its rest would come after the bound), so the step closes the moment
    worker 0 arrives; at t=100.02 it computes on, and a pivot already overdue is no forecast."""
    import hogwild.replica.pacing as pacing

    m, c = _cells(2)
    pacer = Pacer(PaceConfig(min_wait=0.5), (4, 0.0))
    c[0]["began"], c[0]["pace"], c[1]["pace"] = 100.0, 0.04, 0.08
    for now, handed in ((100.035, True), (100.02, False), (100.05, False)):
        c[1]["tick"] = now - 0.01
        monkeypatch.setattr(pacing.time, "monotonic", lambda now=now: now)
        assert pacer.hand_in(1, 0, c, 0, 0.01, 3) is handed, now
    assert c[1]["chunk_s"] == pytest.approx(0.01)  # what the chair reads to see it run
