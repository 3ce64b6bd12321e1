"""optim.update=barrier: where the workers' gradients meet (replica/meeting.py, replica/update.py).

The chair's decisions and the members' sharded step run in this process (fast tier); one test
races real worker processes against the chair and checks that every gradient reached the model
exactly once, however the steps fell."""

from __future__ import annotations

import copy
import random
import time
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from torch import Tensor, nn

from hogwild.config.schema import OptimConfig
from hogwild.config.targets import import_target
from hogwild.config.pace import PaceConfig
from hogwild.replica.meeting import POLL_S, STEPS_KEY, Chair, Meeting, balanced, mean_into
from hogwild.replica.optim import decays, new_shared_state
from hogwild.replica.shared import alloc, bind, param_slots, share_model
from hogwild.replica.start import worker_context
from hogwild.replica.pacing import (MAX_PARTS, MIN_CHUNK_S, PACE_WINDOW, PLAN_FROM_S, Pacer, Split, balanced_share,
                                    chunks_for, make_pacer)
from hogwild.replica.update import BarrierUpdate, Seat, Signals

pytestmark = pytest.mark.timeout(120)


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))


def _replica(cfg: OptimConfig, workers: int, seed: int = 0) -> tuple[nn.Module, Tensor, Meeting, dict[str, Tensor]]:
    model = _net(seed)
    flat = share_model(model, "cpu")
    params = list(model.parameters())
    state = new_shared_state(cfg, params, param_slots(model), flat.numel(), alloc, "cpu")
    state[STEPS_KEY] = torch.zeros(1, dtype=torch.float64).share_memory_()
    return model, flat, Meeting(workers, param_slots(model), [False] * len(params), "cpu", alloc), state


def _chair(meeting: Meeting, max_wait: float, kicks: list[int]) -> Chair:
    """A chair whose bound is always ``max_wait`` (tests/replica/test_pacing.py varies it)."""
    r, w = mp.get_context("spawn").Pipe(duplex=False)
    bound = Pacer(PaceConfig(min_wait=max_wait, max_wait=max_wait, straggler_wait=max_wait))
    return Chair(meeting, bound, torch.zeros(1, dtype=torch.float64), lambda: kicks.append(1), r, w)


def _arrive(m: Meeting, j: int, at: float, read: int = 0, finite: bool = True, compute_s: float = 1.0) -> None:
    c = m.cells[j]
    c["arrived"], c["read"], c["at"], c["compute_s"], c["finite"] = int(m.head["open"]), read, at, compute_s, finite


def test_a_step_closes_when_every_live_worker_has_arrived_and_is_applied_when_every_member_is_done() -> None:
    _, _, m, _ = _replica(OptimConfig(name="adamw"), 3)
    kicks: list[int] = []
    chair = _chair(m, 0.5, kicks)
    m.cells["live"] = 1.0
    _arrive(m, 0, at=10.0)
    _arrive(m, 2, at=10.1, finite=False)
    chair.tick(10.2)
    assert m.head["open"] == 0  # worker 1 has not arrived, and the bound has not passed
    _arrive(m, 1, at=10.3)
    chair.tick(10.3)
    assert (m.head["open"], m.head["applied"], m.head["count"], m.head["t"]) == (1, 0, 2, 0)
    assert m.members(0) == [0, 1, 2] and float(chair.steps[0]) == 1 and kicks
    # Weights are read again only once every member has applied its shard.
    m.cells["done"][[0, 2]] = 0
    chair.tick(10.4)
    assert m.head["applied"] == 0
    m.cells["done"][1] = 0
    chair.tick(10.5)
    assert m.head["applied"] == 1


def test_a_late_worker_does_not_hold_the_step_past_the_bound() -> None:
    _, _, m, _ = _replica(OptimConfig(name="adamw"), 2)
    chair = _chair(m, 0.25, [])
    m.cells["live"] = 1.0
    _arrive(m, 0, at=50.0, compute_s=2.0)  # its gradient took 2 s: the step waits at most 0.5 s more
    assert chair.tick(50.2) <= POLL_S and m.head["open"] == 0
    chair.tick(50.5)
    assert m.head["open"] == 1 and m.members(0) == [0]
    m.cells["done"][0] = 0
    chair.tick(50.6)
    # Worker 1's gradient, computed on step 0's weights, arrives for step 1: alone it starts no bound
    # (it waits for a fresh one), and with it the next step is stale-weighted no more than once.
    _arrive(m, 1, at=51.0, read=0)
    chair.tick(99.0)
    assert m.head["open"] == 1
    _arrive(m, 0, at=99.5, read=1)
    chair.tick(99.5)
    assert m.head["open"] == 2 and m.members(1) == [0, 1] and m.head["closed_late"] == 1


