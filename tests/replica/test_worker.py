"""The worker loop in this process, on a tiny synthetic problem (fast tier)."""

from __future__ import annotations

import math
from typing import Any, Optional
from multiprocessing import Pipe

import pytest
import torch
from torch import Tensor, nn

from hogwild.config.plan import Plan
from hogwild.config.schema import OptimConfig
from hogwild.data.datasets import Dataset, ShardSampler, Split
from hogwild.replica.board import Board
from hogwild.replica.faults import FAULT_ENV, Faults, planned_faults
from hogwild.replica.step import Computed
from hogwild.replica.optim import FlatOptimizer
from hogwild.replica.shared import layout, share_model
from hogwild.replica import pacing
from hogwild.replica.update import HogwildUpdate
from hogwild.replica.worker import Channels, Recipe, WorkerSpec, make_step_fn, run_loop

pytestmark = pytest.mark.timeout(60)


def tiny_worker(quota: int, fault: str = "", rows: int = 1, bf16: bool = False, replica_quota: int = 0) -> tuple:
    """Worker 0 of a replica with ``rows`` workers on a tiny linearly separable problem:
    (step_fn, updater, params, spec, board, flat, ds, model), the updater Hogwild's (SGD)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    ds = Dataset(Split((x,), y), Split((x[:64],), y[:64]), 2, (4,))
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    flat = share_model(model, "cpu")
    params = list(model.parameters())
    opt = HogwildUpdate(FlatOptimizer(OptimConfig(lr=0.5), flat, layout(model), {}), params)
    step_fn = make_step_fn(model, ds, ShardSampler(torch.arange(256), 16, 0), torch.device("cpu"), bf16=bf16)
    if fault:
        step_fn = Faults(workers=fault).step(step_fn, params, 0, 0)
        step_fn(0)  # the warm-up, as a worker makes it: its faults start with the next call
    board = Board(rows)
    board.control["go"] = 1.0
    board.control["next_sync_at"] = math.inf
    board.control["next_report_at"] = math.inf
    spec = WorkerSpec(0, 0, 1, 1, quota, Plan("hogwild", False, 1, 1), replica_quota)
    return step_fn, opt, params, spec, board, flat, ds, model


def _accuracy(model: nn.Module, ds: Dataset) -> float:
    with torch.no_grad():
        return float((model(ds.test.inputs[0]).argmax(1) == ds.test.targets).float().mean())


def test_run_loop_trains_the_shared_model_and_counts_its_work() -> None:
    step_fn, opt, params, spec, board, flat, ds, model = tiny_worker(quota=60)
    before = flat.clone()
    run_loop(step_fn, opt, params, spec, Channels(board))
    row = board.row(0)
    assert (row["pos"], row["applied"], row["samples"], row["skipped"]) == (60, 60, 60 * 16, 0)
    assert row["done"] == 1 and row["ready"] == 1 and 0 < row["loss"] < 0.5
    assert not torch.equal(flat, before)  # the updates went into the shared buffer
    assert _accuracy(model, ds) > 0.9


def test_poisoned_update_is_skipped_and_never_reaches_the_model() -> None:
    step_fn, opt, params, spec, board, flat, _, _ = tiny_worker(quota=20, fault="nan:0:3,nan:0:7,nan:1:5")
    run_loop(step_fn, opt, params, spec, Channels(board))
    row = board.row(0)
    assert (row["applied"], row["skipped"], row["pos"]) == (18, 2, 20)
    assert torch.isfinite(flat).all()


def test_injected_crash_raises_at_its_step_and_the_position_says_where() -> None:
    step_fn, opt, params, spec, board, _, _, _ = tiny_worker(quota=20, fault="crash:0:4")
    with pytest.raises(RuntimeError, match="injected crash at step 4"):
        run_loop(step_fn, opt, params, spec, Channels(board))
    assert board.row(0)["pos"] == 4  # a respawned worker resumes at step 4


def test_stop_flag_ends_the_loop_and_a_respawn_resumes_at_its_position() -> None:
    step_fn, opt, params, spec, board, _, _, _ = tiny_worker(quota=50)
    board.control["stop"] = 1.0
    run_loop(step_fn, opt, params, spec, Channels(board))
    assert board.row(0)["pos"] == 0 and board.row(0)["done"] == 1
    board.control["stop"] = 0.0
    board.row(0)["pos"] = 30
    board.row(0)["done"] = 0
    run_loop(step_fn, opt, params, spec, Channels(board))
    assert board.row(0)["pos"] == 50 and board.row(0)["applied"] == 20


class _StopsAtTheMeeting(HogwildUpdate):
    """As the barrier's updater when the run stops while a gradient waits for its step: the
    gradient never reaches the model and apply says 0 (BarrierUpdate._meet returns None)."""

    def __init__(self, inner: HogwildUpdate, board: Board, at: int) -> None:
        self.__dict__.update(inner.__dict__)
        self.board, self.at, self.calls = board, at, 0

    def apply(self, grads, ok, rate, pos, samples=0, fraction=1.0):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls <= self.at:
            return super().apply(grads, ok, rate, pos, samples, fraction)
        self.board.control["stop"] = 1.0
        return 0


def test_a_batch_whose_update_the_stop_cut_off_is_read_again_on_resume() -> None:
    # A SIGTERM while a batch waited at the meeting moved its position past a batch the model never
    # saw: a resumed run skipped it, one batch a worker lost at every graceful stop.
    step_fn, opt, params, spec, board, flat, _, _ = tiny_worker(quota=50)
    run_loop(step_fn, _StopsAtTheMeeting(opt, board, at=12), params, spec, Channels(board))
    row = board.row(0)
    assert (row["applied"], row["pos"]) == (12, 12) and row["done"] == 1


@pytest.mark.parametrize("sync_at,report_at,wakes", [
    (math.inf, math.inf, 0),  # nothing to wake for: ready and done only
    (10, math.inf, 1),        # the sync point
    (math.inf, 25, 1),        # the metrics point
    (10, 25, 1),              # the nearer one, until the leader moves it
    (40, 50, 0),              # beyond the quota
])
def test_workers_wake_the_leader_once_per_point_crossed(sync_at: float, report_at: float, wakes: int) -> None:
    step_fn, opt, params, spec, board, _, _, _ = tiny_worker(quota=30)
    board.control["next_sync_at"] = sync_at
    board.control["next_report_at"] = report_at
    r, w = Pipe(duplex=False)
    run_loop(step_fn, opt, params, spec, Channels(board, wake=w))
    msgs = []
    while r.poll():
        msgs.append(r.recv_bytes())
    assert msgs == [b"r", *[b"s"] * wakes, b"d"]


def test_fault_plan_parses_only_this_workers_faults() -> None:
    assert planned_faults(1, "nan:0:3,crash:1:5,nan:1:9") == {"crash": {5}, "nan": {9}}
    assert planned_faults(2, "nan:0:3") == {}
    fn = lambda step, share=1.0: Computed(torch.tensor(0.0), 1, 0, 1)  # noqa: E731
    assert Faults().step(fn, [], 0, 0) is fn  # nothing planned: the loop runs the plain step function
    assert Faults(workers="nan:1:3").step(fn, [], 0, 0) is fn
    assert Faults.from_env({FAULT_ENV: "crash:0:5"}) == Faults(workers="crash:0:5")


def test_the_leaders_seam_gives_back_what_it_wraps_unless_a_fault_is_planned_for_its_slot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One seam on the leader's side, its comm: a lost round, and the final round's faults at that
    round's edges (``Comm.round``), which a collective alone cannot tell from any other round's."""
    from hogwild.leader import faults as leader_faults
    from hogwild.replica import faults
    from hogwild.sync.comm import SYNC_ROUND, LocalComm, PeerLost

    comm = LocalComm()
    slept: list[float] = []
    monkeypatch.setattr(leader_faults.time, "sleep", slept.append)
    monkeypatch.setattr(leader_faults.os, "_exit", lambda code: (_ for _ in ()).throw(SystemExit(code)))
    try:
        faults.install({})
        assert leader_faults.faulty_comm(comm, 0) is comm
        faults.install({"HOGWILD_LEADER_FAULT": "late:1:4,lose:1:2,exit:1:0"})
        assert leader_faults.faulty_comm(comm, 0) is comm
        faulty = leader_faults.faulty_comm(comm, 1)
        assert faulty is not comm and faulty.rank == 0  # everything else is the comm's
        with faulty.round(final=False):
            faulty.all_reduce(torch.zeros(1), what=SYNC_ROUND)
        with pytest.raises(PeerLost, match="injected: lose:1:2"), faulty.round(final=False):
            faulty.all_reduce(torch.zeros(1), what=SYNC_ROUND)
        assert slept == []  # rounds before the final one come on time, and nobody exits after them
        with pytest.raises(SystemExit) as died, faulty.round(final=True):
            assert slept == [4]  # late to the final round, before its first collective
            faulty.all_reduce(torch.zeros(1), what=SYNC_ROUND)
        assert died.value.code == 137  # right after it, as a SIGKILL would leave it
    finally:
        faults.install({})


