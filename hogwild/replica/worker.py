"""The Hogwild worker: read a batch of its own shard, compute a gradient privately, and
write the update straight into the shared parameters, in place, without a lock.

Workers talk to their leader only through the shared board (replica/board.py) and one pipe used
to wake the leader; they never import the leader.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Callable, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from hogwild.config.plan import Plan
from hogwild.config.schema import Config
from hogwild.data.datasets import Dataset, ShardSampler, shard
from hogwild.data.mapped import MapSplit, Prefetcher
from hogwild.data.streams import StreamReader, StreamRecords, StreamSplit
from hogwild import logs
from hogwild.errors import escaped, first_line, save_traceback, say
from hogwild.replica.board import Board
from hogwild.replica.compiled import compile_model, warm_up_in_training_mode
from hogwild.replica import faults
from hogwild.replica.lr_schedule import LRSchedule, projected_length
from hogwild.replica.bound import build_bound
from hogwild.replica.meeting import Meeting
from hogwild.replica.optim import (FlatOptimizer, Optimizer, bind_views, clip_grad_norm, grads_finite, make_optimizer,
                                   row_tables, state_numel, state_views, torch_optimizer)
from hogwild.replica.rows import RowMarks
from hogwild.replica.shared import param_slots
from hogwild.replica.pacing import WHOLE, make_pacer
from hogwild.replica.update import BarrierUpdate, HogwildUpdate, Seat, Signals, Updater
from hogwild.replica.start import adopt_environment, leader_watch
from hogwild.config.train import StepConfig
from hogwild.replica.step import Computed, Step, StepFn, batch_len, batch_slice, make_step, to_device
from hogwild.replica.task import make_loss, task_kind

logger = logging.getLogger(__name__)

WORKER_NICENESS = 5

# Which user call a worker is in, for the one line when that code fails, leaves with SystemExit or
# raises KeyboardInterrupt (one process per worker: a module global is this worker's own).
_phase = ["the step"]
DATA, FORWARD = "data: reading a training batch", "model, loss, step: the forward pass and loss"
OPTIM, SCHED = "optim: the optimizer's step", "sched: the learning-rate schedule"
# Whose an exception is (replica/blame.py). Reading and collating a batch and a built-in schedule's
# formula are thin glue around the user's data and sched.* values: what fails there is the user's.
# A phase stays set after its call returns, and hogwild's own code runs on in it (the gradient
# checks after the forward, the bookkeeping after the optimizer's step): there only what is raised
# outside hogwild's files is the user's.
_USER_ANYWHERE, _USER_OUTSIDE = (DATA, SCHED), (FORWARD, OPTIM)
# Seconds this worker's steps spent reading batches and in forward and backward (module-global
# for the same reason as _phase); run_loop moves them onto the board, where metrics.json's time_s
# reads them. Two clock reads a phase: cheap beside any batch.
_spent = {"data": 0.0, "compute": 0.0}


@dataclass(frozen=True)
class WorkerSpec:
    local_index: int
    """Index among this replica's workers (its stats row)."""
    global_index: int
    """Index among all workers of all replicas: picks the shard and the seed offset."""
    num_global: int
    threads: int
    quota: int
    """Batches this worker processes in the whole run."""
    plan: Plan
    """The choices the config made for this replica (config/plan.py), as its leader built them."""
    replica_quota: int = 0
    """Batches all workers of this replica process: the length of the learning-rate schedule."""
    leader_pid: int = 0
    """The leader's process id (a worker's parent may be the fork server)."""
    compile: str = "off"
    """The torch.compile mode of this worker's model (train.compile, resolved by the leader)."""
    niceness: int = WORKER_NICENESS
    """How much lower than the leader's this worker's priority is: 0 for a replica that meets no other."""


@dataclass(frozen=True)
class ReplicaShared:
    """What a worker shares with its replica besides the data: the model's flat buffer and the
    pieces the update path and the data need (each None where the run has none)."""

    flat: Tensor
    opt_state: Optional[dict[str, Tensor]] = None
    """The replica's one optimizer state (optim.state=shared, or the barrier's); None: the worker's own."""
    marks: Optional[RowMarks] = None
    """Row-sparse rounds: the rows this replica's workers touched."""
    meeting: Optional[Meeting] = None
    """The barrier's meeting (optim.update=barrier)."""
    streams: Optional[StreamRecords] = None
    """A training stream's shared positions."""