def test_with_many_workers_the_bound_runs_from_the_median_workers_arrival() -> None:
    _, _, m, _ = _replica(OptimConfig(name="adamw"), 4)
    chair = _chair(m, 0.25, [])
    m.cells["live"] = 1.0
    _arrive(m, 0, at=10.0)  # the first of four comes early by chance: no bound yet
    chair.tick(10.6)
    assert m.head["open"] == 0
    _arrive(m, 1, at=10.8)  # the second of four: the bound runs from here, 0.25 s
    chair.tick(11.0)
    assert m.head["open"] == 0
    chair.tick(11.05)
    assert m.head["open"] == 1 and m.members(0) == [0, 1]


def test_a_dead_member_no_longer_holds_its_step_and_a_step_of_no_finite_gradient_is_no_step() -> None:
    _, _, m, _ = _replica(OptimConfig(name="adamw"), 2)
    chair = _chair(m, 0.5, [])
    m.cells["live"] = 1.0
    _arrive(m, 0, at=1.0, finite=False)
    _arrive(m, 1, at=1.0, finite=False)
    chair.tick(1.0)
    assert m.head["open"] == 1 and m.head["count"] == 0 and float(chair.steps[0]) == 0  # nothing to step on
    m.cells["done"][0] = 0
    chair.tick(1.1)
    assert m.head["applied"] == 0  # worker 1 never applied its shard...
    m.forget(1)  # ...and died: the pool tells the chair, which forgets it
    chair.tick(1.2)
    assert m.head["applied"] == 1 and m.cells["live"][1] == 0 and m.cells["arrived"][1] == -1


def test_shards_cover_every_value_and_parameter_once() -> None:
    _, _, m, _ = _replica(OptimConfig(name="adamw"), 3)
    for parts in (1, 2, 3):
        values = sorted((p.row_offset + i) for r in range(parts) for p in m.value_shard(r, parts)
                        for i in range(p.numel))
        assert values == list(range(m.numel))
        params = sorted(p.slot for r in range(parts) for p in m.param_shard(r, parts))
        assert params == list(range(len(m.slots)))
    assert balanced([10, 1, 1, 8], 2) == [[0], [1, 2, 3]]


def _reference(cfg: OptimConfig, model: nn.Module) -> torch.optim.Optimizer:
    params = list(model.parameters())
    wd = decays(cfg, [tuple(p.shape) for p in params])
    groups = [{"params": [p for p, d in zip(params, wd) if d == w], "weight_decay": w} for w in sorted(set(wd))]
    cls = import_target(cfg._target_, "optim._target_") if cfg._target_ else torch.optim.AdamW
    return cls(groups, lr=cfg.lr)


