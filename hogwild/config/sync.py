"""``sync.*``: how the replicas' leaders meet (rule, interval, staleness bound, timeouts, wire).
Who is in the group when it is elastic is ``elastic.*`` (config/elastic.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from hogwild.config.registry import SYNC_RULES, WIRES
from hogwild.config.validate import choice, positive, require, timeout
from hogwild.errors import ConfigError

BACKENDS = ("auto", "gloo", "nccl")
AUTO = "auto"
SGD_INTERVAL = 50
"""``sync.interval=auto`` under SGD: the interval BENCHMARKS.md's SGD figures were measured at."""
WEIGHTINGS = ("auto", "equal", "steps")
BY_SPEED = ("auto", "true", "false")
COMPRESS = ("auto", "off")
RUNGS: tuple[tuple[str, int], ...] = (("fp32", 1), ("int8", 1), ("int8", 4), ("fp32", 4))
"""``sync.compress=auto``: (sync.dtype, sync.fragments) of each rung of the wire's ladder, in the
order a paced average climbs them (sync/ladder.py). The last is for many replicas: past R = 8,
int8's all_gather sends more than fp32's all_reduce. A rung's index is what a checkpoint keeps: new
rungs go at the end."""


@dataclass
class SyncConfig:
    mode: str = "auto"
    """Cross-replica rule: auto | slowmo | average | broadcast | diloco | median | trimmed_mean.
    auto: average for an adaptive optimizer (AdamW, Adam, Adagrad, ... on the barrier), whose
    replicas then meet every few steps; slowmo under SGD (Hogwild), which keeps every replica's
    progress between rounds far apart (R replicas advance about R times as far per round as one,
    where average keeps one replica's). docs/sync.md says why."""
    interval: Any = "auto"
    """Sync each time a replica's own update count (all its workers) grows by this much. auto: under
    an adaptive optimizer the link sets the pace, every round's measured cost setting the next
    interval (as short as two optimizer steps on a fast link, longer as the round's time or its
    leader's share of a core grows); under SGD, 50."""
    max_lag: Optional[float] = None
    """Steps a replica's workers may run past a round that has not completed before they wait
    for it (stale synchronous parallel); None = one interval, inf = never wait."""
    backend: str = "auto"
    """Process-group backend: auto (gloo on cpu, nccl on cuda) | gloo | nccl."""
    timeout_s: float = 300.0
    """Collective and rendezvous timeout; a dead peer fails the job after this long. Elastic
    mode: also the longest a new group may take to form, and a coordinator may stay away."""
    outer_lr: Optional[float] = None
    """diloco, slowmo: outer learning rate; null = the rule's own (diloco 0.7, slowmo 1.0)."""
    outer_momentum: Optional[float] = None
    """diloco: Nesterov momentum (null = 0.9); slowmo: heavy-ball (null = 1 - 1/replicas)."""
    trim: int = 1
    """trimmed_mean: replicas dropped at each end, per coordinate."""
    target_drift: Optional[float] = None
    """If set, adapt the interval so the measured drift stays near this value."""
    min_interval: int = 5
    """Lower bound of the adaptive interval."""
    max_interval: int = 5000
    """Upper bound of the adaptive interval."""
    dtype: str = "fp32"
    """Wire precision of the synced delta: fp32 | bf16 | fp16 | int8 (compressed ones with error
    feedback; int8 with one scale per 512 values)."""
    fragments: int = 1
    """Sync one of this many stretches of the model per round, in rotation (the final round
    syncs all): a round sends 1/fragments of the model."""
    compress: str = "auto"
    """auto | off. auto: a paced average (an adaptive optimizer's default rounds) on whole fp32
    rounds switches to int8, or int8 in 4 fragments (fp32 in 4 fragments from 16 replicas on, where
    int8's all_gather sends more), the least that fits, once the link asks for two optimizer steps
    between rounds or more (docs/sync.md, "Compression on a slow link"); off:
    sync.dtype and sync.fragments as set. A sync.dtype or sync.fragments of your own turns it off."""
    row_sparse: bool = False
    """Send only the rows of embedding tables (parameters with sparse gradients) that some replica
    wrote since they last travelled, with every dense value; every rule, fp32 or compressed
    wires (docs/sync.md, "Row-sparse rounds")."""
    weighting: str = "auto"
    """average, diloco, slowmo: auto | equal | steps (each replica's change weighs as many steps as
    it made since the last round; a slow replica pulls the consensus less). auto: steps where
    sync.interval_by_speed is on, else equal."""
    interval_by_speed: str = "auto"
    """auto | true | false. true: a replica slower than the fastest one has its interval cut to its
    speed (half as fast, half the steps), so every replica reaches a round at about the same time and
    the fast ones' workers do not wait at sync.max_lag for a slow machine; its change then weighs the
    steps it made (sync.weighting=auto). auto: true for an adaptive optimizer (the barrier's), false
    under SGD, where it was not measured (docs/sync.md, "A slower machine")."""

    def __post_init__(self) -> None:
        if self.mode != AUTO:
            SYNC_RULES.check(self.mode)
        self.interval = interval_value(self.interval)
        if self.max_lag is not None:
            positive(self.max_lag, "sync.max_lag", allow_zero=True)
        choice(self.backend, "sync.backend", BACKENDS)
        timeout(self.timeout_s, "sync.timeout_s")
        positive(1.0 if self.outer_lr is None else self.outer_lr, "sync.outer_lr")
        mu = 0.0 if self.outer_momentum is None else self.outer_momentum
        require(0.0 <= mu < 1.0, "sync.outer_momentum", f"must be in [0, 1), got {mu}")
        positive(self.trim, "sync.trim", allow_zero=True)
        if self.target_drift is not None:
            positive(self.target_drift, "sync.target_drift")
        positive(self.min_interval, "sync.min_interval")
        require(self.max_interval >= self.min_interval, "sync.max_interval",
                 "must be >= sync.min_interval")
        WIRES.check(self.dtype)
        choice(self.compress, "sync.compress", COMPRESS)
        positive(self.fragments, "sync.fragments")
        require(not (self.row_sparse and self.fragments > 1), "sync.fragments",
                f"row-sparse rounds send what moved and do not split into fragments; with sync.row_sparse=true "
                f"set sync.fragments=1, got {self.fragments}")
        choice(self.weighting, "sync.weighting", WEIGHTINGS)
        # Hydra reads sync.interval_by_speed=true as a boolean, which the str field holds as 'True'.
        self.interval_by_speed = str(self.interval_by_speed).lower()
        choice(self.interval_by_speed, "sync.interval_by_speed", BY_SPEED)
        weighted = [name for name in SYNC_RULES.names() if SYNC_RULES.get(name).weighted]  # type: ignore[attr-defined]
        require(self.weighting != "steps" or self.mode in (AUTO, *weighted), "sync.weighting",
                f"steps applies to {', '.join(weighted)}, not sync.mode={self.mode}")

    def climbs(self) -> bool:
        """``sync.compress=auto`` acts: a paced average on whole fp32 rounds of a user's own choosing
        (sync/ladder.py). Resolving the defaults turns it ``off`` everywhere else (config/defaults.py)."""
        return (self.compress == AUTO and self.interval == AUTO and self.mode == "average" and self.dtype == "fp32"
                and self.fragments == 1 and not self.row_sparse and self.target_drift is None)


def wire_label(dtype: str, fragments: int) -> str:
    """How ``metrics.json`` and the logs name a wire: ``int8``, or ``int8/4`` in 4 fragments."""
    return dtype if fragments == 1 else f"{dtype}/{fragments}"


def interval_value(value: Any) -> Any:
    """``sync.interval``: a positive integer, or ``auto``."""
    if value == AUTO:
        return AUTO
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise ConfigError(f"sync.interval: must be a positive integer or 'auto', got {value!r}") from None
    require(isinstance(value, int) and not isinstance(value, bool) and value > 0, "sync.interval",
            f"must be a positive integer or 'auto', got {value!r}")
    return value
