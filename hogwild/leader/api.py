"""The conductor's interface to its group of replicas, and the two records it shares with it.

The leader (core.py) runs one replica and meets the others in sync rounds. *How* it meets them
is a :class:`Group`, handed to it: a torchrun group that never changes (torchrun.py), or an
elastic group that re-forms around lost and returning replicas (elastic.py), which also hands the
leader its :class:`Changes` (the rounds' re-forming, the job's counts while members come and go).
Both read and update the replica through :class:`Crew`, the one record of everything the leader
built, and report trouble through :class:`Control`. Neither side touches the other's private state.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

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


class Changes:
    """What a group whose members change adds (elastic.py's :class:`~hogwild.leader.elastic.Rejoins`),
    handed to the leader beside its :class:`Group`. A group of fixed members (torchrun.py) has none,
    and the leader uses this class itself, whose every method is what a fixed group means: nothing
    to report, nothing to re-form, the members' counts are the job's."""

    def progress(self, rounds: Optional[int] = None, steps: Optional[int] = None) -> None:
        """The leader is alive: its main loop turned (``rounds``, ``steps``: how far it is), or its
        main thread is busy but moving (a batch of a long evaluation; no figures)."""

    def before_round(self) -> bool:
        """Before each round: whether this member asks the group to re-form after it."""
        return False

    def reform(self) -> None:  # every leader calls it after the same round
        pass

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


class Group(ABC):
    """How this replica meets the others: what every group provides. The leader calls, in
    order: :meth:`connect` and :meth:`restore` while it builds the replica, :meth:`start` once all
    is built and before the workers run, :meth:`positions` for each checkpoint, and :meth:`close`
    always. What a group whose members change adds is a :class:`Changes`, handed to the leader
    beside it."""

    env: DistEnv
    """Where this leader sits: torchrun's rank, or the elastic slot among ``sync.replicas``."""

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
    def start(self, crew: Crew) -> None:
        """Before the workers run, with everything the leader built: every member here, the
        replica at the group's state."""

    def positions(self, crew: Crew) -> torch.Tensor:
        """Every replica's data positions, in rank order (collective in a torchrun group)."""
        return torch.stack(crew.comm.all_gather(torch.from_numpy(crew.board.stats["pos"].copy()))).cpu()

    @abstractmethod
    def close(self, degraded: bool) -> None:
        """Leave the group and let go of what it holds (the run_dir lock)."""
