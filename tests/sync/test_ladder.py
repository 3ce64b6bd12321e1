"""``sync.compress=auto``: a paced average's rounds climb from whole fp32 to int8, then to int8 in
four fragments, while the link asks for more than two optimizer steps between rounds; every leader
at the same round, the replicas still agreeing, and the rung carried by the rule's state."""

from __future__ import annotations

import pytest
import torch

from hogwild.config.sync import SyncConfig
from hogwild.replica.board import Board
from hogwild.sync.comm import Comm, LocalComm
from hogwild.sync.fragments import Fragmented
from hogwild.sync.ladder import Ladder, climbs
from hogwild.sync.rounds import RoundFlags, Rounds
from hogwild.sync.rules import Average, make_rule
from hogwild.sync.schedule import SyncSchedule
from tests.conftest import compose_cfg
from tests.fake_comm import run_ranks

PACED = SyncConfig(mode="average", interval="auto")


def test_the_link_asks_for_a_climb_when_its_shortest_round_needs_the_floor_or_more() -> None:
    assert climbs([(5.0, 0.1), (2.0, 0.1)], floor=2)
    assert not climbs([(5.0, 0.1), (1.9, 9.0)], floor=2)  # the leader's CPU is not the link
    assert not climbs([(0.0, 0.0), (0.0, 0.0)], floor=2)  # nothing measured yet
    assert not climbs([(float("nan"), 0.0)], floor=2)


def test_only_a_paced_average_on_whole_fp32_rounds_climbs() -> None:
    """The choice is made once, where the defaults are resolved: a wire or fragments of the user's
    own, a fixed interval, SGD's slowmo or row-sparse rounds keep what was set."""
    assert compose_cfg(["optim.name=adamw"]).sync.compress == "auto"
    for overrides in (["optim.name=adamw", "sync.dtype=int8"], ["optim.name=adamw", "sync.fragments=2"],
                      ["optim.name=adamw", "sync.interval=10"], ["optim.name=adamw", "sync.compress=off"],
                      ["optim.name=sgd"], ["optim.name=adamw", "sync.mode=diloco"]):
        cfg = compose_cfg(overrides)
        assert cfg.sync.compress == "off", overrides
        assert not isinstance(make_rule(cfg.sync, LocalComm(), 100), Ladder), overrides
    assert isinstance(make_rule(PACED, LocalComm(), 100), Ladder)


def test_a_ladder_climbs_one_rung_at_a_time_and_waits_for_the_new_rung_s_own_measure() -> None:
    ladder = make_rule(PACED, LocalComm(), 100)
    assert isinstance(ladder, Ladder) and ladder.wire_name == "fp32" and not ladder.inner.compressed
    slow = [(9.0, 0.1), (8.0, 0.1)]
    # The first round's asks (which the second round carries) include the connection's set-up.
    assert not ladder.after_round(slow, floor=2)
    assert ladder.after_round(slow, floor=2) and ladder.wire_name == "int8"
    assert isinstance(ladder.inner, Average) and ladder.inner.compressed
    # The next round's asks were measured on fp32, the one after on int8's first round (which
    # also agrees on its base): neither moves it.
    assert not ladder.after_round(slow, floor=2) and not ladder.after_round(slow, floor=2)
    assert ladder.after_round(slow, floor=2) and ladder.wire_name == "int8/4"
    assert isinstance(ladder.inner, Fragmented) and len(ladder.inner.parts) == 4
    for _ in range(10):
        assert not ladder.after_round(slow, floor=2)  # the top rung
    fast = make_rule(PACED, LocalComm(), 100)
    assert isinstance(fast, Ladder)
    for _ in range(10):
        assert not fast.after_round([(1.0, 0.5), (1.5, 0.5)], floor=2)
    assert fast.wire_name == "fp32"


def test_the_rung_travels_in_the_rule_s_state_to_a_checkpoint_or_a_joiner() -> None:
    ladder = make_rule(PACED, LocalComm(), 100)
    assert isinstance(ladder, Ladder)
    flat = torch.randn(100)
    ladder.prime(flat)
    for _ in range(5):
        ladder.after_round([(9.0, 0.0)], floor=2)
    assert ladder.wire_name == "int8/4"
    joiner = make_rule(PACED, LocalComm(), 100)
    assert isinstance(joiner, Ladder)
    joiner.load_state_dict(ladder.state_dict())
    assert joiner.wire_name == "int8/4" and isinstance(joiner.inner, Fragmented)
    old = make_rule(PACED, LocalComm(), 100)  # a checkpoint from before the ladder: the bottom rung
    old.load_state_dict({})
    assert isinstance(old, Ladder) and old.wire_name == "fp32"


def _replica(comm: Comm, steps: int) -> tuple[list[torch.Tensor], list[str], dict[str, object], list[float]]:
    """A replica of 4,096 values that drifts between rounds, whose steps are so fast that any
    round asks for thousands of steps: its rounds climb to the top."""
    torch.manual_seed(comm.rank)
    flat, board = torch.randn(4096), Board(1)
    rounds = Rounds(flat, make_rule(PACED, comm, 4096), comm, board, SyncSchedule.from_config(PACED))
    after, wires, sent = [], [], []
    for k in range(steps):
        flat.add_(torch.randn(4096), alpha=0.01)  # this replica's own steps since the last round
        board.stats["pos"] = [1000.0 * (k + 1)]
        board.stats["step_s"] = [0.001 * (k + 1)]
        before = rounds.rule.meter.sent
        rounds.run(RoundFlags(), timeout_s=20.0)
        after.append(flat.clone())
        wires.append(rounds.wire()["sync_wire"])
        sent.append(rounds.rule.meter.sent - before)
    rounds.run(RoundFlags(done=True, final=True), timeout_s=20.0)
    after.append(flat.clone())
    return after, wires, rounds.wire(), sent


def test_two_replicas_climb_together_and_still_land_on_one_model() -> None:
    a, b = run_ranks(2, lambda comm: _replica(comm, 12))
    # Round 1 carries no asks, round 2 the first round's (its connection set-up): round 3 climbs.
    assert a[1] == b[1] == ["fp32", "fp32", "int8", "int8", "int8", "int8/4", *["int8/4"] * 6]
    assert a[2]["sync_wire"] == "int8/4" and a[2]["sync_wire_climbs"] == [{"round": 3, "wire": "int8"},
                                                                          {"round": 6, "wire": "int8/4"}]
    for x, y in zip(a[0][:5], b[0][:5]):
        # Nothing writes between a whole round and its snapshot here, so both replicas hold the
        # round's target (a fragment's round leaves the rest of the model where each replica took it).
        assert torch.allclose(x, y, atol=1e-5), (x - y).abs().max()
    assert torch.equal(a[0][-1], b[0][-1])
    fp32, int8, quarter = a[3][0], a[3][4], a[3][-1]  # round 4 also agreed on int8's base
    assert int8 < fp32 / 3 and quarter < fp32 / 12, a[3]  # what the rounds put on the link


def test_sync_compress_takes_auto_or_off_and_names_itself_otherwise() -> None:
    from hogwild.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^sync\.compress: unknown value 'int8'"):
        SyncConfig(compress="int8")
