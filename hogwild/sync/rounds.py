"""One sync round on the live buffer while the workers train (:func:`sync_round`), and this
replica's bookkeeping of its rounds (count, timings, drift, next sync point)."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Optional, Union

import torch
from torch import Tensor

from hogwild.config.sync import wire_label
from hogwild.errors import Fault
from hogwild.replica.board import Board
from hogwild.sync.comm import Comm, LinkMeter
from hogwild.sync.digest import digest, hex_of
from hogwild.sync.ladder import Ladder
from hogwild.sync.rows import Gathered
from hogwild.sync.rules import RoundFlags, RoundVector, SyncRule, context
from hogwild.sync.schedule import DriftRecord, SyncSchedule, paced_interval

logger = logging.getLogger(__name__)


@dataclass
class RoundOutcome:
    all_done: bool
    any_stop: bool
    checkpoint: bool
    reached: bool
    """Some replica reached train.target_accuracy: the whole job ends after this round."""
    reform: bool
    """Elastic mode: some leader saw a joiner or a newer epoch; all re-form after this round."""
    healthy: bool
    """This replica's snapshot was finite (else it was restored from the consensus)."""
    drift: float
    """This replica's ``||snap - target|| / ||target||`` in this round."""
    last_drifts: list[float]
    """Every replica's drift of the previous round (piggybacked; inf where unhealthy)."""
    paces: list[tuple[float, float]] = field(default_factory=list)
    """Every replica's wanted intervals, from its previous round's time and its leader's CPU
    (piggybacked; 0: none)."""
    speeds: list[float] = field(default_factory=list)
    """Every replica's steps a second of its workers' time since its previous round (0: none)."""
    stats: Optional["RoundStats"] = None
    """Filled by :meth:`Rounds.run`: what the round cost and measured, for the caller to log."""


@dataclass
class RoundStats:
    """One round's figures. Rounds never write TensorBoard: the leader hands these to its
    telemetry, so the sync package knows nothing of reporting."""

    step: int
    """This replica's position when the round ended (the x axis)."""
    seconds: float
    steps_between: Optional[float] = None
    """Replica steps since the previous round's snapshot (None for a finishing round)."""
    drift: Optional[DriftRecord] = None
    """The previous round's drift over every replica, once measured."""
    link: LinkMeter = field(default_factory=LinkMeter)
    """What this replica's round put on the link (bytes each way, seconds in collectives)."""


@dataclass(frozen=True)
class Measures:
    """What a replica sends with a round besides its values (its slots of the control vector)."""

    last_drift: float = 0.0
    """Its drift in the previous round."""
    weight: float = 1.0
    """Its share of the consensus (``sync.weighting``)."""
    pace: tuple[float, float] = (0.0, 0.0)
    """The intervals its previous round's time and its leader's CPU ask for (sync/schedule.py)."""
    speed: float = 0.0
    """Its steps a second of its workers' time since its last round (``sync.interval_by_speed``)."""


