"""What a leader reports while it trains: TensorBoard curves, test evaluations and the
progress display. Only rank 0 writes; the others call no-ops."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from torch import nn

from hogwild.config.plan import Plan
from hogwild.config.schema import Config
from hogwild.replica.board import Board
from hogwild.replica.build import Replica
from hogwild.replica.lr_schedule import LRSchedule
from hogwild.replica.task import evaluate
from hogwild.report.metrics import Metrics, Progress
from hogwild.sync.rounds import RoundStats

logger = logging.getLogger(__name__)

Scores = Callable[[dict[str, float], float, float], None]

# Points per curve: spread over the run's steps (workers wake the leader at each one), so a
# run of one second draws a curve too; at least one loss point a second on long runs.
LOSS_POINTS = 100


@dataclass(frozen=True)
class Hooks:
    """What the conductor hands the telemetry of its evaluations."""

    on_batch: Callable[[], None] = lambda: None
    """Called at each batch: a long evaluation is progress of the leader's loop (elastic liveness)."""
    subject: Optional[Callable[[], nn.Module]] = None
    """The model an evaluation during training reads (the conductor's still copy under a target);
    None: the live one."""
    on_scores: Scores = lambda scores, worker_steps, elapsed_s: None
    """Told each evaluation during training: its scores, one worker's mean steps, the seconds
    trained (the conductor decides whether they end the run)."""


