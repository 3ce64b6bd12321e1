"""The conductor's interface to its group of replicas, and what it shares with it.

The leader (core.py) runs one replica and meets the others in sync rounds. *How* it meets them
is the one :class:`Group` it is handed: a torchrun group that never changes (torchrun.py), or an
elastic group that re-forms around lost and returning replicas (elastic.py). What a group whose
members change adds (re-forming between rounds, the job's counts while members come and go) are
methods of the same interface whose defaults mean a group of fixed members. A group sees the
replica only through :class:`Here`, and changes it only by healing it (its ``state_dict`` and
``load_state_dict``); both sides report trouble through :class:`Control`.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from hogwild.checkpoint.resume import Restored
from hogwild.checkpoint.saver import Saver
from hogwild.config.env import DistEnv
from hogwild.config.schema import Config
from hogwild.errors import EXIT_FAULT
from hogwild.leader.stopping import Stopper
from hogwild.leader.target import Target
from hogwild.replica.board import Board, Counts
from hogwild.replica.build import Replica
from hogwild.replica.meeting import STEPS_KEY
from hogwild.replica.pool import WorkerPool
from hogwild.replica.worker import WorkerSpec
from hogwild.report.summary import RunResult
from hogwild.report.telemetry import Telemetry
from hogwild.sync.comm import Comm, PeerLost
from hogwild.sync.rounds import Rounds
from hogwild.sync.rules import SyncRule
from hogwild.sync.schedule import SyncSchedule

logger = logging.getLogger(__name__)


class Control:
    """How the run is going: a signal, the first fault (and its exit code), whether a peer is
    gone for good, and when the next periodic checkpoint is due."""

    def __init__(self) -> None:
        self.stopper = Stopper()
        self.fault: Optional[str] = None
        self.fault_code = EXIT_FAULT
        self.degraded = False
        """A peer is gone and the group could not re-form: no more collectives."""
        self.next_ckpt = 0.0

    @property
    def signalled(self) -> bool:
        return self.stopper.signal is not None

    @property
    def stopping(self) -> bool:
        return self.signalled or self.fault is not None

    def fail(self, msg: str, code: int = EXIT_FAULT, degraded: bool = False) -> None:
        """The first fault wins: later ones are consequences of it. ``degraded``: a peer is gone
        and the group could not re-form, so no collective may run any more."""
        self.degraded = self.degraded or degraded
        if self.fault is None:
            self.fault, self.fault_code = msg, code
            logger.error("stopping: %s", msg)

    def why(self, msg: str) -> None:
        """Why the run ends, where that is no fault (a signal during start-up)."""
        self.fault = msg

    def checkpoint_in(self, seconds: float) -> None:
        self.next_ckpt = time.monotonic() + seconds


@dataclass
class Crew:
    """Everything the leader builds for its replica, built in one place (Leader._setup)."""

    cfg: Config
    env: DistEnv
    run_dir: Path
    workers: int
    rep: Replica
    comm: Comm
    rule: SyncRule
    board: Board
    schedule: SyncSchedule
    restored: Optional[Restored]
    base: Counts
    """The lineage's counters before this process: restored, or received when healed."""
    saver: Saver
    specs: list[WorkerSpec]
    tel: Telemetry
    rounds: Rounds
    pool: WorkerPool
    target: Target

    def step(self) -> int:
        """The lineage's step count now (TensorBoard's x axis)."""
        return self.base.steps + self.board.applied()

    def scalar(self, tag: str, value: float) -> None:
        """A TensorBoard scalar at the lineage's step now (written by the TensorBoard writer only)."""
        self.tel.metrics.scalar(tag, value, self.step())

    def adopt_counters(self, base: Counts) -> None:
        """The lineage's counters before this process, received from the peer it healed from."""
        self.base = base
        self.board.set_base_steps(base.steps)


