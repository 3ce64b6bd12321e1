"""The leader: one per replica. Builds the shared model, runs its Hogwild workers, and is
the replica's only member of the ``torch.distributed`` group.

Flow: config -> shared model + data -> workers (pool.py) | sync rounds (sync.py) -> metrics.

A *sync round* is the leaders' only meeting point. Every leader enters round k when its
replica has made ``sync.interval`` more steps since round k-1, when its workers are done,
or when it must stop. A small all_reduce of flags (done, stop, checkpoint, healthy) comes
first, so every leader takes the same decision in the same round: nobody waits in a
collective that the others will never enter.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import time
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from hogwild import checkpoint
from hogwild.config import Config, ConfigError, available_cores, resolve_workers
from hogwild.data import load_dataset, shard
from hogwild.distributed import DistEnv, agree_on_path, destroy_group, init_group, pick_backend
from hogwild.evaluate import evaluate
from hogwild.metrics import Metrics, Progress, flatten, write_json
from hogwild.models import build_model
from hogwild.optim import FlatOptimizer
from hogwild.pool import WorkerPool
from hogwild.shared import alloc, layout, share_model
from hogwild.sync import PeerLost, make_rule, sync_round
from hogwild.worker import (APPLIED, LOSS, NEXT_SYNC_AT, NUM_CONTROL, NUM_STATS, POS, SAMPLES,
                            SKIPPED, STEP_S, SYNC_S, SYNC_STEPS, SYNCING, WorkerSpec)

logger = logging.getLogger(__name__)

DUMP_ENV = "HOGWILD_DUMP_FINAL"
EXIT_OK, EXIT_FAULT, EXIT_SIGINT, EXIT_SIGTERM = 0, 3, 130, 143


class Leader:
    def __init__(self, cfg: Config, run_dir: str, env: Optional[DistEnv] = None) -> None:
        self.cfg = cfg
        self.env = env or DistEnv.from_env()
        self.run_dir = Path(run_dir)
        self.device = torch.device("cuda", self.env.local_rank) if cfg.device == "cuda" else torch.device("cpu")
        self.is_rank0 = self.env.rank == 0
        self.stop_signal: Optional[int] = None
        self.fault: Optional[str] = None
        self.syncs = 0
        self.sync_times: list[float] = []
        self.last_drift = 0.0
        self.drifts: list[float] = []
        self.interval = cfg.sync.interval
        self.next_sync_at = float(cfg.sync.interval)
        self.base_steps = 0  # applied updates restored from a checkpoint
        self.base_samples = 0.0
        self.restarts_before = 0
        self.steps_lost = 0
        self.degraded = False  # a peer is gone: no more collectives
        self.time_to_target: Optional[float] = None
        self.skipped_before = 0

    # ---------------------------------------------------------------- setup
    def _setup(self) -> None:
        cfg, env = self.cfg, self.env
        if cfg.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device: cuda requested but torch.cuda.is_available() is False")
        torch.set_num_threads(1)  # the leader sleeps; the cores belong to the workers
        self.ds = load_dataset(cfg.data).share_memory_()
        self.model = build_model(cfg.model, self.ds, cfg.train.seed)
        self.shapes = [tuple(p.shape) for p in self.model.parameters()]
        self.flat = share_model(self.model, cfg.device)
        self.slots = layout(self.model)
        self.opt_state = None
        if cfg.optim.state == "shared":
            self.opt_state = FlatOptimizer.new_state(cfg.optim, self.flat.numel(),
                                                     lambda n: alloc(n, cfg.device))
        self.k = resolve_workers(cfg.workers, env.local_world_size)
        if env.distributed:
            backend = pick_backend(cfg.sync.backend, cfg.device)
            init_group(env, backend, cfg.sync.timeout_s, cfg.device)
            self.run_dir = Path(agree_on_path(str(self.run_dir)))
            # Every leader must run the same number of workers for shard bookkeeping.
            ks = [0] * env.world_size
            dist.all_gather_object(ks, self.k)
            if len(set(ks)) != 1:
                raise ConfigError(f"workers: replicas resolved different worker counts {ks}; "
                                  f"set workers=K explicitly")
        self.rule = make_rule(cfg.sync)
        self.stats = torch.zeros(self.k, NUM_STATS, dtype=torch.float64).share_memory_()
        self.control = torch.zeros(NUM_CONTROL, dtype=torch.float64).share_memory_()
        self.control.numpy()[NEXT_SYNC_AT] = self.next_sync_at if env.distributed else float("inf")
        self._maybe_resume()
        num_global = self.k * env.world_size
        specs = []
        for i in range(self.k):
            g = env.rank * self.k + i
            n_shard = len(shard(len(self.ds.train), num_global, g, cfg.train.seed))
            if cfg.train.max_steps is not None:
                quota = cfg.train.max_steps // self.k + (1 if i < cfg.train.max_steps % self.k else 0)
            else:
                quota = cfg.train.epochs * -(-n_shard // min(cfg.train.batch_size, n_shard))
            threads = max(1, available_cores() // (self.k * env.local_world_size))
            specs.append(WorkerSpec(i, g, num_global, threads, quota))
        self.specs = specs
        self.metrics = Metrics(self.run_dir, self.is_rank0)
        self.progress = Progress(cfg.train.log_every_s, self.is_rank0)

    def _maybe_resume(self) -> None:
        cfg, r = self.cfg, self.cfg.resume
        path: Optional[str] = None
        if isinstance(r, str) and r not in ("auto", "true", "false"):
            path = r
        elif r is True or r in ("auto", "true"):
            found = checkpoint.load_latest(self.run_dir) if self.is_rank0 else None
            path = str(found[1]) if found else ""
            if self.env.distributed:
                path = agree_on_path(path)
            if not path:
                if r is True or r == "true":
                    raise ConfigError(f"resume: no checkpoint in {checkpoint.ckpt_dir(self.run_dir)}")
                return
        if not path:
            return
        ckpt = checkpoint.load(path)
        checkpoint.check_compatible(ckpt, path, cfg.model.name, self.shapes)
        with torch.no_grad():
            self.flat.copy_(ckpt["flat"].to(self.flat.device))
            for name, buf in (self.opt_state or {}).items():
                if name in ckpt.get("opt_state", {}):
                    buf.copy_(ckpt["opt_state"][name].to(buf.device))
        pos = ckpt.get("positions")
        if isinstance(pos, torch.Tensor) and tuple(pos.shape) == (self.env.world_size, self.k):
            self.stats.numpy()[:, POS] = pos[self.env.rank].numpy()
        else:
            logger.warning("checkpoint was made with another replicas x workers layout; "
                           "data positions restart from the beginning of each shard")
        c = ckpt.get("counters", {})
        self.base_steps = int(c.get("steps", 0))
        beat = self.run_dir / "progress.json"
        if beat.is_file():
            try:
                self.steps_lost = max(0, int(json.loads(beat.read_text())["steps"]) - self.base_steps)
            except (ValueError, KeyError):
                pass
        self.base_samples = float(c.get("samples", 0))
        self.syncs = int(c.get("syncs", 0))
        self.restarts_before = int(c.get("worker_restarts", 0))
        self.skipped_before = int(c.get("skipped_nonfinite", 0))
        self.rule.load_state_dict(ckpt.get("sync_state", {}))
        self.resumed_from = path
        logger.info("resumed from %s (step %d, %d syncs)", path, self.base_steps, self.syncs)

    # --------------------------------------------------------------- signals
    def _install_signals(self) -> None:
        def handler(signum: int, _frame: Any) -> None:
            if self.stop_signal is not None and signum == signal.SIGINT:
                logger.error("second interrupt: forcing exit")
                for p in self.pool.procs:
                    if p is not None and p.is_alive():
                        p.kill()
                raise SystemExit(EXIT_SIGINT)
            self.stop_signal = signum
            logger.warning("%s received: stopping workers and writing a final checkpoint "
                           "(Ctrl-C again to force)", signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    # ------------------------------------------------------------- counters
    def _replica_pos(self) -> float:
        return float(self.stats.numpy()[:, POS].sum())

    def _local_totals(self) -> torch.Tensor:
        s = self.stats.numpy()
        return torch.tensor([s[:, APPLIED].sum(), s[:, SAMPLES].sum(), s[:, SKIPPED].sum(),
                             float(self.pool.restarts), s[:, STEP_S].sum(), s[:, SYNC_S].sum(),
                             s[:, SYNC_STEPS].sum(), s[:, POS].sum()], dtype=torch.float64)

    def _stall_s(self, t: torch.Tensor) -> float:
        """Extra time workers' steps took while a sync ran, beyond their usual step time."""
        step_s, sync_s, sync_steps, pos = float(t[4]), float(t[5]), float(t[6]), float(t[7])
        other = max(pos - sync_steps, 1.0)
        return max(0.0, sync_s - sync_steps * (step_s - sync_s) / other)

    # ---------------------------------------------------------------- rounds
    def _on_wire(self, t: torch.Tensor) -> torch.Tensor:
        """NCCL only moves CUDA tensors; Gloo takes them where they are."""
        return t.to(self.flat.device)

    def _round(self, done: bool, stop: bool, final: bool = False) -> tuple[bool, bool]:
        env = self.env
        t0 = time.perf_counter()
        ctl = self.control.numpy()
        ctl[SYNCING] = 1.0
        pos_at_snap = self._replica_pos()
        # A stopping leader may have a dead peer (torchrun SIGTERMs survivors): bound the wait.
        wait_s = min(self.cfg.fault.shutdown_timeout_s, 10.0) if stop else self.cfg.sync.timeout_s
        try:
            out = sync_round(self.flat, self.rule, env.rank, env.world_size, done=done, stop=stop,
                             want_checkpoint=self.is_rank0 and time.monotonic() >= self.next_ckpt,
                             reached=self.time_to_target is not None,
                             last_drift=self.last_drift, final=final, timeout_s=wait_s)
        finally:
            ctl[SYNCING] = 0.0
        if not out.healthy:
            logger.warning("replica %d held non-finite parameters; excluded from the sync and "
                           "restored from the consensus of the others", env.rank)
        self.last_drift = out.drift
        dt = time.perf_counter() - t0
        self.syncs += 1
        self.sync_times.append(dt)
        step = int(self._replica_pos())
        self.metrics.scalar("sync/seconds", dt, step)
        if self.syncs > 1:
            self._record_drift(out.last_drifts, step)
        self.next_sync_at = pos_at_snap + self.interval
        ctl[NEXT_SYNC_AT] = self.next_sync_at
        if out.checkpoint and not final:
            self._checkpoint()
        return out.all_done or out.reached, out.any_stop

    def _record_drift(self, drifts: list[float], step: int) -> None:
        finite = [d for d in drifts if math.isfinite(d)]
        if finite:
            self.drifts.append(max(finite))
            self.metrics.scalar("sync/drift_mean", sum(finite) / len(finite), step)
            self.metrics.scalar("sync/drift_max", max(finite), step)
            self._adapt_interval(max(finite), step)

    def _adapt_interval(self, max_drift: float, step: int) -> None:
        """Proportional control of the interval towards ``sync.target_drift``.

        Every leader sees the same gathered drift, so all take the same decision.
        """
        target = self.cfg.sync.target_drift
        if target is None:
            return
        factor = min(1.5, max(0.5, target / max(max_drift, 1e-12)))
        lo, hi = self.cfg.sync.min_interval, self.cfg.sync.max_interval
        self.interval = min(hi, max(lo, round(self.interval * factor)))
        self.metrics.scalar("sync/interval", self.interval, step)

    # ----------------------------------------------------------- checkpoints
    def _checkpoint(self) -> torch.Tensor:
        """Collective when distributed (positions of all replicas), written by rank 0 only.

        Returns the job-wide totals (see ``_local_totals``) it reduced on the way.
        """
        pos = torch.from_numpy(self.stats.numpy()[:, POS].copy())
        t = self._local_totals()
        if self.env.distributed:
            parts = [self._on_wire(torch.zeros_like(pos)) for _ in range(self.env.world_size)]
            dist.all_gather(parts, self._on_wire(pos))
            pos_all = torch.stack(parts).cpu()
            t = self._on_wire(t)
            dist.all_reduce(t)
            t = t.cpu()
        else:
            pos_all = pos.unsqueeze(0)
        self.next_ckpt = time.monotonic() + self.cfg.checkpoint.every_s
        if not self.is_rank0:
            return t
        steps = self.base_steps + int(t[0])
        payload = {
            "format": checkpoint.FORMAT,
            "model": self.cfg.model.name,
            "shapes": [list(s) for s in self.shapes],
            "flat": self.flat.detach().to("cpu", copy=True),
            "opt_state": {k: v.detach().to("cpu", copy=True) for k, v in (self.opt_state or {}).items()},
            "positions": pos_all,
            "counters": {"steps": steps, "samples": self.base_samples + float(t[1]), "syncs": self.syncs,
                         "worker_restarts": self.restarts_before + int(t[3]),
                         "skipped_nonfinite": self.skipped_before + int(t[2])},
            "sync_state": self.rule.state_dict(),
            "config": OmegaConf.to_container(OmegaConf.structured(self.cfg), resolve=True),
        }
        try:
            checkpoint.save(self.run_dir, payload, steps, self.cfg.checkpoint.keep)
        except OSError as e:
            logger.error("checkpoint: could not write to %s: %s", checkpoint.ckpt_dir(self.run_dir), e)
        return t

    # ------------------------------------------------------------------ loop
    def _periodic(self) -> None:
        now = time.monotonic()
        s = self.stats.numpy()
        step = self.base_steps + int(s[:, APPLIED].sum())
        elapsed = max(time.monotonic() - self.t_train, 1e-9)
        losses = [x for x in s[:, LOSS] if x > 0]
        loss = sum(losses) / len(losses) if losses else float("nan")
        rate = float(s[:, SAMPLES].sum()) / elapsed
        if now >= self.next_tb:
            self.next_tb = now + 1.0
            if self.is_rank0:
                # Heartbeat: after a crash, the resumed run reports how many steps were lost.
                write_json(self.run_dir / "progress.json",
                           {"steps": self.base_steps + int(s[:, APPLIED].sum()) * self.env.world_size})
            self.metrics.scalar("train/loss", loss, step)
            self.metrics.scalar("perf/samples_per_s", rate, step)
            for i in range(self.k):
                self.metrics.scalar(f"perf/samples_per_s_worker{i}", float(s[i, SAMPLES]) / elapsed, step)
        if self.is_rank0 and now >= self.next_eval:
            self.test_loss, self.test_acc = evaluate(self.model, self.ds.test, self.device)
            self.metrics.scalar("test/accuracy", self.test_acc, step)
            self.metrics.scalar("test/loss", self.test_loss, step)
            self.next_eval = time.monotonic() + self.cfg.eval.every_s
            target = self.cfg.train.target_accuracy
            if target is not None and self.test_acc >= target and self.time_to_target is None:
                self.time_to_target = time.monotonic() - self.t_train
                logger.info("test accuracy %.4f reached train.target_accuracy=%.4f after %.2fs",
                            self.test_acc, target, self.time_to_target)
        total = sum(sp.quota for sp in self.specs)
        self.progress.update(
            f"step {int(s[:, POS].sum())}/{total} | loss {loss:.4f} | {rate:,.0f} samples/s"
            f" | test acc {self.test_acc:.4f} | syncs {self.syncs}")

    def _loop(self) -> None:
        cfg = self.cfg
        while True:
            # Sleep until the next thing due (eval, log, checkpoint), a worker's wake-up or death.
            now = time.monotonic()
            due = min(self.next_eval if self.is_rank0 else now + 1.0, self.next_tb, self.next_ckpt,
                      now + self.progress.every_s)
            self.pool.wait(min(max(due - now, 0.001), 0.5))
            msg = self.pool.check(cfg.fault.max_worker_restarts)
            skipped = int(self.stats.numpy()[:, SKIPPED].sum())
            if msg is None and skipped > cfg.fault.max_nonfinite:
                msg = (f"{skipped} non-finite updates skipped, more than "
                       f"fault.max_nonfinite={cfg.fault.max_nonfinite}")
            if msg and not self.fault:
                self.fault = msg
                logger.error("stopping: %s", msg)
            reached = self.time_to_target is not None
            done = self.pool.all_done()
            stop = self.stop_signal is not None or self.fault is not None
            if self.env.distributed:
                if done or stop or reached or self._replica_pos() >= self.next_sync_at:
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
            else:
                if done or stop or reached:
                    return
                if time.monotonic() >= self.next_ckpt:
                    self._checkpoint()
            self._periodic()

    # ------------------------------------------------------------------- run
    def run(self) -> dict[str, Any]:
        self.t_start = time.monotonic()
        self.startup_s: Optional[float] = None
        self.test_loss, self.test_acc = float("nan"), float("nan")
        self.resumed_from: Optional[str] = None
        try:
            self._setup()
            self.pool = WorkerPool(self.cfg, self.specs, self.ds, self.flat, self.opt_state,
                                   self.stats, self.control)
            now = time.monotonic()
            self.next_ckpt = now + self.cfg.checkpoint.every_s
            self.next_eval = now + self.cfg.eval.every_s
            self.next_tb = now
            self._install_signals()
            logger.info("replica %d/%d: %d workers x %d threads, %d steps each, run dir %s",
                        self.env.rank, self.env.world_size, self.k, self.specs[0].threads,
                        self.specs[0].quota, self.run_dir.resolve())
            self.pool.start()
            self.pool.wait_ready(self.cfg.sync.timeout_s)
            if self.env.distributed:
                dist.barrier()
            self.pool.go()
            self.t_train = time.monotonic()
            self.startup_s = self.t_train - self.t_start
            try:
                self._loop()
            finally:
                self.pool.stop(self.cfg.fault.shutdown_timeout_s)
                self.progress.close()
            train_s = time.monotonic() - self.t_train
            return self._finish(train_s)
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
        if self.degraded:
            logger.error("a peer replica is gone: no final sync or checkpoint; the last periodic "
                         "checkpoint in %s stands", checkpoint.ckpt_dir(self.run_dir))
            status = signal.Signals(self.stop_signal).name if self.stop_signal else "failed"
            return {"status": status, "exit_code": self._exit_code(status), "error": self.fault}
        dump = os.environ.get(DUMP_ENV)
        if dump:  # test hook: each replica's final parameters, to check consensus bit for bit
            torch.save(self.flat.cpu().clone(), Path(dump) / f"rank{self.env.rank}.pt")
        t = self._checkpoint()  # workers are stopped: these job totals are final
        if self.env.distributed:
            # The final round's drift has no later round to ride on: gather it once here.
            last = [self._on_wire(torch.zeros(1, dtype=torch.float64)) for _ in range(self.env.world_size)]
            dist.all_gather(last, self._on_wire(torch.tensor([self.last_drift], dtype=torch.float64)))
            self._record_drift([float(x) for x in last], int(self._replica_pos()))
            agg = self._on_wire(torch.tensor([_mean(self.sync_times)], dtype=torch.float64))
            dist.all_reduce(agg)
            mean_sync = float(agg[0]) / self.env.world_size
        else:
            mean_sync = 0.0
        status = "ok"
        if self.stop_signal is not None:
            status = signal.Signals(self.stop_signal).name
        elif self.fault is not None:
            status = "failed"
        result: dict[str, Any] = {"status": status, "exit_code": self._exit_code(status)}
        if not self.is_rank0:
            return result
        self.test_loss, self.test_acc = evaluate(self.model, self.ds.test, self.device)
        final_step = self.base_steps + int(t[0])
        self.metrics.scalar("test/accuracy", self.test_acc, final_step)
        self.metrics.scalar("test/loss", self.test_loss, final_step)
        losses = [x for x in self.stats.numpy()[:, LOSS] if x > 0]
        result.update({
            "test_accuracy": self.test_acc,
            "test_loss": self.test_loss,
            "train_loss": sum(losses) / len(losses) if losses else float("nan"),
            "steps": self.base_steps + int(t[0]),
            "samples": int(self.base_samples + float(t[1])),
            "samples_per_s": float(t[1]) / max(train_s, 1e-9),
            "wall_s": time.monotonic() - self.t_start,
            "train_s": train_s,
            "time_to_target_s": self.time_to_target if self.time_to_target is not None else float("nan"),
            "startup_s": self.startup_s if self.startup_s is not None else float("nan"),
            "workers": self.k,
            "threads_per_worker": self.specs[0].threads,
            "replicas": self.env.world_size,
            "syncs": self.syncs,
            "max_drift": max(self.drifts) if self.drifts else 0.0,
            "mean_drift": _mean(self.drifts),
            "mean_sync_s": mean_sync,
            "worker_stall_s": self._stall_s(t),
            "worker_restarts": self.restarts_before + int(t[3]),
            "skipped_nonfinite": self.skipped_before + int(t[2]),
            "sync_mode": self.cfg.sync.mode if self.env.distributed else "none",
            "final_interval": self.interval,
            "resumed_from": self.resumed_from or "",
            "steps_lost_on_resume": self.steps_lost,
            "run_dir": str(self.run_dir.resolve()),
        })
        if self.fault:
            result["error"] = self.fault
        write_json(self.run_dir / "metrics.json", result)
        hp = flatten("", OmegaConf.to_container(OmegaConf.structured(self.cfg), resolve=True))
        self.metrics.hparams(hp, {"test_accuracy": self.test_acc, "test_loss": self.test_loss})
        self.metrics.close()
        return result

    @staticmethod
    def _exit_code(status: str) -> int:
        return {"ok": EXIT_OK, "SIGINT": EXIT_SIGINT, "SIGTERM": EXIT_SIGTERM}.get(status, EXIT_FAULT)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def run(cfg: Config, run_dir: str, env: Optional[DistEnv] = None) -> dict[str, Any]:
    return Leader(cfg, run_dir, env).run()
