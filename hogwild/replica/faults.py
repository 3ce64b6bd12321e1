"""Fault injection for tests: what a test plans to go wrong, read from the environment by
:func:`install` when a process starts (the leader in leader/choose.py, each worker once it has taken
its leader's environment) and nowhere else. No constructor takes it: it acts at the two seams that
read :func:`planned`, a worker's step function (:meth:`Faults.step`, here) and the leader's comm
(leader/faults.py). With nothing planned each seam gives back what it was given, so neither the
leader's nor a worker's production path carries test code.

``HOGWILD_FAULT`` plans a worker's faults (kind:worker:step, e.g. ``nan:0:20,crash:1:50``):
``nan`` poisons the first gradient of that step, ``crash`` raises in that step,
``slow:W:MS`` makes every step of worker W MS milliseconds longer (a slow or loaded machine; a
part of a batch, pace.balance or pace.chunks, that part's share of MS),
``start:W:0`` kills worker W's first start during its warm-up, before it is ready,
``warm:W:MS`` makes that warm-up MS milliseconds longer (a signal that lands in it), and
``rewarm:W:MS`` makes only a respawned worker's warm-up MS milliseconds longer (a slow respawn).

``HOGWILD_LEADER_FAULT`` does the same for a leader (kind:slot:n): ``lose:S:N`` makes slot S's
N-th sync round fail there after its collective completed everywhere (the others apply the
round, S does not: each member decides a peer's loss on its own), ``exit:S:0`` kills slot S's
leader (exit 137, no cleanup) right after the job's final round, and ``late:S:SECONDS`` makes
slot S's leader come SECONDS late to the job's final round (a final round whose payload takes that
long on a slow link, as seen from its peers).

``HOGWILD_SLOW_WHILE=FILE`` limits ``slow`` to while FILE exists: a test keeps a job slow for
as long as its faults need live training, then removes the file, and the rest runs at speed.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

import torch
from torch import Tensor

from hogwild.replica.step import Computed, StepFn

FAULT_ENV = "HOGWILD_FAULT"
SLOW_WHILE_ENV = "HOGWILD_SLOW_WHILE"
LEADER_FAULT_ENV = "HOGWILD_LEADER_FAULT"

def planned_faults(index: int, spec: str) -> dict[str, set[int]]:
    """The steps (or rounds, or seconds) at which worker or slot ``index`` should fail, by kind."""
    faults: dict[str, set[int]] = {}
    for item in filter(None, spec.split(",")):
        kind, who, step = item.split(":")
        if int(who) == index:
            faults.setdefault(kind, set()).add(int(step))
    return faults


@dataclass(frozen=True)
class Faults:
    """What a test plans to go wrong in this job (a no-op by default)."""

    workers: str = ""
    """``HOGWILD_FAULT``."""
    leaders: str = ""
    """``HOGWILD_LEADER_FAULT``."""
    slow_while: Optional[str] = None
    """``HOGWILD_SLOW_WHILE``."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Faults:
        return cls(environ.get(FAULT_ENV, ""), environ.get(LEADER_FAULT_ENV, ""),
                   environ.get(SLOW_WHILE_ENV) or None)

    def step(self, step_fn: StepFn, params: list[Tensor], global_index: int, leader_pid: int) -> StepFn:
        """Worker ``global_index``'s step function with its planned faults. Its first call is the
        warm-up: the ``start`` and ``warm`` faults land there; the others from the next call on."""
        faults = planned_faults(global_index, self.workers)
        if not faults:
            return step_fn
        nan_at, crash_at = faults.get("nan", set()), faults.get("crash", set())
        delay_s = sum(faults.get("slow", set())) / 1000.0
        slow_while, warmed, last = self.slow_while, [False], [-1]

        def faulty(step: int, share: float = 1.0, summed: bool = False) -> Computed:
            nonlocal delay_s
            if not warmed[0]:
                warmed[0] = True
                _startup(faults, global_index, leader_pid)
                return step_fn(step, share, summed)
            if delay_s and slow_while and not os.path.exists(slow_while):
                delay_s = 0.0  # for good: the test is done with its faults
            if delay_s:  # slower by the sample, as a slow machine is: a batch in parts is slowed once in all
                time.sleep(delay_s * min(1.0, share))
            first = step != last[0]  # a batch computed in parts (pace.balance, pace.chunks) meets its faults once
            last[0] = step
            if first and step in crash_at:
                raise RuntimeError(f"injected crash at step {step}")
            out = step_fn(step, share, summed)
            if first and step in nan_at:
                g = params[0].grad
                assert g is not None
                params[0].grad = g * float("nan") if g.is_sparse else torch.full_like(g, float("nan"))
            return out
        return faulty

    def leader(self, slot: int) -> dict[str, set[int]]:
        """Slot ``slot``'s leader faults by kind (``lose``, ``late``, ``exit``)."""
        return planned_faults(slot, self.leaders)


_planned = Faults()


def install(environ: Mapping[str, str] = os.environ) -> Faults:
    """Read this process's fault plan from its environment: once, as it starts."""
    global _planned
    _planned = Faults.from_env(environ)
    return _planned


def planned() -> Faults:
    """What :func:`install` read (nothing, in a process that never called it)."""
    return _planned


def _startup(faults: dict[str, set[int]], global_index: int, leader_pid: int) -> None:
    """In worker W's warm-up, before it is ready. ``start:W:0``: its first process dies; its
    respawn lives (a marker file named by the leader's pid tells the two apart). ``warm:W:MS``:
    it touches ``<marker>.warm`` (for a test to wait on), then takes MS ms longer. ``rewarm:W:MS``:
    every start after its first takes MS ms longer."""
    marker = Path(tempfile.gettempdir()) / f"hogwild-fault-{leader_pid}-{global_index}"
    if "rewarm" in faults:
        started = marker.with_suffix(".started")
        if started.exists():
            time.sleep(sum(faults["rewarm"]) / 1000.0)
        started.touch()
    if "warm" in faults:
        marker.with_suffix(".warm").touch()
        time.sleep(sum(faults["warm"]) / 1000.0)
    if "start" in faults and not marker.exists():
        marker.touch()
        os._exit(70)  # dies like an OOM-killed process: no cleanup, no traceback
