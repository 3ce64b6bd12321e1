"""The leader: one per replica. Builds the shared model, runs its Hogwild workers, and meets
the other replicas through the :class:`~hogwild.leader.api.Group` it is handed. Flow: config ->
shared model + data -> workers (replica/pool.py) | sync rounds (sync/rounds.py) -> metrics.

A *sync round* is the leaders' only meeting point. Every leader enters round k when its
replica has made ``sync.interval`` more steps since round k-1 (sync/schedule.py), when its
workers are done, or when it must stop. The round's control flags (done, stop, checkpoint,
healthy) travel with it, so every leader takes the same decision in the same round: nobody
waits in a collective that the others will never enter.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from omegaconf import OmegaConf

from hogwild.checkpoint import store as checkpoint
from hogwild.checkpoint.health import loss_bar
from hogwild.checkpoint.saver import Record, Saver
from hogwild.config.env import DistEnv
from hogwild.config.plan import Plan
from hogwild.config.schema import Config
from hogwild.errors import EXIT_FAILED, StopNow
from hogwild.leader.api import Control, Crew, Group, Here
from hogwild.leader.faults import faulty_comm
from hogwild.leader.target import Target
from hogwild.replica import resources
from hogwild.replica.board import Board, Counts, previous_attempt
from hogwild.replica.build import build_replica, replica_device
from hogwild.replica.lr_schedule import check_schedule
from hogwild.replica.meeting import STEPS_KEY
from hogwild.replica.models import model_id
from hogwild.replica.pool import WorkerPool, worker_specs
from hogwild.replica.resources import resolve_workers
from hogwild.replica.shared import held_bytes
from hogwild.report.memory import PeakMemory
from hogwild.report.metrics import flatten, strict
from hogwild.report.rundir import record_config, set_aside_earlier_run
from hogwild.report.summary import RunResult, RunSummary, Status, Timing, worker_time, write_report
from hogwild.report.telemetry import Hooks, Telemetry
from hogwild.report.verdict import Verdict, judge
from hogwild.sync.comm import PeerLost
from hogwild.sync.rounds import RoundFlags, Rounds, SyncStats
from hogwild.sync.rules import make_rule
from hogwild.sync.schedule import SyncSchedule

logger = logging.getLogger(__name__)

# A due checkpoint waits this share of checkpoint.every_s for a round to carry it: a round's
# checkpoint holds every replica's exact positions and totals, one written between rounds only
# this replica's (the others' as last gathered).
LOCAL_GRACE = 0.25


class Leader:
    def __init__(self, cfg: Config, run_dir: str, group: Group, ctl: Optional[Control] = None,
                 overrides: Optional[Sequence[str]] = None) -> None:
        self.cfg, self.run_dir, self.overrides = cfg, Path(run_dir), overrides
        self.ctl = ctl or Control()
        self.group = group
        self.env: DistEnv = self.group.env
        self.t_start = time.monotonic()
        self.memory = PeakMemory()
        """This replica's peak memory, sampled from start-up (building the model is a peak of its
        own) to the final checkpoint."""
        self.t_train: Optional[float] = None
        self.cpu_train = 0.0
        """This process's CPU seconds when training began (time_s.leader.cpu counts from there)."""
        self.group_s = 0.0
        """Wall seconds before the rounds on the group's own work (time_s.leader.group)."""
        self.out_of_time = False
        """``train.max_time`` was spent (this replica's clock)."""
        self.here: Optional[Here] = None
        """The replica as the group sees it, from :meth:`_setup` on."""

    # ---------------------------------------------------------------- setup
    def _setup(self) -> Crew:
        """Everything the run needs, built here and nowhere else."""
        cfg, env, group = self.cfg, self.env, self.group
        torch.set_num_threads(1)  # the leader sleeps; the cores belong to the workers
        k = resolve_workers(cfg.workers, env.local_world_size)
        plan = Plan.of(cfg, k)  # the choices the config makes for this replica, made here once
        resources.check(cfg, plan, env.local_world_size)  # before anything is allocated
        device = replica_device(cfg.device, env.local_rank)
        rep = build_replica(cfg, plan, device, env.local_world_size, syncs=env.distributed)
        comm, run_dir = group.connect(cfg, self.run_dir, rep)
        comm = faulty_comm(comm, env.rank)  # as it is, unless a test planned a fault (leader/faults.py)
        self.run_dir = run_dir
        rule = make_rule(cfg.sync, comm, rep.param_numel, rep.marks)
        board_file = run_dir / "progress" / f"rank{env.rank}.board"
        previous = previous_attempt(board_file)  # read before this attempt overwrites it
        board = Board(k, board_file)
        schedule = SyncSchedule.from_config(cfg.sync, env.distributed, plan.batches_per_step)
        restored = group.restore(cfg, run_dir, rep, board, rule, previous)
        base = restored.counters if restored else Counts()
        saver = Saver(run_dir, cfg.checkpoint.keep, restored.lineage if restored else checkpoint.new_lineage(),
                      model_id(cfg.model), restored.path if restored else None)
        if restored is not None and restored.positions is not None:
            # Until the first round gathers them, the other replicas are where the checkpoint left
            # them: a checkpoint written alone before then must not put their shards back to zero.
            saver.gathered(restored.positions, Counts(), Counts())
        specs = worker_specs(cfg, env, plan, rep.ds.train, rep.compile)
        # The schedule's real length: what each worker reads it at.
        check_schedule(cfg.sched, cfg.optim.lr, plan.schedule_steps(specs[0].replica_quota))
        target = Target(cfg.train.target, rep.task, rep.model, rep.flat)
        tel = Telemetry(cfg, run_dir, env.rank == 0, rep, Hooks(self.group.progress, target.subject, target.saw))
        rounds = Rounds(rep.flat, rule, comm, board, schedule, base.syncs)
        pool = WorkerPool(cfg, specs, rep, board)
        crew = Crew(cfg=cfg, env=env, run_dir=run_dir, workers=k, rep=rep, comm=comm, rule=rule, board=board,
                    schedule=schedule, restored=restored, base=base, saver=saver, specs=specs, tel=tel,
                    rounds=rounds, pool=pool, target=target)
        self.here = Here(crew)  # all the group sees of the replica (leader/api.py)
        return crew

    # ---------------------------------------------------------------- rounds
    def _round(self, crew: Crew, done: bool, stop: bool, final: bool = False) -> tuple[bool, bool]:
        ctl, group = self.ctl, self.group
        t0 = time.perf_counter()
        reform = self.group.before_round()
        self.group_s += time.perf_counter() - t0
        # A leader stopped by a signal or a fault may have a dead peer (torchrun SIGTERMs
        # survivors): bound the wait. A job that simply ended is not stopping, and its final round
        # may take as long as any round: a dense 128 MB round needs 11 s at 100 Mbit/s, and a
        # 10 s bound failed such a job at its very end with exit 3.
        bounded = stop and ctl.stopping
        wait_s = min(self.cfg.fault.shutdown_timeout_s, 10.0) if bounded else self.cfg.sync.timeout_s
        out = crew.rounds.run(flags=RoundFlags(done, stop, group.writer and time.monotonic() >= ctl.next_ckpt,
                                               self._reached(crew), reform, final), timeout_s=wait_s)
        crew.tel.round(out.stats)
        crew.pool.release()  # workers waiting at the lag limit may go on
        if out.checkpoint and not final:
            self._checkpoint(crew)
        # A round that ends the job admits nobody: the members go on to their final collectives,
        # which a joiner just healed would never enter. It finds the job finished and leaves.
        if out.reform and not (final or out.all_done or out.any_stop or out.reached):
            self.group.reform()
        return out.all_done or out.reached, out.any_stop

    def _recover(self, e: PeerLost) -> bool:
        """A collective failed: True if the group re-formed and the loop may go on."""
        why = self.group.recover(e)
        if why is None:
            return True
        self.ctl.fail(why, degraded=True)
        return False

    def _checkpoint(self, crew: Crew) -> None:
        """Collective (positions and totals of every replica), written by the writer only, and
        only if the model is good."""
        self._store(crew, *self._gather(crew))

    def _gather(self, crew: Crew) -> tuple[torch.Tensor, Counts]:
        """Every replica's data positions and the job-wide totals (collective)."""
        own = self._own(crew)
        assert self.here is not None
        positions = self.group.positions(self.here)
        job = self.group.job(Counts.from_tensor(crew.comm.all_reduce(own.to_tensor())))
        crew.saver.gathered(positions, job, own)
        return positions, job

    def _store(self, crew: Crew, positions: torch.Tensor, job: Counts, stopped: bool = False) -> None:
        if self.group.may_write():
            self._write(crew, positions, job, stopped)
        else:
            self.ctl.checkpoint_in(self.cfg.checkpoint.every_s)

    def _write(self, crew: Crew, positions: torch.Tensor, job: Counts, stopped: bool = False) -> None:
        self.ctl.checkpoint_in(self.cfg.checkpoint.every_s)
        if self.group.writer:
            counters = crew.base.plus(job, crew.rounds.syncs)
            record = Record(positions, counters, crew.rule.state_dict(), self._config_dict())
            failed = crew.saver.write(crew.rep, record, loss=crew.board.loss(), stopped=stopped, rank=self.env.rank)
            if failed is not None:
                self.ctl.fail(*failed)

    def _write_alone(self, crew: Crew) -> None:
        """A checkpoint of this replica alone, without a collective (see Saver.local_view)."""
        if not self.group.may_write(alone=True):
            self.ctl.checkpoint_in(self.cfg.checkpoint.every_s)
            return
        self._write(crew, *crew.saver.local_view(crew.board, self.env.rank, self.env.world_size, self._own(crew)))

    def _own(self, crew: Crew) -> Counts:  # this replica's counters (elastic mode adds its slot's earlier processes')
        return self.group.own(crew.board.totals(crew.pool.restarts))

    def _config_dict(self) -> dict[str, Any]:
        return OmegaConf.to_container(OmegaConf.structured(self.cfg), resolve=True)  # type: ignore[return-value]

    # ------------------------------------------------------------------ loop
    def _check_faults(self, crew: Crew) -> None:
        msg = crew.pool.check(self.cfg.fault.max_worker_restarts, stopping=self.ctl.stopping)
        if msg:
            self.ctl.fail(msg)
        skipped = crew.board.skipped()
        if skipped > self.cfg.fault.max_nonfinite:  # the model is not training: a failed run
            self.ctl.fail(f"{skipped} non-finite updates skipped, more than fault.max_nonfinite="
                          f"{self.cfg.fault.max_nonfinite}", EXIT_FAILED)

    def _deadline(self) -> float:
        """When ``train.max_time`` is spent (infinity without one)."""
        budget = self.cfg.train.max_time
        return math.inf if budget is None or self.t_train is None else self.t_train + float(budget)

    def _reached(self, crew: Crew) -> bool:
        """This replica asks the job to end: its target was met or its time budget is spent. A
        round passes it on, so every replica stops at the same round."""
        if not self.out_of_time and time.monotonic() >= self._deadline():
            self.out_of_time = True
            logger.info("train.max_time=%gs spent: stopping with a final round and checkpoint",
                        float(self.cfg.train.max_time))
            crew.tel.ends_now(crew.board, f"train.max_time={float(self.cfg.train.max_time):g}s")
        return crew.target.met or self.out_of_time

    def _loop(self, crew: Crew) -> None:
        ctl, group, board, tel = self.ctl, self.group, crew.board, crew.tel
        while True:
            # Sleep until the next thing due (eval, metrics, checkpoint, the time budget's end), a
            # worker's wake-up or death.
            now = time.monotonic()
            due = min(tel.next_due(), ctl.next_ckpt if group.writer else now + 1.0, now + 1.0, self._deadline())
            # A finished replica's workers wake nobody, and its peers' rounds wait for it: asleep
            # here, it held each of their last rounds for the sleep's bound (0.5 s a round, 1-3 s
            # at the end of a 1-second run). Its next round is due at once, and blocks in the
            # collective until they come.
            finished = self.env.distributed and board.all_done()
            crew.pool.wait(0.0 if finished else min(max(due - now, 0.001), 0.5))
            self._check_faults(crew)
            reached = self._reached(crew)
            done = board.all_done()
            stop = ctl.stopping
            if not self.env.distributed:
                if done or stop or reached:
                    return
                if time.monotonic() >= ctl.next_ckpt:
                    self._checkpoint(crew)
            elif done or stop or reached or crew.schedule.due(board.replica_pos()):
                try:
                    all_done, any_stop = self._round(crew, done, stop)
                except PeerLost as e:
                    if self._recover(e):
                        continue
                    return
                if any_stop and not ctl.signalled:
                    ctl.fail("another replica stopped the job")
                if all_done or any_stop:
                    return
            elif group.writer and time.monotonic() >= ctl.next_ckpt + LOCAL_GRACE * self.cfg.checkpoint.every_s:
                # No round brought the due checkpoint (a long interval, a slow peer): write this
                # replica's own, so checkpoint.every_s holds (within the grace) between rounds.
                self._write_alone(crew)
            tel.tick(board, crew.base.steps, crew.rounds.syncs)
            self.group.progress(crew.rounds.syncs, crew.base.steps + int(board.applied()))

    # ------------------------------------------------------------------- run
    def run(self) -> RunResult:
        ctl = self.ctl
        try:
            ctl.stopper.install()  # a SIGTERM during start-up stops it at once
            self.memory.start()
            crew = self._setup()
            if ctl.signalled:  # a signal whose StopNow landed where it could not be raised (stopping.py)
                raise StopNow()
            pool = crew.pool
            ctl.stopper.workers_started(pool.kill)
            logger.info("replica %d/%d: %d workers x %d threads, %d steps each, run dir %s",
                        self.env.rank, self.env.world_size, crew.workers, crew.specs[0].threads,
                        crew.specs[0].quota, crew.run_dir.resolve())
            try:
                pool.start()
                fault = self.cfg.fault
                if not pool.wait_ready(fault.startup_timeout_s, fault.max_worker_restarts, lambda: ctl.signalled):
                    raise StopNow()  # a signal while the workers warmed up: nothing trained yet
                crew.tel.warm_up(crew.base.steps)
                crew.saver.set_loss_bar(loss_bar(crew.tel.test_loss, crew.rep.task.classes))
                assert self.here is not None
                self.group.start(self.here)
                if self.group.writer:  # the run_dir lock is held: the record is this run's to write
                    if crew.restored is None:
                        set_aside_earlier_run(crew.run_dir)
                    record_config(crew.run_dir, self._config_dict(), self.overrides)
                self.t_train, self.cpu_train = time.monotonic(), time.process_time()
                pool.go(self.t_train)
                ctl.checkpoint_in(self.cfg.checkpoint.every_s)
                crew.tel.start(crew.board, sum(s.quota for s in crew.specs), crew.rep.plan)
                self._loop(crew)
            finally:
                pool.stop(self.cfg.fault.shutdown_timeout_s, self.group.progress)
                crew.tel.close()
            return self.group.finish(self._finish(crew, time.monotonic() - self.t_train))
        except StopNow:
            ctl.why("stopped during start-up: nothing trained, no checkpoint written")
            return self._outcome()
        finally:
            self.memory.stop()
            self.group.close(ctl.degraded)
            ctl.stopper.uninstall()

    def _outcome(self, peer_lost: bool = False) -> RunResult:  # the result of a leader writing no metrics.json
        status = Status.of(self.ctl.stopper.signal, self.ctl.fault, self.ctl.fault_code)
        return RunResult(status=status, exit_code=status.exit_code, error=self.ctl.fault, run_dir=self.run_dir,
                         peer_lost=peer_lost)

    def _finish(self, crew: Crew, train_s: float) -> RunResult:
        """The end of a run whose workers have stopped: the final collectives, then (the writer)
        the verdict, the final checkpoint and metrics.json."""
        final = self._final_collectives(crew)
        if final is None:
            return self._end_degraded(crew)
        positions, job, sync_stats = final
        verdict = self._judge(crew, positions, job) if self.group.writer else None
        crew.tel.round(sync_stats.final)
        if verdict is None:
            return self._outcome()
        return self._report(crew, train_s, job, sync_stats, verdict)

    def _final_collectives(self, crew: Crew) -> Optional[tuple[torch.Tensor, Counts, SyncStats]]:
        """The final round and the collectives after it (positions, totals, every replica's round
        figures); None when a peer is gone and no collective can run. They are one unit: a peer
        lost in any of them (elastic mode) re-forms the group and the survivors run the whole unit
        again, so no survivor is left in a collective the others have finished."""
        while not self.ctl.degraded:
            try:
                if self.env.distributed:
                    self._round(crew, True, True, final=True)
                hand_back_judged(crew)
                positions, job = self._gather(crew)  # workers are stopped: final totals
                return positions, job, crew.rounds.close(self.memory.peak_mb)
            except PeerLost as e:
                self._recover(e)
        return None

    def _end_degraded(self, crew: Crew) -> RunResult:
        """No collective can run, but the writer's own replica (workers stopped) is still worth
        keeping: a peer that froze before the first checkpoint must not cost everything."""
        logger.error("a peer replica is gone: no final sync%s",
                     "; the writer checkpoints its own replica" if self.group.writer else "")
        if self.group.writer:
            self._write_alone(crew)
        return self._outcome(peer_lost=True)

    def _judge(self, crew: Crew, positions: torch.Tensor, job: Counts) -> Verdict:
        """The writer's final evaluation and verdict, then the final checkpoint: judged first, so
        a failed run never writes one."""
        tel, board = crew.tel, crew.board
        tel.evaluate_final(crew.base.steps + board.applied() * self.env.world_size)
        verdict = judge(crew.rep, tel.scores, crew.saver.loss_bar, board.applied(), board.skipped())
        if verdict.failure:
            self.ctl.fail(f"{verdict.failure}; {crew.saver.kept()}", EXIT_FAILED)
        if self.ctl.fault_code != EXIT_FAILED:
            self._store(crew, positions, job, stopped=True)  # the final round is done: no snapshot
        return verdict

    def _time_report(self, crew: Crew, job: Counts, train_s: float, sync_stats: SyncStats) -> dict[str, Any]:
        """metrics.json's ``time_s``: every worker's time summed over the job, this replica's
        workers one by one, and this leader's (docs/outputs.md)."""
        board = crew.board
        return {"workers": worker_time(job, crew.workers * self.env.world_size, train_s),
                "per_worker": [worker_time(board.worker_counts(i), 1, train_s) for i in range(board.workers)],
                "leader": _leader_time(crew, sync_stats, time.process_time() - self.cpu_train, self.group_s)}

    def _report(self, crew: Crew, train_s: float, job: Counts, sync_stats: SyncStats, verdict: Verdict) -> RunResult:
        """metrics.json, and TensorBoard's hyperparameters, from the writer."""
        ctl, tel, board = self.ctl, crew.tel, crew.board
        # The writer's own figure also covers the final evaluation and checkpoint, after the gather.
        self.memory.sample()
        peaks = list(sync_stats.peak_memory_mb)
        peaks[crew.comm.rank if crew.comm.rank < len(peaks) else 0] = self.memory.peak_mb
        status = Status.of(ctl.stopper.signal, ctl.fault, ctl.fault_code)
        assert self.t_train is not None
        timing = Timing(wall_s=time.monotonic() - self.t_start, train_s=train_s, startup_s=self.t_train - self.t_start,
                        time_to_target_s=crew.target.reached_s, worker_steps_to_target=crew.target.worker_steps,
                        # Another replica's clock may have ended the job a moment before this one's.
                        eval_s=tel.eval_s, max_time_reached=self.out_of_time or time.monotonic() >= self._deadline())
        metrics = RunSummary(status=status, error=ctl.fault, counters=crew.base.plus(job, crew.rounds.syncs),
                             job=job, task=crew.rep.task, scores=tel.scores, train_loss=board.loss(),
                             timing=timing, sync=dataclasses.replace(sync_stats, peak_memory_mb=peaks),
                             workers=crew.workers, threads=crew.specs[0].threads,
                             replicas=self.env.world_size, sync_mode=self.cfg.sync.mode,
                             schedule=crew.schedule, resumed=crew.restored, run_dir=crew.run_dir,
                             update={**update_report(crew), **input_report(crew)}).metrics()
        metrics.update(verdict=verdict.summary, target_held=crew.target.held(tel.scores), evaluations=tel.history,
                       time_s=self._time_report(crew, job, train_s, sync_stats),
                       memory_mb=memory_report(crew, self.memory.peak_mb), **crew.rounds.wire(),
                       **self.group.report())
        if crew.restored is not None and metrics["status"] != Status.OK:
            # A resumed run that failed keeps the report of the run it resumed, which told of a
            # model that still exists in the checkpoints: nothing already written is lost.
            set_aside_earlier_run(crew.run_dir, ("metrics.json",))
        write_report(crew.run_dir / "metrics.json", metrics)
        try:
            tel.metrics.hparams(flatten("", self._config_dict()), {f"test_{k}": v for k, v in tel.scores.items()})
            tel.metrics.close()
        except OSError as e:  # a full disk: a run that failed already keeps its own line as the error
            if metrics["exit_code"] == 0:
                raise
            logger.warning("%s", e)
        return RunResult(status=Status(metrics["status"]), exit_code=metrics["exit_code"], error=metrics.get("error"),
                         run_dir=crew.run_dir, metrics=strict(metrics))  # as metrics.json holds it


