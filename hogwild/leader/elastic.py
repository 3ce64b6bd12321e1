"""The elastic group (``elastic.coordinator=HOST:PORT``): each replica is launched on its own,
registers with the coordinator, and the group survives losing a replica.

- A failed collective (a peer killed, stopped or dropped) does not stop the job: the
  survivors form the next epoch's group (elastic/membership.py) and go on; their workers never stop.
- A (re)started replica is seen by the members during a round (each round's calls to the
  coordinator run beside it, on a thread of their own), joins after the next and, before its
  workers start, receives the live model, shared optimizer state, sync-rule state and counters from the
  most advanced member; its data positions come from the coordinator, where every
  leader publishes its own each round, so its shard resumes where its slot left off.
- Each member decides a peer's loss on its own, so a round can complete for some members and
  fail for others. Every new epoch first compares the rounds each member applied; a member
  that is behind takes the state of one that is not, so the group never splits over a round.
- The writer of checkpoints and ``metrics.json`` is the lowest slot of the current epoch,
  and only while it holds the run_dir lock (a dropped writer that comes back holds it and
  finds itself dropped before it writes again).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from hogwild import logs
from hogwild.checkpoint.resume import Restored, restore, resume_path
from hogwild.config.env import DistEnv
from hogwild.config.schema import Config
from hogwild.elastic.comm import ElasticComm
from hogwild.elastic.coordinator import FINISHED
from hogwild.elastic.ledger import Ledger
from hogwild.elastic.link import Batch, CoordinatorAway
from hogwild.elastic.membership import Dropped, Epoch, Membership
from hogwild.elastic.outputs import outputs_of
from hogwild.errors import Fault, StopNow, UserError
from hogwild.files import RunDirLock
from hogwild.leader.api import Control, Group, Here
from hogwild.replica.board import Board, Counts
from hogwild.replica.build import Replica
from hogwild.replica.models import model_id
from hogwild.report.summary import RunResult, Status
from hogwild.config.plan import Plan
from hogwild.sync.comm import Comm, PeerLost
from hogwild.sync.group import destroy_group
from hogwild.sync.rules import SyncRule

logger = logging.getLogger(__name__)


def job_fingerprint(cfg: Config, plan: Plan, params: int) -> str:
    """Everything every replica of one elastic job must agree on, refused in one line when a
    replica registers with another: the wire type (the group's collectives), the optimizer and its
    update path (the state a heal sends), the seed and batch size (the shards must not overlap),
    the fragment count and whether the wire may climb (every collective's size), row-sparse
    rounds (a union of rows is answered with rows, not a whole model), train.accumulate (the
    steps a climb of the wire counts) and a train.target (the final model's check is a collective
    only where one is set)."""
    data = cfg.data._target_ or cfg.data.name
    # The path decides the optimizer state a heal sends: one replica's barrier state means nothing
    # to a Hogwild replica's per-worker one.
    optim = f"{cfg.optim._target_ or cfg.optim.name}/{'shared' if plan.shared_state else 'worker'}/{plan.update}"
    sc = cfg.sync
    return (f"model={model_id(cfg.model)} params={params} data={data} optim={optim} sync.mode={sc.mode} "
            f"sync.dtype={sc.dtype} sync.fragments={sc.fragments} sync.compress={sc.compress} "
            f"sync.row_sparse={sc.row_sparse} "
            f"sync.weighting={sc.weighting} "
            f"workers={plan.workers} elastic.replicas={cfg.elastic.replicas} train.seed={cfg.train.seed} "
            f"train.batch_size={cfg.train.batch_size} train.accumulate={cfg.train.accumulate} "
            f"train.target={cfg.train.target.metric}/{cfg.train.target.value}")


class ElasticGroup(Group):
    """Membership: registering, forming each epoch's group, healing joiners and members left
    behind, and who writes; and around the leader's rounds, re-forming the group around lost and
    returning replicas, counting the job's steps while slots are away, and writing only while its
    epoch is current. It sees the replica only through the :class:`Here` handed to :meth:`start`."""

    def __init__(self, cfg: Config, ctl: Control, env: Optional[DistEnv] = None) -> None:
        ec = cfg.elastic
        assert ec.slot is not None and ec.coordinator is not None
        self.env = dataclasses.replace(env or DistEnv.from_env(), rank=ec.slot, world_size=ec.replicas)
        self.cfg, self.ctl = cfg, ctl
        self.connected = False  # the membership and its communicator exist from connect() on
        self.lock: Optional[RunDirLock] = None
        self.lock_refused = False
        self.is_writer = False  # decided by each epoch (see elect)
        self._ledger: Optional[Ledger] = None  # the job's counts and positions as this slot keeps them
        self.members: tuple[int, ...] = ()
        self.tally = {"replicas_lost": 0, "replicas_joined": 0}  # as this slot saw them, for TensorBoard
        self.round_t0 = time.monotonic()  # when the current round began (a survivor's stall counts from it)
        self._here: Optional[Here] = None
        self._calls: Optional[Batch[bool]] = None  # this round's calls to the coordinator (before_round)
        self._changed = False  # the last round's calls saw a newer epoch or a join request

    @property
    def writer(self) -> bool:
        return self.is_writer

    # ---------------------------------------------------------------- setup
    def connect(self, cfg: Config, run_dir: Path, rep: Replica) -> tuple[Comm, Path]:
        """Register with the coordinator (the group itself forms in :meth:`start`); the folder this
        slot writes to is its own ``run_dir``, or the job's if it was given none (elastic/outputs.py)."""
        sc, ec = cfg.sync, cfg.elastic
        assert ec.coordinator is not None
        # Here, not in __init__: the leader's signal handlers are installed by now, so a SIGTERM
        # while the coordinator is slow to answer stops this replica cleanly.
        self.membership = Membership(ec.coordinator, self.env.rank, self.env.world_size, ec.peer_timeout_s,
                                     ec.min_replicas, sc.timeout_s, lambda: self.ctl.signalled)
        # Its parts, each for its concern: the job's keys at the coordinator, and liveness.
        self.keys, self.liveness = self.membership.keys, self.membership.liveness
        self.comm = ElasticComm(self.membership, sc.timeout_s)
        self.connected = True
        job_dir = self.keys.agree_job(job_fingerprint(cfg, rep.plan, rep.flat.numel()), str(run_dir))
        run_dir = outputs_of(self.env.rank, run_dir, job_dir)
        # Before this process touches anything in run_dir: a second process started in a live
        # slot would otherwise truncate that slot's progress board (its data positions) before
        # being refused.
        self.membership.claim()
        self._ledger = Ledger(self.env.world_size, rep.plan.workers)
        return self.comm, run_dir

    def restore(self, cfg: Config, run_dir: Path, rep: Replica, board: Board, rule: SyncRule,
                previous: Optional[tuple[float, float]]) -> Optional[Restored]:
        """Every slot restores the same checkpoint itself (no group exists yet); a live peer's
        state, if any, replaces it when this slot joins."""
        del previous  # steps lost on resume need a collective over every slot; not reported here
        path = resume_path(cfg.resume, run_dir, True, lambda p: p)
        if path is None:
            return None
        restored, sync_state = restore(path, model_id(cfg.model), rep, board, self.env.rank, self.env.world_size)
        rule.load_state_dict(sync_state)
        self.ledger.restored(restored.positions)
        return restored

    @property
    def here(self) -> Here:
        assert self._here is not None, "the replica is handed over at start()"
        return self._here

    def start(self, here: Here) -> None:
        """Join the running group (or form the first one) before the workers start."""
        self._here = here
        t0 = time.monotonic()
        # Its heartbeat shows how far its restored state is, for the choice of a heal source.
        self.liveness.tick(here.syncs, here.steps)
        self._enter(self.membership.join(), fresh=True)
        self.keys.put(f"heal/{self.membership.epoch.number}/{self.env.rank}", str(time.monotonic() - t0))
        here.scalar("elastic/heal_s", time.monotonic() - t0)

    # ------------------------------------------------------------ membership
    def _enter(self, ep: Epoch, fresh: bool = False) -> None:
        self.comm.form(ep)
        source, behind = self._agree(ep)
        if source is not None and (ep.joiners or behind):
            self._heal(ep, source, behind, fresh)
        self.membership.settled(ep)  # only now: a joiner whose group or heal failed is healed in the next epoch
        self.elect()
        if self.members:
            self.tally["replicas_lost"] += (len(set(self.members) - set(ep.members))
                                            + len(set(ep.joiners) & set(self.members)))
            self.tally["replicas_joined"] += len(ep.joiners)
        self.members = ep.members
        for tag, value in (("epoch", ep.number), ("members", len(ep.members)), *self.tally.items()):
            self.here.scalar(f"elastic/{tag}", value)
        logs.stamp(slot=self.env.rank, epoch=ep.number)
        logger.info("members %s, rank %d of %d%s", list(ep.members), self.comm.rank, self.comm.world_size,
                    " (writer)" if self.writer else "")

    def _agree(self, ep: Epoch) -> tuple[Optional[int], tuple[int, ...]]:
        """(heal source, members a round behind it), from one small gather of the rounds each
        member applied. A round whose collective completed for some members and failed for
        others leaves them apart; the ones behind take the state of one that is not (its model,
        and above all its outer-rule state, which no later round would bring back together)."""
        got = self.comm.all_gather(torch.tensor([self.here.syncs], dtype=torch.int64))
        applied = dict(zip(ep.members, (int(g) for g in got)))
        live = [s for s in ep.members if s not in ep.joiners]
        if not live:
            return ep.source, ()
        top = max(applied[s] for s in live)
        source = ep.source if ep.source in live and applied[ep.source] == top else \
            min(s for s in live if applied[s] == top)
        return source, tuple(s for s in live if applied[s] < top)

    def _heal(self, ep: Epoch, source: int, behind: tuple[int, ...], fresh: bool) -> None:
        here, mine = self.here, self.env.rank == source
        # Every slot (re)started (source is a joiner): the coordinator's positions and totals are
        # from rounds after any checkpoint, so they come from the source's restore point instead.
        restart = source in ep.joiners
        restored = self.ledger.restored_positions if restart else None
        state = {**here.state_dict(), "positions": restored} if mine else None
        if mine and restart:
            self._reset_absent(ep)
        got = self.comm.send_state(state, ep.members.index(source))
        if mine or (self.env.rank not in ep.joiners and self.env.rank not in behind):
            if restart:
                self.publish()
            return
        if self.env.rank in behind:  # a live member: its counters and positions are its own
            logger.warning("applied %d rounds, slot %d applied %d (a round failed here and completed "
                           "there): took slot %d's state", here.syncs, source, int(got["syncs"]), source)
            here.load_state_dict(got, counters=False)
            return
        here.load_state_dict(got)
        if restart:  # this slot's position in the source's checkpoint (its shard's start if none)
            table = got["positions"]
            here.resume_at(table[self.env.rank].numpy() if table is not None else np.zeros(here.workers))
            self.ledger.carry(None)
            self.publish()  # what an earlier lineage left at the coordinator must not be read again
        else:
            pos = self.keys.fetch_as(f"pos/{self.env.rank}", floats(here.workers)) if fresh else None
            if pos is not None:  # workers not started: resume this slot's shard
                here.resume_at(pos)
            counts = floats(Counts().to_tensor().numel())
            done = self.keys.fetch_as(f"done/{self.env.rank}", counts) if fresh else None
            if done is not None:  # and count on from its earlier processes' totals at their last round
                self.ledger.carry(torch.from_numpy(done))
        here.rebase()
        steps = here.optimizer_steps()
        logger.info("healed from slot %d (step %d, %d syncs%s)", source, here.steps, here.syncs,
                    f", the replica's optimizer state at its step {steps}" if steps is not None else "")

    def _reset_absent(self, ep: Epoch) -> None:
        """A group of joiners only goes back to the source's restore point. The slots outside it
        left at the coordinator the positions and totals of the lineage that went back: read by
        :meth:`job` and :meth:`positions`, and by such a slot when it joins later, they
        counted its steps before the checkpoint twice and skipped its data after it. The restore
        point's positions replace them, and zero totals: its steps up to the checkpoint are in the
        counters every member restored. Set before the state is sent, so no later epoch can admit
        such a slot before they are in place; set, not kept (JobKeys.put), so a coordinator
        restart never puts them back over what the slot itself publishes later."""
        table = self.ledger.restored_positions
        for s in range(self.env.world_size):
            if s in ep.members:
                continue
            pos = table[s].numpy() if table is not None else np.zeros(self.here.workers)
            try:
                for key, raw in slot_record(s, pos, Counts()).items():
                    self.keys.set(key, raw)
            except CoordinatorAway:  # the stale ones stay: say so, a resume would show it
                logger.warning("the coordinator went away before slot %d's positions were reset", s)

    def elect(self) -> None:
        """The current epoch's lowest member writes, while it holds the run_dir lock: a dropped
        writer may still hold it, and may let it go at any round."""
        writer = self.comm.rank == 0
        if writer and self.lock is None:
            lock = RunDirLock(self.here.run_dir)
            try:
                lock.acquire()
                self.lock = lock
            except UserError as e:  # a dropped writer still holds it: nobody writes until it lets go
                if not self.lock_refused:
                    logger.warning("%s", e)
                self.lock_refused = True
        if not writer and self.lock is not None:
            self.lock.release()
            self.lock = None
        self.is_writer = writer and self.lock is not None

    def resign(self) -> None:
        """Write nothing more: this member is outside every group it could form."""
        self.is_writer = False

    def regroup(self) -> None:
        """Move to the next epoch, whatever the reason; rejoin if the others dropped us."""
        self.settle()
        self._changed = False  # what the last rounds saw is what this epoch answers
        while True:
            try:
                try:
                    ep = self.membership.advance()
                except Dropped as d:
                    logger.warning("%s; rejoining as a new member (no writes until then)", d)
                    self.is_writer = False
                    ep = self.membership.join()
                self._enter(ep)
                return
            except PeerLost as e:  # a member died while the group formed: next epoch
                logger.warning("%s", e)

    def publish(self, record: Optional[dict[str, bytes]] = None) -> None:
        """This slot's data positions and totals (``record``: as :meth:`record` took them; default:
        now), for a restarted slot to go on from and for the job's count while the slot is away."""
        for key, raw in (record or self.record()).items():
            self.keys.put(key, raw)

    def record(self) -> dict[str, bytes]:
        """This slot's data positions and totals as they are now, taken together."""
        totals = Counts.from_tensor(self.ledger.own(self.here.totals().to_tensor()))
        return slot_record(self.env.rank, self.here.positions(), totals)

    @property
    def ledger(self) -> Ledger:
        assert self._ledger is not None, "the ledger exists from connect() on"
        return self._ledger

    def positions(self, here: Here) -> torch.Tensor:
        """Every slot's data positions (collective): the members' as they are now, gathered in the
        group next to the totals, and an absent slot's as it published them at its last round,
        as its totals are counted (see :meth:`job`). The members' never come from the
        coordinator: while it is away it holds old positions, which beside fresh totals would make
        a resume read their shards again."""
        mine = torch.from_numpy(here.positions())
        members = dict(zip(self.membership.epoch.members, self.comm.all_gather(mine)))
        fetch = lambda s: self.keys.fetch_as(f"pos/{s}", floats(here.workers))  # noqa: E731
        return self.ledger.positions(members, self.absent(), fetch)

    def absent(self) -> list[int]:
        return [s for s in range(self.env.world_size) if s not in self.membership.epoch.members]

    def _settle_quietly(self) -> None:
        """:meth:`settle` at the job's end, where what the last calls raised no longer matters."""
        try:
            self.settle()
        except Exception:  # noqa: BLE001
            logger.debug("the last round's calls to the coordinator failed", exc_info=True)

    def close(self, degraded: bool) -> None:
        self._settle_quietly()
        if not degraded:
            destroy_group()
        if self.lock is not None:
            self.lock.release()
        if self.connected:
            self.comm.abandon(midway=degraded)
            self.membership.close()

    # ------------------------------------------------ what members that change add
    def progress(self, rounds: Optional[int] = None, steps: Optional[int] = None) -> None:
        if rounds is not None:
            self.liveness.tick(rounds, steps)
        elif self.connected:
            self.liveness.moving()

    def before_round(self) -> bool:
        # A round's calls to the coordinator (this slot's positions and totals, the epoch, the join
        # requests) run on a thread of their own while the round goes on: made here, before the
        # round, they held every round for its slowest member's answers (150 ms a round at R = 32
        # on one host) and let each member's workers run 4-5 steps past the interval. Made after
        # the round, every member made them at the same moment (docs/scale.md). The four run on one
        # thread, one after the other, not on a thread each. What they publish is taken here,
        # before the round's snapshot; what they see is acted on at the next round.
        self.round_t0 = time.monotonic()
        self.settle()
        record = self.record()
        self.elect()  # the writer may take the lock a dropped writer has let go
        away = self.keys.away_for()
        if away > self.cfg.sync.timeout_s:  # the group could not change any more: stop while it is whole
            self.ctl.fail(f"elastic.coordinator {self.membership.endpoint} unreachable for {away:.0f}s "
                          "(sync.timeout_s); stopping with a final sync and checkpoint")
        asks = not self.ctl.stopping and self._changed
        try:
            self._calls = self.membership.start(lambda: self._round_calls(record), "a round's calls")
        except CoordinatorAway:
            # An earlier batch is still blocked there: none this round. Publishing keeps the record
            # in this member's memory (its sets fail at once), so a restore after the outage puts
            # back this round's positions, not the last ones before it.
            self._calls = None
            self.publish(record)
        return asks

    def _round_calls(self, record: dict[str, bytes]) -> bool:
        self.publish(record)
        return self.membership.changed()

    def settle(self) -> None:
        """Wait for the last round's calls to the coordinator (long done, unless it is slow), and
        raise what they raised: the membership is the leader's thread's again."""
        calls, self._calls = self._calls, None
        if calls is None:
            return
        try:
            self._changed = calls.result()
        except CoordinatorAway:  # past their deadline: the coordinator counts as away
            self._changed = False

    def reform(self) -> None:
        try:
            self.regroup()
        except StopNow:  # stopped while the group re-formed: the lost-group path stops it cleanly
            raise PeerLost("sync: stopped by a signal while the group re-formed") from None

    def recover(self, e: PeerLost) -> Optional[str]:
        logger.warning("%s; re-forming the group", e)
        try:
            self.regroup()
        except (Fault, StopNow) as f:  # no quorum in time, or a signal: a minority stops, never writes
            self.resign()
            return super().recover(PeerLost(str(f) or "sync: stopped by a signal while waiting for a group"))
        stall = time.monotonic() - self.round_t0
        self.keys.put(f"stall/{self.membership.epoch.number}/{self.env.rank}", str(stall))
        self.here.scalar("elastic/survivor_stall_s", stall)
        return None

    def may_write(self, alone: bool = False) -> bool:
        if alone:
            # A healed writer knows the others only from its first gather: before it, a checkpoint of
            # its own would hold their positions at zero and the job's steps at its own.
            return self.keys.away_for() == 0.0 and self.here.has_view
        # A writer that was stopped past the timeout wakes up believing it still writes; the
        # others have moved on. One look at the epoch before each write keeps it out.
        # While the coordinator is away, the collective that gathered the totals just now is the
        # proof that this group is whole and current (a write alone, which has none, waits).
        try:
            newer = self.membership.current() != self.membership.epoch.number
        except CoordinatorAway:
            newer = False
        if self.writer and newer:
            logger.warning("a newer group exists; not writing")
        return not newer

    def own(self, totals: Counts) -> Counts:
        return Counts.from_tensor(self.ledger.own(totals.to_tensor()))

    def job(self, members: Counts) -> Counts:
        """The members' totals plus, for each slot outside this epoch, its totals as it published
        them at its last round: the group merged those updates, and a slot lost for good must
        not take them out of the job's count. (A slot that comes back carries the same totals
        into its own, so nothing counts twice.)"""
        total = members.to_tensor()
        fetch = lambda s: self.keys.fetch_as(f"done/{s}", floats(total.numel()))  # noqa: E731
        return Counts.from_tensor(self.ledger.job(total, self.absent(), fetch))

    def finish(self, result: RunResult) -> RunResult:
        self._settle_quietly()
        if self.ctl.degraded:
            return result
        self.keys.put(FINISHED, str(self.membership.epoch.number))  # a replica that wakes later exits
        if self.comm.rank == 0 and not self.writer:
            return dataclasses.replace(
                result, status=Status.FAILED, exit_code=Status.FAILED.exit_code,
                error=f"no metrics.json and no final checkpoint: the run_dir lock is held by a dropped "
                      f"writer (its pid is in {self.here.run_dir}/.hogwild.lock)")
        return result

    def report(self) -> dict[str, Any]:
        history = self.membership.history()
        lost = sum(len(set(a.members) - set(b.members)) + len(set(b.joiners) & set(a.members))
                   for a, b in zip(history, history[1:]))
        joined = sum(len(ep.joiners) for ep in history[1:])
        seconds = lambda key: self.keys.fetch_as(key, float)  # noqa: E731
        heal = [seconds(f"heal/{ep.number}/{s}") for ep in history[1:] for s in ep.joiners]
        stall = [seconds(f"stall/{ep.number}/{s}") for ep in history[1:] for s in ep.members if s not in ep.joiners]
        return {"elastic": True, "epochs": len(history), "replicas_lost": lost, "replicas_joined": joined,
                "heal_s": max((h for h in heal if h is not None), default=0.0),
                "survivor_stall_s": max((s for s in stall if s is not None), default=0.0),
                "slot_positions": self.ledger.report()}


def slot_record(slot: int, positions: np.ndarray, totals: Counts) -> dict[str, bytes]:
    """A slot's data positions and totals as the coordinator holds them (read back with
    :func:`floats`)."""
    return {f"pos/{slot}": np.asarray(positions, dtype=np.float64).tobytes(),
            f"done/{slot}": totals.to_tensor().numpy().tobytes()}


def floats(n: int) -> Callable[[bytes], np.ndarray]:
    """A parser of ``n`` float64 values as a leader publishes them (raises ValueError otherwise)."""
    def parse(raw: bytes) -> np.ndarray:
        if len(raw) != 8 * n:
            raise ValueError(f"{len(raw)} bytes, {8 * n} expected")
        return np.frombuffer(raw, dtype=np.float64).copy()
    return parse
