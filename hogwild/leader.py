"""The leader: one per replica. Builds the shared model, runs its Hogwild workers, and is
the replica's only member of the ``torch.distributed`` group.

Flow: config -> shared model + data -> workers (pool.py) | sync rounds (sync.py) -> metrics.

A *sync round* is the leaders' only meeting point. Every leader enters round k when its
replica has made ``sync.interval`` more steps since round k-1 (schedule.py), when its
workers are done, or when it must stop. The round's control flags (done, stop, checkpoint,
healthy) travel with it, so every leader takes the same decision in the same round: nobody
waits in a collective that the others will never enter.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import OmegaConf

from hogwild import checkpoint
from hogwild.board import Board, Totals
from hogwild.comm import Comm, DistComm, LocalComm, PeerLost
from hogwild.config import Config, resolve_workers
from hogwild.distributed import (
    DistEnv,
    agree_on_path,
    agree_on_workers,
    destroy_group,
    init_group,
    pick_backend,
)
from hogwild.errors import EXIT_SIGINT
from hogwild.metrics import flatten, write_json
from hogwild.pool import WorkerPool, worker_specs
from hogwild.replica import build_replica
from hogwild.report import Timing, exit_code, final_report, status_of
from hogwild.resume import Counters, Restored, payload, restore, resume_path
from hogwild.rounds import Rounds
from hogwild.schedule import SyncSchedule
from hogwild.sync import make_rule
from hogwild.telemetry import Telemetry

logger = logging.getLogger(__name__)

DUMP_ENV = "HOGWILD_DUMP_FINAL"


class Leader:
    def __init__(self, cfg: Config, run_dir: str, env: Optional[DistEnv] = None) -> None:
        self.cfg = cfg
        self.env = env or DistEnv.from_env()
        self.run_dir = Path(run_dir)
        self.device = torch.device("cuda", self.env.local_rank) if cfg.device == "cuda" else torch.device("cpu")
        self.is_rank0 = self.env.rank == 0
        self.stop_signal: Optional[int] = None
        self.fault: Optional[str] = None
        self.degraded = False  # a peer is gone: no more collectives
        self.base = Counters()  # what the checkpoint we resumed from had counted
        self.restored: Optional[Restored] = None
        self.t_start = time.monotonic()
        self.t_train: Optional[float] = None
        self.next_ckpt = 0.0

    # ---------------------------------------------------------------- setup
    def _setup(self) -> None:
        cfg, env = self.cfg, self.env
        torch.set_num_threads(1)  # the leader sleeps; the cores belong to the workers
        self.rep = rep = build_replica(cfg)
        self.k = resolve_workers(cfg.workers, env.local_world_size)
        self.comm: Comm = LocalComm()
        if env.distributed:
            init_group(env, pick_backend(cfg.sync.backend, cfg.device), cfg.sync.timeout_s, cfg.device)
            self.run_dir = Path(agree_on_path(str(self.run_dir)))
            agree_on_workers(self.k)
            self.comm = DistComm(rep.flat.device)
        self.rule = make_rule(cfg.sync, self.comm)
        self.board = Board(self.k)
        self.schedule = SyncSchedule.from_config(cfg.sync, env.distributed)
        path = resume_path(cfg.resume, self.run_dir, self.is_rank0, agree_on_path)
        if path is not None:
            self.restored, sync_state = restore(path, cfg.model.name, rep.shapes, rep.flat, rep.opt_state,
                                                self.board, env.rank, env.world_size, self.run_dir)
            self.base = self.restored.counters
            self.rule.load_state_dict(sync_state)
        self.specs = worker_specs(cfg, env, self.k, len(rep.ds.train))
        self.tel = Telemetry(cfg, self.run_dir, self.is_rank0, rep.model, rep.ds.test, self.device,
                             env.world_size)
        self.rounds = Rounds(rep.flat, self.rule, self.comm, self.board, self.schedule, self.tel, self.base.syncs)

    def _install_signals(self) -> None:
        def handler(signum: int, _frame: Any) -> None:
            if self.stop_signal is not None and signum == signal.SIGINT:
                logger.error("second interrupt: forcing exit")
                self.pool.kill()
                raise SystemExit(EXIT_SIGINT)
            self.stop_signal = signum
            logger.warning("%s received: stopping workers and writing a final checkpoint "
                           "(Ctrl-C again to force)", signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    # ---------------------------------------------------------------- rounds
    def _round(self, done: bool, stop: bool, final: bool = False) -> tuple[bool, bool]:
        # A stopping leader may have a dead peer (torchrun SIGTERMs survivors): bound the wait.
        wait_s = min(self.cfg.fault.shutdown_timeout_s, 10.0) if stop else self.cfg.sync.timeout_s
        out = self.rounds.run(done=done, stop=stop, final=final, timeout_s=wait_s,
                              want_checkpoint=self.is_rank0 and time.monotonic() >= self.next_ckpt,
                              reached=self.tel.time_to_target is not None)
        self.pool.release()  # workers waiting at the lag limit may go on
        if out.checkpoint and not final:
            self._checkpoint()
        return out.all_done or out.reached, out.any_stop

    def _checkpoint(self) -> Totals:
        """Collective (positions and totals of every replica), written by rank 0 only.

        Returns the job-wide totals it reduced on the way.
        """
        positions = torch.stack(self.comm.all_gather(torch.from_numpy(self.board.stats["pos"].copy()))).cpu()
        job = Totals.from_tensor(self.comm.all_reduce(self.board.totals(self.pool.restarts).to_tensor()))
        self.next_ckpt = time.monotonic() + self.cfg.checkpoint.every_s
        if self.is_rank0:
            counters = self.base.plus(job, self.rounds.syncs)
            rep = self.rep
            data = payload(model_name=self.cfg.model.name, shapes=rep.shapes, flat=rep.flat,
                           opt_state=rep.opt_state, positions=positions, counters=counters,
                           sync_state=self.rule.state_dict(), config=self._config_dict())
            try:
                checkpoint.save(self.run_dir, data, counters.steps, self.cfg.checkpoint.keep)
            except OSError as e:
                logger.error("checkpoint: could not write to %s: %s", checkpoint.ckpt_dir(self.run_dir), e)
        return job

    def _config_dict(self) -> dict[str, Any]:
        return OmegaConf.to_container(OmegaConf.structured(self.cfg), resolve=True)  # type: ignore[return-value]

    # ------------------------------------------------------------------ loop
    def _fault_message(self) -> Optional[str]:
        msg = self.pool.check(self.cfg.fault.max_worker_restarts)
        skipped = self.board.skipped()
        if msg is None and skipped > self.cfg.fault.max_nonfinite:
            msg = f"{skipped} non-finite updates skipped, more than fault.max_nonfinite={self.cfg.fault.max_nonfinite}"
        return msg

    def _loop(self) -> None:
        while True:
            # Sleep until the next thing due (eval, metrics, checkpoint), a worker's wake-up or death.
            now = time.monotonic()
            due = min(self.tel.next_due(), self.next_ckpt, now + 1.0)
            self.pool.wait(min(max(due - now, 0.001), 0.5))
            msg = self._fault_message()
            if msg and not self.fault:
                self.fault = msg
                logger.error("stopping: %s", msg)
            reached = self.tel.time_to_target is not None
            done = self.board.all_done()
            stop = self.stop_signal is not None or self.fault is not None
            if not self.env.distributed:
                if done or stop or reached:
                    return
                if time.monotonic() >= self.next_ckpt:
                    self._checkpoint()
            elif done or stop or reached or self.schedule.due(self.board.replica_pos()):
                try:
                    all_done, any_stop = self._round(done, stop)
                except PeerLost as e:
                    self.degraded = True
                    self.fault = self.fault or str(e)
                    logger.error("%s; keeping the last periodic checkpoint", e)
                    return
                if any_stop and self.stop_signal is None and self.fault is None:
                    self.fault = "another replica stopped the job"
                if all_done or any_stop:
                    return
            self.tel.tick(self.board, self.base.steps, self.rounds.syncs)

    # ------------------------------------------------------------------- run
    def run(self) -> dict[str, Any]:
        try:
            self._setup()
            self.pool = WorkerPool(self.cfg, self.specs, self.rep, self.board)
            self._install_signals()
            logger.info("replica %d/%d: %d workers x %d threads, %d steps each, run dir %s",
                        self.env.rank, self.env.world_size, self.k, self.specs[0].threads,
                        self.specs[0].quota, self.run_dir.resolve())
            try:
                self.pool.start()
                self.pool.wait_ready(self.cfg.sync.timeout_s)
                self.tel.warm_up(self.base.steps)
                self.comm.all_reduce(torch.zeros(1), self.cfg.sync.timeout_s, "the start barrier")
                self.pool.go()
                self.t_train = time.monotonic()
                self.next_ckpt = self.t_train + self.cfg.checkpoint.every_s
                self.tel.start(self.board, sum(s.quota for s in self.specs))
                self._loop()
            finally:
                self.pool.stop(self.cfg.fault.shutdown_timeout_s)
                self.tel.close()
            return self._finish(time.monotonic() - self.t_train)
        finally:
            if not self.degraded:
                destroy_group()

    def _finish(self, train_s: float) -> dict[str, Any]:
        if self.env.distributed and not self.degraded:
            try:
                self._round(True, True, final=True)
            except PeerLost as e:
                self.degraded = True
                self.fault = self.fault or str(e)
        status = status_of(self.stop_signal, self.fault)
        if self.degraded:
            logger.error("a peer replica is gone: no final sync or checkpoint; the last periodic "
                         "checkpoint in %s stands", checkpoint.ckpt_dir(self.run_dir))
            return {"status": status, "exit_code": exit_code(status), "error": self.fault}
        dump = os.environ.get(DUMP_ENV)
        if dump:  # test hook: each replica's final parameters, to check consensus bit for bit
            torch.save(self.rep.flat.cpu().clone(), Path(dump) / f"rank{self.env.rank}.pt")
        job = self._checkpoint()  # workers are stopped: these job totals are final
        sync_stats = self.rounds.close()
        if not self.is_rank0:
            return {"status": status, "exit_code": exit_code(status)}
        counters = self.base.plus(job, self.rounds.syncs)
        tel = self.tel
        tel.evaluate(counters.steps)
        assert self.t_train is not None
        timing = Timing(wall_s=time.monotonic() - self.t_start, train_s=train_s, startup_s=self.t_train - self.t_start,
                        time_to_target_s=tel.time_to_target)
        result = final_report(status=status, error=self.fault, counters=counters, job=job,
                              test_loss=tel.test_loss, test_acc=tel.test_acc, train_loss=self.board.loss(),
                              timing=timing, sync=sync_stats, workers=self.k, threads=self.specs[0].threads,
                              replicas=self.env.world_size, sync_mode=self.cfg.sync.mode,
                              schedule=self.schedule, resumed=self.restored, run_dir=self.run_dir)
        write_json(self.run_dir / "metrics.json", result)
        tel.metrics.hparams(flatten("", self._config_dict()), {"test_accuracy": tel.test_acc,
                                                                "test_loss": tel.test_loss})
        tel.metrics.close()
        return result


def run(cfg: Config, run_dir: str, env: Optional[DistEnv] = None) -> dict[str, Any]:
    return Leader(cfg, run_dir, env).run()
