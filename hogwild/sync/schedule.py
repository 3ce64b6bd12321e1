"""When the next sync round is due, and how the interval follows the measured drift.

Pure bookkeeping with no I/O and no clock: the leader feeds it replica positions and the
drifts every leader agreed on, and tests drive it directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from hogwild.config.schema import SyncConfig


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

    @classmethod
    def from_config(cls, cfg: SyncConfig, distributed: bool = True) -> "SyncSchedule":
        # One replica never meets anyone: its round is never due.
        first = float(cfg.interval) if distributed else math.inf
        return cls(cfg.interval, first, cfg.max_lag, cfg.target_drift, cfg.min_interval, cfg.max_interval)

    def due(self, replica_pos: float) -> bool:
        return replica_pos >= self.next_sync_at

    @property
    def lag_limit(self) -> float:
        """Replica position at which workers stop and wait for the pending round: the real
        interval between two snapshots then never exceeds ``interval + max_lag``."""
        return self.next_sync_at + (self.interval if self.max_lag is None else self.max_lag)

    def after_round(self, pos_at_snapshot: float) -> float:
        """The next round comes ``interval`` steps after this round's snapshot."""
        self.next_sync_at = pos_at_snapshot + self.interval
        return self.next_sync_at

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
