"""Choices one setting makes for others, each decided here once: which way gradients reach the
model (``optim.update=auto``, by the optimizer family), and the cross-machine rule, interval and
wire that follow from it (``sync.mode=auto``, ``sync.interval=auto``, ``sync.compress=auto``).

An adaptive optimizer (AdamW, Adam, Adagrad, any torch optimizer but SGD) takes the barrier: its
workers' fresh gradients meet before one optimizer state steps (BENCHMARKS.md §17). Across
machines it keeps its quality only when the replicas meet often: on the GPT of BENCHMARKS.md §20,
two replicas averaging every two steps end near DDP, every ten steps 0.04 worse, every fifty 0.09,
and an outer momentum on top of AdamW's own costs more. So it gets ``average``, paced by the link:
rounds as often as the link and the leader's core allow (sync/schedule.py). SGD stays lock-free
(Hogwild), loses little between rounds far apart and gains from keeping every replica's progress,
so it keeps ``slowmo`` every 50 steps, where its figures were measured (docs/sync.md).
A paced average's rounds also carry fewer bytes once the link sets their pace (sync/ladder.py):
only there, and only on the wire a user left alone.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING

from hogwild.config.registry import SYNC_RULES
from hogwild.config.sync import AUTO, SGD_INTERVAL
from hogwild.config.targets import import_target
from hogwild.config.train import OptimConfig
from hogwild.errors import ConfigError

if TYPE_CHECKING:
    from hogwild.config.schema import Config

HOGWILD, BARRIER = "hogwild", "barrier"
ADAPTIVE_MODE, SGD_MODE = "average", "slowmo"


def auto_keeps_hogwild(target: object) -> bool:
    """Whether auto leaves an ``optim._target_`` on the Hogwild path: torch's SGD (staleness costs
    it little, BENCHMARKS.md §17) and SparseAdam (it steps only on sparse gradients, which the
    barrier does not gather), and their subclasses."""
    import torch

    return isinstance(target, type) and issubclass(target, (torch.optim.SGD, torch.optim.SparseAdam))


def _update_path(cfg: OptimConfig) -> str:
    """``optim.update`` resolved: hogwild (each worker steps the shared weights) or barrier (the
    workers' gradients meet and one state per replica steps on their mean; replica/meeting.py).
    Only :func:`resolved` asks: everything else reads the resolved ``optim.update``."""
    if cfg.update != "auto":
        return cfg.update
    if cfg.rowwise:
        return HOGWILD  # a table's rows are written by the workers themselves on either path
    if cfg._target_:
        try:
            cls = import_target(str(cfg._target_), "optim._target_")
        except ConfigError:
            return BARRIER  # torch_optimizer says what is wrong with it, in one line
        return HOGWILD if auto_keeps_hogwild(cls) else BARRIER
    return HOGWILD if cfg.name == "sgd" else BARRIER


def resolved(cfg: "Config") -> "Config":
    """``cfg`` with ``optim.update`` a path (hogwild or barrier), ``sync.mode`` a rule's name and
    ``sync.interval`` a number of steps, or ``auto`` where the link sets the pace (the barrier's
    optimizers, unless ``sync.target_drift`` adapts a fixed interval to its own measure), and
    ``sync.compress`` left ``auto`` only where it acts: a paced average on whole fp32 rounds
    (sync/ladder.py). Composing a config applies it, and so does the leader to a config handed to
    it whole; a resolved config resolves to itself."""
    sync, optim = cfg.sync, cfg.optim
    update = _update_path(optim)
    if update == BARRIER and optim.state == "worker":
        # The barrier keeps one state per replica; auto took it for this optimizer, and a private
        # state per worker asked for would otherwise be dropped without a word.
        raise ConfigError(f"optim.state: worker needs optim.update=hogwild ({optim._target_ or optim.name} takes "
                          "the barrier under optim.update=auto, with one state per replica); set optim.update=hogwild, "
                          "or optim.state=auto")
    adaptive = update == BARRIER
    mode = sync.mode if sync.mode != AUTO else (ADAPTIVE_MODE if adaptive else SGD_MODE)
    paced = sync.interval == AUTO and adaptive and sync.target_drift is None
    interval = sync.interval if sync.interval != AUTO or paced else SGD_INTERVAL
    compress = sync.compress if dataclasses.replace(sync, mode=mode, interval=interval).climbs() else "off"
    by_speed = sync.interval_by_speed if sync.interval_by_speed != AUTO else str(adaptive).lower()
    weighting = sync.weighting
    if weighting == AUTO:
        weighting = "steps" if by_speed == "true" and SYNC_RULES.get(mode).weighted else "equal"  # type: ignore[attr-defined]
    changed = dict(mode=mode, interval=interval, compress=compress, interval_by_speed=by_speed, weighting=weighting)
    if optim.update == update and all(getattr(sync, k) == v for k, v in changed.items()):
        return cfg
    out = copy.copy(cfg)
    out.sync = dataclasses.replace(sync, **changed)
    out.optim = dataclasses.replace(optim, update=update)
    return out
