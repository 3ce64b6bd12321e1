"""The leader's worker pool: spawn, watch, respawn and stop Hogwild workers.

Nothing here blocks forever (design rule 10 in docs/design.md): the leader sleeps in
``multiprocessing.connection.wait`` on the workers' sentinels and the wake pipe with a
timeout, so a dead worker wakes it at once and an idle leader costs no core.
"""

from __future__ import annotations

import logging
import os
import time
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Optional

from hogwild.config.env import DistEnv
from hogwild.config.plan import Plan
from hogwild.config.schema import Config
from hogwild.data.datasets import shard
from hogwild.data.streams import StreamSplit
from hogwild.errors import ConfigError, Fault
from hogwild.replica.blame import USER_EXIT, read_notice
from hogwild.replica.board import Board
from hogwild.replica.build import Replica
from hogwild.replica.meeting import STEPS_KEY, Chair
from hogwild.replica.pacing import make_pacer
from hogwild.replica.resources import available_cores
from hogwild.replica.start import environment, worker_context
from hogwild.replica.worker import WORKER_NICENESS, ReplicaShared, Channels, WorkerSpec, worker_main

logger = logging.getLogger(__name__)

# A stream trained by train.max_time: a quota no run reaches (step counters are 64-bit floats on the
# board, exact to 2**53).
UNBOUNDED = 2**52


