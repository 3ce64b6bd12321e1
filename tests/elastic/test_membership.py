"""Elastic membership in one process (fast tier): several slots, each a thread with its own
:class:`Membership`, against a coordinator store served from a thread here. No training, no
Gloo group: only the epochs, quorum, joins, drops and the job's identity, in seconds.

Timeouts are short but every wait is bounded by a deadline, never a fixed sleep, so a loaded
machine makes these slower, not wrong.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

import pytest

from hogwild.elastic.membership import Dropped, Epoch, Membership
from hogwild.errors import Fault, StopNow, UserError
from tests.elastic.helpers import coordinator_thread

pytestmark = pytest.mark.timeout(120)

PEER_S = 1.0  # elastic.peer_timeout_s: heartbeats every 0.2 s
TIMEOUT_S = 20.0  # sync.timeout_s: long enough for a busy machine, only reached by the quorum test


@pytest.fixture
def coordinator() -> Iterator[str]:
    with coordinator_thread() as port:
        yield f"127.0.0.1:{port}"


def _slots(endpoint: str, n: int, slots: int = 3, timeout_s: float = TIMEOUT_S,
           stopped: Callable[[], bool] = lambda: False) -> list[Membership]:
    return [Membership(endpoint, s, slots, PEER_S, None, timeout_s, stopped) for s in range(n)]


def _all(calls: list[Callable[[], Epoch]]) -> list[Epoch]:
    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result(timeout=60) for f in [pool.submit(c) for c in calls]]


def _joined(ms: list[Membership]) -> list[Epoch]:
    """Every slot joins at once (a fresh job, or all restarted): an epoch of joiners only, each
    healed from its source as a leader's first epoch is (Membership.settled)."""
    epochs = _all([m.join for m in ms])
    for m, ep in zip(ms, epochs):
        m.settled(ep)
    return epochs


def _close(ms: list[Membership]) -> None:
    for m in ms:
        m.close()


def _admit(members: list[Membership], joiner: Membership) -> list[Epoch]:
    """``joiner`` asks to join while ``members`` play leaders: at each round they look for a
    change (Membership.changed) and re-form when there is one, until the joiner is admitted. On a
    loaded host a formation may miss a joiner whose first heartbeat came late; it puts its
    request back, and the next round admits it, as in a real job. The members' last epochs,
    then the joiner's."""
    with ThreadPoolExecutor(len(members) + 1) as pool:
        joining = pool.submit(joiner.join)
        deadline = time.monotonic() + 60
        while True:
            while not members[0].changed():
                assert time.monotonic() < deadline, "the join request never showed"
                if joining.done():
                    break
                time.sleep(0.05)
            epochs = [f.result(timeout=60) for f in [pool.submit(m.advance) for m in members]]
            if joiner.slot in epochs[0].members:
                return [*epochs, joining.result(timeout=60)]
            assert time.monotonic() < deadline, f"{joiner.slot} was never admitted: {epochs}"


def test_the_first_epoch_holds_every_slot_and_all_agree(coordinator: str) -> None:
    ms = _slots(coordinator, 3)
    try:
        epochs = _joined(ms)
        assert len(set(epochs)) == 1, epochs
        ep = epochs[0]
        assert ep.number == 1 and ep.members == (0, 1, 2) and ep.joiners == (0, 1, 2)
        assert [m.changed() for m in ms] == [False] * 3, "a formed group has nothing to re-form"
    finally:
        _close(ms)


def test_survivors_form_the_next_epoch_without_a_dead_slot_and_it_rejoins_as_a_joiner(coordinator: str) -> None:
    ms = _slots(coordinator, 3)
    try:
        _joined(ms)
        ms[2].close()  # its heartbeat stops: a killed replica
        survivors = _all([ms[0].advance, ms[1].advance])
        assert survivors[0] == survivors[1] and survivors[0].members == (0, 1) and survivors[0].number == 2
        assert survivors[0].source == 0

        back = Membership(coordinator, 2, 3, PEER_S, None, TIMEOUT_S)  # the restarted process
        ms.append(back)
        # The members notice the request at a round (Membership.changed) and re-form with it.
        epochs = _admit(ms[:2], back)
        assert len(set(epochs)) == 1 and epochs[0].members == (0, 1, 2) and epochs[0].joiners == (2,)
        assert epochs[0].source == 0
        assert [e.number for e in ms[0].history()] == list(range(1, epochs[0].number + 1))
    finally:
        _close(ms)


