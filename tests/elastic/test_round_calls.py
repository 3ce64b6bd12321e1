"""An elastic member's calls to the coordinator around a round (fast tier): made on a thread of
their own, so a round never waits for the slowest member's answers; what they publish is what the
member held before the round's snapshot; what they see re-forms the group at the next round; and
what they raise is raised in the leader's thread."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import pytest
import torch

from hogwild.elastic.ledger import Ledger
from hogwild.elastic.link import CoordinatorAway
from hogwild.errors import UserError
from hogwild.leader.elastic import ElasticGroup, floats
from hogwild.native import Bounded, Pending
from hogwild.replica.board import Counts


class Coordinator:
    """Every call a member makes there, in order. ``answer``: held until set (a slow coordinator);
    ``joining``: a slot asks to join; ``broken``: what the next look raises; ``blocked``: an earlier
    batch is still blocked there, so the link refuses new ones at once."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.kept: dict[str, bytes] = {}
        self.answer = threading.Event()
        self.answer.set()
        self.joining = False
        self.broken: Exception | None = None
        self.endpoint = "127.0.0.1:1"
        self.blocked = False

    def put(self, key: str, raw: bytes) -> None:
        assert self.answer.wait(10)
        self.calls.append(f"put {key}")
        self.kept[key] = raw

    def changed(self) -> bool:
        self.calls.append("changed")
        if self.broken is not None:
            raise self.broken
        return self.joining

    def away_for(self) -> float:  # the member's own memory of the coordinator: no call
        return 0.0

    def start(self, fn: Callable[[], bool], what: str) -> Pending[bool]:  # as a link starts a batch of calls
        if self.blocked:
            raise CoordinatorAway("elastic.coordinator 127.0.0.1:1 unreachable: an earlier call is still blocked")
        return Bounded(10.0).start(fn, what)


class Replica:
    def __init__(self) -> None:
        self.pos = np.array([10.0, 12.0])
        self.steps = 22

    def positions(self) -> np.ndarray:
        return self.pos.copy()

    def totals(self) -> Counts:
        return Counts(steps=self.steps)


@pytest.fixture
def member() -> tuple[ElasticGroup, Coordinator, Replica]:
    group: Any = ElasticGroup.__new__(ElasticGroup)
    coord, rep = Coordinator(), Replica()
    group.keys = group.membership = coord
    group.env = SimpleNamespace(rank=1)
    group.comm = SimpleNamespace(rank=1)  # not the writer: elect() takes no lock
    group.cfg = SimpleNamespace(sync=SimpleNamespace(timeout_s=60.0))
    group.ctl = SimpleNamespace(stopping=False)
    group.lock, group.lock_refused, group.is_writer = None, False, False
    group._ledger, group._here = Ledger(2, 2), rep
    group._calls, group._changed = None, False
    return group, coord, rep


def _counts(raw: bytes) -> Counts:
    return Counts.from_tensor(torch.from_numpy(np.frombuffer(raw, dtype=np.float64).copy()))


def test_a_round_begins_while_the_coordinator_has_not_answered(
        member: tuple[ElasticGroup, Coordinator, Replica]) -> None:
    group, coord, _ = member
    coord.answer.clear()  # the coordinator answers nothing until the round is under way
    assert group.before_round() is False
    assert coord.calls == []
    coord.answer.set()
    group.settle()
    assert coord.calls == ["put pos/1", "put done/1", "changed"]


def test_it_publishes_what_it_held_before_the_round(member: tuple[ElasticGroup, Coordinator, Replica]) -> None:
    group, coord, rep = member
    coord.answer.clear()
    group.before_round()
    rep.pos += 7.0  # the workers ran on during the round: the round did not merge those steps
    rep.steps += 14
    coord.answer.set()
    group.settle()
    assert floats(2)(coord.kept["pos/1"]).tolist() == [10.0, 12.0]
    assert _counts(coord.kept["done/1"]).steps == 22


def test_a_join_seen_during_one_round_re_forms_the_group_at_the_next(
        member: tuple[ElasticGroup, Coordinator, Replica]) -> None:
    group, coord, _ = member
    coord.joining = True
    assert group.before_round() is False  # its calls see the join while this round goes on
    assert group.before_round() is True  # every member's flag travels with this round


def test_what_the_calls_raise_stops_the_leader_at_the_next_round(
        member: tuple[ElasticGroup, Coordinator, Replica]) -> None:
    group, coord, _ = member
    coord.broken = UserError("elastic.coordinator 127.0.0.1:1: want/3 holds 'x', not a join request")
    group.before_round()
    with pytest.raises(UserError, match="want/3"):
        group.before_round()


def test_while_an_earlier_batch_is_blocked_a_round_still_keeps_what_it_held(
        member: tuple[ElasticGroup, Coordinator, Replica]) -> None:
    group, coord, rep = member
    coord.blocked = True
    rep.steps = 40
    assert group.before_round() is False
    # put() keeps the record in the member's memory before its set fails, so what a restore puts
    # back after the outage is this round's, not the last one before it
    assert coord.calls == ["put pos/1", "put done/1"]
    assert _counts(coord.kept["done/1"]).steps == 40
