"""The coordinator link against a coordinator that is stopped, not dead (fast tier).

A stopped server (SIGSTOP, or a network that drops packets) still completes TCP handshakes, so
a store client blocks in ``recv`` far past its own timeout. Here a proxy in front of a real
coordinator plays that server: while paused it accepts and reads, and forwards nothing.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Iterator

import pytest

from hogwild.elastic.link import CoordinatorAway, Link, Memory
from hogwild.elastic.membership import Membership
from hogwild.errors import UserError
from tests.elastic.helpers import coordinator_thread

pytestmark = pytest.mark.timeout(120)

CALL_S = 2.0


class PausableProxy:
    """Forwards 127.0.0.1:<port> to ``upstream``; :meth:`pause` holds every byte, as a stopped process would."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.running = threading.Event()
        self.running.set()
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def pause(self) -> None:
        self.running.clear()

    def resume(self) -> None:
        self.running.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.srv.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                self.running.wait()
                dst.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.srv.close()


@pytest.fixture
def proxy() -> Iterator[PausableProxy]:
    with coordinator_thread() as port:
        p = PausableProxy(port)
        yield p
        p.resume()
        p.close()


def test_a_call_to_a_stopped_coordinator_gives_up_at_its_deadline_and_recovers_when_it_wakes(
        proxy: PausableProxy) -> None:
    memory = Memory()
    link = Link(f"127.0.0.1:{proxy.port}", 30.0, memory, call_s=CALL_S, retry_s=0.1)
    memory.keep("job", "fp")
    assert link.add("hb/0", 1) == 1
    proxy.pause()
    t0 = time.monotonic()
    with pytest.raises(CoordinatorAway, match="unreachable"):
        link.add("hb/0", 1)
    # Before the fix the call blocked until the server woke, however long that took.
    assert time.monotonic() - t0 < CALL_S + 3
    assert memory.away_since is not None
    t0 = time.monotonic()
    for _ in range(5):  # and while it sleeps, no call piles up behind the blocked one
        with pytest.raises(CoordinatorAway):
            link.check("job")
    assert time.monotonic() - t0 < 1.0
    proxy.resume()
    deadline = time.monotonic() + 30
    while True:
        try:
            assert link.add("hb/0", 0) >= 1
            break
        except CoordinatorAway:
            assert time.monotonic() < deadline, "the link never came back after the coordinator woke"
            time.sleep(0.1)
    assert memory.away_since is None and link.get("job") == b"fp"


def test_a_coordinator_that_accepts_and_never_answers_fails_the_start_in_one_line() -> None:
    silent = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(silent.accept()[0]), daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(UserError, match=r"elastic.coordinator: no coordinator reachable at 127.0.0.1:\d+ within 2s"):
        Link(f"127.0.0.1:{silent.getsockname()[1]}", 2.0, Memory())
    assert time.monotonic() - t0 < 10, "the connect waited on a server that never answers"
    # The abandoned connect waits on the open connection until it is reset, and then logs a C++
    # stack trace: reset it and let it end inside this test's capture, not in a later test's output.
    for conn in held:
        conn.close()
    silent.close()
    for th in threading.enumerate():
        if th.name == "hogwild-store-call":
            th.join(10)
            assert not th.is_alive(), "the abandoned connect outlived its reset connection"


def test_a_membership_waiting_for_a_group_sees_a_stopped_coordinator_as_away(proxy: PausableProxy) -> None:
    m = Membership(f"127.0.0.1:{proxy.port}", 0, 1, 1.0, None, 30.0)
    try:
        m.join()
        proxy.pause()
        t0 = time.monotonic()
        assert not m.changed()  # a leader's check at each round: away means "no change", at once
        assert time.monotonic() - t0 < CALL_S + 3
        assert m.memory.away_for() > 0
    finally:
        proxy.resume()
        m.close()


def test_reading_a_key_that_another_replica_deletes_never_blocks(proxy: PausableProxy) -> None:
    """A check then a get raced a join request being deleted: the get waited for the key the
    store's whole timeout (30 s), the link counted the coordinator as away, and no epoch formed
    (seen beside a CPU hog). A read is now one non-blocking call."""
    memory = Memory()
    link = Link(f"127.0.0.1:{proxy.port}", 30.0, memory, call_s=CALL_S)
    other = Link(f"127.0.0.1:{proxy.port}", 30.0, Memory(), call_s=CALL_S)
    assert link.fetch("want/1") is None and not link.check("want/1"), "a read created the key"
    stop = threading.Event()

    def churn() -> None:  # another replica: asks to join, is admitted, settles, again and again
        while not stop.is_set():
            other.set("want/1", "1.0")
            other.delete("want/1")
    churner = threading.Thread(target=churn, daemon=True)
    churner.start()
    try:
        seen = {link.fetch("want/1") for _ in range(300)}
    finally:
        stop.set()
        churner.join(10)
    assert seen <= {None, b"1.0"} and memory.away_since is None, "a read blocked on a deleted key"


class ThreadsSeen:
    """A store client that notes the thread each call runs on."""

    def __init__(self, store: Any) -> None:
        self.store, self.seen = store, list[threading.Thread]()  # the objects: an ident is reused

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.store, name)

        def noted(*args: Any) -> Any:
            self.seen.append(threading.current_thread())
            return fn(*args)
        return noted

    def threads(self) -> int:
        return len({id(t) for t in self.seen})


def test_a_batch_of_calls_runs_on_one_thread_and_answers_what_it_read(proxy: PausableProxy) -> None:
    link = Link(f"127.0.0.1:{proxy.port}", 30.0, Memory(), call_s=CALL_S)
    link._store = store = ThreadsSeen(link._store)  # type: ignore[assignment]

    def calls() -> int:
        link.set("pos/0", b"1")
        link.set("done/0", b"2")
        return link.add("epoch", 0) + link.add("wants", 0)

    assert link.start(calls, "a round's calls").result() == 0
    # One thread for the batch, not one a call: a thread a call is what cost a leader its CPU.
    assert store.threads() == 1 and threading.current_thread() not in store.seen
    store.seen.clear()
    assert link.get("pos/0") == b"1" and link.get("done/0") == b"2"
    assert store.threads() == 2  # lone calls: each on a thread of its own, under its own deadline


def test_a_batch_to_a_stopped_coordinator_gives_up_at_one_deadline_and_blocks_no_later_call(
        proxy: PausableProxy) -> None:
    memory = Memory()
    link = Link(f"127.0.0.1:{proxy.port}", 30.0, memory, call_s=CALL_S, retry_s=0.1)
    assert link.add("epoch", 0) == 0
    proxy.pause()
    t0 = time.monotonic()
    batch = link.start(lambda: [link.add("epoch", 0) for _ in range(4)], "a round's calls")
    assert time.monotonic() - t0 < 1.0  # started, not waited for
    with pytest.raises(CoordinatorAway, match="unreachable"):
        batch.result()
    assert time.monotonic() - t0 < CALL_S + 3  # one deadline for the four, not one each
    assert memory.away_since is not None
    t0 = time.monotonic()
    with pytest.raises(CoordinatorAway):  # the blocked batch holds no later call for a deadline
        link.check("epoch")
    with pytest.raises(CoordinatorAway):
        link.start(lambda: link.check("epoch"), "the next round's calls")
    assert time.monotonic() - t0 < 1.0
    proxy.resume()
    deadline = time.monotonic() + 30
    while True:  # calls go through again once the batch has returned
        try:
            assert link.add("epoch", 0) == 0
            break
        except CoordinatorAway:
            assert time.monotonic() < deadline, "the link never came back after the coordinator woke"
            time.sleep(0.1)