def test_workers_wait_at_the_lag_limit_until_the_round_completes() -> None:
    import threading
    import time

    step_fn, opt, params, spec, board, _, _, _ = tiny_worker(quota=30)
    board.control["lag_limit"] = 10  # a round is pending; max_lag allows 10 steps
    kick_r, kick_w = Pipe(duplex=False)
    worker = threading.Thread(target=run_loop, args=(step_fn, opt, params, spec, Channels(board, kick=kick_r)))
    worker.start()
    deadline = time.monotonic() + 20
    while board.row(0)["pos"] < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    assert board.row(0)["pos"] == 10 and worker.is_alive(), "the worker ran past the lag limit"
    board.control["lag_limit"] = math.inf  # the leader finished the round
    kick_w.send_bytes(b"k")
    worker.join(20)
    assert not worker.is_alive() and board.row(0)["pos"] == 30
    assert board.row(0)["lag_wait_s"] >= 0.3


def test_slow_fault_delays_every_step_after_the_warm_up() -> None:
    import time

    fn = Faults(workers="slow:0:200").step(lambda step, share=1.0, summed=False: (torch.tensor(0.0), 1, 0), [], 0, 0)
    fn(0)  # the warm-up
    t0 = time.perf_counter()
    fn(0)
    fn(1)
    assert time.perf_counter() - t0 >= 0.4
    t0 = time.perf_counter()
    for _ in range(4):  # a batch in quarters (pace.chunks) is slowed by the sample: 200 ms in all, not 800
        fn(2, 0.25)
    assert 0.2 <= time.perf_counter() - t0 < 0.5


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["its kick pipe closed", "the watch says so"])
def test_a_worker_waiting_at_the_lag_bound_leaves_when_its_leader_is_gone(how: str) -> None:
    """Workers waited on a Condition shared with the leader. A leader killed while it held the
    Condition's lock (notifying after a round, or stopped there and then killed) left it held
    forever, and a waiting worker blocked re-acquiring it and outlived its leader; one was found
    after a frozen-peer test. The wait now shares no lock: it polls a pipe whose only writer is
    the leader, and a dead leader ends it either way."""
    import threading

    import numpy as np

    from hogwild.replica.worker import wait_for_round

    board = Board(1)
    board.stats["pos"] = np.array([10.0])
    board.control["lag_limit"] = 5.0  # past the bound: the worker must wait for a round
    kick_r, kick_w = Pipe(duplex=False)
    alive = how != "the watch says so"
    if how == "its kick pipe closed":
        kick_w.close()
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (wait_for_round(board.stats, board.control, kick_r, lambda: alive),
                                              done.set()), daemon=True)
    waiter.start()
    assert done.wait(10), "the worker waited on for a leader that is gone"


