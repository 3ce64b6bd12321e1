"""In-place update rules over the flat buffer, with state per worker or in shared memory.

The rules reproduce ``torch.optim`` (SGD with momentum, Adam, Adagrad) step for step, but
write only through views of the flat buffer with in-place ops under ``no_grad``, and keep
their state in flat buffers too, so the same code serves private and shared state
(design rule 6 in docs/design.md). Sparse gradients (``EmbeddingBag(sparse=True)``) touch only their rows.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch import Tensor

from hogwild.config import OptimConfig
from hogwild.shared import Slot


def state_names(cfg: OptimConfig) -> tuple[str, ...]:
    if cfg.name == "sgd":
        return ("momentum",) if cfg.momentum > 0 else ()
    if cfg.name == "adam":
        return ("exp_avg", "exp_avg_sq")
    return ("sum",)


def grads_finite(grads: list[Optional[Tensor]]) -> bool:
    """A NaN or Inf anywhere makes the norms non-finite; one fused op for all tensors."""
    vals = [g._values() if g.is_sparse else g for g in grads if g is not None]
    if not vals:
        return True
    return bool(torch.isfinite(torch.stack(torch._foreach_norm(vals)).sum()))


class FlatOptimizer:
    def __init__(self, cfg: OptimConfig, flat: Tensor, slots: list[Slot],
                 state: dict[str, Tensor]) -> None:
        self.cfg = cfg
        self.params = [s.view(flat) for s in slots]
        self.state = {k: [s.view(buf) for s in slots] for k, buf in state.items()}
        self.t = 0  # Adam's bias-correction step counts this worker's own updates

    @staticmethod
    def new_state(cfg: OptimConfig, n: int, alloc: Callable[[int], Tensor]) -> dict[str, Tensor]:
        return {k: alloc(n) for k in state_names(cfg)}

    @torch.no_grad()
    def step(self, grads: list[Optional[Tensor]]) -> None:
        self.t += 1
        c = self.cfg
        for i, (p, g) in enumerate(zip(self.params, grads)):
            if g is None:
                continue
            if g.is_sparse:
                if c.name == "sgd" and c.momentum == 0 and c.weight_decay == 0:
                    p.add_(g, alpha=-c.lr)  # rows outside the batch are never written
                    continue
                if c.name == "adagrad" and c.weight_decay == 0:
                    self._sparse_adagrad(p, g.coalesce(), self.state["sum"][i])
                    continue
                g = g.to_dense()
            if c.weight_decay:
                g = g.add(p, alpha=c.weight_decay)
            if c.name == "sgd":
                if c.momentum > 0:
                    buf = self.state["momentum"][i]
                    buf.mul_(c.momentum).add_(g)
                    g = buf
                p.add_(g, alpha=-c.lr)
            elif c.name == "adam":
                self._adam(p, g, self.state["exp_avg"][i], self.state["exp_avg_sq"][i])
            else:
                s = self.state["sum"][i]
                s.addcmul_(g, g, value=1.0)
                p.addcdiv_(g, s.sqrt().add_(c.eps), value=-c.lr)

    def _adam(self, p: Tensor, g: Tensor, m: Tensor, v: Tensor) -> None:
        b1, b2 = self.cfg.betas
        # Shared state is written by other workers while we read it. If we saw another
        # worker's large gradient in m but not yet in v, m/sqrt(v) would explode. So every
        # worker writes v before m, and reads m before v: any m we see has its v in place.
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        m.lerp_(g, 1 - b1)
        m_seen = m.clone() if self.cfg.state == "shared" else m
        bc1 = 1 - b1 ** self.t
        bc2 = 1 - b2 ** self.t
        denom = (v.sqrt() / math.sqrt(bc2)).add_(self.cfg.eps)
        p.addcdiv_(m_seen, denom, value=-self.cfg.lr / bc1)

    def _sparse_adagrad(self, p: Tensor, g: Tensor, s: Tensor) -> None:
        idx, vals = g._indices()[0], g._values()
        s.index_add_(0, idx, vals * vals)
        std = s.index_select(0, idx).sqrt_().add_(self.cfg.eps)
        p.index_add_(0, idx, vals / std, alpha=-self.cfg.lr)
