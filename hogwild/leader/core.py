"""The leader: one per replica. Builds the shared model, runs its Hogwild workers, and is
the replica's only member of the ``torch.distributed`` group. Flow: config -> shared model +
data -> workers (replica/pool.py) | sync rounds (sync/rules.py) -> metrics.

A *sync round* is the leaders' only meeting point. Every leader enters round k when its
replica has made ``sync.interval`` more steps since round k-1 (sync/schedule.py), when its
workers are done, or when it must stop. The round's control flags (done, stop, checkpoint,
healthy) travel with it, so every leader takes the same decision in the same round: nobody
waits in a collective that the others will never enter.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import OmegaConf

from hogwild.checkpoint import store as checkpoint
from hogwild.checkpoint.health import loss_bar
from hogwild.checkpoint.resume import Counters, Restored, resume
from hogwild.checkpoint.saver import Saver
from hogwild.config.env import DistEnv
from hogwild.config.schema import Config
from hogwild.errors import EXIT_FAILED, EXIT_FAULT, StopNow
from hogwild.files import RunDirLock
from hogwild.leader.stopping import Stopper
from hogwild.replica import resources
from hogwild.replica.board import Board, Totals, previous_attempt
from hogwild.replica.build import build_replica
from hogwild.replica.faults import dump_final
from hogwild.replica.models import model_id
from hogwild.replica.pool import WorkerPool, worker_specs
from hogwild.replica.resources import resolve_workers
from hogwild.report.metrics import flatten
from hogwild.report.summary import Timing, exit_code, final_report, status_of, write_report
from hogwild.report.telemetry import Telemetry
from hogwild.report.verdict import judge
from hogwild.sync.comm import Comm, PeerLost
from hogwild.sync.group import destroy_group, join_torchrun_group
from hogwild.sync.rounds import Rounds
from hogwild.sync.rules import make_rule
from hogwild.sync.schedule import SyncSchedule

logger = logging.getLogger(__name__)

# A due checkpoint waits this share of checkpoint.every_s for a round to carry it: a round's
# checkpoint holds every replica's exact positions and totals, one written between rounds only
# this replica's (the others' as last gathered).
LOCAL_GRACE = 0.25


class Leader:
    def __init__(self, cfg: Config, run_dir: str, env: Optional[DistEnv] = None) -> None:
        self.cfg, self.env, self.run_dir = cfg, env or DistEnv.from_env(), Path(run_dir)
        self.device = torch.device("cuda", self.env.local_rank) if cfg.device == "cuda" else torch.device("cpu")
        self.is_rank0 = self.env.rank == 0
        self.stopper = Stopper()
        self.fault, self.fault_code = None, EXIT_FAULT  # type: Optional[str], int
        self.degraded = False  # a peer is gone: no more collectives
        self.restored: Optional[Restored] = None
        self.t_start, self.next_ckpt = time.monotonic(), 0.0
        self.t_train: Optional[float] = None
        self.lock: Optional[RunDirLock] = None
        self.comm: Comm  # set by _connect

    # ---------------------------------------------------------------- setup
    def _setup(self) -> None:
        cfg, env = self.cfg, self.env
        torch.set_num_threads(1)  # the leader sleeps; the cores belong to the workers
        self.k = resolve_workers(cfg.workers, env.local_world_size)
        resources.check(cfg, self.k, env.local_world_size)  # before anything is allocated
        self.rep = rep = build_replica(cfg)
        self._connect()
        self.rule = make_rule(cfg.sync, self.comm, rep.param_numel)
        board_file = self.run_dir / "progress" / f"rank{env.rank}.board"
        previous = previous_attempt(board_file)  # read before this attempt overwrites it
        self.board = Board(self.k, board_file)
        self.schedule = SyncSchedule.from_config(cfg.sync, env.distributed)
        self.restored = r = self._resume(previous)
        self.base = r.counters if r else Counters()
        self.saver = Saver(self.run_dir, cfg.checkpoint.keep, r.lineage if r else checkpoint.new_lineage(),
                           model_id(cfg.model), r.path if r else None)
        self.specs = worker_specs(cfg, env, self.k, len(rep.ds.train))
        self.tel = Telemetry(cfg, self.run_dir, env.rank == 0, rep.model, rep.ds.test, self.device, rep.task)
        self.rounds = Rounds(rep.flat, self.rule, self.comm, self.board, self.schedule, self.base.syncs)

    def _connect(self) -> None:  # the group, the agreed run_dir, and its one writer's lock (design rule 17)
        sc = self.cfg.sync
        self.comm, self.run_dir = join_torchrun_group(self.env, sc.backend, sc.timeout_s, self.cfg.device,
                                                      self.run_dir, self.k, self.rep.flat.device)
        if self.is_rank0:
            self.lock = RunDirLock(self.run_dir)
            self.lock.acquire()

    def _resume(self, previous: Optional[tuple[float, float]]) -> Optional[Restored]:
        return resume(self.cfg, self.run_dir, self.rep, self.board, self.rule, self.comm, self.env, previous)

    # ---------------------------------------------------------------- rounds
    def _round(self, done: bool, stop: bool, final: bool = False) -> tuple[bool, bool]:
        # A stopping leader may have a dead peer (torchrun SIGTERMs survivors): bound the wait.
        wait_s = min(self.cfg.fault.shutdown_timeout_s, 10.0) if stop else self.cfg.sync.timeout_s
        out = self.rounds.run(done=done, stop=stop, final=final, timeout_s=wait_s,
                              want_checkpoint=self.is_rank0 and time.monotonic() >= self.next_ckpt,
                              reached=self.tel.time_to_target is not None, reform=self._reform_wanted())
        self.tel.round(out.stats)
        self.pool.release()  # workers waiting at the lag limit may go on
        if out.checkpoint and not final:
            self._checkpoint()
        # A round that ends the job admits nobody: the members go on to their final collectives,
        # which a joiner just healed would never enter. It finds the job finished and leaves.
        if out.reform and not (final or out.all_done or out.any_stop or out.reached):
            self._reform()
        return out.all_done or out.reached, out.any_stop

    # Hooks of the elastic mode (leader/elastic.py); a torchrun job's group never changes.
    def _reform_wanted(self) -> bool:
        return False

    def _reform(self) -> None:  # every leader calls it after the same round
        pass

    def _recover(self, e: PeerLost) -> bool:
        """A collective failed: True if the group re-formed and the loop may go on."""
        self.degraded = True
        self._fail(f"{e}; keeping the last periodic checkpoint")
        return False

    def _gather_positions(self) -> torch.Tensor:  # every replica's data positions, in rank order
        return torch.stack(self.comm.all_gather(torch.from_numpy(self.board.stats["pos"].copy()))).cpu()

    def _report_extra(self) -> dict[str, Any]:
        return {}

    def _start_barrier(self) -> None:
        self.comm.all_reduce(torch.zeros(1), self.cfg.sync.timeout_s, "the start barrier")

    def _checkpoint(self, write: bool = True) -> Totals:
        """Collective (positions and totals of every replica), written by rank 0 only, and
        only if the model is good. Returns the job-wide totals it reduced on the way."""
        own = self._own()
        positions = self._gather_positions()
        job = Totals.from_tensor(self.comm.all_reduce(own.to_tensor()))
        self.saver.gathered(positions, job, own)
        if write:
            self._write(positions, job)
        return job

    def _write(self, positions: torch.Tensor, job: Totals) -> None:
        self.next_ckpt = time.monotonic() + self.cfg.checkpoint.every_s
        if self.is_rank0:
            failed = self.saver.write(self.rep, positions=positions, counters=self.base.plus(job, self.rounds.syncs),
                                      sync_state=self.rule.state_dict(), config=self._config_dict(),
                                      loss=self.board.loss())
            if failed is not None:
                self._fail(*failed)

    def _write_local(self) -> None:
        """A checkpoint of this replica alone, without a collective (see Saver.local_view)."""
        self._write(*self.saver.local_view(self.board, self.env.rank, self.env.world_size, self._own()))

    def _own(self) -> Totals:  # this replica's counters (elastic mode adds its slot's earlier processes')
        return self.board.totals(self.pool.restarts)

    def _fail(self, msg: str, code: int = EXIT_FAULT) -> None:
        if self.fault is None:
            self.fault, self.fault_code = msg, code
            logger.error("stopping: %s", msg)

    def _config_dict(self) -> dict[str, Any]:
        return OmegaConf.to_container(OmegaConf.structured(self.cfg), resolve=True)  # type: ignore[return-value]

    # ------------------------------------------------------------------ loop
    def _check_faults(self) -> None:
        msg = self.pool.check(self.cfg.fault.max_worker_restarts)
        if msg:
            self._fail(msg)
        skipped = self.board.skipped()
        if skipped > self.cfg.fault.max_nonfinite:  # the model is not training: a failed run
            self._fail(f"{skipped} non-finite updates skipped, more than fault.max_nonfinite="
                       f"{self.cfg.fault.max_nonfinite}", EXIT_FAILED)

    def _loop(self) -> None:
        while True:
            # Sleep until the next thing due (eval, metrics, checkpoint), a worker's wake-up or death.
            now = time.monotonic()
            due = min(self.tel.next_due(), self.next_ckpt if self.is_rank0 else now + 1.0, now + 1.0)
            self.pool.wait(min(max(due - now, 0.001), 0.5))
            self._check_faults()
            reached = self.tel.time_to_target is not None
            done = self.board.all_done()
            stop = self.stopper.signal is not None or self.fault is not None
            if not self.env.distributed:
                if done or stop or reached:
                    return
                if time.monotonic() >= self.next_ckpt:
                    self._checkpoint()
            elif done or stop or reached or self.schedule.due(self.board.replica_pos()):
                try:
                    all_done, any_stop = self._round(done, stop)
                except PeerLost as e:
                    if self._recover(e):
                        continue
                    return
                if any_stop and self.stopper.signal is None:
                    self._fail("another replica stopped the job")
                if all_done or any_stop:
                    return
            elif self.is_rank0 and time.monotonic() >= self.next_ckpt + LOCAL_GRACE * self.cfg.checkpoint.every_s:
                # No round brought the due checkpoint (a long interval, a slow peer): write this
                # replica's own, so checkpoint.every_s holds (within the grace) between rounds.
                self._write_local()
            self.tel.tick(self.board, self.base.steps, self.rounds.syncs)

    # ------------------------------------------------------------------- run
    def run(self) -> dict[str, Any]:
        try:
            self.stopper.install()  # a SIGTERM during start-up stops it at once
            self._setup()
            self.pool = WorkerPool(self.cfg, self.specs, self.rep, self.board)
            self.stopper.workers_started(self.pool.kill)
            logger.info("replica %d/%d: %d workers x %d threads, %d steps each, run dir %s",
                        self.env.rank, self.env.world_size, self.k, self.specs[0].threads,
                        self.specs[0].quota, self.run_dir.resolve())
            try:
                self.pool.start()
                fault = self.cfg.fault
                if not self.pool.wait_ready(fault.startup_timeout_s, fault.max_worker_restarts,
                                            lambda: self.stopper.signal is not None):
                    raise StopNow()  # a signal while the workers warmed up: nothing trained yet
                self.tel.warm_up(self.base.steps)
                self.saver.loss_bar = loss_bar(self.tel.test_loss, self.rep.task.classes)
                self._start_barrier()
                self.pool.go()
                self.t_train = time.monotonic()
                self.next_ckpt = self.t_train + self.cfg.checkpoint.every_s
                self.tel.start(self.board, sum(s.quota for s in self.specs))
                self._loop()
            finally:
                self.pool.stop(self.cfg.fault.shutdown_timeout_s)
                self.tel.close()
            return self._finish(time.monotonic() - self.t_train)
        except StopNow:
            self.fault = "stopped during start-up: nothing trained, no checkpoint written"
            return self._outcome()
        finally:
            if not self.degraded:
                destroy_group()
            if self.lock is not None:
                self.lock.release()

    def _outcome(self, **extra: Any) -> dict[str, Any]:  # the result of a leader writing no metrics.json
        status = status_of(self.stopper.signal, self.fault, self.fault_code)
        return {"status": status, "exit_code": exit_code(status), "error": self.fault, **extra}

    def _finish(self, train_s: float) -> dict[str, Any]:
        while self.env.distributed and not self.degraded:
            try:
                self._round(True, True, final=True)
                break
            except PeerLost as e:
                self._recover(e)  # elastic mode re-forms and the survivors retry the final round
        if self.degraded:
            # No collective can run, but rank 0's own replica (workers stopped) is still worth
            # keeping: a peer that froze before the first checkpoint must not cost everything.
            logger.error("a peer replica is gone: no final sync%s",
                         "; rank 0 checkpoints its own replica" if self.is_rank0 else "")
            if self.is_rank0:
                self._write_local()
            return self._outcome(peer_lost=True)
        dump_final(self.rep.flat, self.env.rank)
        tel, board = self.tel, self.board
        if self.is_rank0:  # judged before the final checkpoint: a failed run never writes one
            tel.evaluate(self.base.steps + board.applied() * self.env.world_size)
            verdict = judge(self.rep, tel.scores, self.saver.loss_bar, board.applied(), board.skipped())
            if verdict.failure:
                self._fail(f"{verdict.failure}; {self.saver.kept()}", EXIT_FAILED)
        job = self._checkpoint(write=self.fault_code != EXIT_FAILED)  # workers are stopped: final totals
        sync_stats = self.rounds.close()
        self.tel.round(sync_stats.final)
        if not self.is_rank0:
            return self._outcome()
        status = status_of(self.stopper.signal, self.fault, self.fault_code)
        counters = self.base.plus(job, self.rounds.syncs)
        assert self.t_train is not None
        timing = Timing(wall_s=time.monotonic() - self.t_start, train_s=train_s, startup_s=self.t_train - self.t_start,
                        time_to_target_s=tel.time_to_target, worker_steps_to_target=tel.worker_steps_to_target)
        result = final_report(status=status, error=self.fault, counters=counters, job=job,
                              task=self.rep.task, scores=tel.scores, train_loss=board.loss(),
                              timing=timing, sync=sync_stats, workers=self.k, threads=self.specs[0].threads,
                              replicas=self.env.world_size, sync_mode=self.cfg.sync.mode,
                              schedule=self.schedule, resumed=self.restored, run_dir=self.run_dir)
        result.update(verdict=verdict.summary, **self._report_extra())
        write_report(self.run_dir / "metrics.json", result)
        tel.metrics.hparams(flatten("", self._config_dict()), {f"test_{k}": v for k, v in tel.scores.items()})
        tel.metrics.close()
        return result


def run(cfg: Config, run_dir: str, env: Optional[DistEnv] = None) -> dict[str, Any]:
    return Leader(cfg, run_dir, env).run()
