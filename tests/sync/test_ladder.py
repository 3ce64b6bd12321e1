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
from hogwild.sync.ladder import Ladder, cost, fitting
from hogwild.sync.schedule import link_ask
from hogwild.sync.rounds import RoundFlags, Rounds
from hogwild.sync.rules import Average, make_rule
from hogwild.sync.schedule import SyncSchedule
from tests.conftest import compose_cfg
from tests.fake_comm import run_ranks

PACED = SyncConfig(mode="average", interval="auto")


def test_the_link_s_ask_is_the_shortest_round_any_replica_saw_and_picks_the_lowest_rung_that_fits() -> None:
    assert link_ask([(5.0, 0.1), (2.0, 9.0)]) == 2.0  # the leader's CPU is not the link
    assert link_ask([(0.0, 0.0), (float("nan"), 0.0)]) is None  # nothing measured yet
    # Two replicas: int8 sends a quarter of fp32's bytes, four fragments of it a sixteenth.
    assert fitting(0, 1.9, floor=2, replicas=2) == 0  # the steps set the pace, not the link
    assert fitting(0, 5.0, floor=2, replicas=2) == 1  # int8 would ask for 1.25
    assert fitting(0, 30.0, floor=2, replicas=2) == 2  # 10 Mbit/s: straight to int8 in fragments
    assert fitting(1, 3.0, floor=2, replicas=2) == 2
    assert fitting(2, 50.0, floor=2, replicas=2) == 2  # the top
    # At eight replicas int8's all_gather sends as much as fp32's all_reduce: only fragments help.
    assert cost(1, 8) == cost(0, 8) and fitting(0, 5.0, floor=2, replicas=8) == 2


def test_many_replicas_never_climb_to_a_wire_that_sends_more_than_whole_fp32_rounds() -> None:
    """int8's all_gather sends R / 8 of fp32's all_reduce: at 32 replicas int8 in four fragments sends
    as much as whole fp32 rounds, at 1,024 replicas 32 times as much. The ladder used to climb to it
    whatever it cost; from 16 replicas on its rung is whole fp32 values in four fragments."""
    assert cost(1, 1024) == 128 and cost(2, 1024) == 32 and cost(3, 1024) == 0.25
    for replicas in (16, 32, 64, 1024):
        assert fitting(0, 5.0, floor=2, replicas=replicas) == 3, replicas  # fp32/4 asks for 1.25
        assert fitting(0, 90.0, floor=2, replicas=replicas) == 3, replicas  # nothing fits: the cheapest
        assert cost(fitting(0, 90.0, floor=2, replicas=replicas), replicas) < cost(0, replicas)
    # Two replicas climb as before: int8 first (every value every round), its fragments past that.
    assert fitting(0, 5.0, floor=2, replicas=2) == 1 and fitting(0, 90.0, floor=2, replicas=2) == 2
    assert fitting(2, 90.0, floor=2, replicas=2) == 2  # fp32/4 sends more than int8/4 there: no step


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


def test_a_ladder_climbs_where_the_link_asks_and_waits_for_the_new_rung_s_own_measure() -> None:
    ladder = make_rule(PACED, LocalComm(), 100)
    assert isinstance(ladder, Ladder) and ladder.wire_name == "fp32" and not ladder.inner.compressed
    assert not ladder.after_round([(0.0, 0.0), (0.0, 0.0)], floor=2)  # the first round: nothing measured
    assert ladder.after_round([(5.0, 0.1), (6.0, 0.1)], floor=2) and ladder.wire_name == "int8"
    assert isinstance(ladder.inner, Average) and ladder.inner.compressed
    # The next round's asks were measured on fp32: they do not move it.
    assert not ladder.after_round([(50.0, 0.1), (50.0, 0.1)], floor=2)
    assert not ladder.after_round([(1.0, 0.1), (1.2, 0.1)], floor=2)  # int8 fits
    assert ladder.after_round([(3.0, 0.1), (3.5, 0.1)], floor=2) and ladder.wire_name == "int8/4"
    assert isinstance(ladder.inner, Fragmented) and len(ladder.inner.parts) == 4
    for _ in range(10):
        assert not ladder.after_round([(90.0, 0.1), (90.0, 0.1)], floor=2)  # the top; never back down
    assert ladder.wire_name == "int8/4"
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
    ladder.after_round([(30.0, 0.0)], floor=2)
    assert ladder.wire_name == "int8/4"
    joiner = make_rule(PACED, LocalComm(), 100)
    assert isinstance(joiner, Ladder)
    joiner.load_state_dict(ladder.state_dict())
    assert joiner.wire_name == "int8/4" and isinstance(joiner.inner, Fragmented)
    old = make_rule(PACED, LocalComm(), 100)  # a checkpoint from before the ladder: the bottom rung
    old.load_state_dict({})
    assert isinstance(old, Ladder) and old.wire_name == "fp32"


def _climbed(hold_rounds: int = 0) -> Ladder:
    """A ladder that climbed to int8 (two replicas ask for 6 steps, the floor is 2), then saw
    ``hold_rounds`` rounds whose asks were still measured on fp32."""
    ladder = make_rule(PACED, LocalComm(), 100)
    assert isinstance(ladder, Ladder)
    ladder.prime(torch.randn(100))
    assert ladder.after_round([(6.0, 0.0), (6.0, 0.0)], floor=2) and ladder.wire_name == "int8"
    for _ in range(hold_rounds):
        assert not ladder.after_round([(6.0, 0.0), (6.0, 0.0)], floor=2)
    return ladder