@dataclass(frozen=True)
class Channels:
    """How a worker and its leader reach each other: the board, and the pipes (None: not there)."""

    board: Board
    wake: Optional[Connection] = None
    """The worker wakes its leader (ready, a sync point passed, done, its one line before it dies)."""
    kick: Optional[Connection] = None
    """The leader wakes workers waiting at the lag bound or at the barrier."""
    life: Optional[Connection] = None
    """Its end closes when the leader dies: a worker never outlives it."""
    notices: Optional[Connection] = None
    """The barrier's notices to the chair."""


@dataclass(frozen=True)
class Recipe:
    """How the loop turns gradients into updates, beyond the updater: the rate's schedule, the
    clipping norm, the time budget the schedule may be cut to, and batches per update."""

    sched: Optional[LRSchedule] = None
    clip: Optional[float] = None
    time_budget_s: Optional[float] = None
    accumulate: int = 1


def worker_main(cfg: Config, spec: WorkerSpec, ds: Dataset, shared: ReplicaShared, channels: Channels,
                environ: Optional[dict[str, str]] = None) -> None:
    """A spawned worker. An exception ends it with one line and its traceback in a file of the
    run directory (the leader then respawns it or stops the run): a bug every respawn hits is
    reported once, not a traceback per death."""
    if environ is not None:
        adopt_environment(environ)
    faults.install()  # a test's fault plan for this worker, from its leader's environment
    board, wake = channels.board, channels.wake
    try:
        _work(cfg, spec, ds, shared, channels)
    except (SystemExit, KeyboardInterrupt) as e:
        from hogwild.replica.blame import USER_EXIT, context, tell_leader

        # The user's code (a dataset item, a forward, a loss) left: workers ignore SIGINT and
        # SIGTERM and never call sys.exit, so this ends a worker that did not finish, never as 0.
        # Its line goes to the leader, which stops the run with exit 2: a respawn would meet it again.
        where = context(e, spec.global_index, int(board.row(spec.local_index)["pos"]))
        tell_leader(wake, spec.local_index, f"{escaped(e, _phase[0])}{where}")
        os._exit(USER_EXIT)
    # BaseException: a user's own subclass of it (not an Exception) ended a worker with a Python traceback
    # and a respawn, and the run could end with exit 0.
    except BaseException as e:  # noqa: BLE001 - the worker's one exit for what nobody expected
        from hogwild.replica.blame import USER_EXIT, context, tell_leader, user_failure

        run_dir = board.path.parent.parent if board.path is not None else None
        path = save_traceback(e, run_dir)
        line = user_failure(e, _phase[0], _USER_ANYWHERE, _USER_OUTSIDE)
        if line is not None:
            # The user's code failed (an item that raises, a forward that breaks at step 30): the same
            # batch fails the same way in every respawn, so the leader stops the run now, with exit 2
            # and this one line, instead of respawning fault.max_worker_restarts times first.
            where = context(e, spec.global_index, int(board.row(spec.local_index)["pos"]))
            tell_leader(wake, spec.local_index, f"{line}{where}; the traceback is in {path}")
            os._exit(USER_EXIT)
        # say(): a stderr on a full disk loses the line; the leader still sees the death.
        say(f"hogwild: worker {spec.global_index}: {type(e).__name__}: {first_line(e)} (traceback in {path})")
        os._exit(1)  # a worker never runs the interpreter's teardown with shared tensors half-written


