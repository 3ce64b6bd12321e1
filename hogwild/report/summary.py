"""The run's final report (``metrics.json``) and the status and exit code it ends with."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Optional

from hogwild.checkpoint.resume import Restored
from hogwild.errors import EXIT_FAILED, EXIT_FAULT, EXIT_OK, EXIT_SIGINT, EXIT_SIGTERM, EXIT_WRITE, first_line
from hogwild.replica.board import Counts
from hogwild.replica.task import Task
from hogwild.report.metrics import write_json
from hogwild.sync.rounds import SyncStats
from hogwild.sync.schedule import SyncSchedule

class Status(str, Enum):
    """How a run ended, and the exit code that says so (docs/faults.md): the one map from
    outcome to code, for the leader, ``metrics.json``, the API and the CLI. A ``str`` so that
    ``metrics.json`` and ``result.status == "ok"`` read it as the plain word."""

    OK = "ok"
    SIGINT = "SIGINT"
    SIGTERM = "SIGTERM"
    FAILED = "failed"
    TRAINING_FAILED = "training_failed"
    WRITE_FAILED = "write_failed"

    def __str__(self) -> str:
        return self.value

    @property
    def exit_code(self) -> int:
        return {Status.OK: EXIT_OK, Status.SIGINT: EXIT_SIGINT, Status.SIGTERM: EXIT_SIGTERM, Status.FAILED: EXIT_FAULT,
                Status.TRAINING_FAILED: EXIT_FAILED, Status.WRITE_FAILED: EXIT_WRITE}[self]

    @classmethod
    def of(cls, stop_signal: Optional[int], fault: Optional[str], fault_code: int = EXIT_FAULT) -> "Status":
        """A signal first (the user stopped it), then the first fault by its code, else ok."""
        if stop_signal is not None:
            return cls(signal.Signals(stop_signal).name)
        if fault is None:
            return cls.OK
        return next((s for s in cls if s is not cls.OK and s.exit_code == fault_code), cls.FAILED)


@dataclass
class RunResult:
    """How a leader's run ended. ``metrics`` is what ``metrics.json`` holds, on the one leader that
    writes it (rank 0, or the elastic writer); None elsewhere and when nothing trained."""

    status: Status
    """ok | SIGINT | SIGTERM | failed | training_failed | write_failed"""
    exit_code: int
    error: Optional[str] = None
    run_dir: Optional[Path] = None
    metrics: Optional[dict[str, Any]] = None
    peer_lost: bool = False
    """A collective to a lost peer may still be pending in Gloo/NCCL: the process must exit at
    once rather than tear the interpreter down (which would abort instead of exiting 3)."""

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK

    @property
    def checkpoint(self) -> Optional[Path]:
        """The run's last checkpoint (``checkpoints/last.pt``), if it wrote one."""
        last = self.run_dir / "checkpoints" / "last.pt" if self.run_dir else None
        return last if last is not None and last.is_file() else None


def write_report(path: Path, result: dict[str, Any]) -> None:
    """``metrics.json``, tried twice; if the disk still refuses, ``result`` says so (exit 5)."""
    for attempt in (1, 2):
        try:
            write_json(path, result)
            return
        except OSError as e:
            if attempt == 2:
                why = f"metrics.json: could not write {path}: {first_line(e)}"
                earlier = result.get("error")
                result.update(status=Status.WRITE_FAILED, exit_code=Status.WRITE_FAILED.exit_code,
                              error=f"{earlier}; and {why}" if earlier else why)


@dataclass
class Timing:
    wall_s: float
    train_s: float
    startup_s: Optional[float]
    time_to_target_s: Optional[float]
    worker_steps_to_target: Optional[float] = None
    eval_s: float = 0.0
    max_time_reached: bool = False
    """Seconds of the rank-0 leader's evaluations during training (eval.max_fraction bounds them)."""


