"""When the next sync round is due, and how the interval follows the measured drift.

Pure bookkeeping with no I/O and no clock: the leader feeds it replica positions and the
drifts every leader agreed on, and tests drive it directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from hogwild.config.schema import SyncConfig
from hogwild.config.sync import AUTO

PACE_WALL = 0.75
"""A paced round takes at most this share of its interval: its result lands before the next round
is due, so the workers, who run on through a round, never wait at ``sync.max_lag`` for it."""
PACE_CPU = 0.05
"""...and its leader's CPU at most this share of the interval's time: the leader runs on a core the
workers use, and rounds more often than this take more steps than they save."""
SHARE_ROUNDS, MIN_SHARE = 5, 0.1
"""``sync.interval_by_speed``: a replica's share of the interval is the median of its last this many
rounds' measures, and never under this share (a replica ten times slower than the fastest is a
fault for the timeouts, not a pace)."""
PACE_START, PACE_FLOOR = 10, 2
"""A paced interval starts at this many optimizer steps (no round is measured yet) and never goes
below that many: averaging every step was no better than every two in the model (BENCHMARKS.md §20)."""


def paced_interval(round_s: float, cpu_s: float, steps_per_s: float) -> float:
    """The replica steps an interval needs so that a round of ``round_s`` seconds on the clock and
    ``cpu_s`` of its leader's CPU stays within :data:`PACE_WALL` and :data:`PACE_CPU` of it, at
    ``steps_per_s`` (the replica's steps per second of its workers' compute)."""
    return steps_per_s * max(round_s / PACE_WALL, cpu_s / PACE_CPU)


UNEVEN = 0.75
"""A fleet whose slowest replica runs at most this share of the fastest one's speed is uneven: its
paced interval covers the wait for the last to arrive (:func:`round_ask`)."""


def round_ask(wanted: list[tuple[float, float]], uneven: bool) -> Optional[float]:
    """The interval a round's time asks for. In an ``uneven`` fleet under ``sync.interval_by_speed``
    the longest round any replica saw: the replicas' intervals follow their speeds, so what the first
    to arrive waits for the last is the slow ones' jitter (a machine held by a CPU quota runs in
    bursts), and an interval that left it out had the full-speed worker of a fleet at 1, 1/2 and 1/4
    of a core waiting at ``sync.max_lag`` for rounds every five steps (647 samples a second against
    840; benchmarks/stragglers.md §23). Elsewhere the shortest (:func:`link_ask`): between machines of
    one speed the longest took balanced fleets from rounds every 2.5 steps to every 4 and ended 0.03
    higher; with equal steps a slower replica's wait grows with the interval."""
    if not uneven:
        return link_ask(wanted)
    times = _measured_times(wanted)
    return max(times) if times else None


def link_ask(wanted: list[tuple[float, float]]) -> Optional[float]:
    """The interval the link asks for, from every replica's (time, CPU) asks: the shortest round
    any replica saw (the others also waited for the last to arrive, which is not the link's cost);
    None where no replica measured one."""
    times = _measured_times(wanted)
    return min(times) if times else None


def _measured_times(wanted: list[tuple[float, float]]) -> list[float]:
    """The time asks of the replicas that measured a round (0 or NaN: none yet)."""
    return [t for t, _ in wanted if math.isfinite(t) and t > 0]