@pytest.mark.parametrize("cfg", [
    OptimConfig(name="adamw", lr=0.01, weight_decay=0.1, decay_norm_and_bias=False),
    OptimConfig(_target_="torch.optim.AdamW", lr=0.01, weight_decay=0.1, decay_norm_and_bias=False),
    OptimConfig(_target_="torch.optim.Adafactor", lr=0.01),  # factored moments: not parameter-shaped
], ids=["flat adamw", "torch AdamW", "torch Adafactor"])
@pytest.mark.parametrize("members", [1, 3])
def test_members_stepping_their_shards_are_one_optimizer_stepping_the_mean(cfg: OptimConfig, members: int) -> None:
    model, flat, m, state = _replica(cfg, 3)
    ref_model = copy.deepcopy(_net())
    ref = _reference(cfg, ref_model)
    params = list(model.parameters())
    ups = [BarrierUpdate(cfg, Seat(m, j, flat, state), params, Signals(lambda: False), Pacer(PaceConfig()))
           for j in range(3)]
    gen = torch.Generator().manual_seed(1)
    for step in range(6):
        grads = [torch.randn(m.numel, generator=gen) for _ in range(members)]
        # One member's gradient is poisoned on step 2: it arrives to say so, and never reaches the state.
        poisoned = members > 1 and step == 2
        for j, g in enumerate(grads):
            m.rows[j].copy_(g)
            m.cells[j]["finite"] = 0.0 if poisoned and j == 0 else 1.0
            m.cells[j]["member_of"], m.cells[j]["applies"] = step, 1.0  # as the chair closes it
        if poisoned:
            m.rows[0].fill_(float("nan"))
        m.head["t"] = step
        for j in range(members):
            ups[j].shard.apply(step, None)
        used = grads[1:] if poisoned else grads
        mean = torch.stack(used).mean(0)
        for i, p in enumerate(ref_model.parameters()):
            p.grad = mean[m.offsets[i]:m.offsets[i] + p.numel()].view(p.shape).clone()
        ref.step()
    assert ups[members - 1].shard.last_count == members  # the last step's divisor: every member's gradient
    # One state per replica, however many members: every optimizer state tensor of every member's
    # shard lies in the replica's shared state, so none is held twice (per-worker Hogwild keeps one
    # whole state per worker).
    assert _private_state(ups, state) == []
    for ours, theirs in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert all(torch.isfinite(v).all() for v in state.values())


def _private_state(ups: list[BarrierUpdate], state: dict[str, Tensor]) -> list[str]:
    """The state tensors of the members' shard optimizers that are not views of ``state``."""
    shared = {t.untyped_storage().data_ptr() for t in state.values()}
    found = []
    for j, up in enumerate(ups):
        for opt, _, _ in up.shard._shards.values():
            inner = getattr(opt, "opt", None)
            held = ([(k, v) for st in inner.state.values() for k, v in st.items()] if inner is not None
                    else [(k, v) for k, views in opt.state.items() for v in views])
            found += [f"member {j}: {k}" for k, v in held
                      if isinstance(v, Tensor) and v.untyped_storage().data_ptr() not in shared]
    return found


# ---------------------------------------------------------------------- real processes

D, UPDATES = 64, 25


def _gradient(j: int, s: int) -> Tensor:
    return torch.randn(D, generator=torch.Generator().manual_seed(1000 * j + s))


def _racing_worker(j: int, meeting: Meeting, flat: Tensor, state: dict[str, Tensor], notices: Any, kick: Any,
                   counts: Tensor, seed: int) -> None:
    torch.set_num_threads(1)
    model = nn.Linear(D, 1, bias=False)
    bind(model, flat)
    cfg = OptimConfig(name="sgd", lr=1.0, update="barrier")
    up = BarrierUpdate(cfg, Seat(meeting, j, flat, state), list(model.parameters()),
                       Signals(lambda: False, notices, kick), Pacer(PaceConfig()))
    rng = random.Random(seed + j)
    up.ready()
    for s in range(UPDATES):
        assert up.begin()
        (model.weight * _gradient(j, s)).sum().backward()
        time.sleep(rng.uniform(0.0, 0.02) + (0.03 if j == 2 else 0.0))  # worker 2 is slow: often late
        ok = not (j == 1 and s == 7)
        if not ok:
            model.weight.grad.fill_(float("nan"))
        assert up.apply([model.weight.grad], ok, None, 0) == int(ok)
        counts[j, s] = up.shard.last_count if ok else 0
    up.finish()