def _work(cfg: Config, spec: WorkerSpec, ds: Dataset, shared: ReplicaShared, channels: Channels) -> None:
    # Oversubscribed intra-op threads make Hogwild slower than one process (design rule 4
    # in docs/design.md).
    torch.set_num_threads(spec.threads)
    # Lower priority than the leader: its short sync bursts then preempt workers at once
    # instead of queueing behind them for a scheduler tick on a fully loaded machine. A replica
    # that meets no other has no bursts, and niced workers lost to any other busy process on the
    # machine: a core shared with one left a niced worker a quarter of it (BENCHMARKS.md §19).
    if spec.niceness:
        os.nice(spec.niceness)
    # The leader owns Ctrl-C and SIGTERM and stops workers through the control block (killing
    # them only past fault.shutdown_timeout_s). A SIGTERM to the whole process group (timeout,
    # scancel) must not kill them mid-step: the leader would see deaths during its clean stop.
    # A worker whose leader is gone leaves on its own (leader_watch).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logs.setup(worker=spec.global_index)
    torch.manual_seed(cfg.train.seed + spec.global_index)

    flat, board = shared.flat, channels.board
    model = build_bound(cfg.model, ds, cfg.train.seed, flat)  # no private copy of the values first
    compile_model(model, spec.compile)  # in place: the parameters stay the shared views
    params = list(model.parameters())
    alive = leader_watch(channels.life)
    updater = make_updater(cfg, spec, shared, model, channels, lambda: bool(board.control["stop"]) or not alive())
    sampler: Union[ShardSampler, StreamReader]
    if isinstance(ds.train, StreamSplit):  # its own part of the stream, from its position (data/streams.py)
        sampler = StreamReader(ds.train, spec.global_index, spec.num_global, cfg.train.batch_size, shared.streams,
                               spec.local_index)
    else:
        sampler = ShardSampler(shard(len(ds.train), spec.num_global, spec.global_index, cfg.train.seed),
                               cfg.train.batch_size, cfg.train.seed + spec.global_index)
    step = make_step(cfg.step, cfg.loss, make_loss(cfg.loss, task_kind(cfg, ds)), model)
    step_fn = make_step_fn(model, ds, sampler, flat.device, step, cfg.data.loader_workers,
                           bf16=cfg.train.precision == "bf16")
    step_fn = faults.planned().step(step_fn, params, spec.global_index, spec.leader_pid)
    sched = LRSchedule(cfg.sched, cfg.optim.lr, spec.plan.schedule_steps(spec.replica_quota or spec.quota))
    # One throw-away forward/backward: the allocator's and autograd's first-call costs land
    # in startup (reported as such), not in the first training steps.
    # eval: a training-mode forward would move BatchNorm's shared running statistics; a compiled
    # model without them warms up its training graph instead (replica/compiled.py).
    model.train(warm_up_in_training_mode(model, spec.compile))
    # A worker resumed with its quota done warms up on its last batch: a stream read past its
    # quota would begin an epoch that is never trained (and metrics.json's stream_epochs say so).
    step_fn(max(0, min(int(board.row(spec.local_index)["pos"]), spec.quota - 1)))
    model.train()
    run_loop(step_fn, updater, params, spec, channels,
             Recipe(sched, cfg.optim.clip_grad_norm, cfg.train.max_time, cfg.train.accumulate), shared.marks)


def make_updater(cfg: Config, spec: WorkerSpec, shared: ReplicaShared, model: torch.nn.Module, channels: Channels,
                 stopping: Callable[[], bool]) -> Updater:
    """How this worker's gradients reach ``model`` (replica/update.py): under the barrier, its
    meeting with the others, and the direct writes of a sparse table's rows; else its own optimizer
    (the model's embedding tables keep a row-wise state under ``optim.rowwise``)."""
    flat, opt_state, meeting = shared.flat, shared.opt_state, shared.meeting
    params, slots, tables = list(model.parameters()), param_slots(model), row_tables(model)
    if opt_state is None:
        opt_state = FlatOptimizer.new_state(cfg.optim, state_numel(cfg.optim, flat.numel(), tables),
                                            lambda n: torch.zeros(n, device=flat.device))
    if not spec.plan.barrier:
        return HogwildUpdate(make_optimizer(cfg.optim, flat, slots, params, opt_state, tables), params,
                             spec.plan.batches_per_step)
    assert meeting is not None  # the barrier's replica holds one (replica/build.py)
    direct: Optional[Optimizer] = None
    sparse = meeting.tables
    if sparse:  # the rows of sparse tables are written directly, with the replica's one state
        if cfg.optim._target_:
            direct = torch_optimizer(cfg.optim, [params[i] for i in sparse])
            probe, views = state_views(cfg.optim, params, slots, opt_state)
            bind_views(direct.opt, [params[i] for i in sparse], [probe[i] for i in sparse], [views[i] for i in sparse])
        else:  # every worker writes rows of the one state: racing, as optim.state=shared under hogwild
            direct = FlatOptimizer(cfg.optim, flat, slots, opt_state, racing=True)
    pacer = make_pacer(cfg.pace, model, cfg.train.batch_size, meeting.workers, bool(sparse))
    return BarrierUpdate(cfg.optim, Seat(meeting, spec.local_index, flat, opt_state), params,
                         Signals(stopping, channels.notices, channels.kick), pacer, direct)


