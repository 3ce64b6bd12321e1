"""The leader's fault seams for tests: its comm and its rounds, wrapped at start-up
(``Leader._setup``) with what :func:`hogwild.replica.faults.planned` says is planned for its slot,
and given back as they are when nothing is (replica/faults.py documents the plan).

- The comm: ``lose:S:N`` fails slot S's N-th sync round there once its collective completed
  everywhere, as when this leader judges a peer lost the moment the others finish.
- The rounds: ``late:S:SECONDS`` before the job's final round, ``exit:S:0`` right after it, and
  ``HOGWILD_DUMP_FINAL`` once the final round and its gather are done. A comm cannot tell where
  the final round ends (its collectives look like any other), the rounds can.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Optional, cast

import torch
from torch import Tensor

from hogwild.replica.faults import planned
from hogwild.sync.comm import SYNC_ROUND, Comm, PeerLost
from hogwild.sync.rounds import Rounds


def faulty_comm(comm: Comm, slot: int) -> Comm:
    """Slot ``slot``'s comm with its planned ``lose`` rounds; ``comm`` itself when none are."""
    lose = planned().leader(slot).get("lose")
    return cast(Comm, _LosingComm(comm, frozenset(lose), slot)) if lose else comm


def faulty_rounds(rounds: Rounds, slot: int) -> Rounds:
    """Slot ``slot``'s rounds with their final-round faults and the dump; ``rounds`` itself when
    nothing is planned for them."""
    faults = planned()
    plan = faults.leader(slot)
    if not (plan.keys() & {"late", "exit"} or faults.dump_dir):
        return rounds
    return cast(Rounds, _FaultyRounds(rounds, plan, faults.dump_dir, slot))


class _LosingComm:
    """Forwards to the comm; its sync rounds numbered in ``lose`` raise :class:`PeerLost` once
    they completed. Not a subclass: every attribute stays the comm's."""

    def __init__(self, comm: Comm, lose: frozenset[int], slot: int) -> None:
        self._comm, self._lose, self._slot, self._rounds = comm, lose, slot, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)

    def all_reduce(self, t: Tensor, timeout_s: Optional[float] = None, what: str = "a collective") -> Tensor:
        out = self._comm.all_reduce(t, timeout_s, what)
        if what == SYNC_ROUND:
            self._rounds += 1
            if self._rounds in self._lose:
                raise PeerLost(f"sync: {what} failed here after it completed "
                               f"(injected: lose:{self._slot}:{self._rounds})")
        return out


class _FaultyRounds:
    """Forwards to the replica's rounds; the final round comes ``late`` and the leader ``exit``s
    right after it; :meth:`close` (after the final round and gather) dumps the final state. Not a
    subclass: every attribute, and every write a method of the rounds makes, stays theirs."""

    def __init__(self, rounds: Rounds, plan: dict[str, set[int]], dump_dir: Optional[str], rank: int) -> None:
        self._rounds, self._plan, self._dump, self._rank = rounds, plan, dump_dir, rank

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rounds, name)

    def run(self, **kwargs: Any) -> Any:
        final = kwargs["flags"].final  # sync/rounds.py: RoundFlags
        if final:
            for seconds in self._plan.get("late", ()):
                time.sleep(seconds)
        out = self._rounds.run(**kwargs)
        if final and "exit" in self._plan:
            os._exit(137)  # as a SIGKILL would leave it: nothing flushed, no lock released
        return out

    def close(self, *args: Any, **kwargs: Any) -> Any:
        stats = self._rounds.close(*args, **kwargs)
        if self._dump:
            r = self._rounds
            torch.save(r.flat.cpu().clone(), Path(self._dump) / f"rank{self._rank}.pt")
            torch.save({"sync": r.rule.state_dict(), "syncs": r.syncs}, Path(self._dump) / f"rank{self._rank}.state.pt")
        return stats