def test_a_minority_never_forms_a_group_and_says_who_is_alive(coordinator: str) -> None:
    ms = _slots(coordinator, 3, timeout_s=3.0)
    try:
        _joined(ms)
        ms[1].close()
        ms[2].close()
        with pytest.raises(Fault, match=r"no group with a quorum formed within 3s .*slots alive: \[0\]"):
            ms[0].advance()
        assert ms[0].current() == 1, "a minority formed an epoch"
    finally:
        _close(ms)


def test_a_silent_member_is_dropped_and_learns_it(coordinator: str) -> None:
    ms = _slots(coordinator, 3)
    try:
        _joined(ms)
        ms[2].liveness.heartbeat.stop()  # stopped (SIGSTOP, a long GC pause): its process lives on
        epochs = _all([ms[0].advance, ms[1].advance])
        assert epochs[0].members == (0, 1)
        with pytest.raises(Dropped, match="replica 2 was dropped"):
            ms[2].advance()
    finally:
        _close(ms)


def test_a_signal_while_waiting_for_a_group_stops_the_wait(coordinator: str) -> None:
    stop = threading.Event()
    lone = Membership(coordinator, 0, 3, PEER_S, None, TIMEOUT_S, stop.is_set)
    try:
        threading.Timer(0.5, stop.set).start()
        with pytest.raises(StopNow):
            lone.join()  # 1 of 3 slots: no quorum ever; the signal ends the wait, not the timeout
    finally:
        lone.close()


def test_a_replica_of_another_job_is_refused_and_the_run_dir_is_the_first_ones(coordinator: str) -> None:
    a, b, c = _slots(coordinator, 3)
    try:
        assert a.keys.agree_job("model=mlp params=9610", "runs/a") == "runs/a"
        assert b.keys.agree_job("model=mlp params=9610", "runs/elsewhere") == "runs/a"
        with pytest.raises(UserError, match=r"elastic.coordinator .*model=convnet.* differs from the running job's"):
            c.keys.agree_job("model=convnet params=1", "runs/a")
    finally:
        _close([a, b, c])


def test_a_slot_that_wakes_after_the_job_finished_leaves(coordinator: str) -> None:
    ms = _slots(coordinator, 2, slots=2)
    try:
        _joined(ms)
        ms[0].keys.put("finished", "1")
        ms[1].close()  # slot 1's process is gone; its restart comes too late
        late = Membership(coordinator, 1, 2, PEER_S, None, TIMEOUT_S)
        ms.append(late)
        with pytest.raises(Fault, match="finished while replica 1 was away"):
            late.join()
    finally:
        _close(ms)


def test_a_joiner_that_died_before_admission_stops_asking(coordinator: str) -> None:
    """Its join request outlived it: every round saw a slot wanting in and re-formed the group
    (a new epoch, a new Gloo group, an alive-window wait), forever (issue 24, item 4)."""
    ms = _slots(coordinator, 3)
    try:
        _joined(ms)
        ms[2].close()
        _all([ms[0].advance, ms[1].advance])  # slot 2 lost
        ghost = Membership(coordinator, 2, 3, PEER_S, None, TIMEOUT_S)
        ghost.wanted(2, "1", keep=True)  # asked to join, then died before its heartbeat ever ran
        ghost.close()
        assert ms[0].changed()
        epochs = _all([ms[0].advance, ms[1].advance])
        assert epochs[0].members == (0, 1) and epochs[0].joiners == ()
        assert not ms[0].changed() and not ms[1].changed(), "the dead joiner's request keeps re-forming the group"
    finally:
        _close(ms)