def make_step_fn(model: torch.nn.Module, ds: Dataset, sampler: Union[ShardSampler, StreamReader],
                 device: torch.device, step: Optional[Step] = None, loader_workers: int = 0,
                 bf16: bool = False) -> StepFn:
    """One step's loss and gradient under the step contract (replica/step.py; the default: a
    plain ``model(*inputs)`` and cross-entropy); ``bf16``: the forward and the loss under bf16
    autocast, with float32 weights and gradients (the shared buffer never holds anything else)."""
    read: Callable[[int], tuple[Any, Optional[Tensor]]]
    if isinstance(sampler, StreamReader):
        read = sampler.batch
    elif loader_workers and isinstance(ds.train, MapSplit):
        read = Prefetcher(ds.train, sampler, loader_workers).batch
    else:
        shard_sampler = sampler
        read = lambda index: ds.train.batch(shard_sampler.batch(index))  # noqa: E731
    step = step or Step(StepConfig(), F.cross_entropy, model)

    part: list[Any] = [None, None, None, 0]
    """The batch being computed in parts (pace.balance, pace.chunks): its index, inputs, labels, and where the
    next part starts. Read once: a stream's batch cannot be read twice."""

    def step_fn(index: int, share: float = 1.0, summed: bool = False) -> Computed:
        """Adds the gradient of batch ``index``, or of its next ``share`` (replica/faults.py's
        StepFn), into each ``.grad`` (the updater has set them)."""
        _phase[0] = DATA
        t0 = time.perf_counter()
        if part[0] == index:
            inputs, y, start = part[1], part[2], part[3]
        else:
            (inputs, y), start = read(index), 0
        whole = batch_len(inputs, y)
        end = min(whole, start + max(1, round(share * whole)))
        part[:] = [index, inputs, y, end] if end < whole else [None, None, None, 0]
        if end - start < whole:
            inputs, y = batch_slice(inputs, y, start, end)
        inputs, y = to_device(inputs, y, device, non_blocking=True)
        t1 = time.perf_counter()
        _phase[0] = FORWARD
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = step.run(model, inputs, y)
        (loss.float() * (end - start) if summed else loss.float()).backward()
        _spent["data"] += t1 - t0
        _spent["compute"] += time.perf_counter() - t1
        return Computed(loss, end - start, whole - end, whole)
    return step_fn


def in_chunks(step_fn: StepFn, index: int, chunks: int, hand_in: Callable[[float, int], bool],
              params: list[Tensor]) -> Computed:
    """Batch ``index`` (or its rest) in chunks of a ``chunks``-th of it, until it is done or
    ``hand_in(seconds a chunk, chunks left)`` says to hand in what is done (pace.chunks): one
    Computed over the chunks computed, each ``.grad`` the mean over their samples, as if they were
    one batch."""
    done: list[Computed] = []
    t0 = time.perf_counter()
    while True:
        done.append(step_fn(index, 1.0 / chunks, summed=True))
        left, took = done[-1].left, done[-1].samples
        if left == 0 or hand_in((time.perf_counter() - t0) / len(done), math.ceil(left / max(took, 1))):
            break
    samples = sum(c.samples for c in done)
    torch._foreach_mul_([p.grad for p in params if p.grad is not None], 1.0 / max(samples, 1))
    loss = sum(c.loss.detach().float() * c.samples for c in done) / max(samples, 1)
    return Computed(loss, samples, done[-1].left, done[-1].whole)