def _leader_time(crew: Crew, sync_stats: SyncStats, cpu_s: float, group_s: float) -> dict[str, float]:
    """metrics.json's ``time_s.leader``: the writer's leader during training. ``rounds`` is the wall
    time of this attempt's rounds in this process (the workers train on meanwhile, up to
    sync.max_lag); ``group`` the wall time before them that the group's own work took (elastic
    mode: publishing positions, looking for a newer epoch or a joiner at the coordinator); ``cpu``
    covers everything the process did (evaluation, rounds, the chair, the memory sampler) on the
    core its workers need."""
    chair = crew.pool.chair
    return {"evaluation": crew.tel.eval_s, "rounds": sum(crew.rounds.times), "group": group_s,
            "rounds_cpu": sync_stats.cpu_s, "chair_cpu": chair.cpu_s if chair is not None else 0.0, "cpu": cpu_s}


def update_report(crew: Crew) -> dict[str, Any]:
    """``metrics.json``'s account of how gradients reached the model: the path, and under the
    barrier the optimizer steps of this replica (its lineage's) and the gradients that came late
    to their step and joined the next, and the last bound a step waited under (replica/pacing.py;
    null with one worker, who waits for nobody)."""
    rep = crew.rep
    if not rep.plan.barrier:
        return {"update": rep.plan.update, "optimizer_steps": None, "late_gradients": None, "wait_bound": None}
    assert rep.opt_state is not None and rep.meeting is not None
    chair = crew.pool.chair
    return {"update": rep.plan.update, "optimizer_steps": int(rep.opt_state[STEPS_KEY][0]),
            "late_gradients": int(rep.meeting.head["closed_late"]),
            "wait_bound": chair.pacer.last if chair is not None else None}


