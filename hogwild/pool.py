"""The leader's worker pool: spawn, watch, respawn and stop Hogwild workers.

Nothing here blocks forever (DESIGN rule 10): the leader sleeps in
``multiprocessing.connection.wait`` on the workers' sentinels and the wake pipe with a
timeout, so a dead worker wakes it at once and an idle leader costs no core.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from multiprocessing.connection import wait
from typing import Any, Optional

from torch import Tensor

from hogwild.config import Config
from hogwild.data import Dataset
from hogwild.worker import DONE, GO, READY, STOP, WorkerSpec, worker_main

logger = logging.getLogger(__name__)


class WorkerPool:
    def __init__(self, cfg: Config, specs: list[WorkerSpec], ds: Dataset, flat: Tensor,
                 opt_state: Optional[dict[str, Tensor]], stats: Tensor, control: Tensor) -> None:
        # fork would copy autograd's and CUDA's threads into a broken child (DESIGN rule 5).
        self._ctx = mp.get_context("spawn")
        self.cfg, self.specs, self.ds, self.flat = cfg, specs, ds, flat
        self.opt_state, self.stats, self.control = opt_state, stats, control
        self._wake_r, self._wake_w = self._ctx.Pipe(duplex=False)
        self.procs: list[Any] = [None] * len(specs)
        self.restarts = 0

    def _spawn(self, i: int) -> None:
        p = self._ctx.Process(
            target=worker_main, name=f"hogwild-worker-{self.specs[i].global_index}", daemon=True,
            args=(self.cfg, self.specs[i], self.ds, self.flat, self.opt_state, self.stats,
                  self.control, self._wake_w))
        p.start()
        self.procs[i] = p

    def start(self) -> None:
        for i in range(len(self.specs)):
            self._spawn(i)

    def wait(self, timeout: float) -> None:
        """Sleep until a worker wakes us, dies, or ``timeout`` passes; drain the pipe."""
        live = [p.sentinel for p in self.procs if p is not None and p.exitcode is None]
        for obj in wait([self._wake_r, *live], timeout=max(0.0, timeout)):
            if obj is self._wake_r:
                while self._wake_r.poll():
                    self._wake_r.recv_bytes()

    def wait_ready(self, timeout: float) -> None:
        """Block until every worker has built its model and shard, or fail naming the wait."""
        deadline = time.monotonic() + timeout
        while not (self.stats.numpy()[:, READY] > 0).all():
            dead = [p for p in self.procs if p is not None and p.exitcode is not None]
            if dead:
                raise RuntimeError(f"worker {dead[0].name} exited with code {dead[0].exitcode} "
                                   f"before training started")
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not ready after {timeout:.0f}s")
            self.wait(0.1)

    def go(self) -> None:
        self.control.numpy()[GO] = 1.0

    def all_done(self) -> bool:
        return bool((self.stats.numpy()[:, DONE] > 0).all())

    def check(self, max_restarts: int) -> Optional[str]:
        """Respawn dead workers on their own shard; a message once the bound is passed."""
        stats = self.stats.numpy()
        for i, p in enumerate(self.procs):
            if p is None or p.exitcode is None or stats[i, DONE] > 0 or self.control.numpy()[STOP]:
                continue
            if self.restarts >= max_restarts:
                return (f"worker {self.specs[i].global_index} died (exit code {p.exitcode}) and "
                        f"fault.max_worker_restarts={max_restarts} respawns are used up")
            self.restarts += 1
            logger.warning("worker %d died (exit code %s); respawning on the same shard "
                           "(restart %d of %d)", self.specs[i].global_index, p.exitcode,
                           self.restarts, max_restarts)
            self._spawn(i)
        return None

    def stop(self, timeout: float) -> None:
        """Ask workers to stop, then terminate, then kill: never more than ~timeout + 2 s."""
        self.control.numpy()[STOP] = 1.0
        deadline = time.monotonic() + timeout
        for p in self.procs:
            if p is not None:
                p.join(max(0.0, deadline - time.monotonic()))
        for sig_name in ("terminate", "kill"):
            alive = [p for p in self.procs if p is not None and p.is_alive()]
            if not alive:
                break
            logger.warning("%s %d worker(s) that did not stop in time", sig_name, len(alive))
            for p in alive:
                getattr(p, sig_name)()
            for p in alive:
                p.join(1.0)
        self._wake_r.close()
        self._wake_w.close()

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p is not None and p.pid is not None]