def wait_for_round(stats: np.ndarray, ctrl: np.void, kick: Connection,
                   leader_alive: Callable[[], bool]) -> float:
    """Block, without spinning, while this replica is ``sync.max_lag`` steps past a round that
    has not completed (the leader moves ``lag_limit`` and writes to ``kick`` after each round).
    Returns the seconds waited. Nothing here can block for longer than a poll: no lock is
    shared with the leader, so a leader that dies at any moment leaves nothing held (design
    rule 10)."""
    t0 = time.perf_counter()
    while stats["pos"].sum() >= ctrl["lag_limit"] and not ctrl["stop"] and leader_alive():
        try:
            if kick.poll(0.1):
                while kick.poll():  # drained: a kick only says "look again"
                    kick.recv_bytes()
        except EOFError:
            break  # its writer, the leader, is gone
    return time.perf_counter() - t0


def schedule_length(pos: int, ctrl: np.void, total: int, time_budget_s: Optional[float]) -> int:
    """The replica's run length in steps for its learning-rate schedule: the planned ``total``, or
    under ``train.max_time`` the steps the budget will allow at the pace so far (``pos`` steps made),
    if fewer, so a schedule ends when the run does. Steps stay steps: warm-up is unchanged, and a torch
    scheduler (its own length) is never stepped ahead."""
    if time_budget_s is None:
        return total
    return projected_length(pos, (time.monotonic() - float(ctrl["go_at"])) / time_budget_s, total)


def _rate(recipe: Recipe, ctrl: np.void) -> Optional[Callable[[int], float]]:
    """The learning rate of the replica's optimizer step ``t``: every worker of a replica uses one
    rate at one step, however many there are (None: the optimizer keeps its own)."""
    sched = recipe.sched
    if sched is None:
        return None

    def rate(t: int) -> float:
        caller, _phase[0] = _phase[0], SCHED
        # Under a time budget the length is projected from the steps made so far, not the batches
        # read: a step of the barrier may hold fewer batches than planned (a late worker's gradient,
        # a batch in parts), and the schedule must still end when the run does.
        lr = sched.lr_at(t, schedule_length(t, ctrl, sched.total, recipe.time_budget_s))
        _phase[0] = caller
        return lr
    return rate


def _gradient(step_fn: StepFn, updater: Updater, params: list[Tensor], step: int, n: int,
              clip: Optional[float]) -> tuple[list[Computed], list[Optional[Tensor]], float, bool]:
    """The gradient of batch ``step`` (or its next part), or the mean of ``n`` accumulated batches,
    in each ``.grad``: its parts, the gradients, its loss, and whether it is finite (clipped when it is)."""
    # A batch may be cut (pace.balance, pace.chunks); accumulated batches are always whole.
    split = updater.split() if n == 1 else WHOLE
    if split.chunks > 1:
        parts = [in_chunks(step_fn, step, split.chunks, updater.hand_in, params)]
    else:
        parts = [step_fn(step + i, split.share) for i in range(n)]
    grads = [p.grad for p in params]
    if n > 1:
        torch._foreach_mul_([g for g in grads if g is not None], 1.0 / n)  # the mean, as one batch n times larger
    lval = sum(float(c.loss.detach()) for c in parts) / n
    ok = bool(np.isfinite(lval)) and grads_finite(grads)
    if ok and clip is not None:
        clip_grad_norm(grads, clip)
    return parts, grads, lval, ok


def _wait_for_go(ctrl: np.void, leader_alive: Callable[[], bool]) -> bool:
    """Replicas start together once every worker everywhere is up (spawn takes seconds); False
    when the leader is gone first."""
    while not ctrl["go"] and not ctrl["stop"]:
        if not leader_alive():
            return False
        time.sleep(0.005)
    return True


