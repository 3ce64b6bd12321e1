"""``sync.fragments=F``: each round syncs one of F contiguous stretches of the flat buffer,
in rotation, so a round sends about 1/F of the model (as Streaming DiLoCo does by layers).

Each fragment has a rule of its own (its outer parameters and momentum, its wire's residual),
which sees only its stretch, so a fragment's outer step is the one the whole-model rule would
take on those values with F times the interval. The job's final round syncs every fragment,
so the job still ends on one model. See docs/sync.md, "Fragments".
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from hogwild.config.schema import SyncConfig
from hogwild.errors import ConfigError
from hogwild.sync.base import SyncContext, SyncRule
from hogwild.sync.comm import Comm

CURSOR = "fragment_cursor"


def bounds(numel: int, fragments: int) -> list[slice]:
    """F nearly equal stretches covering ``numel`` values, in order."""
    cuts = [i * numel // fragments for i in range(fragments + 1)]
    return [slice(cuts[i], cuts[i + 1]) for i in range(fragments)]


class Fragmented(SyncRule):
    """Rotates through F copies of one rule. Which fragment is next travels in the rule's state
    (checkpoints, a joiner's heal), so every member of a group syncs the same one."""

    name = "fragments"  # a wrapper, not a sync.mode: never registered

    def __init__(self, cfg: SyncConfig, comm: Comm, params: Optional[int],
                 make: Callable[[Comm], SyncRule]) -> None:
        super().__init__(cfg, comm, params)
        self.parts = [make(self.comm) for _ in range(cfg.fragments)]
        self.cursor = 0
        self._final_from: Optional[int] = None
        self.regions: Optional[list[slice]] = None
        self._pending: Optional[dict[str, Tensor]] = None

    def _bind(self, numel: int) -> list[slice]:
        if self.regions is None:
            if numel < len(self.parts):
                raise ConfigError(f"sync.fragments={len(self.parts)}: more fragments than the model's "
                                  f"{numel} values")
            self.regions = bounds(numel, len(self.parts))
            for part, r in zip(self.parts, self.regions):
                # The float buffers (BatchNorm statistics) follow the parameters in the flat
                # buffer: each fragment learns how many of its own values are parameters.
                if self.params is not None:
                    part.params = max(0, min(self.params - r.start, r.stop - r.start))
            if self._pending is not None:
                self._load(self._pending)
        return self.regions

    def prime(self, flat: Tensor) -> None:
        for part, r in zip(self.parts, self._bind(flat.numel())):
            part.prime(flat[r])

    def plan(self, numel: int, final: bool, timeout_s: Optional[float] = None) -> list[slice]:
        regions = self._bind(numel)
        if not final:
            return [regions[self.cursor]]
        # The final round lands every fragment on the consensus, starting where the rotation is.
        # One that a lost peer cut short runs again from where it began: a survivor one fragment
        # further than another would start elsewhere (a collective mismatch, or the wrong stretches
        # averaged together).
        if self._final_from is None:
            self._final_from = self.cursor
        self.cursor = self._final_from
        return [regions[(self.cursor + i) % len(regions)] for i in range(len(regions))]

    def exchange(self, snap: Tensor, ctl: Tensor, rank: int, timeout_s: float,
                 final: bool = False) -> tuple[Tensor, Tensor]:
        part = self.parts[self.cursor]
        self.cursor = (self.cursor + 1) % len(self.parts)
        target, ctl = part.exchange(snap, ctl, rank, timeout_s, final)
        self.ending, self.spread = part.ending, part.spread
        return target, ctl

    def target(self, snap: Tensor, ctx: SyncContext) -> Tensor:
        """Only for callers that drive a rule by hand: the current fragment's target, joined
        with the rest of ``snap``."""
        r = self._bind(snap.numel())[self.cursor]
        part = self.parts[self.cursor]
        self.cursor = (self.cursor + 1) % len(self.parts)
        out = snap.clone()
        out[r] = part.target(snap[r].clone(), ctx)
        return out

    def settle(self, flat: Tensor) -> None:
        for part, r in zip(self.parts, self._bind(flat.numel())):
            part.settle(flat[r])

    def held(self) -> list[Tensor]:
        return [*super().held(), *(t for part in self.parts for t in part.held())]

    def state_dict(self) -> dict[str, Tensor]:
        states = [p.state_dict() for p in self.parts]
        # The fragments' states joined end to end have the whole-model rule's layout, so a
        # checkpoint resumes under any sync.fragments, 1 included.
        out = {k: torch.cat([s[k] for s in states]) for k in states[0] if all(k in s for s in states)}
        out[CURSOR] = torch.tensor([self.cursor], dtype=torch.int64)
        return out

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        if self.regions is None:  # a checkpoint is read before the first prime
            self._pending = dict(state)
        else:
            self._load(state)

    def _load(self, state: dict[str, Tensor]) -> None:
        assert self.regions is not None
        self._pending = None
        if CURSOR in state:
            self.cursor = int(state[CURSOR]) % len(self.parts)
        whole = {k: v for k, v in state.items() if k != CURSOR}
        for part, r in zip(self.parts, self.regions):
            part.load_state_dict({k: v[r] for k, v in whole.items()})