def worker_time(job: Counts, workers: int, train_s: float) -> dict[str, float]:
    """metrics.json's ``time_s.workers``: where all workers' seconds of training went, summed over
    every replica. ``steps`` splits into reading data, forward and backward, applying the update
    and waiting at the barrier, and ``other_in_steps`` (the gradient checks, clipping, the board);
    ``round_wait`` is time stopped for a round (sync.max_lag); ``outside_steps`` is the rest of
    ``workers x train_s`` (start-up after go, respawns, the end). ``cpu_in_steps`` below ``steps``
    less the waits is time the worker was ready to run and did not: a core shared with others."""
    named = job.data_s + job.compute_s + job.update_s + job.wait_s
    return {"train": train_s * workers, "steps": job.step_s, "data": job.data_s, "forward_backward": job.compute_s,
            "update": job.update_s, "barrier_wait": job.wait_s, "other_in_steps": max(0.0, job.step_s - named),
            "round_wait": job.lag_wait_s, "outside_steps": max(0.0, train_s * workers - job.step_s - job.lag_wait_s),
            "cpu_in_steps": job.cpu_s}


@dataclass
class RunSummary:
    """Everything ``metrics.json`` reports, as the writer gathered it at the end of a run."""

    status: Status
    error: Optional[str]
    counters: Counts
    """The lineage's counts, restored ones included."""
    job: Counts
    """This attempt's counts over every replica."""
    task: Task
    scores: dict[str, float]
    train_loss: float
    timing: Timing
    sync: SyncStats
    workers: int
    threads: int
    replicas: int
    sync_mode: str
    schedule: SyncSchedule
    resumed: Optional[Restored]
    run_dir: Path
    update: Optional[dict[str, Any]] = None
    """How gradients reached the model (:func:`hogwild.leader.core.update_report`)."""

    def metrics(self) -> dict[str, Any]:
        """The flat object ``metrics.json`` holds (keys documented in docs/outputs.md); a
        value that does not exist is None, which the file writes as null."""
        result: dict[str, Any] = {
            "status": self.status,
            "exit_code": self.status.exit_code,
            "task": self.task.kind,
            **{f"test_{name}": value for name, value in self.scores.items()},
            **{f"baseline_{name}": value for name, value in self.task.baseline.items()},
            "train_loss": self.train_loss,
            "steps": self.counters.steps,
            "samples": int(self.counters.samples),
            "batch_parts": int(self.job.batch_parts),
            "samples_per_s": self.job.samples / max(self.timing.train_s, 1e-9),
            "wall_s": self.timing.wall_s,
            "train_s": self.timing.train_s,
            "time_to_target_s": self.timing.time_to_target_s,
            "worker_steps_to_target": self.timing.worker_steps_to_target,
            "startup_s": self.timing.startup_s,
            "eval_s": self.timing.eval_s,
            "eval_fraction": self.timing.eval_s / max(self.timing.train_s, 1e-9),
            "max_time_reached": self.timing.max_time_reached,
            "workers": self.workers,
            "threads_per_worker": self.threads,
            "replicas": self.replicas,
            "syncs": self.counters.syncs,
            "max_drift": self.schedule.max_drift,
            "mean_drift": self.schedule.mean_drift,
            "mean_sync_s": self.sync.mean_sync_s,
            "steps_per_sync": self.sync.steps_per_sync,
            "max_steps_per_sync": self.sync.max_steps_per_sync,
            "steps_per_sync_per_replica": self.sync.steps_per_sync_by_replica,
            "sync_bytes_sent": self.sync.link.sent,
            "sync_bytes_received": self.sync.link.received,
            "sync_bytes_per_step": self.sync.link.sent * self.replicas / max(self.job.steps, 1),
            "sync_link_s": self.sync.link.seconds,
            "sync_cpu_s": self.sync.cpu_s,
            "peak_memory_mb": max((m for m in self.sync.peak_memory_mb if m is not None), default=None),
            "peak_memory_mb_per_replica": self.sync.peak_memory_mb,
            "replica_final_state": self.sync.final_state,
            "lag_wait_s": self.job.lag_wait_s,
            **(self.update or {}),
            "barrier_wait_s": self.job.wait_s,
            "barrier_wait_fraction": self.job.wait_s / max(self.job.step_s, 1e-9),
            "worker_stall_s": self.job.stall_s(),
            "worker_restarts": self.counters.worker_restarts,
            "skipped_nonfinite": self.counters.skipped_nonfinite,
            "sync_mode": self.sync_mode if self.replicas > 1 else "none",
            "final_interval": self.schedule.interval,
            "resumed_from": self.resumed.path if self.resumed else "",
            "steps_lost_on_resume": self.resumed.steps_lost if self.resumed else None,
            "run_dir": str(self.run_dir.resolve()),
        }
        if self.task.kind == "classification":
            result["chance_accuracy"] = self.task.baseline["accuracy"]
        if self.error:
            result["error"] = self.error
        return result