def input_report(crew: Crew) -> dict[str, Any]:
    """``metrics.json``'s ``compile`` (the torch.compile mode the workers used: train.compile
    resolved) and ``stream_epochs`` (a training stream: the epochs each of this replica's workers
    had begun, from 0; null for map-style data)."""
    rep = crew.rep
    epochs = rep.streams.epochs.tolist() if rep.streams is not None else None
    return {"compile": rep.compile, "stream_epochs": epochs}


def memory_report(crew: Crew, peak_mb: Optional[float]) -> Optional[dict[str, float]]:
    """``metrics.json``'s ``memory_mb``: this replica's peak (``peak_memory_mb``) and what of it the
    model, the optimizer state (shared, or every worker's own) and the sync rule's state and round
    buffers hold, as allocated; ``rest`` is the remainder at the peak (the interpreters with torch,
    the data, evaluation, a target's still copy). None where the peak is not measured."""
    if peak_mb is None:
        return None
    rep = crew.rep
    parts = {"model": held_bytes([rep.flat]) / 2**20,
             "optimizer_state": (held_bytes((rep.opt_state or {}).values())
                                 + crew.workers * rep.private_state_bytes) / 2**20,
             "rule_state": held_bytes(crew.rule.held()) / 2**20}
    return {"peak": round(peak_mb, 1), **{k: round(v, 1) for k, v in parts.items()},
            "rest": round(max(peak_mb - sum(parts.values()), 0.0), 1)}


def hand_back_judged(crew: Crew) -> None:
    """A run that train.target stopped ends on a model that meets it. The final round lands on the
    replicas' mean (and a single replica's workers train on after the evaluation), which near a
    plateau can read a little below the copy that met the target; every replica then lands on that
    copy instead, sent by the leader that judged it. Collective whenever a target is set, so every
    leader makes the same calls."""
    tel, target = crew.tel, crew.target
    if not target.is_set:
        return
    flat, rank = crew.rep.flat, crew.comm.rank
    miss = torch.zeros(crew.comm.world_size)
    miss[rank] = float(target.judged is not None and target.final_misses(tel.score_final()))
    crew.comm.all_reduce(miss, crew.cfg.sync.timeout_s, "the check of the final model")
    if not bool(miss.any()):
        return
    src = int(torch.nonzero(miss)[0])
    if rank == src:
        target.restore(tel.scores)
        tel.rescore()
    crew.comm.broadcast(flat, src)
    crew.rule.settle(flat)