def test_every_gradient_reaches_the_model_once_however_the_steps_fall() -> None:
    """Three worker processes with jittered compute times and a slow one, a bound that often
    closes steps without it (its gradient then joins the next step), and one poisoned gradient:
    the model moved by exactly the sum of each finite gradient over its step's count."""
    ctx = worker_context()  # the workers' own start: forks of a server that imported torch once
    model = nn.Linear(D, 1, bias=False)
    flat = share_model(model, "cpu")
    w0 = flat.clone()
    cfg = OptimConfig(name="sgd", lr=1.0, update="barrier")
    state = {STEPS_KEY: torch.zeros(1, dtype=torch.float64).share_memory_()}
    m = Meeting(3, param_slots(model), [False], "cpu", alloc)
    counts = torch.zeros(3, UPDATES, dtype=torch.float64).share_memory_()
    notices_r, notices_w = ctx.Pipe(duplex=False)
    kicks = [ctx.Pipe(duplex=False) for _ in range(3)]
    pacer = Pacer(PaceConfig(min_wait=0.2, max_wait=0.2, straggler_wait=0.2))
    chair = Chair(m, pacer, state[STEPS_KEY], lambda: [w.send_bytes(b"k") for _, w in kicks],
                  notices_r, notices_w)
    chair.start()
    procs = [ctx.Process(target=_racing_worker, args=(j, m, flat, state, notices_w, kicks[j][0], counts, 7))
             for j in range(3)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(90)
        assert [p.exitcode for p in procs] == [0, 0, 0]
    finally:
        chair.stop()
        for p in procs:
            if p.is_alive():
                p.kill()
    expected = w0.double().clone()
    for j in range(3):
        for s in range(UPDATES):
            if counts[j, s] > 0:
                expected -= cfg.lr * _gradient(j, s).double() / counts[j, s]
    assert counts[1, 7] == 0 and (counts > 0).sum() == 3 * UPDATES - 1
    assert m.head["closed_late"] > 0  # the slow worker's gradients did join later steps
    torch.testing.assert_close(flat.double(), expected, rtol=0, atol=1e-4)
    # Every closed step but one whose only gradient was the poisoned one stepped the optimizer.
    assert m.head["applied"] - 1 <= int(state[STEPS_KEY][0]) <= m.head["applied"] < 3 * UPDATES


def test_a_worker_much_slower_than_the_pivot_computes_on_a_share_of_its_batch() -> None:
    """pace.balance (LB-BSP): a worker whose whole batch takes twice the pivot's computes each batch
    in halves, so its gradient arrives with the pivot's; a part may come a little after the pivot (the
    slack, within the straggler bound) rather than well before it, when the worker would idle; noise
    between equal workers cuts nothing."""
    assert balanced_share(2.0, [1.0, 2.0]) == pytest.approx(0.5)  # two workers: the pivot is the faster
    assert balanced_share(1.0, [1.0, 2.0]) == 1.0  # the fast one keeps its whole batch
    assert balanced_share(1.1, [1.0, 1.1]) == 1.0  # within the band: jitter, not a straggler
    assert balanced_share(2.1, [1.0, 2.1]) == pytest.approx(0.5)  # halves of 1.05: within the slack
    assert balanced_share(2.2, [1.0, 2.2]) == pytest.approx(1 / 3)  # halves of 1.1 would come too late
    assert balanced_share(2.2, [1.0, 2.2], slack=0.1) == pytest.approx(0.5)
    assert balanced_share(1.6, [1.0, 1.6]) == pytest.approx(0.5)  # whole: 1.6 late; halves: 0.8, early but on time
    assert balanced_share(10.0, [1.0, 10.0]) == 1 / MAX_PARTS  # never more parts: the bound does the rest
    assert balanced_share(0.0, [1.0, 0.0]) == balanced_share(2.0, [0.0, 2.0]) == 1.0  # nothing measured yet
    assert balanced_share(0.004, [0.001, 0.004]) == 1.0  # millisecond batches: jitter, and a part costs a meeting
    # Sixteen workers, two at half speed: the pivot is the median worker's pace, not the fastest one's.
    paces = [1.0 + 0.01 * j for j in range(14)] + [2.0, 2.0]
    assert balanced_share(2.0, paces) == pytest.approx(0.5)  # 2 / 1.07: halves
    assert balanced_share(1.13, paces) == 1.0


def test_a_steps_mean_weighs_each_gradient_by_its_samples() -> None:
    """Each row is a mean over its own batch: the step's mean is the mean over all their samples,
    as if one batch; with equal batches it is the plain mean, as before."""
    _, _, m, _ = _replica(OptimConfig(name="adamw"), 3)
    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(m.numel, generator=gen) for _ in range(3)]
    pieces = m.value_shard(0, 1)
    for mine, samples, want in [(0, [16, 8, 4], (16 * grads[0] + 8 * grads[1] + 4 * grads[2]) / 28),
                                (2, [16, 8, 4], (16 * grads[0] + 8 * grads[1] + 4 * grads[2]) / 28),
                                (1, [16, 16, 16], torch.stack(grads).mean(0))]:
        for j, g in enumerate(grads):
            m.rows[j].copy_(g)
        assert mean_into(m.rows, mine, [0, 1, 2], pieces, samples)
        assert torch.allclose(m.rows[mine], want, atol=1e-6), (mine, samples)
    for j, g in enumerate(grads):
        m.rows[j].copy_(g)
    assert mean_into(m.rows, 1, [0, 2], pieces, [30, 10])  # a member that brought nothing is not in it
    assert torch.allclose(m.rows[1], (30 * grads[0] + 10 * grads[2]) / 40, atol=1e-6)


