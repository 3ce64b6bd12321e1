"""Outer-optimizer sync rules: the replicas' mean change since the last round is treated
as a pseudo-gradient and fed to an outer SGD with momentum (design note in docs/sync.md).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from hogwild.config.schema import SyncConfig
from hogwild.sync.base import SyncContext, SyncRule, register
from hogwild.sync.comm import Comm


class OuterRule(SyncRule):
    """θ_g: the agreed parameters after the last round; b: the outer momentum.

    Δ = mean_{healthy r}(θ_g − θ_r);  b ← μ·b + Δ;  θ_g ← θ_g − η·step;  target = θ_g,
    with ``step`` from :meth:`step`. θ_g starts at the job's initial parameters (every
    replica builds the same model from the same seed, or loads the same checkpoint), so the
    first interval's progress counts like every other.
    """

    default_lr: float
    weighted = True
    state_copies = 2
    POSITIONAL = ("global_params", "momentum")

    def __init__(self, cfg: SyncConfig, comm: Comm, params: Optional[int] = None) -> None:
        super().__init__(cfg, comm, params)
        self.global_params: Optional[Tensor] = None
        self.momentum: Optional[Tensor] = None
        self.lr = cfg.outer_lr if cfg.outer_lr is not None else self.default_lr

    @property
    def mu(self) -> float:
        """Read at every round: in elastic mode the group, and so the rule's default, changes."""
        m = self.cfg.outer_momentum
        return m if m is not None else self.default_momentum(self.comm.world_size)

    def default_momentum(self, replicas: int) -> float:
        raise NotImplementedError

    def step(self, pseudo: Tensor, momentum: Tensor) -> Tensor:
        raise NotImplementedError

    def prime(self, flat: Tensor) -> None:
        if self.global_params is None:  # a restored outer state wins
            self.global_params = flat.detach().clone()
            self.momentum = torch.zeros_like(self.global_params)

    def exchange(self, snap: Tensor, ctl: Tensor, rank: int, timeout_s: float,
                 final: bool = False) -> tuple[Tensor, Tensor]:
        # A round that ends the job lands on the replicas' mean (θ_g too; b is kept for a resumed
        # run): the job ends on a model the replicas trained to, not on the momentum's step past
        # it, which no worker ever corrected and which can read well below the replicas' mean.
        if self.compressed or self.global_params is None or self.momentum is None:
            return super().exchange(snap, ctl, rank, timeout_s, final)
        # The same step as target(), on one fused collective: Δ = θ_g − sum/W. Every line is one
        # pass over the buffer, and passes are what a round costs beyond its collective.
        total, ctl, w = self._fused_sum(snap, ctl, rank, timeout_s, final)
        w = max(w, 1e-12)
        # W·(mean − snap):
        gap = torch.sub(total, snap, alpha=w, out=self.scratch("spread", snap.numel(), snap))
        self.spread = float(gap.norm()) / w
        if self.ending:
            return self.global_params.copy_(total.div_(w)), ctl
        pseudo = torch.sub(self.global_params, total, alpha=1.0 / w, out=total)
        return self._outer_step(pseudo), ctl  # θ_g itself: the round reads its target, never writes it

    def target(self, snap: Tensor, ctx: SyncContext) -> Tensor:
        assert self.global_params is not None, "prime() comes before the first round"
        # _mean sends zeros for an unhealthy replica, so only the healthy ones count.
        pseudo = self._mean(self.global_params - snap, ctx)
        self.spread = float((snap - self.global_params).add_(pseudo).norm())  # ‖snap − mean‖
        if self.ending:
            return self.global_params.sub_(pseudo).clone()
        return self._outer_step(pseudo).clone()

    def _outer_step(self, pseudo: Tensor) -> Tensor:
        """b ← μ·b + Δ; θ_g ← θ_g − η·step on the parameters; the float buffers take the
        replicas' mean. Returns θ_g (the rule's own state)."""
        assert self.global_params is not None and self.momentum is not None
        n = pseudo.numel() if self.params is None else self.params
        g, p, b = self.global_params[:n], pseudo[:n], self.momentum[:n]
        torch.add(p, b, alpha=self.mu, out=b)  # b ← Δ + μ·b in one pass
        g.sub_(self.step(p, b), alpha=self.lr)
        # BatchNorm's running mean and variance are averages of what the replicas saw, not a
        # direction to extrapolate: a momentum step (or η > 1) past their mean can push a running
        # variance below zero, and evaluation in eval() mode then returns NaN. θ_g − Δ is the mean.
        self.global_params[n:].sub_(pseudo[n:])
        return self.global_params

    def settle(self, flat: Tensor) -> None:
        if self.global_params is not None:  # the momentum is kept, as after a final round
            self.global_params.copy_(flat)

    def state_dict(self) -> dict[str, Tensor]:
        if self.global_params is None or self.momentum is None:
            return {}
        return {"global_params": self.global_params, "momentum": self.momentum}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        if "global_params" in state:
            self.global_params = state["global_params"].clone()
            self.momentum = state["momentum"].clone()


@register
class DiLoCo(OuterRule):
    """Nesterov outer step, ``step = Δ + μ·b``; DiLoCo's defaults η = 0.7, μ = 0.9."""

    name = "diloco"
    default_lr = 0.7

    def default_momentum(self, replicas: int) -> float:
        return 0.9

    def step(self, pseudo: Tensor, momentum: Tensor) -> Tensor:
        return pseudo.add_(momentum, alpha=self.mu)


@register
class SlowMo(OuterRule):
    """Heavy-ball outer step, ``step = b``, with η = 1 and μ = 1 − 1/R for R replicas.

    Where the replicas agree, Δ repeats round after round and b grows to Δ/(1−μ) = R·Δ: R
    replicas make R times the progress of one, as if their updates had landed on one shared
    model. Where each replica's local steps already settle (a stiff direction), Δ is the
    distance to the settled point, and heavy-ball with η = 1 converges for any μ < 1
    (averaging is the μ = 0 case), so the outer step never overshoots where averaging would
    not. Noise that differs between replicas averages out in Δ before the momentum sees it.
    """

    name = "slowmo"
    default_lr = 1.0

    def default_momentum(self, replicas: int) -> float:
        return 1.0 - 1.0 / max(replicas, 1)

    def step(self, pseudo: Tensor, momentum: Tensor) -> Tensor:
        return momentum
