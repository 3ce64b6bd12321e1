"""The leaders' collectives behind one small interface.

Sync rules and the leader call :class:`Comm`, never ``torch.distributed`` directly, so the
same rule code runs on a real Gloo/NCCL group (:class:`DistComm`) and, in tests, on N ranks
played by threads in one process.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import ContextManager, Iterator, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from hogwild.errors import Fault, first_line


SYNC_ROUND = "the sync round"  # the ``what`` of a round's first collective (one per round)


class PeerLost(Fault):
    """Another leader did not join a collective in time: no further collective can complete."""


class Comm(ABC):
    """SUM all_reduce, broadcast and all_gather among the leaders, in place where torch is."""

    rank: int
    world_size: int

    @abstractmethod
    def all_reduce(self, t: Tensor, timeout_s: Optional[float] = None, what: str = "a collective") -> Tensor:
        """Sum ``t`` over ranks in place and return it; :class:`PeerLost` past ``timeout_s``."""

    @abstractmethod
    def broadcast(self, t: Tensor, src: int) -> Tensor:
        """Overwrite ``t`` with rank ``src``'s value and return it."""

    @abstractmethod
    def all_gather(self, t: Tensor) -> list[Tensor]:
        """Every rank's ``t``, in rank order."""

    @contextmanager
    def round(self, final: bool) -> Iterator[None]:
        """The collectives of one sync round (``final``: the job's last); nothing happens at its
        edges here. A comm that wraps another acts there if it needs a round's boundaries: a
        collective cannot tell the final round's from any other."""
        del final
        yield


class DistComm(Comm):
    """The process group of ``torch.distributed``. NCCL only moves tensors on the group's
    device, so tensors elsewhere (small CPU control vectors) travel through a copy there."""

    def __init__(self, device: torch.device, group: Optional[dist.ProcessGroup] = None) -> None:
        self.group = group
        self.device = device
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def _on_wire(self, t: Tensor) -> Tensor:
        return t if t.device == self.device else t.to(self.device)

    def all_reduce(self, t: Tensor, timeout_s: Optional[float] = None, what: str = "a collective") -> Tensor:
        wire = self._on_wire(t)
        try:
            work = dist.all_reduce(wire, async_op=True, group=self.group)
            assert work is not None
            if timeout_s is None:
                work.wait()
            else:
                work.wait(timeout=timedelta(seconds=timeout_s))
        except (RuntimeError, dist.DistError) as e:
            limit = f" within {timeout_s:.0f}s" if timeout_s is not None else ""
            raise PeerLost(f"sync: peers did not join {what}{limit} ({first_line(e)})") from None
        if wire is not t:
            t.copy_(wire)
        return t

    def broadcast(self, t: Tensor, src: int) -> Tensor:
        wire = self._on_wire(t)
        with _lost_peer("a broadcast"):
            dist.broadcast(wire, src=src, group=self.group)
        if wire is not t:
            t.copy_(wire)
        return t

    def all_gather(self, t: Tensor) -> list[Tensor]:
        wire = self._on_wire(t)
        parts = [torch.empty_like(wire) for _ in range(self.world_size)]
        # A peer stopped or killed after the last round fails this one (Gloo: "Application
        # timeout caused pair closure"): the lost-peer path, not a crash report.
        with _lost_peer("an all_gather"):
            dist.all_gather(parts, wire, group=self.group)
        return [p.to(t.device) for p in parts]


@contextmanager
def _lost_peer(what: str) -> Iterator[None]:
    try:
        yield
    except (RuntimeError, dist.DistError) as e:
        raise PeerLost(f"sync: {what} failed ({first_line(e)})") from None


class LocalComm(Comm):
    """A job of one replica: every collective is the identity."""

    rank = 0
    world_size = 1

    def all_reduce(self, t: Tensor, timeout_s: Optional[float] = None, what: str = "a collective") -> Tensor:
        return t

    def broadcast(self, t: Tensor, src: int) -> Tensor:
        return t

    def all_gather(self, t: Tensor) -> list[Tensor]:
        return [t]


@dataclass
class LinkMeter:
    """What the sync rounds put on the link: bytes as Gloo's algorithms move them (ring
    all_reduce and all_gather, one-to-all broadcast), and seconds inside collectives, waits for
    a slower peer included."""

    sent: float = 0.0
    received: float = 0.0
    seconds: float = 0.0

    def copy(self) -> "LinkMeter":
        return LinkMeter(self.sent, self.received, self.seconds)

    def since(self, before: "LinkMeter") -> "LinkMeter":
        return LinkMeter(self.sent - before.sent, self.received - before.received,
                         self.seconds - before.seconds)


class Metered(Comm):
    """Any :class:`Comm`, counting what passes through it into :attr:`meter`. Bytes are counted
    from each collective's payload rather than read from the network card: the leader's link
    also carries the coordinator's and the store's traffic, and loopback counts nothing."""

    def __init__(self, inner: Comm) -> None:
        self.inner = inner
        self.meter = LinkMeter()

    @property
    def rank(self) -> int:  # type: ignore[override]
        return self.inner.rank

    @property
    def world_size(self) -> int:  # type: ignore[override]
        return self.inner.world_size

    def _count(self, t0: float, sent: float, received: float) -> None:
        m = self.meter
        m.seconds += time.perf_counter() - t0
        if self.world_size > 1:
            m.sent += sent
            m.received += received

    def all_reduce(self, t: Tensor, timeout_s: Optional[float] = None, what: str = "a collective") -> Tensor:
        t0, b = time.perf_counter(), ring_all_reduce_bytes(_nbytes(t), self.world_size)
        out = self.inner.all_reduce(t, timeout_s, what)
        self._count(t0, b, b)
        return out

    def broadcast(self, t: Tensor, src: int) -> Tensor:
        t0, R, b = time.perf_counter(), self.world_size, _nbytes(t)
        out = self.inner.broadcast(t, src)
        mine = self.rank == src
        self._count(t0, (R - 1) * b if mine else 0.0, 0.0 if mine else b)
        return out

    def all_gather(self, t: Tensor) -> list[Tensor]:
        t0, R, b = time.perf_counter(), self.world_size, _nbytes(t)
        out = self.inner.all_gather(t)
        self._count(t0, (R - 1) * b, (R - 1) * b)
        return out

    def round(self, final: bool) -> ContextManager[None]:
        return self.inner.round(final)


def ring_all_reduce_bytes(nbytes: float, world: int) -> float:
    """What a ring all_reduce of ``nbytes`` sends, and receives, per rank: a reduce-scatter,
    then an all_gather, each moving ``(R - 1) / R`` of the buffer."""
    return 2 * (world - 1) / world * nbytes


def _nbytes(t: Tensor) -> float:
    return float(t.numel() * t.element_size())