def worker_specs(cfg: Config, env: DistEnv, plan: Plan, train: Any, compile_mode: str = "off") -> list[WorkerSpec]:
    """This replica's workers: global shard index, thread budget and batch quota of each, the
    ``plan`` they follow and the torch.compile mode they use."""
    k = plan.workers
    num_global = k * env.world_size
    threads = max(1, available_cores() // (k * env.local_world_size))
    stream = isinstance(train, StreamSplit)
    if stream:
        check_stream_length(cfg, train, num_global)
    quotas = []
    for i in range(k):
        if cfg.train.max_steps is not None:
            quotas.append(cfg.train.max_steps // k + (1 if i < cfg.train.max_steps % k else 0))
        elif stream:
            quotas.append(UNBOUNDED)  # a stream has no length: train.max_time ends the run
        else:
            n_shard = len(shard(len(train), num_global, env.rank * k + i, cfg.train.seed))
            quotas.append(cfg.train.epochs * -(-n_shard // min(cfg.train.batch_size, n_shard)))
    nice = WORKER_NICENESS if env.distributed else 0  # only a replica that meets others has sync bursts
    return [WorkerSpec(i, env.rank * k + i, num_global, threads, q, plan, sum(quotas), os.getpid(), compile_mode,
                       nice) for i, q in enumerate(quotas)]


def check_stream_length(cfg: Config, train: StreamSplit, num_global: int) -> None:
    """One batch per worker at least: a shorter stream leaves some worker's part empty (it would
    fail in that worker, after the others started)."""
    need = cfg.train.batch_size * num_global
    held = train.read_head(need)
    if held < need:
        raise ConfigError(f"data: the training stream holds {held} samples, fewer than one batch per worker "
                          f"(train.batch_size={cfg.train.batch_size} x {num_global} workers = {need})")


class WorkerPool:
    def __init__(self, cfg: Config, specs: list[WorkerSpec], rep: Replica, board: Board) -> None:
        # Never plain fork: it would copy autograd's and CUDA's threads into a broken child
        # (design rule 5); a fork server that has only imported torch is safe (replica/start.py).
        self._ctx = worker_context(cfg)  # its server preloads the config's target modules
        self.cfg, self.specs, self.rep, self.board = cfg, specs, rep, board
        # Workers past sync.max_lag wait on their kick pipe; the leader writes to each after every
        # round. No lock is shared: a leader killed while it held a Condition's lock (notifying
        # after a round) left workers blocked forever re-acquiring it (design rule 10).
        self._kicks: list[Optional[tuple[Connection, Connection]]] = [None] * len(specs)
        self._wake_r, self._wake_w = self._ctx.Pipe(duplex=False)
        # Only this process holds _life_w: workers see its end-of-file once the leader is gone
        # (replica/start.py, leader_watch).
        self._life_r, self._life_w = self._ctx.Pipe(duplex=False)
        self.procs: list[Any] = [None] * len(specs)
        self.restarts = 0
        self._said: dict[int, str] = {}
        """The line of each worker that the user's code ended (replica/blame.py), by worker index."""
        # optim.update=barrier with several workers: the thread that closes their steps, and the pipe
        # on which they tell it they arrived or finished a shard (replica/meeting.py).
        self.chair: Optional[Chair] = None
        self._notices: Optional[tuple[Connection, Connection]] = None
        if rep.plan.barrier and rep.plan.workers > 1:
            assert rep.opt_state is not None and rep.meeting is not None
            self._notices = self._ctx.Pipe(duplex=False)
            pacer = make_pacer(cfg.pace)
            self.chair = Chair(rep.meeting, pacer, rep.opt_state[STEPS_KEY], self.release, *self._notices)

    def _spawn(self, i: int) -> None:
        self._close_kick(i)  # a respawn gets a fresh pipe: its predecessor's may hold stale kicks
        kick_r, kick_w = self._ctx.Pipe(duplex=False)
        os.set_blocking(kick_w.fileno(), False)  # a kick is never worth waiting for
        self._kicks[i] = (kick_r, kick_w)
        p = self._ctx.Process(
            # Not daemonic: a worker may start DataLoader processes (data.loader_workers). Workers
            # still never outlive the leader: they leave their loop when it is gone, and stop()
            # ends them on every exit path.
            target=worker_main, name=f"hogwild-worker-{self.specs[i].global_index}", daemon=False,
            args=(self.cfg, self.specs[i], self.rep.ds,
                  ReplicaShared(self.rep.flat, self.rep.opt_state, self.rep.marks, self.rep.meeting, self.rep.streams),
                  Channels(self.board, self._wake_w, kick_r, self._life_r, self._notices[1] if self._notices else None),
                  environment()))
        p.start()
        self.procs[i] = p

    def start(self) -> None:
        if self.chair is not None:
            self.chair.start()
        for i in range(len(self.specs)):
            self._spawn(i)

    def wait(self, timeout: float) -> None:
        """Sleep until a worker wakes us, dies, or ``timeout`` passes; drain the pipe."""
        live = [p.sentinel for p in self.procs if p is not None and p.exitcode is None]
        for obj in wait([self._wake_r, *live], timeout=max(0.0, timeout)):
            if obj is self._wake_r:
                self._drain()

    def _drain(self) -> None:
        """Read the wake pipe: a wake-up only says "look again"; a notice is a worker's line."""
        while self._wake_r.poll():
            said = read_notice(self._wake_r.recv_bytes())
            if said is not None:
                self._said.setdefault(*said)

    def wait_ready(self, timeout: float, max_restarts: int, stopping: Callable[[], bool]) -> bool:
        """Block until every worker has built its model and shard; a worker that dies on the
        way is respawned like any other. False if ``stopping()`` turned true first."""
        deadline = time.monotonic() + timeout
        while not self.board.all_ready():
            if stopping():
                return False
            msg = self.check(max_restarts)
            if msg:
                raise Fault(f"{msg}, before training started")
            if time.monotonic() > deadline:
                raise Fault(f"workers not ready after {timeout:.0f}s (fault.startup_timeout_s)")
            self.wait(0.1)
        return True

    def go(self, at: float) -> None:
        """Training starts; ``at`` (``time.monotonic()``, one clock for every process of the
        machine) is when, for schedules that follow a time budget."""
        self.board.control["go_at"] = at
        self.board.control["go"] = 1.0

    def check(self, max_restarts: int, stopping: bool = False) -> Optional[str]:
        """Respawn dead workers on their own shard; a message once the bound is passed. None
        once the leader is ``stopping`` (a signal or a fault): a stop respawns nobody. A worker that
        the user's code ended raises :class:`ConfigError` with its line (exit 2)."""
        stats, stopping = self.board.stats, stopping or bool(self.board.control["stop"])
        for i, p in enumerate(self.procs):
            if p is None or p.exitcode is None or stats[i]["done"] > 0 or stopping:
                continue
            if p.exitcode == USER_EXIT:
                self._drain()  # its notice was written before it exited: it is in the pipe now
            if p.exitcode == USER_EXIT and i in self._said:
                # The user's code failed in it (an item, a forward, a loss, a step): a respawn meets the
                # same batch and fails the same way, so the run stops now with exit 2 and the worker's one
                # line, and the checkpoints written so far stay as they are.
                raise ConfigError(self._said[i])
            if self.restarts >= max_restarts:
                return (f"worker {self.specs[i].global_index} died (exit code {p.exitcode}) and "
                        f"fault.max_worker_restarts={max_restarts} respawns are used up")
            self.restarts += 1
            logger.warning("worker %d died (exit code %s); respawning on the same shard "
                           "(restart %d of %d)", self.specs[i].global_index, p.exitcode,
                           self.restarts, max_restarts)
            self._forget(i)
            self._spawn(i)
        return None

    def _forget(self, i: int) -> None:
        """A dead worker's place in the meeting: no step waits for it, and its successor starts clean."""
        if self.chair is not None:
            self.chair.gone(i)
        elif self.rep.plan.barrier:  # a replica of one worker on the barrier: no chair, it closed its own steps
            assert self.rep.meeting is not None
            self.rep.meeting.forget_alone()

    def release(self) -> None:
        """Wake workers waiting for a round: the lag limit moved, or they must stop."""
        for kick in self._kicks:
            if kick is not None:
                try:
                    kick[1].send_bytes(b"k")
                except OSError:  # full (the worker has kicks pending anyway), or the worker is gone
                    pass

    def _close_kick(self, i: int) -> None:
        kick, self._kicks[i] = self._kicks[i], None
        for conn in kick or ():
            conn.close()

    def kill(self) -> None:
        for p in self.procs:
            if p is not None and p.is_alive():
                p.kill()

    def stop(self, timeout: float, alive: Callable[[], None] = lambda: None) -> None:
        """Ask workers to stop, then terminate, then kill: never more than ~timeout + 2 s.
        ``alive`` is called while it waits: a worker that just finished its quota may take
        seconds to exit on a loaded machine, and the leader is not stuck meanwhile."""
        self.board.control["stop"] = 1.0
        self.release()
        if self.chair is not None:
            self.chair.stop()  # before the pipes it kicks close
        deadline = time.monotonic() + timeout
        for p in self.procs:
            while p is not None and p.is_alive() and time.monotonic() < deadline:
                alive()
                p.join(min(0.2, max(0.0, deadline - time.monotonic())))
        for sig_name in ("terminate", "kill"):
            alive = [p for p in self.procs if p is not None and p.is_alive()]
            if not alive:
                break
            logger.warning("%s %d worker(s) that did not stop in time", sig_name, len(alive))
            for p in alive:
                getattr(p, sig_name)()
            for p in alive:
                p.join(1.0)
        for conn in (self._wake_r, self._wake_w, self._life_r, self._life_w, *(self._notices or ())):
            conn.close()
        for i in range(len(self._kicks)):
            self._close_kick(i)
