"""Cross-replica sync rules, chosen by ``sync.mode``: one small class each.

The shared machinery (control vector, :class:`SyncRule`, registry) is in ``sync/base.py``;
the outer-optimizer rules (``diloco``, ``slowmo``) are in ``sync/outer.py``.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
from torch import Tensor

from hogwild.config.registry import SYNC_RULES
from hogwild.config.schema import SyncConfig
from hogwild.errors import ConfigError
from hogwild.sync import outer
from hogwild.sync.base import RoundFlags, RoundVector, SyncContext, SyncRule, context, register
from hogwild.sync.comm import Comm
from hogwild.replica.rows import RowMarks
from hogwild.sync.fragments import Fragmented
from hogwild.sync.ladder import Ladder
from hogwild.sync.rows import RowSparse

__all__ = ["Average", "Broadcast", "Median", "RoundFlags", "RoundVector", "SyncContext", "SyncRule", "TrimmedMean",
           "context", "make_rule", "outer"]

logger = logging.getLogger(__name__)


def make_rule(cfg: SyncConfig, comm: Comm, params: Optional[int] = None,
              marks: Optional[RowMarks] = None) -> SyncRule:
    """The rule ``sync.mode`` names; ``params``: the flat buffer's parameter prefix (the rest
    are float buffers); ``marks``: the replica's row marks under ``sync.row_sparse``."""
    if cfg.climbs() and marks is None:
        return Ladder(cfg, comm, params, lambda c, metered: make_rule(c, metered, params))
    rule: type[SyncRule] = SYNC_RULES.get(cfg.mode)
    if marks is not None:
        return RowSparse(cfg, comm, params, rule(cfg, comm, params), marks)
    if cfg.fragments > 1 and params is not None and cfg.fragments > params:
        # Each fragment keeps a rule of its own: a count past the model's values only costs memory
        # (a replica grew past 3 GiB before anything said no).
        raise ConfigError(f"sync.fragments: {cfg.fragments} fragments of a model of {params} parameters; "
                          f"use at most {params}")
    if cfg.fragments > 1:
        return Fragmented(cfg, comm, params, lambda c: rule(cfg, c, None))
    return rule(cfg, comm, params)


@register
class Average(SyncRule):
    """θ ← weighted mean over healthy replicas of θ_r (compressed: the change since the last
    agreed mean, which is small and rounds well)."""

    name = "average"
    weighted = True
    POSITIONAL = ("_base",)

    def __init__(self, cfg: SyncConfig, comm: Comm, params: Optional[int] = None) -> None:
        super().__init__(cfg, comm, params)
        self._base: Optional[Tensor] = None

    def prime(self, flat: Tensor) -> None:
        if self.compressed and self._base is None:
            self._base = flat.detach().clone()

    def exchange(self, snap: Tensor, ctl: Tensor, rank: int, timeout_s: float,
                 final: bool = False) -> tuple[Tensor, Tensor]:
        if self.compressed:
            return super().exchange(snap, ctl, rank, timeout_s, final)
        total, ctl, w = self._fused_sum(snap, ctl, rank, timeout_s, final)
        return total.div_(max(w, 1e-12)), ctl

    def target(self, snap: Tensor, ctx: SyncContext) -> Tensor:
        if not self.compressed:
            return self._mean(snap, ctx)
        assert self._base is not None, "prime() comes before the first round"
        self._base.add_(self._mean(snap - self._base, ctx))
        return self._base

    def settle(self, flat: Tensor) -> None:
        if self._base is not None:
            self._base.copy_(flat)

    def state_dict(self) -> dict[str, Tensor]:
        return {} if self._base is None else {"base": self._base}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        if "base" in state and self.compressed:
            self._base = state["base"].clone()


@register
class Broadcast(SyncRule):
    """θ ← θ_0 (the lowest-ranked healthy replica's parameters)."""

    name = "broadcast"

    def target(self, snap: Tensor, ctx: SyncContext) -> Tensor:
        return self.comm.broadcast(snap.clone(), ctx.first_healthy)


def _gather(snap: Tensor, ctx: SyncContext, comm: Comm) -> Tensor:
    """Stack of the healthy replicas' snapshots (world x n) via all_gather."""
    parts = comm.all_gather(snap)
    return torch.stack([p for p, ok in zip(parts, ctx.healthy) if ok])


@register
class Median(SyncRule):
    """θ ← coordinate-wise median over healthy replicas (robust to one wild replica)."""

    name = "median"

    def target(self, snap: Tensor, ctx: SyncContext) -> Tensor:
        ordered = _gather(snap, ctx, self.comm).sort(dim=0).values
        n = ordered.shape[0]
        # Mean of the two middle values for an even count, so the rule stays symmetric.
        return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2


@register
class TrimmedMean(SyncRule):
    """θ ← per coordinate, the mean after dropping the ``trim`` largest and smallest values."""

    name = "trimmed_mean"

    def target(self, snap: Tensor, ctx: SyncContext) -> Tensor:
        stacked = _gather(snap, ctx, self.comm)
        k = self.cfg.trim
        n = stacked.shape[0]
        if n - 2 * k < 1:
            k = (n - 1) // 2
            logger.warning("sync.trim=%d leaves no replica of %d; trimming %d", self.cfg.trim, n, k)
        ordered = stacked.sort(dim=0).values
        return ordered[k:n - k].mean(dim=0)