class _Tally:
    """One step's account on the worker's board row: the clocks read before it, added after."""

    def __init__(self, updater: Updater, syncing: bool) -> None:
        self.syncing, self.t0, self.cpu0 = syncing, time.perf_counter(), time.process_time()
        self.waited, self.data0, self.compute0 = updater.wait_s, _spent["data"], _spent["compute"]

    def add(self, row: np.void, updater: Updater, samples: int) -> None:
        dt = time.perf_counter() - self.t0
        row["samples"] += samples
        row["step_s"] += dt
        row["wait_s"] += updater.wait_s - self.waited
        row["data_s"] += _spent["data"] - self.data0
        row["compute_s"] += _spent["compute"] - self.compute0
        row["cpu_s"] += time.process_time() - self.cpu0
        if self.syncing:
            row["sync_s"] += dt
            row["sync_steps"] += 1


def run_loop(step_fn: StepFn, updater: Updater, params: list[Tensor], spec: WorkerSpec, channels: Channels,
             recipe: Recipe = Recipe(), marks: Optional[RowMarks] = None) -> None:
    """The worker's steps until its quota is done or the run stops (or its leader is gone): each
    reads a batch, computes its gradient and applies it through ``updater``, and the board counts it."""
    board, wake, kick = channels.board, channels.wake, channels.kick
    stats, ctrl = board.stats, board.control
    row = stats[spec.local_index]
    leader_alive = leader_watch(channels.life)
    rate = _rate(recipe, ctrl)
    updater.ready()
    row["ready"] = 1.0
    if wake is not None:
        wake.send_bytes(b"r")
    if not _wait_for_go(ctrl, leader_alive):
        return
    # Read after "go": a respawned worker resumes where its predecessor stopped, a joining replica where a peer says.
    step = int(row["pos"])
    reached = 1  # of the batch being computed: 1 so far every part reached the model, 0 one did not count, -1 poisoned
    while step < spec.quota and not ctrl["stop"]:
        if not leader_alive():  # leader gone (kill -9): never outlive it
            return
        if kick is not None and stats["pos"].sum() >= ctrl["lag_limit"]:
            row["lag_wait_s"] += wait_for_round(stats, ctrl, kick, leader_alive)
            continue  # stop may have been set while waiting
        tally = _Tally(updater, bool(ctrl["syncing"]))
        if not updater.begin():
            break  # the run stops while a step is applied
        # train.accumulate batches make one update; the last of a quota that does not divide may be short.
        n = min(recipe.accumulate, spec.quota - step)
        parts, grads, lval, ok = _gradient(step_fn, updater, params, step, n, recipe.clip)
        batch, whole = sum(c.samples for c in parts), sum(c.whole for c in parts)
        _phase[0] = OPTIM
        # A poisoned update never reaches the shared model (under the barrier it arrives to say so).
        t_apply, waited_before_apply = time.perf_counter(), updater.wait_s
        got = updater.apply(grads, ok, rate, int(stats["pos"].sum()), batch, batch / whole)
        row["update_s"] += time.perf_counter() - t_apply - (updater.wait_s - waited_before_apply)
        if ok and not got:  # the run stopped at the meeting: the batch never reached the model, so a resume reads it
            break
        if ok:
            if marks is not None:  # after the write: a round that misses the stamp still sees the row
                marks.mark(grads, int(ctrl["row_epoch"]))
            row["loss"] = lval if row["loss"] <= 0 else 0.98 * float(row["loss"]) + 0.02 * lval
        # A batch in parts counts once, with its last part: applied if every part was, else skipped.
        reached = min(reached, got if ok else -1)
        if parts[-1].left:  # its position moves with its last part: a checkpoint never skips the rest
            row["parts"] += 1
        else:
            row["skipped"] += int(reached < 0)
            row["applied"] += max(reached, 0)
            reached, step = 1, step + n
        row["pos"] = step
        tally.add(row, updater, batch)
        target = min(ctrl["next_sync_at"], ctrl["next_report_at"])
        if wake is not None and ctrl["notified"] < target <= stats["pos"].sum():
            ctrl["notified"] = target
            wake.send_bytes(b"s")
    updater.finish()
    row["done"] = 1.0
    if wake is not None:
        wake.send_bytes(b"d")
