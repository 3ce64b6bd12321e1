"""Cross-replica sync rules: one small class each, chosen by ``sync.mode``.

A rule only computes the *target* parameters of this replica from a snapshot, using
collectives among the leaders. The leader then moves the live buffer by
``target - snapshot`` in place, so updates that workers applied while the collective ran
survive (DESIGN rule 2). A rule never touches the live buffer itself.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from hogwild.config import ConfigError, SyncConfig

logger = logging.getLogger(__name__)

_WIRE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class SyncContext:
    """What every leader agreed on in this round's control exchange."""

    rank: int
    world_size: int
    healthy: list[bool]
    """Per rank: its snapshot is finite. Unhealthy replicas contribute nothing."""

    @property
    def n_healthy(self) -> int:
        return sum(self.healthy)

    @property
    def first_healthy(self) -> int:
        return self.healthy.index(True)


class SyncRule(ABC):
    name: ClassVar[str]

    def __init__(self, cfg: SyncConfig, group: Optional[dist.ProcessGroup] = None) -> None:
        self.cfg = cfg
        self.group = group
        self.wire = _WIRE[cfg.dtype]
        self._residual: Optional[Tensor] = None  # error feedback of the compressed wire

    @abstractmethod
    def target(self, snap: Tensor, ctx: SyncContext) -> Tensor:
        """The parameters this replica should hold; ``snap`` may be reused as scratch."""

    def state_dict(self) -> dict[str, Tensor]:
        return {}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        del state

    def _all_reduce_sum(self, x: Tensor) -> Tensor:
        dist.all_reduce(x, op=dist.ReduceOp.SUM, group=self.group)
        return x

    def _masked(self, snap: Tensor, ctx: SyncContext) -> Tensor:
        return snap if ctx.healthy[ctx.rank] else torch.zeros_like(snap)

    def _mean(self, x: Tensor, ctx: SyncContext) -> Tensor:
        """Mean over healthy replicas of ``x``, on the configured wire dtype."""
        x = self._masked(x, ctx)
        if self.wire == torch.float32:
            return self._all_reduce_sum(x.clone()).div_(ctx.n_healthy)
        # Reduced precision: send the rounded value, keep the rounding error for next time.
        if self._residual is None or self._residual.shape != x.shape:
            self._residual = torch.zeros_like(x)
        corrected = x + self._residual
        low = corrected.to(self.wire)
        self._residual = corrected - low.float()
        return self._all_reduce_sum(low).float().div_(ctx.n_healthy)


_RULES: dict[str, type[SyncRule]] = {}


def register(cls: type[SyncRule]) -> type[SyncRule]:
    _RULES[cls.name] = cls
    return cls


def make_rule(cfg: SyncConfig, group: Optional[dist.ProcessGroup] = None) -> SyncRule:
    if cfg.mode not in _RULES:
        raise ConfigError(f"sync.mode: unknown rule {cfg.mode!r}; choose one of {', '.join(_RULES)}")
    return _RULES[cfg.mode](cfg, group)


def rule_names() -> list[str]:
    return list(_RULES)


@register
class Average(SyncRule):
    """θ ← mean over healthy replicas of θ_r (compressed: the delta to the last mean)."""

    name = "average"

    def __init__(self, cfg: SyncConfig, group: Optional[dist.ProcessGroup] = None) -> None:
        super().__init__(cfg, group)
        self._base: Optional[Tensor] = None

    def target(self, snap: Tensor, ctx: SyncContext) -> Tensor:
        if self.wire == torch.float32:
            return self._mean(snap, ctx)
        # Send only the change since the last agreed mean, which is small and rounds well.
        if self._base is None:
            self._base = _broadcast(snap.clone(), ctx.first_healthy, self.group)
        delta = snap - self._base if ctx.healthy[ctx.rank] else torch.zeros_like(snap)
        self._base = self._base + self._mean(delta, ctx)
        return self._base.clone()


def _broadcast(x: Tensor, src: int, group: Optional[dist.ProcessGroup]) -> Tensor:
    dist.broadcast(x, src=src, group=group)
    return x


@register
class Broadcast(SyncRule):
    """θ ← θ_0 (the lowest-ranked healthy replica's parameters)."""

    name = "broadcast"

    def target(self, snap: Tensor, ctx: SyncContext) -> Tensor:
        return _broadcast(snap.clone(), ctx.first_healthy, self.group)


@register
class DiLoCo(SyncRule):
    """Outer Nesterov SGD on the averaged pseudo-gradient Δ = mean_r(θ_global − θ_r):

    b ← μ·b + Δ;  θ_global ← θ_global − η·(Δ + μ·b);  target = θ_global.
    """

    name = "diloco"

    def __init__(self, cfg: SyncConfig, group: Optional[dist.ProcessGroup] = None) -> None:
        super().__init__(cfg, group)
        self.global_params: Optional[Tensor] = None
        self.momentum: Optional[Tensor] = None

    def target(self, snap: Tensor, ctx: SyncContext) -> Tensor:
        if self.global_params is None:
            self.global_params = _broadcast(snap.clone(), ctx.first_healthy, self.group)
            self.momentum = torch.zeros_like(snap)
        assert self.momentum is not None
        pseudo = self._mean(self.global_params - snap, ctx) if ctx.healthy[ctx.rank] else \
            self._mean(torch.zeros_like(snap), ctx)
        mu, lr = self.cfg.outer_momentum, self.cfg.outer_lr
        self.momentum.mul_(mu).add_(pseudo)
        self.global_params.sub_(pseudo.add(self.momentum, alpha=mu), alpha=lr)
        return self.global_params.clone()

    def state_dict(self) -> dict[str, Tensor]:
        if self.global_params is None or self.momentum is None:
            return {}
        return {"global_params": self.global_params.clone(), "momentum": self.momentum.clone()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        if "global_params" in state:
            self.global_params = state["global_params"].clone()
            self.momentum = state["momentum"].clone()


def _gather(snap: Tensor, ctx: SyncContext, group: Optional[dist.ProcessGroup]) -> Tensor:
    """Stack of the healthy replicas' snapshots (world x n) via all_gather."""
    parts = [torch.empty_like(snap) for _ in range(ctx.world_size)]
    dist.all_gather(parts, snap, group=group)
    return torch.stack([p for p, ok in zip(parts, ctx.healthy) if ok])


@register
class Median(SyncRule):
    """θ ← coordinate-wise median over healthy replicas (robust to one wild replica)."""

    name = "median"

    def target(self, snap: Tensor, ctx: SyncContext) -> Tensor:
        ordered = _gather(snap, ctx, self.group).sort(dim=0).values
        n = ordered.shape[0]
        # Mean of the two middle values for an even count, so the rule stays symmetric.
        return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2


@register
class TrimmedMean(SyncRule):
    """θ ← per coordinate, the mean after dropping the ``trim`` largest and smallest values."""

    name = "trimmed_mean"

    def target(self, snap: Tensor, ctx: SyncContext) -> Tensor:
        stacked = _gather(snap, ctx, self.group)
        k = self.cfg.trim
        n = stacked.shape[0]
        if n - 2 * k < 1:
            k = (n - 1) // 2
            logger.warning("sync.trim=%d leaves no replica of %d; trimming %d", self.cfg.trim, n, k)
        ordered = stacked.sort(dim=0).values
        return ordered[k:n - k].mean(dim=0)

