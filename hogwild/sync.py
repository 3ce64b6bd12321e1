"""Cross-replica sync rules: one small class each, chosen by ``sync.mode``.

A rule only computes the *target* parameters of this replica from a snapshot, using
collectives among the leaders. The leader then moves the live buffer by
``target - snapshot`` in place, so updates that workers applied while the collective ran
survive (design rule 2 in docs/design.md). A rule never touches the live buffer itself.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
from torch import Tensor

from hogwild.comm import Comm
from hogwild.config import SyncConfig
from hogwild.errors import ConfigError

logger = logging.getLogger(__name__)

_WIRE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class RoundVector:
    """Layout of the control vector every round all-reduces (SUM): four job-wide flags, then
    one "my snapshot is finite" slot per rank, then one slot per rank for the drift it
    measured in the previous round."""

    ALL_DONE, ANY_STOP, WANT_CKPT, REACHED = range(4)
    NUM_FLAGS = 4

    @staticmethod
    def size(world: int) -> int:
        return RoundVector.NUM_FLAGS + 2 * world

    @staticmethod
    def healthy_slot(rank: int) -> int:
        return RoundVector.NUM_FLAGS + rank

    @staticmethod
    def drift_slot(world: int, rank: int) -> int:
        return RoundVector.NUM_FLAGS + world + rank

    @staticmethod
    def world(ctl: Tensor) -> int:
        return (ctl.numel() - RoundVector.NUM_FLAGS) // 2


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

    def __init__(self, cfg: SyncConfig, comm: Comm) -> None:
        self.cfg = cfg
        self.comm = comm
        self.wire = _WIRE[cfg.dtype]
        self._residual: Optional[Tensor] = None  # error feedback of the compressed wire
        self._scratch: dict[str, Tensor] = {}

    def scratch(self, name: str, numel: int, like: Tensor) -> Tensor:
        """A buffer kept across rounds: fresh multi-MB allocations page-fault on every sync."""
        buf = self._scratch.get(name)
        if buf is None or buf.numel() != numel or buf.dtype != like.dtype or buf.device != like.device:
            buf = torch.empty(numel, dtype=like.dtype, device=like.device)
            self._scratch[name] = buf
        return buf

    @abstractmethod
    def target(self, snap: Tensor, ctx: SyncContext) -> Tensor:
        """The parameters this replica should hold; ``snap`` may be reused as scratch."""

    def exchange(self, snap: Tensor, ctl: Tensor, rank: int, timeout_s: float) -> tuple[Tensor, Tensor]:
        """Reduce the control vector, then compute the target: (target, reduced control).

        Rules whose data collective is itself a SUM all_reduce fuse both into one call.
        """
        ctl = self.comm.all_reduce(ctl, timeout_s, "the sync round")
        return self.target(snap, context(ctl, rank)), ctl

    def state_dict(self) -> dict[str, Tensor]:
        return {}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        del state

    def _all_reduce_sum(self, x: Tensor) -> Tensor:
        return self.comm.all_reduce(x)

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


def make_rule(cfg: SyncConfig, comm: Comm) -> SyncRule:
    if cfg.mode not in _RULES:
        raise ConfigError(f"sync.mode: unknown rule {cfg.mode!r}; choose one of {', '.join(_RULES)}")
    return _RULES[cfg.mode](cfg, comm)


@register
class Average(SyncRule):
    """θ ← mean over healthy replicas of θ_r (compressed: the delta to the last mean)."""

    name = "average"

    def __init__(self, cfg: SyncConfig, comm: Comm) -> None:
        super().__init__(cfg, comm)
        self._base: Optional[Tensor] = None

    def exchange(self, snap: Tensor, ctl: Tensor, rank: int, timeout_s: float) -> tuple[Tensor, Tensor]:
        if self.wire != torch.float32:
            return super().exchange(snap, ctl, rank, timeout_s)
        # One collective per round: control flags travel in front of the parameters, and an
        # unhealthy replica sends zeros, so the healthy count divides the sum.
        c = ctl.numel()
        buf = self.scratch("fused", c + snap.numel(), snap)
        buf[:c].copy_(ctl)
        if ctl[RoundVector.healthy_slot(rank)] > 0:
            buf[c:].copy_(snap)
        else:
            buf[c:].zero_()
        self.comm.all_reduce(buf, timeout_s, "the sync round")
        ctl = buf[:c].clone()
        n = context(ctl, rank).n_healthy
        return buf[c:].div_(max(n, 1)), ctl

    def target(self, snap: Tensor, ctx: SyncContext) -> Tensor:
        if self.wire == torch.float32:
            return self._mean(snap, ctx)
        # Send only the change since the last agreed mean, which is small and rounds well.
        if self._base is None:
            self._base = self.comm.broadcast(snap.clone(), ctx.first_healthy)
        delta = snap - self._base if ctx.healthy[ctx.rank] else torch.zeros_like(snap)
        self._base = self._base + self._mean(delta, ctx)
        return self._base.clone()


def context(ctl: Tensor, rank: int) -> SyncContext:
    world = RoundVector.world(ctl)
    first = RoundVector.healthy_slot(0)
    healthy = [bool(x > 0.5) for x in ctl[first:first + world].tolist()]
    return SyncContext(rank, world, healthy)


@register
class Broadcast(SyncRule):
    """θ ← θ_0 (the lowest-ranked healthy replica's parameters)."""

    name = "broadcast"

    def target(self, snap: Tensor, ctx: SyncContext) -> Tensor:
        return self.comm.broadcast(snap.clone(), ctx.first_healthy)


@register
class DiLoCo(SyncRule):
    """Outer Nesterov SGD on the averaged pseudo-gradient Δ = mean_r(θ_global − θ_r):

    b ← μ·b + Δ;  θ_global ← θ_global − η·(Δ + μ·b);  target = θ_global.
    """

    name = "diloco"

    def __init__(self, cfg: SyncConfig, comm: Comm) -> None:
        super().__init__(cfg, comm)
        self.global_params: Optional[Tensor] = None
        self.momentum: Optional[Tensor] = None

    def target(self, snap: Tensor, ctx: SyncContext) -> Tensor:
        if self.global_params is None:
            self.global_params = self.comm.broadcast(snap.clone(), ctx.first_healthy)
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

