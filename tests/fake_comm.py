"""N leaders played by threads in one process: a fake communicator for fast sync tests.

Each collective is a rendezvous of all ranks on a barrier: every rank deposits a copy of its
tensor, all read every deposit, and only then may a slot be reused. Sums run in rank order,
so every rank gets bit-for-bit the same result, as with a real all_reduce.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, TypeVar

import torch
from torch import Tensor

from hogwild.sync.comm import Comm, PeerLost

T = TypeVar("T")


class ThreadGroup:
    def __init__(self, world: int, timeout_s: float = 20.0) -> None:
        self.world = world
        self.timeout_s = timeout_s
        self.barrier = threading.Barrier(world)
        self.slots: list[Optional[Tensor]] = [None] * world


class ThreadComm(Comm):
    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.world_size = group.world

    def _exchange(self, t: Tensor, timeout_s: Optional[float], what: str) -> list[Tensor]:
        g = self.group
        g.slots[self.rank] = t.detach().clone()
        limit = g.timeout_s if timeout_s is None else timeout_s
        try:
            g.barrier.wait(limit)  # every rank has deposited
            values = [s.clone() for s in g.slots if s is not None]
            g.barrier.wait(limit)  # every rank has read: slots may be reused
        except threading.BrokenBarrierError:
            raise PeerLost(f"sync: peers did not join {what} within {limit:.0f}s") from None
        return values

    def all_reduce(self, t: Tensor, timeout_s: Optional[float] = None, what: str = "a collective") -> Tensor:
        values = self._exchange(t, timeout_s, what)
        total = values[0]
        for v in values[1:]:
            total = total + v
        t.copy_(total)
        return t

    def broadcast(self, t: Tensor, src: int) -> Tensor:
        t.copy_(self._exchange(t, None, "a broadcast")[src])
        return t

    def all_gather(self, t: Tensor) -> list[Tensor]:
        return self._exchange(t, None, "an all_gather")


def run_ranks(world: int, fn: Callable[[Comm], T], timeout_s: float = 20.0) -> list[T]:
    """``fn(comm)`` on ``world`` threads, one rank each; re-raises the first rank's error."""
    group = ThreadGroup(world, timeout_s)
    results: list[Any] = [None] * world
    errors: list[Optional[BaseException]] = [None] * world

    def body(rank: int) -> None:
        torch.set_num_threads(1)
        try:
            results[rank] = fn(ThreadComm(group, rank))
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            errors[rank] = e
            group.barrier.abort()  # the other ranks must not wait for this one

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(world)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout_s * 3)
        assert not th.is_alive(), "a rank hung"
    for e in errors:
        if e is not None and not isinstance(e, PeerLost):
            raise e
    for e in errors:
        if e is not None:
            raise e
    return results