def test_a_barrier_worker_measures_its_pace_and_cuts_its_next_batch_to_it() -> None:
    cfg = OptimConfig(name="adamw")
    model, flat, m, state = _replica(cfg, 2)
    params = list(model.parameters())
    # The run is stopping: apply() writes its cell, then meets nobody (no chair runs here).
    ups = [BarrierUpdate(cfg, Seat(m, j, flat, state), params, Signals(lambda: True), Pacer(PaceConfig(balance=True)))
           for j in range(2)]
    m.cells["live"] = 1.0
    m.cells["pace"] = [0.01, 0.02]  # worker 1's whole batch takes twice worker 0's
    assert ups[0].begin() and ups[1].begin()
    assert (ups[0].split().share, ups[1].split().share) == (1.0, pytest.approx(0.5))
    ups[1]._t0 = time.perf_counter() - 0.01  # its half batch took 10 ms: a whole one would take 20
    assert ups[1].apply([None] * len(params), True, None, 0, samples=8, fraction=0.5) == 0
    c = m.cells[1]
    # Its pace moves towards 20 ms, and stays there (a busy machine only ever adds to a measured time).
    assert c["samples"] == 8 and 0.0199 < c["pace"] < 0.03, c["pace"]
    for took in (0.01, 0.01, 0.5, 0.01):  # one half batch spans a stall (the process was paused)
        ups[1]._t0 = time.perf_counter() - took
        ups[1].apply([None] * len(params), True, None, 0, samples=8, fraction=0.5)
    assert 0.0199 < c["pace"] < 0.03, c["pace"]  # an outlier, not a slower worker: no smaller share
    for _ in range(3):  # slowed for good (five times slower): the pace follows within three gradients
        ups[1]._t0 = time.perf_counter() - 0.05
        ups[1].apply([None] * len(params), True, None, 0, samples=8, fraction=0.5)
    assert c["pace"] > 0.09, c["pace"]
    off = BarrierUpdate(cfg, Seat(m, 1, flat, state), params, Signals(lambda: True), Pacer(PaceConfig(balance=False)))
    assert off.begin() and off.split().share == 1.0  # pace.balance=false: whole batches whatever the paces


def test_a_worker_in_chunks_hands_in_once_the_pivot_is_in_and_its_rest_would_come_after_the_bound() -> None:
    """pace.chunks: no pivot yet, computing on; the pivot in and the batch's rest due within
    pace.min_wait of its compute time, computing on; due after it, handing in; the step closed
    without this worker, handing in at once. Chunks replace the pace's split, and a replica of one
    worker computes whole batches."""
    cfg = OptimConfig(name="adamw")
    model, flat, m, state = _replica(cfg, 3)
    params = list(model.parameters())
    pace = PaceConfig(min_wait=0.5, chunks=4)
    up = BarrierUpdate(cfg, Seat(m, 2, flat, state), params, Signals(lambda: True), Pacer(pace, (4, 0.02), workers=3))
    m.cells["live"] = 1.0
    m.cells["pace"] = [0.01, 0.01, 0.015]
    assert up.split().chunks == 1  # a batch of 15 ms: whole (each chunk's overhead would show)
    m.cells["pace"] = [0.01, 0.01, 0.04]
    assert up.begin() and up.split() == (1.0, 4)  # the pace's share is not asked for
    now = time.monotonic()  # seconds of margin below: a loaded machine may pause this test
    assert not up.hand_in(1.0, 9)  # nobody has arrived
    _arrive(m, 0, now - 4.0, compute_s=10.0)  # one of two others: the pivot of three live workers is the second
    assert not up.hand_in(1.0, 9)
    _arrive(m, 1, now - 2.0, compute_s=10.0)  # the pivot: the chair waits for this worker until 3 s from now
    assert not up.hand_in(1.0, 2)  # the rest in 2 s: on time
    assert up.hand_in(1.0, 4)  # the rest in 4 s: late, so what is done goes now
    m.cells[1]["read"] = -1  # a stale gradient is no pivot
    assert not up.hand_in(1.0, 4)
    m.head["open"] = 1  # the step closed without this worker: whatever it holds is late already
    assert up.hand_in(0.0, 1)
    m.cells[0]["pace"] = 0.04
    assert make_pacer(pace, _net(), 32, workers=1).split(0, m.cells).chunks == 1  # one worker waits for nobody
    assert make_pacer(pace, _net(), 32, workers=3, tables=True).split(0, m.cells).chunks == 1  # rows written at once


