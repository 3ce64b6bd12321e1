"""The torchrun group: the ranks torchrun started, fixed for the whole run. Rank 0 writes.

A lost peer cannot be replaced here: the survivors stop, rank 0 keeps its own replica's
checkpoint, and torchrun's ``--max-restarts`` restarts the job, which resumes from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import torch

from hogwild import logs
from hogwild.checkpoint.resume import Restored, resume
from hogwild.config.env import DistEnv
from hogwild.config.schema import Config
from hogwild.files import RunDirLock
from hogwild.leader.api import Group, Here
from hogwild.replica.board import Board
from hogwild.replica.build import Replica
from hogwild.sync.comm import Comm
from hogwild.sync.group import destroy_group, join_torchrun_group
from hogwild.sync.rules import SyncRule


class TorchrunGroup(Group):
    def __init__(self, env: Optional[DistEnv] = None, stopped: Callable[[], bool] = lambda: False) -> None:
        self.env = env or DistEnv.from_env()
        self.stopped = stopped  # a signal arrived: the rendezvous stops waiting for peers
        self.lock: Optional[RunDirLock] = None
        self.comm: Optional[Comm] = None
        self.timeout_s = 0.0  # sync.timeout_s, from connect() on

    @property
    def writer(self) -> bool:
        return self.env.rank == 0

    def connect(self, cfg: Config, run_dir: Path, rep: Replica) -> tuple[Comm, Path]:
        """The group, the agreed run_dir, and its one writer's lock (design rule 17)."""
        sc = cfg.sync
        if self.env.world_size > 1:
            logs.stamp(replica=self.env.rank)
        self.timeout_s = sc.timeout_s
        self.comm, run_dir = join_torchrun_group(self.env, sc, cfg.device, run_dir,
                                                 rep.plan.workers, rep.flat.device, self.stopped)
        if self.writer:
            self.lock = RunDirLock(run_dir)
            self.lock.acquire()
        return self.comm, run_dir

    def restore(self, cfg: Config, run_dir: Path, rep: Replica, board: Board, rule: SyncRule,
                previous: Optional[tuple[float, float]]) -> Optional[Restored]:
        assert self.comm is not None
        return resume(cfg, run_dir, rep, board, rule, self.comm, previous)

    def start(self, here: Here) -> None:
        assert self.comm is not None
        self.comm.all_reduce(torch.zeros(1), self.timeout_s, "the start barrier")

    def positions(self, here: Here) -> torch.Tensor:
        assert self.comm is not None
        return torch.stack(self.comm.all_gather(torch.from_numpy(here.positions()))).cpu()

    def close(self, degraded: bool) -> None:
        if not degraded:  # a collective to the lost peer may still be pending: leave the group be
            destroy_group()
        if self.lock is not None:
            self.lock.release()
