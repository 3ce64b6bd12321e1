"""The leaders' collectives in elastic mode: one Gloo group per membership epoch.

A collective is waited for in short polls, not one blocking call: between polls the leader
checks its peers' heartbeats and the coordinator's epoch, so a peer that was killed, stopped
(SIGSTOP) or dropped by the others fails the round within ``elastic.peer_timeout_s`` instead of
``sync.timeout_s``, while a peer that is merely slow (still heartbeating) is waited for.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from hogwild.elastic.link import CoordinatorAway
from hogwild.elastic.membership import Epoch, Membership
from hogwild.errors import first_line
from hogwild.native import hold, leave
from hogwild.sync.comm import Comm, PeerLost

logger = logging.getLogger(__name__)

CHECK_EVERY_S = 0.5


class ElasticComm(Comm):
    def __init__(self, membership: Membership, timeout_s: float) -> None:
        self.m = membership
        self.timeout_s = timeout_s
        self.pg: Optional[Any] = None

    @property
    def rank(self) -> int:  # type: ignore[override]
        return self.m.rank()

    @property
    def world_size(self) -> int:  # type: ignore[override]
        return self.m.group_size()

    def form(self, ep: Epoch) -> None:
        """Build epoch ``ep``'s group; waits until all its members arrive, or until one of them
        is known lost (its heartbeat stopped, or a newer epoch exists): a member that died
        between the epoch's publication and here costs ``elastic.peer_timeout_s``, not the
        constructor's ``sync.timeout_s``."""
        self.abandon()
        what = f"the group of epoch {ep.number}"
        box: dict[str, Any] = {}

        def build() -> None:
            try:
                # Its own store connection: the constructor holds its client while it waits for
                # the other members' keys, and the heartbeat checks below must not queue behind it.
                host, port = self.m.store_address()
                store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=self.timeout_s))
                box["pg"] = dist.ProcessGroupGloo(dist.PrefixStore(f"pg/{ep.number}", store),
                                                  ep.members.index(self.m.slot), len(ep.members),
                                                  timedelta(seconds=self.timeout_s))
            except BaseException as e:  # noqa: BLE001 - handed to the leader's thread below
                box["error"] = e

        builder = threading.Thread(target=build, name="hogwild-group", daemon=True)
        builder.start()
        t0 = time.monotonic()
        try:
            while True:
                builder.join(CHECK_EVERY_S)
                if not builder.is_alive():
                    break
                self.m.tick()  # waiting for the others is this loop's progress
                self._check_peers(what)  # an abandoned constructor gives up on its own, at its timeout
                if time.monotonic() - t0 > self.timeout_s + CHECK_EVERY_S:
                    raise PeerLost(f"sync: {what} did not form within {self.timeout_s:.0f}s (sync.timeout_s)")
        except BaseException:
            if builder.is_alive():
                leave(builder)
            raise
        if "error" in box:
            raise PeerLost(f"sync: {what} did not form: {first_line(box['error'])}") from None
        self.pg = box["pg"]

    def abandon(self, midway: bool = True) -> None:
        """Abort the current group. ``midway``: a collective may still be in flight on it, so
        it is held to the end of the process (hogwild/native.py) rather than freed; a group
        closed after the job's last collective completed is simply let go."""
        if self.pg is not None:
            try:
                self.pg.abort()
            except Exception:  # noqa: BLE001 - a broken group may refuse even that
                logger.debug("abort failed", exc_info=True)
            if midway:
                hold(self.pg)
            self.pg = None

    def _wait(self, work: Any, timeout_s: Optional[float], what: str) -> None:
        t0 = time.monotonic()
        check_at, nap = t0 + CHECK_EVERY_S, 0.0002
        # Heartbeats tell a lost peer from a slow one, so a short caller timeout (a stopping
        # leader's) is not needed here and would drop peers that are merely still training.
        limit = max(self.timeout_s, timeout_s or 0.0)
        while not work.is_completed():
            now = time.monotonic()
            if now >= check_at:
                check_at = now + CHECK_EVERY_S
                self.m.tick()
                self._check_peers(what)
            if now - t0 > limit:
                raise PeerLost(f"sync: peers did not join {what} within {limit:.0f}s")
            time.sleep(nap)
            nap = min(nap * 2, 0.01)
        try:
            work.wait()
        except (RuntimeError, dist.DistError) as e:
            raise PeerLost(f"sync: {what} failed: {first_line(e)}") from None

    def _check_peers(self, what: str) -> None:
        try:
            if self.m.superseded():
                raise PeerLost(f"sync: the others formed a newer group during {what}")
            dead = self.m.lost_peers()
        except CoordinatorAway:
            return  # no heartbeats to read: the collective's own limit still holds
        if dead:
            how = ", ".join(f"{s} {why}" for s, why in dead.items())
            raise PeerLost(f"sync: replica(s) {how} for {self.m.peer_timeout_s:.0f}s "
                           f"(elastic.peer_timeout_s) during {what}")

    def _group(self) -> Any:
        if self.pg is None:
            raise PeerLost("sync: no group (the last one was abandoned)")
        return self.pg

    def all_reduce(self, t: Tensor, timeout_s: Optional[float] = None, what: str = "a collective") -> Tensor:
        self._wait(self._group().allreduce([t]), timeout_s, what)
        return t

    def broadcast(self, t: Tensor, src: int) -> Tensor:
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = src, 0
        self._wait(self._group().broadcast([t], opts), None, "a broadcast")
        return t

    def all_gather(self, t: Tensor) -> list[Tensor]:
        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        self._wait(self._group().allgather([parts], [t]), None, "an all_gather")
        return parts

    def send_state(self, state: Optional[dict[str, Any]], src: int) -> dict[str, Any]:
        """Rank ``src``'s ``state`` (tensors and plain values) on every rank: the heal."""
        if self.rank == src:
            buf = io.BytesIO()
            torch.save(state, buf)
            data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
            size = torch.tensor([data.numel()], dtype=torch.int64)
        else:
            size = torch.zeros(1, dtype=torch.int64)
        self.broadcast(size, src)
        if self.rank != src:
            data = torch.empty(int(size.item()), dtype=torch.uint8)
        self.broadcast(data, src)
        # weights_only: a peer's bytes are data, never code.
        return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True)
