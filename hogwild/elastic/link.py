"""A connection to the coordinator that outlives the coordinator.

``hogwild-coordinator`` keeps its keys in memory only. If it dies and is started again on the
same host:port, every replica puts back what it knows on its first call to the new one, before
that call goes through:

- the keys it wrote or read that must outlive the coordinator (:meth:`Memory.keep`: the job,
  the run_dir, the members of each epoch it saw, its own data position, its metrics), each
  with a compare-and-set from empty, so nothing another replica restored first is overwritten;
- the epoch number, raised to the highest it knows.

So the numbering goes on across the restart: a replica's first heartbeat on the new
coordinator comes after its restore, and a new epoch needs live members, so an epoch that a
live replica is in is back in the store before anyone can count that replica and form the
next one (elastic/membership.py). Replicas that just came back also wait ``elastic.peer_timeout_s``
before forming anything, so the slower ones can restore first.

While the coordinator is away the replicas go on training: the current epoch's group
connects the leaders directly. Only what needs the coordinator waits (a new epoch) or is
skipped (liveness checks between polls); :class:`CoordinatorAway` says which call could not
run, and :meth:`Memory.away_for` how long the outage has lasted.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from datetime import timedelta
from typing import Callable, Generic, Optional, TypeVar, Union

import torch.distributed as dist

from hogwild.config.env import split_endpoint
from hogwild.native import Bounded, CallTimedOut, Pending
from hogwild.elastic.signing import Signer, SignedStore, parse
from hogwild.errors import UserError, first_line
from hogwild.sync.comm import PeerLost

logger = logging.getLogger(__name__)
T = TypeVar("T")

# Between the leader's reconnection attempts while the coordinator is away: a connect to a host
# that drops packets blocks its main loop for CONNECT_S. The heartbeat thread tries at each beat
# (it blocks nobody), so it is usually the one that puts the keys back.
RETRY_S = 2.0
CONNECT_S = 0.5
# The least deadline of one store call: a healthy coordinator answers in milliseconds, a loaded
# host's scheduler may add a second; shorter would call a busy coordinator away.
MIN_CALL_S = 2.0


def call_deadline(peer_timeout_s: float) -> float:
    """A store call's deadline: a coordinator is given as long as a peer before it counts as away."""
    return max(MIN_CALL_S, peer_timeout_s)


# Who is told of each store call in this process (observe_calls): nobody, but in a measurement.
_OBSERVERS: list[Callable[[str, str, float], None]] = []


def observe_calls(observer: Callable[[str, str, float], None]) -> None:
    """From now on, each store call of every link in this process to ``observer(operation, key,
    seconds)``: the coordinator's load, counted where it comes from (scripts/measures/coordinator_swarm.py)."""
    _OBSERVERS.append(observer)


class CoordinatorAway(PeerLost):
    """The coordinator cannot be reached right now."""


def connect(endpoint: str, timeout_s: float) -> dist.TCPStore:
    host, port = split_endpoint(endpoint)
    deadline = time.monotonic() + timeout_s
    # Wait for the port with plain sockets: a TCPStore constructor left running in a helper
    # thread when the process exits aborts it ("terminate called without an active exception").
    while not _listening(host, port):
        if time.monotonic() >= deadline:
            raise UserError(f"elastic.coordinator: no coordinator reachable at {endpoint} within {timeout_s:.0f}s "
                            "(sync.timeout_s; start one with hogwild-coordinator): connection refused")
        time.sleep(0.2)
    try:
        # The deadline is for a server that accepts and never answers, which the client would
        # wait for forever.
        return Bounded(max(MIN_CALL_S, deadline - time.monotonic())).call(
            lambda: dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s)), "connect")
    except (RuntimeError, TimeoutError, dist.DistError) as e:
        raise UserError(f"elastic.coordinator: no coordinator reachable at {endpoint} within {timeout_s:.0f}s "
                        f"(sync.timeout_s; start one with hogwild-coordinator): {first_line(e)}") from None


def _listening(host: str, port: int) -> bool:
    # A plain socket first: a TCPStore client that cannot connect logs C++ stack traces.
    try:
        with socket.create_connection((host, port), timeout=CONNECT_S):
            return True
    except OSError:
        return False