def test_a_kick_ends_the_wait_only_once_the_bound_moved() -> None:
    import threading

    import numpy as np

    from hogwild.replica.worker import wait_for_round

    board = Board(1)
    board.stats["pos"] = np.array([10.0])
    board.control["lag_limit"] = 5.0
    kick_r, kick_w = Pipe(duplex=False)
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (wait_for_round(board.stats, board.control, kick_r, lambda: True),
                                              done.set()), daemon=True)
    waiter.start()
    kick_w.send_bytes(b"k")  # a kick with the bound where it was: look again, and wait on
    assert not done.wait(0.5), "a kick ended the wait though the round had not completed"
    board.control["lag_limit"] = 20.0
    kick_w.send_bytes(b"k")
    assert done.wait(10), "the worker did not go on once the round completed"


def test_accumulated_batches_make_one_update_on_their_mean_gradient() -> None:
    """train.accumulate=2 under Hogwild (plain SGD): each update is one step on the mean of two
    batches' gradients, and the position moves by both batches."""
    step_fn, opt, params, spec, board, flat, ds, model = tiny_worker(quota=6)
    w = flat.clone().requires_grad_(True)
    for update in range(3):  # SGD lr 0.5 on the mean of batches 2u and 2u + 1
        grads = []
        for index in (2 * update, 2 * update + 1):
            x, y = ds.train.batch(ShardSampler(torch.arange(256), 16, 0).batch(index))
            weight, bias = w[:8].view(2, 4), w[8:10]
            g, = torch.autograd.grad(nn.functional.cross_entropy(x[0] @ weight.T + bias, y), w)
            grads.append(g)
        with torch.no_grad():
            w -= 0.5 * (grads[0] + grads[1]) / 2
    expected = w.detach()
    updater = HogwildUpdate(opt.opt, params, batches_per_step=2)
    run_loop(step_fn, updater, params, spec, Channels(board), Recipe(accumulate=2))
    assert (board.row(0)["pos"], board.row(0)["applied"]) == (6, 3)
    torch.testing.assert_close(flat, expected, rtol=1e-5, atol=1e-6)


