"""``sync.fragments``: one stretch of the model per round, in rotation, on N ranks played by threads."""

from __future__ import annotations

import math
from typing import Optional

import pytest
import torch

from hogwild.config.schema import SyncConfig
from hogwild.errors import ConfigError
from hogwild.sync.comm import Comm, LocalComm, PeerLost
from hogwild.sync.fragments import bounds
from hogwild.sync.rounds import Measures, RoundFlags, sync_round
from hogwild.sync.rules import make_rule
from tests.fake_comm import run_ranks

pytestmark = pytest.mark.timeout(60)

NAN = float("nan")
N = 10


def _start(rank: int) -> torch.Tensor:
    return torch.arange(N, dtype=torch.float32) + 10.0 * rank


def test_bounds_cover_the_buffer_in_nearly_equal_stretches() -> None:
    b = bounds(10, 3)
    assert [(s.start, s.stop) for s in b] == [(0, 3), (3, 6), (6, 10)]


def test_each_round_syncs_the_next_fragment_and_the_final_round_all() -> None:
    cfg = SyncConfig(mode="average", fragments=2)

    def rank_fn(comm: Comm) -> list[list[float]]:
        rule = make_rule(cfg, comm)
        flat = _start(comm.rank)
        rule.prime(flat)
        seen = []
        for final in (False, False):
            sync_round(flat, rule, RoundFlags(final=final))
            seen.append(flat.tolist())
        flat += comm.rank  # the replicas move apart again
        sync_round(flat, rule, RoundFlags(final=True))
        seen.append(flat.tolist())
        return seen

    r0, r1 = run_ranks(2, rank_fn)
    mean = (_start(0) + _start(1)) / 2
    assert r0[0][:5] == r1[0][:5] == mean[:5].tolist()  # round 1: the first half
    assert r0[0][5:] == _start(0)[5:].tolist() and r1[0][5:] == _start(1)[5:].tolist()
    assert r0[1] == r1[1] == mean.tolist()  # round 2: the second half; now all agree
    assert r0[2] == r1[2] == (mean + 0.5).tolist()  # the final round lands every fragment


def test_a_final_round_cut_short_runs_again_from_its_first_fragment() -> None:
    """A peer lost in the final round re-forms the group, and the survivors run it again: each
    from the fragment where the final round began, however far it got before."""
    class LosesAPeer(LocalComm):
        calls = 0

        def all_reduce(self, t: torch.Tensor, timeout_s: Optional[float] = None, what: str = "") -> torch.Tensor:
            self.calls += 1
            if self.calls == 3:  # the final round's second fragment
                raise PeerLost("sync: a sync round failed")
            return t

    rule = make_rule(SyncConfig(mode="average", fragments=3), LosesAPeer())
    flat = _start(0)
    rule.prime(flat)
    sync_round(flat, rule, RoundFlags())  # the rotation is at fragment 1
    first = rule.plan(N, final=True)
    with pytest.raises(PeerLost):
        sync_round(flat, rule, RoundFlags(final=True))
    assert rule.plan(N, final=True) == first and first[0] == bounds(N, 3)[1]


def test_a_round_sends_one_fragment_of_the_model() -> None:
    n = 40_000

    def rank_fn(comm: Comm) -> tuple[float, float]:
        sent = []
        for f in (1, 4):
            rule = make_rule(SyncConfig(mode="slowmo", fragments=f), comm)
            flat = torch.randn(n)
            rule.prime(flat)
            sync_round(flat, rule)
            sent.append(rule.meter.sent)
        return sent[0], sent[1]

    whole, quarter = run_ranks(2, rank_fn)[0]
    assert quarter == pytest.approx(whole / 4, rel=0.01)


def test_a_fragments_outer_state_is_the_whole_rules_on_its_stretch() -> None:
    """Fragment k's slowmo sees its stretch every F-th round, as a whole-model slowmo run on
    that stretch alone with F times the interval would."""
    F, rounds = 2, 6
    moves = [[torch.randn(N, generator=torch.Generator().manual_seed(100 * r + k)) * 0.1
              for k in range(rounds)] for r in range(2)]

    def run(comm: Comm, cfg: SyncConfig, region: slice, which: list[int]) -> list[float]:
        rule = make_rule(cfg, comm)
        flat = _start(0)[region].clone()
        rule.prime(flat)
        for k in range(rounds):
            flat += moves[comm.rank][k][region]
            if k in which:
                sync_round(flat, rule)
        return flat.tolist()

    cfg = SyncConfig(mode="slowmo", fragments=F)
    frag = run_ranks(2, lambda c: run(c, cfg, slice(0, N), list(range(rounds))))
    for k, region in enumerate(bounds(N, F)):
        # Rounds k, k+F, ... sync fragment k; its values in the other rounds just accumulate.
        alone = run_ranks(2, lambda c: run(c, SyncConfig(mode="slowmo"), region, list(range(k, rounds, F))))
        for r in range(2):
            got = frag[r][region]
            assert got == pytest.approx(alone[r], rel=1e-5, abs=1e-6)