class Memory:
    """What one replica's connections share: the keys to put back, the highest epoch it knows,
    and the current outage. Written from the leader's thread and the heartbeat thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kept: dict[str, bytes] = {}
        self.epoch = 0
        self.away_since: Optional[float] = None
        self.back_at = float("-inf")  # when the coordinator was last reached again after an outage

    def keep(self, key: str, value: Union[str, bytes]) -> None:
        with self.lock:
            self.kept[key] = value.encode() if isinstance(value, str) else value

    def forget(self, key: str) -> None:
        with self.lock:
            self.kept.pop(key, None)

    def saw_epoch(self, number: int) -> None:
        with self.lock:
            self.epoch = max(self.epoch, number)

    def away_for(self) -> float:
        since = self.away_since
        return 0.0 if since is None else time.monotonic() - since

    def went_away(self, now: float) -> bool:
        """An outage starts now, unless one is already under way (caller holds the lock)."""
        if self.away_since is not None:
            return False
        self.away_since = now
        return True

    def came_back(self, now: float) -> Optional[float]:
        """The outage ends now: how long it lasted, or None if there was none (caller holds the lock)."""
        if self.away_since is None:
            return None
        lasted, self.away_since, self.back_at = now - self.away_since, None, now
        return lasted


class Link:
    """One TCPStore client that reconnects (and restores, see the module) after an outage."""

    def __init__(self, endpoint: str, timeout_s: float, memory: Memory, call_s: float = MIN_CALL_S,
                 retry_s: float = RETRY_S, signer: Optional[Signer] = None,
                 on_call: Callable[[], None] = lambda: None) -> None:
        self.endpoint, self.timeout_s, self.memory, self.retry_s = endpoint, timeout_s, memory, retry_s
        self.signer = signer or Signer(None)
        self.on_call = on_call  # each call is a turn of its caller's loop (elastic liveness)
        self.host, self.port = split_endpoint(endpoint)
        self._store: Optional[dist.TCPStore] = connect(endpoint, timeout_s)
        self._next_try = 0.0
        self._bounded = Bounded(call_s)
        self._batches: set[int] = set()  # the threads running a batch of calls now (start())

    @property
    def store(self) -> dist.TCPStore:
        """The raw client (a Gloo group's rendezvous runs on it); reconnects if needed."""
        return self._bounded_call(self._client, "reconnect")

    def _client(self) -> dist.TCPStore:
        if self._store is None:
            self._reconnect()
        assert self._store is not None
        return self._store

    def _bounded_call(self, fn: Callable[[], T], what: str) -> T:
        if threading.get_ident() in self._batches:  # the batch's thread is under a deadline already
            return fn()
        try:
            return self._bounded.call(fn, what)
        except CallTimedOut as e:
            raise self.gave_up(e) from None

    def gave_up(self, e: CallTimedOut) -> CoordinatorAway:
        """A call (or a batch) past its deadline: the coordinator counts as lost from now."""
        self._lost(e)
        return CoordinatorAway(f"elastic.coordinator {self.endpoint} unreachable: {e}")

    def start(self, fn: Callable[[], T], what: str) -> Batch[T]:
        """``fn``, a few calls of this link, started now on one thread under one deadline: its
        calls run there one after the other, not each on a thread of its own as a lone call does.
        A thread a call cost an elastic leader 1.2 ms of CPU a round at R = 8 on 2 cores, where the
        cores are the workers' (docs/scale.md). :meth:`Batch.result` waits for it."""
        def batch() -> T:
            me = threading.get_ident()
            self._batches.add(me)
            try:
                return fn()
            finally:
                self._batches.discard(me)

        try:
            return Batch(self, self._bounded.start(batch, what))
        except CallTimedOut as e:
            raise self.gave_up(e) from None

    def _do(self, op: str, *args: object) -> object:
        if not _OBSERVERS:
            return self._call(op, *args)
        t0 = time.monotonic()
        try:
            return self._call(op, *args)
        finally:
            for observe in _OBSERVERS:
                observe(op, str(args[0]) if args else "", time.monotonic() - t0)

    def _call(self, op: str, *args: object) -> object:
        self.on_call()
        run = lambda: getattr(SignedStore(self._client(), self.signer), op)(*args)  # noqa: E731
        try:
            return self._bounded_call(run, op)
        except dist.DistNetworkError as e:
            self._lost(e)
        # The connection was dead (often just stale: the coordinator already came back): once more.
        try:
            return self._bounded_call(run, op)
        except dist.DistNetworkError as e:
            self._lost(e)
            raise CoordinatorAway(f"elastic.coordinator {self.endpoint} unreachable: {first_line(e)}") from None

    def _lost(self, e: BaseException) -> None:
        self._store, self._next_try = None, 0.0
        with self.memory.lock:
            if self.memory.went_away(time.monotonic()):
                logger.warning("lost the coordinator at %s (%s); training goes on, membership changes wait for it",
                               self.endpoint, first_line(e))

    def _reconnect(self) -> None:
        now = time.monotonic()
        if now < self._next_try:
            raise CoordinatorAway(f"elastic.coordinator {self.endpoint} unreachable")
        self._next_try = now + self.retry_s
        if not _listening(self.host, self.port):
            raise CoordinatorAway(f"elastic.coordinator {self.endpoint} unreachable")
        try:
            store = dist.TCPStore(self.host, self.port, is_master=False, timeout=timedelta(seconds=self.timeout_s))
            self._restore(store)
        except (RuntimeError, dist.DistError) as e:
            raise CoordinatorAway(f"elastic.coordinator {self.endpoint}: {first_line(e)}") from None
        self._store = store
        with self.memory.lock:
            lasted = self.memory.came_back(now)
            if lasted is not None:
                logger.warning("coordinator at %s is back after %.1fs; restored %d keys and epoch %d", self.endpoint,
                               lasted, len(self.memory.kept), self.memory.epoch)

    def _restore(self, store: dist.TCPStore) -> None:
        with self.memory.lock:
            kept, epoch = dict(self.memory.kept), self.memory.epoch
        signed = SignedStore(store, self.signer)
        for key, value in kept.items():  # keys first: whoever reads the epoch finds its members
            signed.compare_set(key, b"", value)
        while (current := signed.counter("epoch", 0)) < epoch:
            signed.compare_set("epoch", str(current).encode(), str(epoch).encode())

    # the store's calls, through the reconnecting path and the signer (elastic/signing.py)
    def add(self, key: str, n: int) -> int:
        return int(self._do("counter", key, n))  # type: ignore[call-overload]

    def get(self, key: str) -> bytes:
        return self._do("get", key)  # type: ignore[return-value]

    def set(self, key: str, value: Union[str, bytes]) -> None:
        self._do("set", key, _bytes(value))

    def check(self, key: str) -> bool:
        return bool(self._do("check", key))

    def compare_set(self, key: str, expected: str, desired: str) -> str:
        raw = self._do("compare_set", key, expected.encode(), desired.encode())
        return raw.decode(errors="replace")  # type: ignore[attr-defined]

    def delete(self, key: str) -> None:
        self._do("delete", key)

    def fetch(self, key: str) -> Optional[bytes]:
        """The key's value, or None if it is not there or the coordinator is away."""
        try:
            return self._do("read", key)  # type: ignore[return-value]
        except CoordinatorAway:
            return None

    def append(self, log: str, value: str) -> None:
        """Add ``value`` to ``log``: the key ``log`` counts its entries, ``log/<i>`` holds the i-th."""
        self.set(f"{log}/{self.add(log, 1)}", value)

    def entries(self, log: str, start: int, count: int) -> list[bytes]:
        """Entries ``start + 1`` to ``count`` of ``log`` (:meth:`append`), up to the first not yet
        written: it is counted a moment before it is written, and read at a later look."""
        out: list[bytes] = []
        for i in range(start + 1, count + 1):
            raw = self.fetch(f"{log}/{i}")
            if raw is None:
                break
            out.append(raw)
        return out

    def fetch_as(self, key: str, fn: Callable[[bytes], T]) -> Optional[T]:
        """:meth:`fetch`, parsed by ``fn``; a value it cannot parse stops the replica in one line."""
        raw = self.fetch(key)
        return None if raw is None else parse(key, raw, fn)


class Batch(Generic[T]):
    """Calls under way (:meth:`Link.start`)."""

    def __init__(self, link: Link, pending: Pending[T]) -> None:
        self._link, self._pending = link, pending

    def result(self) -> T:
        """What the batch returned or raised; past its deadline, the coordinator counts as lost
        (:class:`CoordinatorAway`), and the link's calls fail at once until the batch returns."""
        try:
            return self._pending.result()
        except CallTimedOut as e:
            raise self._link.gave_up(e) from None


def _bytes(value: Union[str, bytes]) -> bytes:
    return value.encode() if isinstance(value, str) else value