class Telemetry:
    def __init__(self, cfg: Config, run_dir: Path, is_rank0: bool, rep: Replica, hooks: Hooks = Hooks()) -> None:
        """``rep``: the replica whose model is evaluated on its test split, on its device."""
        self.cfg, self.run_dir, self.is_rank0 = cfg, run_dir, is_rank0
        self.model, self.test, self.device, self.task = rep.model, rep.ds.test, rep.flat.device, rep.task
        self.on_batch, self.on_scores = hooks.on_batch, hooks.on_scores
        self.subject = hooks.subject or (lambda: self.model)
        self._final_scored = False  # score_final scored the final model as it stands
        self.metrics = Metrics(run_dir, is_rank0)
        self.scores: dict[str, float] = {m: math.nan for m in rep.task.metrics}
        """The last test evaluation: every metric the task reports."""
        self._t0 = time.monotonic()
        self._next_tb = self._next_eval = self._eval_ok_at = self._t0
        self._tb_pos = self._eval_pos = self._initial = 0.0
        self._loss_every = self._eval_every = 1.0
        self._eval_pending = False  # its step came, but its cost budget has not
        self.eval_s = 0.0
        """Seconds the evaluations during training took (eval.max_fraction bounds their share)."""
        self.history: list[dict[str, float]] = []
        """Every evaluation during training: ``s`` (seconds of training when it began), ``step`` and
        the task's scores, so a loss-against-time curve needs no TensorBoard reader."""
        self._eval_cost = 0.0  # the last evaluation's seconds: what the next one is expected to take
        self.progress: Optional[Progress] = None
        self.lr: Optional[LRSchedule] = None
        self._per_step = 1

    def warm_up(self, step: int) -> None:
        """The accuracy before training, during startup: the first evaluation's one-off costs
        then never count against the evaluation budget while workers train."""
        if self.is_rank0:
            t0 = time.monotonic()
            self.evaluate(step)
            self._eval_cost = time.monotonic() - t0

    def start(self, board: Board, total_steps: int, plan: Plan) -> None:
        """Training starts now: clocks, curves and the progress display count from here.
        ``total_steps``: the replica's batches; the ``plan`` says how many make one optimizer step
        (the learning-rate schedule counts steps) and how often to evaluate."""
        self._t0 = self._next_tb = self._next_eval = self._eval_ok_at = time.monotonic()
        initial = board.replica_pos()
        self._initial = initial
        self._tb_pos, self._eval_pos = initial, initial + 1
        self._loss_every = max(1.0, (total_steps - initial) / LOSS_POINTS)
        self._eval_every = plan.eval_every(total_steps - initial)
        self._next_eval = self._t0 + self.cfg.eval.every_s
        self._eval_ok_at = self._budget_allows()
        self.progress = Progress(total_steps, self.cfg.train.log_every_s, self.is_rank0, int(initial))
        self._per_step = plan.batches_per_step
        self.lr = LRSchedule(self.cfg.sched, self.cfg.optim.lr, plan.schedule_steps(total_steps))  # as the workers
        board.control["next_report_at"] = initial
        t = self.cfg.train
        # The planned steps end the run at the latest (train.max_time may end it sooner), so a warm-up
        # longer than them is never finished either way: said now, and not again at the end.
        ends = f"train.max_steps={t.max_steps}" if t.max_steps is not None else f"train.epochs={t.epochs}"
        self._warn(self.lr.unfinished_warmup(self.lr.total, ends))

    def ends_now(self, board: Board, ends: str) -> None:
        """``ends`` (a key) stops the run at the replica's step now: a warning if its warm-up is not over."""
        # A run whose planned steps end inside the warm-up was told so at the start: not again.
        if self.lr is not None and self.lr.unfinished_warmup(self.lr.total, ends) is None:
            self._warn(self.lr.unfinished_warmup(int(board.replica_pos()) // self._per_step, ends))

    def _warn(self, msg: Optional[str]) -> None:
        if msg and self.is_rank0:
            logger.warning(msg)

    def next_due(self) -> float:
        """The time of the next sample that no worker will wake the leader for."""
        if not self.is_rank0:
            return self._next_tb
        due = max(self._next_eval, self._eval_ok_at)
        return min(self._next_tb, due, self._eval_ok_at if self._eval_pending else math.inf)

    @property
    def test_loss(self) -> float:
        return self.scores["loss"]

    def evaluate(self, step: int, model: Optional[nn.Module] = None, subset: bool = False) -> None:
        """Test scores of ``model`` (the live one unless given), logged at ``step``; ``subset``: at
        most ``eval.max_batches`` batches (the evaluations during training)."""
        limit = self.cfg.eval.max_batches if subset else None
        self.scores = evaluate(model or self.model, self.test, self.device, self.task, self.cfg.eval.batch_size,
                               on_batch=self.on_batch, max_batches=limit)
        self._log_scores(step)

    def evaluate_final(self, step: int) -> None:
        """The final model's scores, logged at ``step``: evaluated here unless the check of the
        final model already scored it as it stands."""
        if self._final_scored:
            self._log_scores(step)
        else:
            self.evaluate(step)

    def _log_scores(self, step: int) -> None:
        for name, value in self.scores.items():
            self.metrics.scalar(f"test/{name}", value, step)

    def round(self, stats: Optional[RoundStats]) -> None:
        """A sync round's figures (sync/rounds.py measures them; only this class writes)."""
        if stats is None:
            return
        if stats.seconds:  # the final gather's record carries no round of its own
            self.metrics.scalar("sync/seconds", stats.seconds, stats.step)
            self.metrics.scalar("sync/bytes_sent", stats.link.sent, stats.step)
            self.metrics.scalar("sync/bytes_received", stats.link.received, stats.step)
            self.metrics.scalar("sync/link_s", stats.link.seconds, stats.step)
        if stats.steps_between is not None:
            self.metrics.scalar("sync/steps_between", stats.steps_between, stats.step)
        rec = stats.drift
        if rec is not None:
            self.metrics.scalar("sync/drift_mean", rec.mean, stats.step)
            self.metrics.scalar("sync/drift_max", rec.max, stats.step)
            if self.cfg.sync.target_drift is not None:
                self.metrics.scalar("sync/interval", rec.interval, stats.step)

    def tick(self, board: Board, base_steps: int, syncs: int) -> None:
        now = time.monotonic()
        elapsed = max(now - self._t0, 1e-9)
        pos = board.replica_pos()
        step, loss, rate = base_steps + board.applied(), board.loss(), board.samples() / elapsed
        if pos >= self._tb_pos or now >= self._next_tb:
            self._tb_pos, self._next_tb = self._grid_after(pos, self._loss_every), now + 1.0
            if math.isfinite(loss):
                self.metrics.scalar("train/loss", loss, step)
            self.metrics.scalar("perf/samples_per_s", rate, step)
            if self.lr is not None:
                self.metrics.scalar("train/lr", self.lr.lr_at(int(pos) // self._per_step), step)
            self.metrics.scalar("sync/lag_wait_s", float(board.stats["lag_wait_s"].sum()), step)
            for i, row in enumerate(board.stats):
                self.metrics.scalar(f"perf/samples_per_s_worker{i}", float(row["samples"]) / elapsed, step)
        self._eval_pending = self.is_rank0 and pos >= self._eval_pos
        # Both the step grid and the clock wait for the cost budget (see _budget_allows).
        if self.is_rank0 and (self._eval_pending or now >= self._next_eval) and now >= self._eval_ok_at:
            t0 = time.monotonic()
            self.evaluate(step, self.subject(), subset=True)
            self.history.append({"s": t0 - self._t0, "step": step, **self.scores})
            self._eval_cost = time.monotonic() - t0
            self.eval_s += self._eval_cost
            self._eval_pos, self._next_eval = self._grid_after(pos, self._eval_every), t0 + self.cfg.eval.every_s
            self._eval_ok_at = self._budget_allows()
            self._eval_pending = False
            self.on_scores(self.scores, (pos - self._initial) / len(board.stats), time.monotonic() - self._t0)
        # Workers wake the leader when the replica crosses this position; a point already
        # passed would wake nobody, so a pending evaluation waits on next_due() instead.
        eval_at = self._eval_pos if self.is_rank0 and not self._eval_pending else math.inf
        board.control["next_report_at"] = min(self._tb_pos, eval_at)
        if self.progress is not None:
            head = self.task.headline
            self.progress.update(int(pos), f"loss {loss:.4f} | {rate:,.0f} samples/s"
                                 f" | test {head} {self.scores[head]:.4f} | syncs {syncs}")

    def _budget_allows(self) -> float:
        """When the next evaluation fits the budget: the evaluations so far plus one more (expected
        to take as long as the last) within ``eval.max_fraction`` of the training time. Waiting only
        after an evaluation still let a slow first one take most of a short run."""
        return self._t0 + (self.eval_s + self._eval_cost) / self.cfg.eval.max_fraction

    def _grid_after(self, pos: float, every: float) -> float:
        """The next point of a fixed grid of positions: a leader woken late does not push
        every later point back, so the run gets its planned number of points."""
        return self._initial + (math.floor((pos - self._initial) / every) + 1) * every

    def score_final(self) -> dict[str, float]:
        """Evaluate the final model (workers stopped, final round made) on the whole test split;
        the final report reuses these scores unless :meth:`rescore` says the model changed."""
        self.scores = evaluate(self.model, self.test, self.device, self.task, self.cfg.eval.batch_size,
                               on_batch=self.on_batch)
        self._final_scored = True
        return self.scores

    def rescore(self) -> None:
        """The model changed after :meth:`score_final` (a judged copy was handed back)."""
        self._final_scored = False

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()