def test_a_batch_in_parts_is_computed_part_by_part_and_read_once() -> None:
    """pace.balance hands a slow worker a share: its gradients are those of the batch's parts in
    order, each says how many samples it used (the step's mean weighs it by them) and how many are
    left, and the batch is read once (a stream's cannot be read twice)."""
    step_fn, _, params, _, _, _, ds, model = tiny_worker(quota=1)
    reads = []
    original = ds.train.batch
    ds.train.batch = lambda rows: reads.append(1) or original(rows)  # type: ignore[method-assign]
    rows = ShardSampler(torch.arange(256), 16, 0).batch(2)
    for start, share, (used, left) in [(0, 0.5, (8, 8)), (8, 0.25, (4, 4)), (12, 0.5, (4, 0))]:
        for p in params:
            p.grad = torch.zeros_like(p)
        assert step_fn(2, share)[1:] == (used, left, 16)
        got = [p.grad.clone() for p in params]
        for p in params:
            p.grad = None
        part = rows[start:start + used]
        nn.functional.cross_entropy(model(ds.train.inputs[0][part]), ds.train.targets[part]).backward()
        assert all(torch.allclose(a, p.grad) for a, p in zip(got, params)), start
    assert len(reads) == 1
    assert step_fn(2)[1:] == (16, 0, 16) and len(reads) == 2  # done with it: the index reads afresh


class _Handing:
    """An updater's hand_in for in_chunks: yes after ``after`` chunks (never: None)."""

    def __init__(self, after: Optional[int]) -> None:
        self.after, self.asked = after, []  # type: list[tuple[float, int]]

    def hand_in(self, chunk_s: float, chunks_left: int) -> bool:
        self.asked.append((chunk_s, chunks_left))
        return self.after is not None and len(self.asked) >= self.after