def test_auto_chunks_are_four_of_at_least_eight_samples_and_none_for_batch_norm() -> None:
    net = _net()
    assert chunks_for("auto", net, 32) == (4, MIN_CHUNK_S, PLAN_FROM_S) == (4, 0.02, 0.3)
    assert chunks_for("auto", net, 16).chunks == 2 and chunks_for("auto", net, 12).chunks == 1
    assert chunks_for("auto", nn.Sequential(nn.Linear(5, 7), nn.BatchNorm1d(7)), 64).chunks == 1
    assert chunks_for(3, net, 4) == (3, 0.0, float("inf"))  # a number set by hand is kept, whatever the batch or step


def test_from_a_long_step_auto_gives_a_steadily_slow_worker_its_planned_share_and_chunks_to_the_rest() -> None:
    """pace.chunks=auto: while the step (the median live worker's whole batch) is short, every worker
    computes in chunks, the straggler too; from PLAN_FROM_S on, a worker each of whose last paces was
    over pace.balance's band of the median computes pace.balance's planned share, and the others, the
    median's equals or slowed for a moment, still compute in chunks. A number set by hand chunks every
    batch, and with pace.balance off chunks stay."""
    m = Meeting(3, param_slots(_net()), [False] * 3, "cpu", alloc)
    m.cells["live"] = 1.0
    slow, fast = (make_pacer(PaceConfig(), _net(), 32, workers=3) for _ in range(2))
    step = PLAN_FROM_S
    for _ in range(PACE_WINDOW):
        slow.timed(step, 0.5)  # half a batch in one step's time: its pace is two steps
        fast.timed(step, 1.0)
    m.cells["pace"] = [0.1, 0.1, 0.25]  # a short step; the straggler's batch takes 2.5 times the median's
    assert slow.split(2, m.cells) == Split(1.0, 4) and fast.split(0, m.cells) == Split(1.0, 4)
    m.cells["pace"] = [step, 1.05 * step, 2 * step]  # a long step
    assert slow.split(2, m.cells) == Split(0.5, 1)  # pace.balance: half a batch a step
    assert fast.split(0, m.cells) == Split(1.0, 4)  # within the band
    assert m.cells[2]["chunk_s"] == 0.0  # a part says nothing as it goes: the chair cannot see it stop
    m.cells["live"][0] = 0.0  # a dead worker's pace is not the step's: the median is worker 1's, 1.05 x
    assert slow.split(2, m.cells) == Split(0.5, 1)
    m.cells["pace"][1] = 0.1  # the live median a short step again: chunks
    assert slow.split(2, m.cells) == Split(1.0, 4)
    m.cells["live"][0], m.cells["pace"][1] = 1.0, 1.05 * step
    slow.timed(0.9 * step, 1.0)  # one batch at the others' speed: the spell may be over, chunks follow it
    assert slow.split(2, m.cells) == Split(1.0, 4)
    for _ in range(PACE_WINDOW - 1):
        slow.timed(step, 0.5)
    assert slow.split(2, m.cells) == Split(1.0, 4)  # four slow paces again: not yet steady
    slow.timed(step, 0.5)
    assert slow.split(2, m.cells) == Split(0.5, 1)
    assert make_pacer(PaceConfig(chunks=4), _net(), 32, workers=3).split(2, m.cells) == Split(1.0, 4)
    assert make_pacer(PaceConfig(balance=False), _net(), 32, workers=3).split(2, m.cells) == Split(1.0, 4)