def sync_round(flat: Tensor, rule: SyncRule, flags: RoundFlags = RoundFlags(), mine: Measures = Measures(), *,
               timeout_s: float = 300.0) -> RoundOutcome:
    """One round on the live buffer ``flat`` while workers may keep writing to it; ``mine``: what
    this replica sends with it.

    ``snap = flat.clone(); target = rule(snap); flat += target - snap``: updates applied
    during the collective survive (design rule 2 in docs/design.md). A ``final`` round (workers
    stopped) lands the replica exactly on ``target`` so every replica ends bit-for-bit identical.
    A fragmented rule syncs one stretch of ``flat`` per round (all of them in the final one).
    """
    rank, world, final = rule.comm.rank, rule.comm.world_size, flags.final
    regions = rule.plan(flat.numel(), final, timeout_s)
    # A gathered stretch (row-sparse rounds) holds every value that moved: the rest cannot be NaN.
    whole = len(regions) == 1 and (isinstance(regions[0], Gathered) or regions[0] == slice(0, flat.numel()))
    # Health covers the whole model even when one fragment travels: a NaN elsewhere would
    # otherwise wait F rounds for its fragment while the workers train on it.
    healthy = True if whole else math.isfinite(float(flat.norm()))
    R = RoundVector
    ctl = R.new(flags, world, flat)
    ctl[R.drift_slot(world, rank)] = mine.last_drift  # non-finite values are dropped by the reader
    ctl[R.pace_slot(world, rank)], ctl[R.cpu_pace_slot(world, rank)] = mine.pace
    ctl[R.speed_slot(world, rank)] = mine.speed
    red: Optional[Tensor] = None
    gaps, scales = 0.0, 0.0
    for region in regions:
        snap = _read(flat, region, rule)
        # One reduction instead of an isfinite mask: NaN/Inf anywhere make the norm non-finite. The
        # same pass gives the scale of the drift, so the round reads the buffer once less.
        scale = float(snap.norm())
        healthy = healthy and math.isfinite(scale)
        ctl[R.healthy_slot(rank)] = float(healthy)
        ctl[R.weight_slot(world, rank)] = mine.weight if healthy else 0.0
        target, got = rule.exchange(snap, ctl, rank, timeout_s, final)
        red = got if red is None else red  # a final round's later fragments reduce the same flags
        if context(red, rank).n_healthy == 0:
            raise Fault("sync: every replica holds non-finite parameters; nothing to sync from "
                        "(lower optim.lr, or resume from the last good checkpoint)")
        with torch.no_grad():
            delta = torch.sub(target, snap, out=snap)  # the snapshot's last use: its memory takes the change
            # Drift: this replica's distance to the consensus, relative to its size. A rule that steps
            # past the replicas' mean (outer momentum) measured it to that mean on the way.
            gap = rule.spread if rule.spread is not None else float(delta.norm())
            gaps, scales = gaps + gap * gap, scales + scale * scale
            _apply(flat, region, target if final or not healthy else delta, exact=final or not healthy)
    assert red is not None
    drift = math.sqrt(gaps) / max(math.sqrt(scales), 1e-12) if healthy else math.inf
    f = red.cpu()
    agreed, d0, p0, c0 = R.agreed(f), R.drift_slot(world, 0), R.pace_slot(world, 0), R.cpu_pace_slot(world, 0)
    s0 = R.speed_slot(world, 0)
    return RoundOutcome(all_done=agreed.done, any_stop=agreed.stop, checkpoint=agreed.checkpoint,
                        reached=agreed.reached, reform=agreed.reform, healthy=healthy, drift=drift,
                        last_drifts=f[d0:d0 + world].tolist(),
                        paces=list(zip(f[p0:p0 + world].tolist(), f[c0:c0 + world].tolist())),
                        speeds=f[s0:s0 + world].tolist())


def _read(flat: Tensor, region: Union[slice, Gathered], rule: SyncRule) -> Tensor:
    """The round's snapshot of ``region``, in a buffer the rule keeps across rounds."""
    if isinstance(region, Gathered):
        return region.read(flat, rule.scratch("snapshot", region.numel, flat))
    live = flat[region]
    return rule.scratch("snapshot", live.numel(), flat).copy_(live)


def _apply(flat: Tensor, region: Union[slice, Gathered], values: Tensor, exact: bool) -> None:
    """Land ``region`` on ``values`` (``exact``), or move it by them while workers write."""
    if isinstance(region, Gathered):
        (region.write if exact else region.add)(flat, values)
    elif exact:
        flat[region].copy_(values)
    else:
        flat[region].add_(values)


@dataclass
class SyncStats:
    """Every replica's rounds, summed up after the final one."""

    mean_sync_s: float = 0.0
    """Wall time of one round in a leader, including any wait for a slower replica."""
    steps_per_sync: float = 0.0
    """The real interval: a replica's mean steps between the snapshots of two rounds."""
    max_steps_per_sync: float = 0.0
    """The largest such gap of any replica (at most ``interval + max_lag`` with one worker)."""
    steps_per_sync_by_replica: list[float] = field(default_factory=list)
    """Each replica's mean steps between snapshots, by rank (``sync.interval_by_speed``: a slower
    replica's are fewer)."""
    final: Optional[RoundStats] = field(default=None, repr=False)
    """The final round's drift, which no later round carries."""
    link: LinkMeter = field(default_factory=LinkMeter)
    """A replica's rounds over the whole run, the mean over replicas."""
    peak_memory_mb: list[Optional[float]] = field(default_factory=list)
    """Each replica's peak memory as its leader measured it, by rank (None: not measured)."""
    cpu_s: float = 0.0
    """A leader's CPU seconds in its rounds over the run (every thread of its process), the mean
    over replicas: what the rounds took from the cores the workers use."""
    final_state: list[dict[str, object]] = field(default_factory=list)
    """Each replica's final state by rank (:meth:`Rounds.close`: digests of its model and rule
    state, and its rounds); empty for a lone replica."""


