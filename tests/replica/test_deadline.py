"""optim.deadline: how long a barrier step waits for its last workers, driven through the chair with
an explicit clock (no processes, nothing timed): two workers, worker 0 the pivot, each gradient
taking 1 s, worker 1 a given lag behind it."""

from __future__ import annotations

import multiprocessing as mp
from typing import Optional

import pytest
import torch
from torch import nn

from hogwild.config.schema import OptimConfig
from hogwild.errors import ConfigError
from hogwild.replica.deadline import MIN_LAGS, Deadline
from hogwild.replica.meeting import Chair, Meeting
from hogwild.replica.shared import alloc, param_slots


def _chair(kind: str, max_wait: float = 0.5, straggler_wait: float = 0.1) -> tuple[Chair, Meeting]:
    m = Meeting(2, param_slots(nn.Linear(4, 1)), [False, False], "cpu", alloc)
    m.cells["live"] = 1.0
    r, w = mp.get_context("spawn").Pipe(duplex=False)
    chair = Chair(m, Deadline(kind, max_wait, straggler_wait), torch.zeros(1, dtype=torch.float64),
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


# Worker 1 on a slower core for a spell, a third of a step behind, then late once by more than the
# fixed bound, then a third of a step behind again.
SPELL = [0.3, 0.35, 0.3, 0.35, 0.3, 0.7, 0.3, 0.35, 0.3, 0.35, 0.3, 0.35]


def test_a_fixed_bound_cuts_a_worker_late_once_step_after_step() -> None:
    """optim.deadline=fixed: once worker 1 missed a step, every later step waits for it only
    optim.straggler_wait, so a third of a step behind it never makes a step again."""
    chair, m = _chair("fixed")
    made = _steps(chair, m, SPELL)
    assert made[:5] == [True] * 5 and made[5] is False
    assert not any(made[6:])


def test_an_adaptive_bound_waits_again_for_a_worker_as_far_behind_as_it_usually_is() -> None:
    """optim.deadline=adaptive (the default): the bound follows worker 1's recent lags, so the one
    lag of 0.7 is cut and the third of a step behind before and after it is waited for."""
    assert OptimConfig().deadline == "adaptive"
    chair, m = _chair("adaptive")
    made = _steps(chair, m, SPELL)
    assert made[:5] == [True] * 5
    assert made[5] is False and made[6] is False  # cut; its gradient joined the next step
    assert all(made[7:]), made


def test_an_adaptive_bound_does_not_wait_for_a_stopped_worker() -> None:
    """Worker 1 a few hundredths of a step behind, then stopped for 3 s now and then: each stop
    costs the step about a tenth of a step (optim.straggler_wait), not the ceiling (optim.max_wait,
    here 2 steps), and the stop does not raise the bound for the steps after it."""
    chair, m = _chair("adaptive", max_wait=2.0)
    lags: list[Optional[float]] = [0.02, 0.05, 0.03, 0.06, 0.04, 0.05, None, 0.03, 0.05, 0.04, None, 0.02]
    made = _steps(chair, m, lags)
    assert made[:MIN_LAGS] == [True] * MIN_LAGS
    assert made[6] is False and made[10] is False
    assert chair.deadline.bound(set()) < 0.2
    assert made[8:10] == [True, True]


def test_the_adaptive_bound_stays_within_its_floor_and_ceiling() -> None:
    d = Deadline("adaptive", 0.5, 0.1)
    assert d.bound({1}) == 0.5  # no lags known yet: the ceiling
    d.lags.extend([0.0] * 8)
    assert d.bound({1}) == 0.1  # never under optim.straggler_wait
    d.lags.extend([3.0, 3.5, 2.5, 3.0] * 4)
    assert d.bound({1}) == 0.5  # never over optim.max_wait


def test_a_bad_deadline_is_one_line_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="optim.deadline"):
        OptimConfig(deadline="sometimes")


def test_a_worker_still_on_older_weights_is_waited_for_only_the_floor() -> None:
    """A worker missing from the step before too computes on older weights, and its gradient is
    stale whenever it comes: the step waits only optim.straggler_wait for it, however late the
    recent gradients came; one that joined the step before late computes on fresh weights and gets
    the adaptive bound."""
    chair, m = _chair("adaptive")
    made = _steps(chair, m, [0.4, 0.45, 0.35, 0.42, 0.38, 0.4])
    assert all(made)
    d = chair.deadline
    assert d.bound({1}) > 0.4
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
    assert d.bound({1}) > 0.4  # it computes step k + 2 on fresh weights