class Here:
    """The replica as its group sees it, built by the leader over its :class:`Crew`: what the group
    reads (how far the replica is, its data positions, its counters) and the one way it changes
    it, a heal: :meth:`state_dict` on the replica that sends, :meth:`load_state_dict` on the one
    that receives, as torchft's Manager heals through the state functions a trainer registers."""

    def __init__(self, crew: Crew) -> None:
        self._crew = crew

    @property
    def workers(self) -> int:
        return self._crew.workers

    @property
    def run_dir(self) -> Path:
        return self._crew.run_dir

    @property
    def syncs(self) -> int:
        """Sync rounds this replica's lineage applied."""
        return self._crew.rounds.syncs

    @property
    def steps(self) -> int:
        """The lineage's steps before this process (restored, or received when healed)."""
        return self._crew.base.steps

    @property
    def has_view(self) -> bool:
        """The checkpoints know every replica's positions (from a gather, or the restore point)."""
        return self._crew.saver.has_view

    def positions(self) -> np.ndarray:
        """Each of this replica's workers' data position, in batches (a copy)."""
        return self._crew.board.stats["pos"].astype(np.float64)

    def totals(self) -> Counts:
        """This process's counters so far (respawned workers' included)."""
        return self._crew.board.totals(self._crew.pool.restarts)

    def scalar(self, tag: str, value: float) -> None:
        self._crew.scalar(tag, value)

    def optimizer_steps(self) -> Optional[int]:
        """The replica's one optimizer state's step, where it keeps one (the barrier)."""
        steps = (self._crew.rep.opt_state or {}).get(STEPS_KEY)
        return int(steps[0]) if steps is not None else None

    def state_dict(self) -> dict[str, Any]:
        """What a heal sends: the model, the optimizer state, the sync rule's state, the lineage,
        its counters and the rounds it applied. The tensors are the live ones: send, then drop."""
        crew = self._crew
        return {"flat": crew.rep.flat, "opt": crew.rep.opt_state or {}, "sync": crew.rule.state_dict(),
                "counters": crew.base.lineage(), "syncs": crew.rounds.syncs, "lineage": crew.saver.lineage}

    def load_state_dict(self, state: dict[str, Any], counters: bool = True) -> None:
        """Take another replica's :meth:`state_dict`, before or between rounds (no worker writes
        the model while the leader is in a round or has not started them). ``counters``: its
        lineage's counters too, for a replica that goes on from there (a joiner); a live member
        a round behind keeps its own."""
        crew = self._crew
        crew.saver.adopt(str(state["lineage"]))
        with torch.no_grad():
            crew.rep.flat.copy_(state["flat"])
            for name, buf in (crew.rep.opt_state or {}).items():
                buf.copy_(state["opt"][name])
        crew.rule.load_state_dict(state["sync"])
        if counters:
            crew.adopt_counters(Counts.from_dict(state["counters"]))
        crew.rounds.adopt(int(state["syncs"]))

    def resume_at(self, positions: np.ndarray) -> None:
        """The workers, not started yet, read on from ``positions`` (a batch count each)."""
        self._crew.board.set_positions(positions)

    def rebase(self) -> None:
        """The healed model is the one the next round's drift and schedule count from."""
        self._crew.rounds.rebase()


class Group(ABC):
    """How this replica meets the others: the one interface the leader is handed. It calls, in
    order: :meth:`connect` and :meth:`restore` while it builds the replica, :meth:`start` once all
    is built and before the workers run, :meth:`positions` for each checkpoint, and :meth:`close`
    always. The methods after :meth:`close` are what a group whose members change adds; their
    defaults are what a group of fixed members means: nothing to report, nothing to re-form, the
    members' counts are the job's."""

    env: DistEnv
    """Where this leader sits: torchrun's rank, or the elastic slot among ``elastic.replicas``."""

    @abstractmethod
    def connect(self, cfg: Config, run_dir: Path, rep: Replica) -> tuple[Comm, Path]:
        """Join the group: its communicator, and the run_dir every member agreed on."""

    @abstractmethod
    def restore(self, cfg: Config, run_dir: Path, rep: Replica, board: Board, rule: SyncRule,
                previous: Optional[tuple[float, float]]) -> Optional[Restored]:
        """Load the checkpoint ``cfg.resume`` names into the replica, if any."""

    @property
    @abstractmethod
    def writer(self) -> bool:
        """This leader writes checkpoints and metrics.json now."""

    @abstractmethod
    def start(self, here: Here) -> None:
        """Before the workers run, with the replica built: every member here, the replica at the
        group's state."""

    @abstractmethod
    def positions(self, here: Here) -> torch.Tensor:
        """Every replica's data positions, in rank order (collective)."""

    @abstractmethod
    def close(self, degraded: bool) -> None:
        """Leave the group and let go of what it holds (the run_dir lock)."""

    # ------------------------------------------- what a group whose members change adds
    def progress(self, rounds: Optional[int] = None, steps: Optional[int] = None) -> None:
        """The leader is alive: its main loop turned (``rounds``, ``steps``: how far it is), or its
        main thread is busy but moving (a batch of a long evaluation; no figures)."""

    def before_round(self) -> bool:
        """Before each round: whether this member asks the group to re-form after it."""
        return False

    def reform(self) -> None:
        """After the round that asked for it; every leader calls it after the same round."""

    def recover(self, e: PeerLost) -> Optional[str]:
        """A collective failed: None if the group re-formed and training goes on, else why not."""
        return f"{e}; keeping the last periodic checkpoint"

    def own(self, totals: Counts) -> Counts:
        """This replica's counters as the job sees them."""
        return totals

    def job(self, members: Counts) -> Counts:
        """The job's counters, from the sum of the group members' :meth:`own`."""
        return members

    def may_write(self, alone: bool = False) -> bool:
        """Checked before each checkpoint the writer writes after a collective, or ``alone``:
        without one (between rounds)."""
        return True

    def finish(self, result: RunResult) -> RunResult:
        return result

    def report(self) -> dict[str, Any]:
        """Extra keys of metrics.json."""
        return {}