class Rounds:
    def __init__(self, flat: torch.Tensor, rule: SyncRule, comm: Comm, board: Board,
                 schedule: SyncSchedule, syncs: int = 0) -> None:
        self.flat, self.rule, self.comm, self.board = flat, rule, comm, board
        self.schedule = schedule
        self.syncs = syncs  # rounds of the whole lineage, restored ones included
        self.times: list[float] = []  # this process's rounds
        self.cpu_s = 0.0  # their CPU seconds in this process
        self.last_drift = 0.0
        self.gaps: list[float] = []  # replica steps between consecutive snapshots
        self._last_snap = board.replica_pos()
        self._last_work = self.board.busy_s()
        self.climbed: list[tuple[int, str]] = []
        """(round, wire) of each step up the wire's ladder (``sync.compress=auto``) in this process."""
        self.asking = (0.0, 0.0)
        """The intervals this replica's last round's time and its CPU ask for (a paced schedule; 0:
        none), sent with the next round."""
        # A replica that never meets another (no torchrun, no coordinator) has no round due, ever:
        # an outer rule primed anyway held two more models (θ_g and its momentum, 1.2 GB beside a
        # 10M-row table) for nothing, and its checkpoints carried the initial model as θ_g, which
        # a run resumed on several replicas took for its outer state. Unprimed, such a resume
        # primes from the model it restored.
        if math.isfinite(schedule.next_sync_at):
            rule.prime(flat)
        rule.attach(board)
        board.control["next_sync_at"] = schedule.next_sync_at
        board.control["lag_limit"] = schedule.lag_limit

    def run(self, flags: RoundFlags, timeout_s: float) -> RoundOutcome:
        t0, cpu0 = time.perf_counter(), time.process_time()
        ctl = self.board.control
        ctl["syncing"] = 1.0
        pos_at_snap, work = self.board.replica_pos(), self.board.busy_s()
        speed = self._speed(pos_at_snap, work)
        link = self.rule.meter.copy()
        try:
            mine = Measures(self.last_drift, self._weight(pos_at_snap), self.asking, speed)
            with self.comm.round(flags.final):
                out = sync_round(self.flat, self.rule, flags, mine, timeout_s=timeout_s)
        finally:
            ctl["syncing"] = 0.0
        if not out.healthy:
            logger.warning("replica %d held non-finite parameters; excluded from the sync and "
                           "restored from the consensus of the others", self.comm.rank)
        self.last_drift = out.drift
        dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        self.cpu_s += cpu
        self.syncs += 1
        self.times.append(dt)
        stats = RoundStats(step=int(self.board.replica_pos()), seconds=dt, link=self.rule.meter.since(link))
        if len(self.times) > 1:  # the drifts riding on round 1 were measured by nobody
            stats.drift = self.schedule.record_drift(out.last_drifts)
        if not (flags.done or flags.final):  # a finished replica's rounds say nothing about the interval
            self.gaps.append(pos_at_snap - self._last_snap)
            stats.steps_between = self.gaps[-1]
            before = self.schedule.interval
            self.schedule.record_pace(out.paces)
            if self.schedule.interval != before:
                logger.debug("paced interval %d -> %d (asked for the rounds' time, CPU: %s)", before,
                             self.schedule.interval, ", ".join(f"{t:.1f} {c:.1f}" for t, c in out.paces))
            self.asking = self._pace(dt, cpu, speed)
            self.schedule.record_speeds(out.speeds, self.comm.rank)
        if not flags.final:
            # Every leader climbs at the same round, a finished replica too: its next round is the
            # others' (a leader that skipped the climb sent whole fp32 against their int8, and
            # Gloo failed the job with "collective mismatch").
            self._climb(out.paces)
        self._last_snap, self._last_work = pos_at_snap, work
        ctl["next_sync_at"] = self.schedule.after_round(pos_at_snap)
        ctl["lag_limit"] = self.schedule.lag_limit
        out.stats = stats
        return out

    def _climb(self, paces: list[tuple[float, float]]) -> None:
        """``sync.compress=auto``: the wire steps up while the link sets the pace (sync/ladder.py)."""
        if isinstance(self.rule, Ladder) and self.rule.after_round(paces, self.schedule.floor):
            self.climbed.append((self.syncs, self.rule.wire_name))

    def wire(self) -> dict[str, object]:
        """What the rounds sent at the end (``sync.dtype``, ``/fragments`` when above 1), and where
        ``sync.compress=auto`` climbed: ``metrics.json``'s ``sync_wire``."""
        cfg = self.rule.cfg
        name = self.rule.wire_name if isinstance(self.rule, Ladder) else wire_label(cfg.dtype, cfg.fragments)
        return {"sync_wire": name, "sync_wire_climbs": [{"round": r, "wire": w} for r, w in self.climbed]}

    def _pace(self, round_s: float, cpu_s: float, speed: float) -> tuple[float, float]:
        """The intervals this round's time and its leader's CPU ask for (0 when the schedule is not
        paced, or nothing was measured), at ``speed`` (:meth:`_speed`: steps over the workers' busy
        seconds, so waiting for a slow round does not make rounds look cheaper)."""
        # Under sync.interval_by_speed the agreed interval is the fastest replica's: a slower one
        # asks in the steps the fastest makes in the same time.
        steps_per_s = speed / self.schedule.share
        if not self.schedule.paced or steps_per_s <= 0:
            return 0.0, 0.0
        return paced_interval(round_s, 0.0, steps_per_s), paced_interval(0.0, cpu_s, steps_per_s)

    def _speed(self, pos: float, work: float) -> float:
        """The replica's steps a second of its workers' time since the last snapshot, times its
        workers (0 when nothing was measured): a slower machine's is lower, and waiting for a round
        (not in the workers' time) does not lower it."""
        busy = work - self._last_work
        return (pos - self._last_snap) * self.board.workers / busy if busy > 0 and pos > self._last_snap else 0.0

    def _weight(self, pos_at_snap: float) -> float:
        """``sync.weighting=steps``: the replica's steps since the last round's snapshot, the
        work behind its change (at least 1, so a replica that made none still counts a little
        and a round where none did divides by something)."""
        if self.rule.cfg.weighting != "steps":
            return 1.0
        return max(pos_at_snap - self._last_snap, 1.0)

    def adopt(self, syncs: int) -> None:
        """The lineage's round count of the peer this replica took its state from."""
        self.syncs = syncs

    def rebase(self) -> None:
        """Positions jumped (healed from a peer): the next interval counts from here."""
        self._last_snap = pos = self.board.replica_pos()
        self._last_work = self.board.busy_s()
        self.board.control["next_sync_at"] = self.schedule.after_round(pos)
        self.board.control["lag_limit"] = self.schedule.lag_limit

    def close(self, peak_memory_mb: Optional[float] = None) -> SyncStats:
        """After the final round: record its drift (it has no later round to ride on) and
        sum up every replica's rounds, with each replica's ``peak_memory_mb`` and a digest of the
        state it ends on (its model, its rule's state and its rounds: equal on every replica when
        the job ends in consensus), in one small gather."""
        link = self.rule.meter
        # A lone replica has nobody to agree with: its model is not hashed for nothing.
        alone = self.comm.world_size == 1
        ends_on = [math.nan] * 2 if alone else [digest({"flat": self.flat}), digest(self.rule.state_dict())]
        mine = torch.tensor([self.last_drift, _mean(self.times), _mean(self.gaps),
                             max(self.gaps, default=0.0), link.sent, link.received, link.seconds,
                             math.nan if peak_memory_mb is None else peak_memory_mb, self.cpu_s,
                             *ends_on, self.syncs], dtype=torch.float64)
        gathered = self.comm.all_gather(mine)
        if self.comm.world_size == 1:
            return SyncStats(peak_memory_mb=[peak_memory_mb])
        final = RoundStats(step=int(self.board.replica_pos()), seconds=0.0,
                           drift=self.schedule.record_drift([float(g[0]) for g in gathered]))
        col = [[float(x) for x in g] for g in gathered]
        return SyncStats(mean_sync_s=_mean([g[1] for g in col]), steps_per_sync=_mean([g[2] for g in col]),
                         max_steps_per_sync=max(g[3] for g in col), steps_per_sync_by_replica=[g[2] for g in col],
                         final=final,
                         link=LinkMeter(*(_mean([g[i] for g in col]) for i in (4, 5, 6))),
                         peak_memory_mb=[g[7] if math.isfinite(g[7]) else None for g in col],
                         cpu_s=_mean([g[8] for g in col]),
                         final_state=[{"model": hex_of(g[9]), "sync_state": hex_of(g[10]), "syncs": int(g[11])}
                                      for g in col])


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0
