"""The leader's fault seam for tests: its comm, wrapped at start-up (``Leader._setup``) with what
:func:`hogwild.replica.faults.planned` says is planned for its slot, and given back as it is when
nothing is (replica/faults.py documents the plan).

- ``lose:S:N`` fails slot S's N-th sync round there once its collective completed everywhere, as
  when this leader judges a peer lost the moment the others finish.
- ``late:S:SECONDS`` comes that late to the job's final round, and ``exit:S:0`` dies right after
  it: the round's edges are the comm's :meth:`~hogwild.sync.comm.Comm.round`, which the rounds
  open around each round's collectives.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional, cast

from torch import Tensor

from hogwild.replica.faults import planned
from hogwild.sync.comm import SYNC_ROUND, Comm, PeerLost


def faulty_comm(comm: Comm, slot: int) -> Comm:
    """Slot ``slot``'s comm with its planned faults; ``comm`` itself when none are."""
    plan = planned().leader(slot)
    if not plan.keys() & {"lose", "late", "exit"}:
        return comm
    return cast(Comm, _FaultyComm(comm, plan, slot))


class _FaultyComm:
    """Forwards to the comm; its sync rounds numbered in ``lose`` raise :class:`PeerLost` once
    they completed, and the final round comes ``late`` and is the last thing an ``exit`` slot
    does. Not a subclass: every attribute stays the comm's."""

    def __init__(self, comm: Comm, plan: dict[str, set[int]], slot: int) -> None:
        self._comm, self._plan, self._slot, self._rounds = comm, plan, slot, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)

    def all_reduce(self, t: Tensor, timeout_s: Optional[float] = None, what: str = "a collective") -> Tensor:
        out = self._comm.all_reduce(t, timeout_s, what)
        if what == SYNC_ROUND:
            self._rounds += 1
            if self._rounds in self._plan.get("lose", ()):
                raise PeerLost(f"sync: {what} failed here after it completed "
                               f"(injected: lose:{self._slot}:{self._rounds})")
        return out

    @contextmanager
    def round(self, final: bool) -> Iterator[None]:
        if final:
            for seconds in self._plan.get("late", ()):
                time.sleep(seconds)
        with self._comm.round(final):
            yield
        if final and "exit" in self._plan:
            os._exit(137)  # as a SIGKILL would leave it: nothing flushed, no lock released