def _median(recent: list[float]) -> float:
    """The upper median of the last rounds' figures: one round's hiccup does not move it."""
    return sorted(recent)[len(recent) // 2]


@dataclass
class DriftRecord:
    """What one round's gathered drifts amounted to."""

    mean: float
    max: float
    interval: int
    """The interval after adaptation (unchanged without ``sync.target_drift``)."""


@dataclass
class SyncSchedule:
    interval: int
    """Replica steps between the snapshot of one round and the next round."""
    next_sync_at: float
    """Replica position at which the next round is due."""
    max_lag: Optional[float] = None
    """Steps workers may run past a pending round; None: one (current) interval."""
    target_drift: Optional[float] = None
    min_interval: int = 1
    max_interval: int = 2**31
    drifts: list[float] = field(default_factory=list)
    """The max drift of every recorded round."""
    paced: bool = False
    """``sync.interval=auto`` (resolved by config/defaults.py): every round's cost sets the next interval."""
    floor: int = 1
    """A paced interval's lower bound: :data:`PACE_FLOOR` optimizer steps, in replica steps."""
    by_speed: bool = False
    """``sync.interval_by_speed`` (resolved: config/defaults.py): this replica's interval is the
    agreed one times its speed over the fastest replica's (:meth:`record_speeds`)."""
    shares: list[float] = field(default_factory=list)
    """This replica's speed over the fastest one's, in its last rounds (``by_speed``)."""
    slowest: list[float] = field(default_factory=list)
    """The slowest replica's speed over the fastest one's, in the last rounds (``by_speed``)."""

    @classmethod
    def from_config(cls, cfg: SyncConfig, distributed: bool = True, per_step: int = 1) -> "SyncSchedule":
        """``per_step``: the replica steps (workers' batches) one optimizer step takes."""
        paced = cfg.interval == AUTO
        interval = PACE_START * per_step if paced else int(cfg.interval)
        # One replica never meets anyone: its round is never due.
        first = float(interval) if distributed else math.inf
        return cls(interval, first, cfg.max_lag, cfg.target_drift, cfg.min_interval, cfg.max_interval,
                   paced=paced, floor=PACE_FLOOR * per_step,
                   by_speed=cfg.interval_by_speed == "true")

    def due(self, replica_pos: float) -> bool:
        return replica_pos >= self.next_sync_at

    @property
    def share(self) -> float:
        """This replica's part of the agreed interval: 1, or under ``by_speed`` its speed over the
        fastest replica's, the median of its last :data:`SHARE_ROUNDS` rounds (one round's hiccup
        is not a slower machine), at least :data:`MIN_SHARE`."""
        if not self.shares:
            return 1.0
        return max(MIN_SHARE, _median(self.shares))

    @property
    def mine(self) -> int:
        """This replica's steps from one round's snapshot to the next round."""
        return max(1, round(self.interval * self.share))

    @property
    def lag_limit(self) -> float:
        """Replica position at which workers stop and wait for the pending round: the real
        interval between two snapshots then never exceeds ``interval + max_lag``."""
        return self.next_sync_at + (self.mine if self.max_lag is None else self.max_lag)

    def after_round(self, pos_at_snapshot: float) -> float:
        """The next round comes this replica's interval (:attr:`mine`) after this round's snapshot."""
        self.next_sync_at = pos_at_snapshot + self.mine
        return self.next_sync_at

    def record_speeds(self, speeds: list[float], rank: int) -> None:
        """Every replica's speed in the round just done (0: not measured). Under ``by_speed`` a
        slower replica's interval shrinks to its speed, so that it reaches the next round when the
        fastest one does, with the steps it could make, instead of the fastest one's workers
        waiting at ``sync.max_lag`` for it (a DDP-like pace); ``sync.weighting=steps`` then weighs
        its change by those steps. Every replica's figure travels in the round, so each knows the
        fastest one's."""
        known = [s for s in speeds if math.isfinite(s) and s > 0]
        if not self.by_speed or not known or not 0 <= rank < len(speeds) or speeds[rank] <= 0:
            return
        self.shares = [*self.shares[1 - SHARE_ROUNDS:], min(1.0, speeds[rank] / max(known))]
        self.slowest = [*self.slowest[1 - SHARE_ROUNDS:], min(known) / max(known)]

    @property
    def uneven(self) -> bool:
        """Under ``by_speed``: the slowest replica's recent median share is :data:`UNEVEN` or less."""
        if not self.by_speed or not self.slowest:
            return False
        return _median(self.slowest) <= UNEVEN

    def record_drift(self, drifts: list[float]) -> Optional[DriftRecord]:
        """Every replica's drift of one round (non-finite ones, from unhealthy replicas, are
        ignored). Every leader sees the same list, so all take the same decision."""
        finite = [d for d in drifts if math.isfinite(d)]
        if not finite:
            return None
        worst = max(finite)
        self.drifts.append(worst)
        self._adapt(worst)
        return DriftRecord(sum(finite) / len(finite), worst, self.interval)

    def record_pace(self, wanted: list[tuple[float, float]]) -> None:
        """Every replica's wanted intervals for its round's time and its leader's CPU
        (:func:`paced_interval`; 0 or NaN: none measured yet). A round's time is what
        :func:`round_ask` takes of them; the busiest leader's CPU counts. Every leader sees the
        same list, so all take the same interval; one round at most halves or doubles it, so a
        hiccup, or the first round's connection set-up, does not swing it."""
        link = round_ask(wanted, self.uneven)
        cpus = [c for _, c in wanted if math.isfinite(c) and c > 0]
        if not self.paced or (link is None and not cpus):
            return
        want = math.ceil(max(link or 0.0, max(cpus, default=0.0)))
        bounded = min(2 * self.interval, max(self.interval // 2, want))
        self.interval = int(min(self.max_interval, max(self.floor, bounded)))

    def _adapt(self, max_drift: float) -> None:
        """Proportional control of the interval towards ``target_drift``."""
        if self.target_drift is None:
            return
        factor = min(1.5, max(0.5, self.target_drift / max(max_drift, 1e-12)))
        self.interval = min(self.max_interval, max(self.min_interval, round(self.interval * factor)))

    @property
    def max_drift(self) -> float:
        return max(self.drifts) if self.drifts else 0.0

    @property
    def mean_drift(self) -> float:
        return sum(self.drifts) / len(self.drifts) if self.drifts else 0.0
