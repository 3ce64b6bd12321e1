"""The leader in elastic mode (``sync.coordinator=HOST:PORT``): each replica is launched on
its own, registers with the coordinator, and the group survives losing a replica.

- A failed collective (a peer killed, stopped or dropped) does not stop the job: the
  survivors form the next epoch's group (elastic/membership.py) and go on; their workers never stop.
- A (re)started replica joins at the group's next round and, before its workers start,
  receives the live model, shared optimizer state, sync-rule state and counters from the
  lowest surviving member; its data positions come from the coordinator, where every
  leader publishes its own each round, so its shard resumes where its slot left off.
- The writer of checkpoints and ``metrics.json`` is the lowest slot of the current epoch,
  and only while it holds the run_dir lock (a dropped writer that comes back holds it and
  finds itself dropped before it writes again).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from hogwild.replica.board import Totals
from hogwild.sync.comm import PeerLost
from hogwild.config.schema import Config
from hogwild.elastic.link import CoordinatorAway
from hogwild.config.env import DistEnv
from hogwild.elastic.comm import ElasticComm
from hogwild.errors import EXIT_FAULT, Fault, UserError
from hogwild.files import RunDirLock
from hogwild.leader.core import Leader
from hogwild.elastic.membership import Dropped, Epoch, Membership
from hogwild.replica.models import model_id
from hogwild.checkpoint.resume import Counters, Restored, restore, resume_path
from hogwild.leader.stopping import StopNow

logger = logging.getLogger(__name__)


class ElasticLeader(Leader):
    def __init__(self, cfg: Config, run_dir: str, env: Optional[DistEnv] = None) -> None:
        sc = cfg.sync
        assert sc.slot is not None
        base = env or DistEnv.from_env()
        super().__init__(cfg, run_dir, dataclasses.replace(base, rank=sc.slot, world_size=sc.replicas))
        self.is_rank0 = False  # the writer is decided by each epoch (see _became)
        self._lock_refused = False
        self._round_t0 = time.monotonic()
        self.carried: Optional[torch.Tensor] = None  # earlier processes' totals of this slot (_heal)
        self._members: tuple[int, ...] = ()
        self._tally = {"replicas_lost": 0, "replicas_joined": 0}  # as this slot saw them, for TensorBoard

    # ---------------------------------------------------------------- setup
    def _connect(self) -> None:
        """Register with the coordinator (the group itself forms in _start_barrier)."""
        sc, rep = self.cfg.sync, self.rep
        assert sc.coordinator is not None
        self.m = Membership(sc.coordinator, self.env.rank, self.env.world_size, sc.peer_timeout_s,
                            sc.min_replicas, sc.timeout_s, lambda: self.stopper.signal is not None)
        fingerprint = (f"model={model_id(self.cfg.model)} params={rep.flat.numel()} sync.mode={sc.mode} "
                       f"workers={self.k} sync.replicas={sc.replicas}")
        self.run_dir = Path(self.m.agree_job(fingerprint, str(self.run_dir)))
        self.comm = ElasticComm(self.m, sc.timeout_s)
        self.positions = torch.zeros(self.env.world_size, self.k, dtype=torch.float64)

    def _resume(self, previous: Optional[tuple[float, float]]) -> Optional[Restored]:
        """Every slot restores the same checkpoint itself (no group exists yet); a live peer's
        state, if any, replaces it when this slot joins."""
        del previous  # steps lost on resume need a collective over every slot; not reported here
        path = resume_path(self.cfg.resume, self.run_dir, True, lambda p: p)
        if path is None:
            return None
        restored, sync_state = restore(path, model_id(self.cfg.model), self.rep.shapes, self.rep.flat,
                                       self.rep.opt_state, self.board, self.env.rank, self.env.world_size)
        self.rule.load_state_dict(sync_state)
        return restored

    def _start_barrier(self) -> None:
        """Join the running group (or form the first one) before the workers start."""
        t0 = time.monotonic()
        self._enter(self.m.join(), fresh=True)
        self.m.put(f"heal/{self.m.epoch.number}/{self.env.rank}", str(time.monotonic() - t0))
        self._tb("heal_s", time.monotonic() - t0)

    # ------------------------------------------------------------ membership
    def _enter(self, ep: Epoch, fresh: bool = False) -> None:
        self.comm.form(ep)
        if ep.joiners and ep.source is not None:
            self._heal(ep, fresh)
        self._became(ep)
        if self._members:
            self._tally["replicas_lost"] += len(set(self._members) - set(ep.members)) + len(set(ep.joiners) & set(self._members))
            self._tally["replicas_joined"] += len(ep.joiners)
        self._members = ep.members
        for tag, value in (("epoch", ep.number), ("members", len(ep.members)), *self._tally.items()):
            self._tb(tag, value)
        logger.info("slot %d in epoch %d: members %s, rank %d of %d%s", self.env.rank, ep.number,
                    list(ep.members), self.comm.rank, self.comm.world_size, " (writer)" if self.is_rank0 else "")

    def _heal(self, ep: Epoch, fresh: bool) -> None:
        assert ep.source is not None
        src = ep.members.index(ep.source)
        mine = self.env.rank == ep.source
        state = {"flat": self.rep.flat, "opt": self.rep.opt_state or {}, "sync": self.rule.state_dict(),
                 "counters": dataclasses.asdict(self.base), "syncs": self.rounds.syncs} if mine else None
        got = self.comm.send_state(state, src)
        if self.env.rank not in ep.joiners:
            return
        with torch.no_grad():
            self.rep.flat.copy_(got["flat"])
            for name, buf in (self.rep.opt_state or {}).items():
                buf.copy_(got["opt"][name])
        self.rule.load_state_dict(got["sync"])
        self.base = Counters.from_dict(got["counters"])
        self.board.control["base_steps"] = self.base.steps
        self.rounds.syncs = int(got["syncs"])
        pos = self.m.link.fetch(f"pos/{self.env.rank}") if fresh else None
        if pos is not None:  # workers not started: resume this slot's shard
            self.board.stats["pos"] = np.frombuffer(pos, dtype=np.float64).copy()
        done = self.m.link.fetch(f"done/{self.env.rank}") if fresh else None
        if done is not None:  # and count on from its earlier processes' totals at their last round
            self.carried = torch.from_numpy(np.frombuffer(done, dtype=np.float64).copy())
        self.rounds.rebase()
        logger.info("slot %d healed from slot %d (step %d, %d syncs)", self.env.rank, ep.source,
                    self.base.steps, self.rounds.syncs)

    def _became(self, ep: Epoch) -> None:
        writer = self.comm.rank == 0
        if writer and self.lock is None:
            lock = RunDirLock(self.run_dir)
            try:
                lock.acquire()
                self.lock = lock
            except UserError as e:  # a dropped writer still holds it: nobody writes until it lets go
                if not self._lock_refused:
                    logger.warning("slot %d: %s", self.env.rank, e)
                self._lock_refused = True
        if not writer and self.lock is not None:
            self.lock.release()
            self.lock = None
        self.is_rank0 = writer and self.lock is not None

    def _regroup(self) -> None:
        """Move to the next epoch, whatever the reason; rejoin if the others dropped us."""
        while True:
            try:
                try:
                    ep = self.m.advance()
                except Dropped as d:
                    logger.warning("%s; rejoining as a new member (no writes until then)", d)
                    self.is_rank0 = False
                    ep = self.m.join()
                self._enter(ep)
                return
            except PeerLost as e:  # a member died while the group formed: next epoch
                logger.warning("slot %d: %s", self.env.rank, e)

    # ----------------------------------------------------------------- hooks
    def _round(self, done: bool, stop: bool, final: bool = False) -> tuple[bool, bool]:
        self._round_t0 = time.monotonic()
        self.m.put(f"pos/{self.env.rank}", self.board.stats["pos"].astype(np.float64).tobytes())
        self.m.put(f"done/{self.env.rank}", self._own().to_tensor().numpy().tobytes())
        return super()._round(done, stop, final)

    def _reform_wanted(self) -> bool:
        self._became(self.m.epoch)  # the writer may take the lock a dropped writer has let go
        away = self.m.memory.away_for()
        if away > self.cfg.sync.timeout_s:  # the group could not change any more: stop while it is whole
            self._fail(f"sync.coordinator {self.m.endpoint} unreachable for {away:.0f}s (sync.timeout_s); "
                       "stopping with a final sync and checkpoint")
        return self.stopper.signal is None and self.fault is None and self.m.changed()

    def _reform(self) -> None:
        try:
            self._regroup()
        except StopNow:  # stopped while the group re-formed: the lost-group path stops it cleanly
            raise PeerLost("sync: stopped by a signal while the group re-formed") from None

    def _recover(self, e: PeerLost) -> bool:
        logger.warning("slot %d: %s; re-forming the group", self.env.rank, e)
        try:
            self._regroup()
        except (Fault, StopNow) as f:  # no quorum in time, or a signal: a minority stops, never writes
            self.is_rank0 = False
            return super()._recover(PeerLost(str(f) or "sync: stopped by a signal while waiting for a group"))
        stall = time.monotonic() - self._round_t0
        self.m.put(f"stall/{self.m.epoch.number}/{self.env.rank}", str(stall))
        self._tb("survivor_stall_s", stall)
        return True

    def _tb(self, tag: str, value: float) -> None:
        """TensorBoard's ``elastic/*`` as they happen (from slot 0's leader, the TensorBoard writer)."""
        self.tel.metrics.scalar(f"elastic/{tag}", value, self.base.steps + self.board.applied())

    def _finish(self, train_s: float) -> dict[str, Any]:
        result = super()._finish(train_s)
        if not self.degraded:
            self.m.put("finished", str(self.m.epoch.number))  # a replica that wakes later exits
            if self.comm.rank == 0 and not self.is_rank0:
                result.update(status="failed", exit_code=EXIT_FAULT,
                              error=f"no metrics.json and no final checkpoint: the run_dir lock is held by a dropped "
                                    f"writer (its pid is in {self.run_dir}/.hogwild.lock)")
        return result

    def _write(self, positions: torch.Tensor, job: Any) -> None:
        # A writer that was stopped past the timeout wakes up believing it still writes; the
        # others have moved on. One look at the epoch before each write keeps it out.
        # While the coordinator is away, the collective that gathered ``job`` just now is the proof
        # that this group is whole and current (_write_local, which has none, waits).
        try:
            newer = self.m.current() != self.m.epoch.number
        except CoordinatorAway:
            newer = False
        if self.is_rank0 and newer:
            logger.warning("slot %d: a newer group exists; not writing", self.env.rank)
            self.next_ckpt = time.monotonic() + self.cfg.checkpoint.every_s
            return
        super()._write(positions, job)

    def _own(self) -> Totals:
        own = super()._own()
        return own if self.carried is None else Totals.from_tensor(own.to_tensor() + self.carried)

    def _write_local(self) -> None:
        if self.m.memory.away_since is None:
            super()._write_local()
        else:
            self.next_ckpt = time.monotonic() + self.cfg.checkpoint.every_s

    def _gather_positions(self) -> torch.Tensor:
        """Every slot's positions as published at its last round (a lost slot's stay put)."""
        for s in range(self.env.world_size):
            raw = self.m.link.fetch(f"pos/{s}")
            if raw is not None:
                self.positions[s] = torch.from_numpy(np.frombuffer(raw, dtype=np.float64).copy())
        self.positions[self.env.rank] = torch.from_numpy(self.board.stats["pos"].astype(np.float64))
        return self.positions.clone()

    def _report_extra(self) -> dict[str, Any]:
        history = self.m.history()
        lost = sum(len(set(a.members) - set(b.members)) + len(set(b.joiners) & set(a.members))
                   for a, b in zip(history, history[1:]))
        joined = sum(len(ep.joiners) for ep in history[1:])
        heal = [self._float(f"heal/{ep.number}/{s}") for ep in history[1:] for s in ep.joiners]
        stall = [self._float(f"stall/{ep.number}/{s}") for ep in history[1:] for s in ep.members
                 if s not in ep.joiners]
        return {"elastic": True, "epochs": len(history), "replicas_lost": lost, "replicas_joined": joined,
                "heal_s": max((h for h in heal if h is not None), default=0.0),
                "survivor_stall_s": max((s for s in stall if s is not None), default=0.0),
                "slot_positions": self.positions.sum(dim=1).tolist()}

    def _float(self, key: str) -> Optional[float]:
        raw = self.m.link.fetch(key)
        return None if raw is None else float(raw)

    def run(self) -> dict[str, Any]:
        try:
            return super().run()
        finally:
            if isinstance(getattr(self, "comm", None), ElasticComm):
                self.comm.abandon()
            if hasattr(self, "m"):
                self.m.close()