def test_the_rotation_and_each_fragments_state_survive_a_checkpoint() -> None:
    """Resumed after round 1 from the writer's state, under the same or another fragment
    count, the job goes on where the rotation stopped: round 2 syncs the second fragment."""
    cfg = SyncConfig(mode="slowmo", fragments=2)

    def first(comm: Comm) -> tuple[list[float], dict[str, torch.Tensor]]:
        rule = make_rule(cfg, comm)
        flat = _start(comm.rank)
        rule.prime(torch.zeros(N))
        sync_round(flat, rule)
        return flat.tolist(), rule.state_dict()

    (flat0, state), _ = run_ranks(2, first)
    assert int(state["fragment_cursor"]) == 1 and state["global_params"].numel() == N

    def second(comm: Comm, fragments: int) -> list[float]:
        rule = make_rule(SyncConfig(mode="slowmo", fragments=fragments), comm)
        rule.load_state_dict(state)  # read before the first prime, as resume does
        flat = torch.tensor(flat0) + comm.rank
        rule.prime(flat)
        sync_round(flat, rule)
        return flat.tolist()

    a, b = run_ranks(2, lambda c: second(c, 2))
    assert a[:5] == [x for x in flat0[:5]] and b[:5] == [x + 1 for x in flat0[:5]]  # first half untouched
    assert a[5:] == b[5:]  # second half synced
    # The same checkpoint under the whole-model rule: every value syncs, from the same outer state.
    whole = run_ranks(2, lambda c: second(c, 1))
    assert whole[0] == whole[1] and whole[0][5:] == pytest.approx(a[5:])


def test_a_nan_outside_the_fragment_makes_the_replica_unhealthy() -> None:
    """The fragment that travels is finite, but the replica is not: it must not be counted."""
    def rank_fn(comm: Comm) -> tuple[list[float], bool]:
        rule = make_rule(SyncConfig(mode="average", fragments=2), comm)
        flat = _start(comm.rank)
        if comm.rank == 1:
            flat[8] = NAN  # in the second fragment; round 1 syncs the first
        rule.prime(flat)
        out = sync_round(flat, rule)
        return flat.tolist(), out.healthy

    (a, ha), (b, hb), (c, hc) = run_ranks(3, rank_fn)
    assert (ha, hb, hc) == (True, False, True)
    want = ((_start(0) + _start(2)) / 2)[:5].tolist()
    assert a[:5] == b[:5] == c[:5] == want  # the sick replica takes the others' first fragment
    assert math.isnan(b[8])  # its own turn comes next round


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_fragments_with_a_compressed_wire_agree_everywhere(dtype: str) -> None:
    def rank_fn(comm: Comm) -> list[float]:
        rule = make_rule(SyncConfig(mode="slowmo", fragments=3, dtype=dtype, weighting="steps"), comm)
        flat = torch.ones(3000)
        rule.prime(flat)
        g = torch.Generator().manual_seed(comm.rank)
        for k in range(7):
            flat += 0.01 * torch.randn(3000, generator=g)
            sync_round(flat, rule, RoundFlags(final=k == 6), Measures(weight=10.0 + comm.rank))
        return flat.tolist()

    out = run_ranks(3, rank_fn)
    assert out[0] == out[1] == out[2]


def test_more_fragments_than_values_is_a_config_error() -> None:
    rule = make_rule(SyncConfig(mode="slowmo", fragments=20), LocalComm())
    with pytest.raises(ConfigError, match="sync.fragments"):
        rule.prime(torch.zeros(10))


@pytest.mark.parametrize("mode,dtype,key", [("slowmo", "fp32", "global_params"), ("average", "int8", "base")])
def test_settling_on_a_handed_back_model_sets_every_fragments_agreed_model(mode: str, dtype: str, key: str) -> None:
    # A run that met its target ends on the copy that met it; a run resumed from that checkpoint
    # must start its rounds from there, in every fragment.
    rule = make_rule(SyncConfig(mode=mode, fragments=3, dtype=dtype), LocalComm())
    rule.prime(_start(0))
    handed_back = torch.linspace(-1.0, 1.0, N)
    rule.settle(handed_back)
    assert torch.equal(rule.state_dict()[key], handed_back)