def test_a_replica_healed_just_after_a_climb_climbs_again_with_its_source() -> None:
    """The hold after a climb travels in the rule's state: a joiner healed from a replica that just
    climbed, and a member healed a round behind its source, decide every later round as it does."""
    fresh = make_rule(PACED, LocalComm(), 100)
    for source, healed in ((_climbed(), fresh), (_climbed(1), _climbed())):
        healed.load_state_dict(source.state_dict())
        for _ in range(3):
            paces = [(6.0, 0.0), (6.0, 0.0)]
            assert healed.after_round(paces, floor=2) == source.after_round(paces, floor=2)
            assert healed.wire_name == source.wire_name
        assert source.wire_name == "int8/4"


def _replica(comm: Comm, steps: int, done: bool = False
             ) -> tuple[list[torch.Tensor], list[str], dict[str, object], list[float]]:
    """A replica of 4,096 values that drifts between rounds, whose steps are so fast that any
    round asks for thousands of steps: its rounds climb straight to the top. ``done``: rank 0's
    workers finished their quota before the first round (it takes part in the others' rounds)."""
    torch.manual_seed(comm.rank)
    flat, board = torch.randn(4096), Board(1)
    rounds = Rounds(flat, make_rule(PACED, comm, 4096), comm, board, SyncSchedule.from_config(PACED))
    after, wires, sent = [], [], []
    for k in range(steps):
        flat.add_(torch.randn(4096), alpha=0.01)  # this replica's own steps since the last round
        board.stats["pos"] = [1000.0 * (k + 1)]
        board.stats["step_s"] = [0.001 * (k + 1)]
        before = rounds.rule.meter.sent
        rounds.run(RoundFlags(done=done and comm.rank == 0), timeout_s=20.0)
        after.append(flat.clone())
        wires.append(rounds.wire()["sync_wire"])
        sent.append(rounds.rule.meter.sent - before)
    rounds.run(RoundFlags(done=True, final=True), timeout_s=20.0)
    after.append(flat.clone())
    return after, wires, rounds.wire(), sent


def test_two_replicas_climb_together_and_still_land_on_one_model() -> None:
    a, b = run_ranks(2, lambda comm: _replica(comm, 12))
    # Round 1 carries no asks, round 2 the first round's: it climbs.
    assert a[1] == b[1] == ["fp32", "int8/4", *["int8/4"] * 10]
    assert a[2]["sync_wire"] == "int8/4" and a[2]["sync_wire_climbs"] == [{"round": 2, "wire": "int8/4"}]
    for x, y in zip(a[0][:2], b[0][:2]):
        # Nothing writes between a whole round and its snapshot here, so both replicas hold the
        # round's target (a fragment's round leaves the rest of the model where each replica took it).
        assert torch.allclose(x, y, atol=1e-5), (x - y).abs().max()
    assert torch.equal(a[0][-1], b[0][-1])
    # What the rounds put on the link: no round after the climb sends a whole fp32 model again
    # (the fragments start from the last fp32 round's mean, not a broadcast).
    fp32 = a[3][0]
    assert all(sent < fp32 / 12 for sent in a[3][2:]), a[3]


def test_sixteen_replicas_climb_to_fp32_fragments_and_each_round_sends_a_quarter() -> None:
    """At 16 replicas int8 in four fragments would send half a whole fp32 round; fp32 in four
    fragments sends a quarter, and the replicas still end on one model."""
    ranks = run_ranks(16, lambda comm: _replica(comm, 6))
    for r in ranks:
        assert r[1] == ["fp32", "fp32/4", *["fp32/4"] * 4], r[1]
    # A quarter of the model and the round's control vector (int8/4 here: 15 x 1,032 bytes a round,
    # about half of fp32's 31.5 KB).
    fp32 = ranks[0][3][0]
    assert all(fp32 / 4 <= sent < fp32 / 3 for sent in ranks[0][3][2:]), ranks[0][3]
    assert all(torch.equal(r[0][-1], ranks[0][0][-1]) for r in ranks)


def test_a_replica_whose_workers_are_done_climbs_with_the_others() -> None:
    """A replica that finished its quota first still meets the others' rounds: it climbs with them
    (when it did not, the next round was whole fp32 on one side and int8 on the other, and Gloo
    failed the job with "collective mismatch")."""
    a, b = run_ranks(2, lambda comm: _replica(comm, 6, done=True))
    assert a[1] == b[1] == ["fp32", "int8/4", *["int8/4"] * 4]
    assert torch.equal(a[0][-1], b[0][-1])


def test_sync_compress_takes_auto_or_off_and_names_itself_otherwise() -> None:
    from hogwild.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^sync\.compress: unknown value 'int8'"):
        SyncConfig(compress="int8")


def _climbs_to_int8(comm: Comm) -> tuple[torch.Tensor, float, float]:
    from hogwild.sync.rounds import sync_round

    torch.manual_seed(comm.rank)
    flat = torch.randn(4096)
    ladder = make_rule(PACED, comm, 4096)
    assert isinstance(ladder, Ladder)
    ladder.prime(flat)
    sync_round(flat, ladder)  # whole fp32
    mean = flat.clone()
    assert ladder.after_round([(5.0, 0.0), (5.0, 0.0)], floor=2) and ladder.wire_name == "int8"
    flat.add_(torch.randn(4096), alpha=0.01)
    before = ladder.meter.sent
    sync_round(flat, ladder)  # int8, from the fp32 round's mean as its base
    return flat, ladder.meter.sent - before, float((flat - mean).abs().max())


def test_from_whole_fp32_rounds_int8_starts_on_their_mean_and_the_replicas_still_agree() -> None:
    (a, sent, moved), (b, _, _) = run_ranks(2, _climbs_to_int8)
    assert torch.allclose(a, b, atol=1e-6)
    assert sent < 4096 * 4 / 3  # no whole fp32 model went out to agree on a base
    assert moved < 0.05  # the mean moved by the replicas' small steps, rounded to int8