def test_a_batch_in_chunks_hands_in_the_mean_of_the_chunks_done_and_keeps_the_rest_for_later() -> None:
    """pace.chunks: a batch of 16 in 4 chunks of 4. Handed in after one chunk, the gradient is the
    mean over those 4 samples and 12 are left; the rest, in one call, is the mean over the other 12;
    never handed in, the 4 chunks make the whole batch's gradient, as one batch computed at once.
    The batch is read once, and the updater hears how many chunks are left each time."""
    from hogwild.replica.worker import in_chunks

    step_fn, _, params, _, _, _, ds, model = tiny_worker(quota=1)
    reads = []
    original = ds.train.batch
    ds.train.batch = lambda rows: reads.append(1) or original(rows)  # type: ignore[method-assign]
    rows = ShardSampler(torch.arange(256), 16, 0).batch(3)

    def reference(part: Tensor) -> tuple[list[Tensor], float]:
        for p in params:
            p.grad = None
        loss = nn.functional.cross_entropy(model(ds.train.inputs[0][part]), ds.train.targets[part])
        loss.backward()
        return [p.grad.clone() for p in params], float(loss.detach())

    for (start, end), after, asked in [((0, 4), 1, [3]), ((4, 16), None, [2, 1])]:
        want, want_loss = reference(rows[start:end])
        for p in params:
            p.grad = torch.zeros_like(p)
        handing = _Handing(after)
        got = in_chunks(step_fn, 3, 4, handing.hand_in, params)
        assert (got.samples, got.left, got.whole) == (end - start, 16 - end, 16)
        assert [left for _, left in handing.asked] == asked and all(s > 0 for s, _ in handing.asked)
        assert float(got.loss) == pytest.approx(want_loss, rel=1e-5)
        for a, p in zip(want, params):
            torch.testing.assert_close(p.grad, a, rtol=1e-5, atol=1e-6)
    assert len(reads) == 1
    whole, _ = reference(rows)
    for p in params:
        p.grad = torch.zeros_like(p)
    assert in_chunks(step_fn, 3, 4, _Handing(None).hand_in, params).samples == 16
    for a, p in zip(whole, params):
        torch.testing.assert_close(p.grad, a, rtol=1e-5, atol=1e-6)


def test_a_batch_slice_cuts_every_tensor_of_the_batch_and_nothing_else() -> None:
    from hogwild.replica.step import batch_slice

    ids, mask, bias = torch.arange(12).view(4, 3), torch.ones(4, 3), torch.zeros(7)
    part, y = batch_slice({"input_ids": ids, "attention_mask": mask, "bias": bias, "name": "x"}, torch.arange(4), 1, 3)
    assert isinstance(part, dict) and y is not None
    assert torch.equal(part["input_ids"], ids[1:3]) and part["attention_mask"].shape == (2, 3)
    assert part["bias"] is bias and part["name"] == "x" and torch.equal(y, torch.arange(1, 3))
    (x,), none = batch_slice((torch.arange(6.0).view(3, 2),), None, 0, 1)
    assert none is None and x.shape == (1, 2)


def test_under_a_time_budget_the_schedule_follows_the_steps_made_not_the_batches_read() -> None:
    """A barrier step may hold fewer batches than planned (a late worker's gradient, a batch in
    parts): halfway through the budget the rate is halfway down its cosine however many batches
    the steps held, and the schedule ends when the run does, not before."""
    import time

    from hogwild.config.train import SchedConfig
    from hogwild.replica.lr_schedule import LRSchedule

    class ThreeStepsABatch:  # an updater whose optimizer steps run three to a batch
        batches_per_step, wait_s = 1, 0.0

        def __init__(self) -> None:
            self.rates: list[float] = []

        def ready(self) -> None: ...
        def finish(self) -> None: ...
        def begin(self) -> bool:
            return True

        def split(self) -> pacing.Split:
            return pacing.WHOLE

        def hand_in(self, chunk_s: float, chunks_left: int) -> bool:
            return False

        def apply(self, grads: list, ok: bool, rate: Any, pos: int, samples: int = 0, fraction: float = 1.0) -> int:
            self.rates.append(rate(3 * (pos + 1)))
            return 1

    step_fn, _, params, spec, board, _, _, _ = tiny_worker(quota=10)
    sched = LRSchedule(SchedConfig(name="cosine"), 1.0, 10_000)
    board.control["go_at"] = time.monotonic() - 50.0  # half of a 100 s budget spent: 30 steps made, 60 to come
    up = ThreeStepsABatch()
    run_loop(step_fn, up, params, spec, Channels(board), Recipe(sched, None, 100.0))
    assert 0.4 < up.rates[-1] < 0.6, up.rates[-1]  # read from the batches (10 in half the time), it would be 0