def test_a_whole_group_restarted_against_a_live_coordinator_forms_again(coordinator: str) -> None:
    """Every replica died (or a minority timed out) while the coordinator kept running, and the
    restart loop brought them all back: their own new heartbeats made the old epoch look alive,
    so each waited to be admitted by a group that no longer existed (issue 24, item 1)."""
    first = _slots(coordinator, 3)
    _joined(first)
    _close(first)  # all three die
    again = _slots(coordinator, 3, timeout_s=8.0)
    try:
        epochs = _joined(again)
        assert len(set(epochs)) == 1 and epochs[0].number == 2, epochs
        assert epochs[0].members == (0, 1, 2) and epochs[0].joiners == (0, 1, 2)
    finally:
        _close(again)


def test_a_second_process_in_a_live_slot_is_refused(coordinator: str) -> None:
    """A requeued job whose old node still runs: the second process in slot 1 used to be admitted
    and finish with exit 0 while the first exited 3, and the steps were counted twice (issue 24,
    item 7). It is refused in one line; the first keeps its slot."""
    ms = _slots(coordinator, 3)
    try:
        _joined(ms)
        twin = Membership(coordinator, 1, 3, PEER_S, None, TIMEOUT_S)
        ms.append(twin)
        with pytest.raises(UserError, match=r"elastic.slot=1: the slot is held by a live replica \(\w+ pid \d+"):
            twin.join()
        assert not ms[0].changed(), "the refused twin asked to join anyway"
    finally:
        _close(ms)


def test_a_silent_holder_loses_its_slot_to_its_restart_and_stops_when_it_wakes(coordinator: str) -> None:
    ms = _slots(coordinator, 3)
    try:
        _joined(ms)
        ms[2].liveness.heartbeat.stop()  # stopped, not dead: its process will wake later
        _all([ms[0].advance, ms[1].advance])  # it is dropped
        restart = Membership(coordinator, 2, 3, PEER_S, None, TIMEOUT_S)
        ms.append(restart)
        epochs = _admit(ms[:2], restart)
        assert epochs[2].joiners == (2,)
        with pytest.raises(Fault, match="slot 2 was taken over by another process"):
            ms[2].advance()  # the old holder wakes: it must not come back as slot 2
    finally:
        _close(ms)


def test_a_member_whose_loop_is_stuck_is_dropped_though_its_heartbeat_beats(coordinator: str) -> None:
    """A heartbeat thread proves that a process exists, not that its leader's loop moves: one
    stuck in a write on a network filesystem stayed a member, and the others waited for it in
    every group they formed (issue 24, item 5). Now its progress, carried by the heartbeat, stops."""
    ms = _slots(coordinator, 3)
    looping = {0: threading.Event(), 1: threading.Event(), 2: threading.Event()}
    for e in looping.values():
        e.set()

    def loop(m: Membership, on: threading.Event) -> None:  # a leader's main loop, turning
        step = 0
        while not on.wait(0.05) or on.is_set():
            if not on.is_set():
                continue
            step += 1
            m.liveness.tick(0, step)
            time.sleep(0.05)
    try:
        _joined(ms)
        for m in ms:
            threading.Thread(target=loop, args=(m, looping[m.slot]), daemon=True).start()
        time.sleep(3 * PEER_S)  # everyone is moving: nobody is lost
        assert ms[0].liveness.stale((1, 2)) == [] and ms[1].liveness.stale((0, 2)) == []
        looping[2].clear()  # slot 2's loop hangs; its heartbeat thread goes on
        t0 = time.monotonic()
        deadline = t0 + 30
        # Each member judges by what it saw itself (a leader in a collective looks twice a second).
        while not (2 in ms[0].liveness.stale((1, 2)) and 2 in ms[1].liveness.stale((0, 2))):
            assert time.monotonic() < deadline, "a stuck member was never seen as lost"
            time.sleep(0.05)
        assert time.monotonic() - t0 >= PEER_S * 0.9, "lost before elastic.peer_timeout_s without progress"
        beat = ms[0].liveness.beat_of(2)  # read by another member: slot 2's own calls would count as turns
        assert beat is not None and beat.ticks > 0
        epochs = _all([ms[0].advance, ms[1].advance])
        assert epochs[0] == epochs[1] and epochs[0].members == (0, 1), epochs
    finally:
        for e in looping.values():
            e.clear()
        _close(ms)


