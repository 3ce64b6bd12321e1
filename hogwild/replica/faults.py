"""Fault injection for tests, e.g. ``HOGWILD_FAULT=nan:0:20,crash:1:50`` (kind:worker:step).

The worker asks for its hook once, at start; with the variable unset it gets its step
function back untouched, so the training loop carries no test code.

Kinds: ``nan`` poisons the first gradient of that step, ``crash`` raises in that step,
``slow:W:MS`` makes every step of worker W MS milliseconds longer (a slow or loaded machine),
``start:W:0`` kills worker W's first start during its warm-up, before it is ready, and
``warm:W:MS`` makes that warm-up MS milliseconds longer (a signal that lands in it).

``HOGWILD_LEADER_FAULT`` does the same for a leader (kind:slot:n): ``lose:S:N`` makes slot S's
N-th sync round fail there after its collective completed everywhere (the others apply the
round, S does not: each member decides a peer's loss on its own), and ``exit:S:0`` kills slot
S's leader (exit 137, no cleanup) right after the job's final round, and ``late:S:SECONDS`` makes
slot S's leader come SECONDS late to the job's final round (a final round whose payload takes that
long on a slow link, as seen from its peers).

``HOGWILD_SLOW_WHILE=FILE`` limits ``slow`` to while FILE exists: a test keeps a job slow for
as long as its faults need live training, then removes the file, and the rest runs at speed.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

FAULT_ENV = "HOGWILD_FAULT"
DUMP_ENV = "HOGWILD_DUMP_FINAL"
SLOW_WHILE_ENV = "HOGWILD_SLOW_WHILE"
LEADER_FAULT_ENV = "HOGWILD_LEADER_FAULT"

# Computes batch ``step``'s gradients into the parameters' ``.grad``: (loss, batch size).
StepFn = Callable[[int], tuple[Tensor, int]]


def planned_faults(global_index: int, spec: str | None = None) -> dict[str, set[int]]:
    """The steps at which worker ``global_index`` should fail, by kind."""
    spec = os.environ.get(FAULT_ENV, "") if spec is None else spec
    faults: dict[str, set[int]] = {}
    for item in filter(None, spec.split(",")):
        kind, who, step = item.split(":")
        if int(who) == global_index:
            faults.setdefault(kind, set()).add(int(step))
    return faults


def inject_faults(step_fn: StepFn, params: list[Tensor], global_index: int) -> StepFn:
    faults = planned_faults(global_index)
    if not faults:
        return step_fn
    nan_at, crash_at = faults.get("nan", set()), faults.get("crash", set())
    delay_s = sum(faults.get("slow", set())) / 1000.0
    slow_while = os.environ.get(SLOW_WHILE_ENV)

    def faulty(step: int) -> tuple[Tensor, int]:
        nonlocal delay_s
        if delay_s and slow_while and not os.path.exists(slow_while):
            delay_s = 0.0  # for good: the test is done with its faults
        if delay_s:
            time.sleep(delay_s)
        if step in crash_at:
            raise RuntimeError(f"injected crash at step {step}")
        loss, batch = step_fn(step)
        if step in nan_at:
            g = params[0].grad
            assert g is not None
            params[0].grad = g * float("nan") if g.is_sparse else torch.full_like(g, float("nan"))
        return loss, batch
    return faulty


def startup_faults(global_index: int, leader_pid: int) -> None:
    """In worker W's warm-up, before it is ready. ``start:W:0``: its first process dies; its
    respawn lives (a marker file named by the leader's pid tells the two apart). ``warm:W:MS``:
    it touches ``<marker>.warm`` (for a test to wait on), then takes MS ms longer."""
    faults = planned_faults(global_index)
    marker = Path(tempfile.gettempdir()) / f"hogwild-fault-{leader_pid}-{global_index}"
    if "warm" in faults:
        marker.with_suffix(".warm").touch()
        time.sleep(sum(faults["warm"]) / 1000.0)
    if "start" in faults and not marker.exists():
        marker.touch()
        os._exit(70)  # dies like an OOM-killed process: no cleanup, no traceback


def leader_faults(rank: int) -> dict[str, set[int]]:
    """What ``HOGWILD_LEADER_FAULT`` plans for the leader of replica (or slot) ``rank``."""
    return planned_faults(rank, os.environ.get(LEADER_FAULT_ENV, ""))


def late_to_final(rank: int) -> None:
    for seconds in leader_faults(rank).get("late", ()):
        time.sleep(seconds)


def exit_after_final(rank: int) -> None:
    if "exit" in leader_faults(rank):
        os._exit(137)  # as a SIGKILL would leave it: nothing flushed, no lock released


def dump_final(flat: Tensor, rank: int, sync_state: dict[str, Tensor], syncs: int) -> None:
    """``HOGWILD_DUMP_FINAL=DIR``: each replica's final parameters, to check consensus bit for
    bit, and beside them its sync rule's state and rounds applied, which must agree too."""
    dump = os.environ.get(DUMP_ENV)
    if dump:
        torch.save(flat.cpu().clone(), Path(dump) / f"rank{rank}.pt")
        torch.save({"sync": sync_state, "syncs": syncs}, Path(dump) / f"rank{rank}.state.pt")