def _rejoin_slot_2(coordinator: str, ms: list[Membership]) -> tuple[Membership, list[Epoch]]:
    """Slot 2 dies, the others go on, its restart asks to join and an epoch admits it."""
    ms[2].close()
    _all([ms[0].advance, ms[1].advance])
    back = Membership(coordinator, 2, 3, PEER_S, None, TIMEOUT_S)
    return back, _admit(ms[:2], back)


def _next_epoch_with(members: list[Membership], back: Membership) -> list[Epoch]:
    """Every slot, ``back`` included, moves on to the next epoch. The formation's alive window is
    ``peer_timeout_s / 2`` (0.5 s here): on a loaded host it can miss ``back``'s heartbeat and
    leave it out, and ``back`` is dropped as a real leader would be. It then asks to join again
    and is admitted as a joiner, which is what this file checks either way."""
    with ThreadPoolExecutor(len(members) + 1) as pool:
        futures = [pool.submit(m.advance) for m in [*members, back]]
        epochs = [f.result(timeout=60) for f in futures[:-1]]
        try:
            return [*epochs, futures[-1].result(timeout=60)]
        except Dropped:
            return _admit(members, back)


def test_a_joiner_whose_heal_failed_is_a_joiner_again_in_the_next_epoch(coordinator: str) -> None:
    """Admitted, then its group or its heal failed: the next epoch took it for a plain member
    with its stale model, and as slot 0 it would have become the writer and the heal source
    (issue 24, item 6). Its request now stands until it is healed."""
    ms = _slots(coordinator, 3)
    try:
        _joined(ms)
        back, epochs = _rejoin_slot_2(coordinator, ms)
        ms.append(back)
        assert epochs[0].joiners == (2,)
        assert not ms[0].changed(), "a joiner being healed in this epoch asks again"
        # The heal failed (no settled()): its request stands for the next epoch.
        assert ms[0].wanting(epochs[0].number + 1) == [2]
        # Every member moves on to the next epoch, which takes slot 2 for a joiner again.
        again = _next_epoch_with(ms[:2], back)
        assert len(set(again)) == 1 and again[0].number > epochs[0].number, again
        assert again[0].joiners == (2,) and again[0].source in (0, 1), again[0]
        back.settled(again[0])  # healed this time
        assert not ms[0].changed() and not ms[1].changed()
    finally:
        _close(ms)


def test_the_heal_source_is_the_most_advanced_member_not_the_lowest(coordinator: str) -> None:
    ms = _slots(coordinator, 3)
    done = threading.Event()

    def turning(m: Membership, rnd: int, step: int) -> None:  # a leader's loop: it ticks while it lives
        while not done.wait(0.05):
            m.liveness.tick(rnd, step)
    try:
        _joined(ms)
        # Slot 0 is behind (say it was dropped while stopped and healed since).
        threading.Thread(target=turning, args=(ms[0], 5, 500), daemon=True).start()
        threading.Thread(target=turning, args=(ms[1], 7, 700), daemon=True).start()
        time.sleep(3 * PEER_S / 5)  # a heartbeat or two carries it
        back, epochs = _rejoin_slot_2(coordinator, ms)
        ms.append(back)
        assert epochs[0].joiners == (2,) and epochs[0].source == 1, epochs[0]
        assert all(e == epochs[0] for e in epochs)
    finally:
        done.set()
        _close(ms)


def test_an_epoch_of_joiners_only_names_one_restore_point_the_most_advanced(coordinator: str) -> None:
    """Every replica restarted (or a fresh job), each with what it could restore: each used to
    keep its own checkpoint (issue 24, item 11). The epoch now names the joiner whose restored
    state is furthest on, and the others take its state."""
    ms = _slots(coordinator, 3)
    try:
        for m, (rnd, step) in zip(ms, [(3, 300), (9, 900), (6, 600)]):
            m.liveness.tick(rnd, step)  # as a leader does with its restored state before it joins
        epochs = _joined(ms)
        assert all(e == epochs[0] for e in epochs)
        assert epochs[0].joiners == (0, 1, 2) and epochs[0].source == 1, epochs[0]
        assert Epoch.decode(epochs[0].number, epochs[0].encode(), 3) == epochs[0]
    finally:
        _close(ms)


def test_an_epoch_names_a_joiner_as_its_source_only_when_all_are_joining() -> None:
    assert Epoch.decode(4, "0,1,2|0,1,2|2", 3).source == 2
    assert Epoch.decode(4, "0,1,2|2|1", 3).source == 1
    with pytest.raises(ValueError):
        Epoch.decode(4, "0,1,2|1,2|2", 3)  # a joiner would heal the live member 0


class _Counting:
    """A member's link, counting the store calls it makes (the coordinator's load from it)."""

    def __init__(self, m: Membership) -> None:
        self.keys: list[str] = []
        link = m.link
        for op in ("fetch", "get", "add", "set", "check", "compare_set", "delete"):
            real = getattr(link, op)
            setattr(link, op, self._count(real))

    def _count(self, real: Callable[..., object]) -> Callable[..., object]:
        def call(key: str, *args: object) -> object:
            self.keys.append(key)
            return real(key, *args)
        return call


def test_a_member_reads_the_join_requests_only_when_one_changed(coordinator: str) -> None:
    """Before each round a leader asks whether anyone wants in. It read every slot's want key:
    one call a slot a round at each member, a million a round at 1,000 members. It reads them
    again only when a request was written or deleted, and still sees every new one."""
    ms = [Membership(coordinator, s, 6, PEER_S, 2, TIMEOUT_S) for s in range(2)]  # 2 of 6 slots are a quorum
    try:
        _joined(ms)
        counted = _Counting(ms[0])
        assert not ms[0].changed()  # the first look reads them all
        counted.keys.clear()
        assert not ms[0].changed() and not ms[0].changed()
        assert counted.keys == ["epoch", "wants"] * 2, counted.keys
        late = Membership(coordinator, 4, 6, PEER_S, 2, TIMEOUT_S)
        epochs = _admit(ms, late)
        assert epochs[0].members == (0, 1, 4), epochs
        late.settled(epochs[-1])
        assert not ms[0].changed()
        late.close()
    finally:
        _close(ms)


def test_each_member_reads_a_few_heartbeats_and_learns_every_loss(coordinator: str) -> None:
    """A member read every other member's heartbeat at each check of a collective: R - 1 calls,
    R x (R - 1) at the coordinator. It reads the WATCH after it; a loss one of those finds is
    reported, and the members that do not watch the lost slot learn it from the report."""
    from hogwild.elastic.membership import WATCH

    ms = _slots(coordinator, 7, slots=7)
    try:
        _joined(ms)
        counted = _Counting(ms[0])
        ms[0].lost_peers()
        assert {k for k in counted.keys if k.startswith("hb/")} == {f"hb/{s}" for s in range(1, 1 + WATCH)}
        ms[5].close()  # silent from here: watched by 2, 3 and 4, not by 0 or 6
        deadline = time.monotonic() + 30
        seen: dict[int, dict[int, str]] = {}
        while time.monotonic() < deadline and not all(5 in seen.get(s, {}) for s in (0, 2, 6)):
            for s in (0, 2, 3, 4, 6):
                seen[s] = ms[s].lost_peers()
            time.sleep(0.1)
        assert all(seen[s] == {5: "silent"} for s in (0, 2, 6)), seen
        epochs = _all([m.advance for i, m in enumerate(ms) if i != 5])
        assert all(ep.members == (0, 1, 2, 3, 4, 6) for ep in epochs), epochs
    finally:
        _close(ms)
