"""The int8 wire, the link meter and replicas weighted by work, on N ranks played by threads."""

from __future__ import annotations

import math
from typing import Optional

import pytest
import torch

from hogwild.config.schema import SyncConfig
from hogwild.errors import ConfigError
from hogwild.sync.comm import Comm
from hogwild.sync.rounds import Measures, sync_round
from hogwild.sync.rules import make_rule
from hogwild.sync.wire import CHUNK, pack, unpack
from tests.fake_comm import run_ranks

pytestmark = pytest.mark.timeout(60)

NAN = float("nan")


def _values(rank: int, n: int = 3000, spread: float = 1e-2) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank)
    return 1.0 + spread * torch.randn(n, generator=g)


def test_int8_packing_errs_by_at_most_half_a_step_per_chunk() -> None:
    x = torch.randn(3 * CHUNK + 17) * torch.linspace(0.01, 100.0, 3 * CHUNK + 17)
    x[CHUNK:2 * CHUNK] = 0.0  # an all-zero chunk must not divide by a zero scale
    packed, decoded = pack(x)
    assert packed.dtype == torch.int8 and packed.numel() == 4 * CHUNK + 4 * 4  # values, then 4 fp32 scales
    got = unpack(packed, x.numel())
    assert torch.equal(got, decoded[:x.numel()])  # what the sender keeps is what receivers decode
    for c in range(4):
        part = slice(c * CHUNK, min((c + 1) * CHUNK, x.numel()))
        step = float(x[part].abs().max()) / 127
        assert float((got[part] - x[part]).abs().max()) <= step / 2 + 1e-6
    assert torch.all(got[CHUNK:2 * CHUNK] == 0)


def _average_rounds(cfg: SyncConfig, rounds: int, replicas: int = 2) -> list[list[float]]:
    """Every replica moves by its own fixed change each interval, then syncs: the buffers after
    the last round."""
    def rank_fn(comm: Comm) -> list[float]:
        rule = make_rule(cfg, comm)
        flat = torch.ones(3000)
        rule.prime(flat)
        step = _values(comm.rank) - 1.0
        for _ in range(rounds):
            flat += step
            sync_round(flat, rule)
        return flat.tolist()

    return run_ranks(replicas, rank_fn)


def test_int8_average_is_identical_on_every_replica_and_error_feedback_keeps_it_on_track() -> None:
    exact = torch.tensor(_average_rounds(SyncConfig(mode="average"), 20)[0])
    out = _average_rounds(SyncConfig(mode="average", dtype="int8"), 20)
    assert out[0] == out[1], "replicas disagree after an int8 round"
    got = torch.tensor(out[0])
    # One round's rounding step: the largest change in a chunk / 127.
    step = float((_values(0) - 1.0).abs().max()) / 127
    assert not torch.equal(got, exact)  # it really went through int8
    # 20 rounds of rounding without feedback could pile up to 20 half-steps; with it, the error
    # stays within about one round's.
    assert float((got - exact).abs().max()) < step


@pytest.mark.parametrize("mode", ["average", "slowmo"])
def test_int8_leaves_out_an_unhealthy_replica_and_restores_it(mode: str) -> None:
    vals = [_values(0), _values(1).fill_(NAN), _values(2)]

    def rank_fn(comm: Comm) -> tuple[list[float], bool]:
        rule = make_rule(SyncConfig(mode=mode, dtype="int8"), comm)
        rule.prime(torch.ones(3000))
        flat = vals[comm.rank].clone()
        out = sync_round(flat, rule)
        return flat.tolist(), out.healthy

    out = run_ranks(3, rank_fn)
    assert [h for _, h in out] == [True, False, True]
    assert out[0][0] == out[1][0] == out[2][0] and all(math.isfinite(v) for v in out[1][0])
    if mode == "average":
        want = (vals[0] + vals[2]) / 2
        step = float((vals[0] - 1.0).abs().max()) / 127
        assert float((torch.tensor(out[0][0]) - want).abs().max()) <= step


def _phase(cfg: SyncConfig, rounds: int, start: Optional[tuple[list[float], dict[str, torch.Tensor]]] = None,
           ) -> list[tuple[list[float], dict[str, torch.Tensor]]]:
    """``rounds`` intervals and rounds from the initial model, or from a checkpoint's model and
    rule state (every replica loads the same one, as on resume): each rank's (model, state)."""
    def rank_fn(comm: Comm) -> tuple[list[float], dict[str, torch.Tensor]]:
        rule = make_rule(cfg, comm)
        flat = torch.ones(3000) if start is None else torch.tensor(start[0])
        if start is not None:
            rule.load_state_dict(start[1])
        rule.prime(flat)
        for _ in range(rounds):
            flat += _values(comm.rank) - 1.0
            sync_round(flat, rule)
        return flat.tolist(), rule.state_dict()

    return run_ranks(2, rank_fn)


@pytest.mark.parametrize("dtype", ["int8", "bf16"])
@pytest.mark.parametrize("mode", ["average", "slowmo"])
def test_a_compressed_rule_resumes_from_its_checkpointed_state(mode: str, dtype: str) -> None:
    """A run stopped after 3 rounds and resumed from the writer's checkpoint for 3 more ends
    where the uninterrupted run does, within one round's rounding: what resume loses is each
    replica's residual, which is its own and never checkpointed."""
    cfg = SyncConfig(mode=mode, dtype=dtype)
    straight = torch.tensor(_phase(cfg, 6)[0][0])
    writer = _phase(cfg, 3)[0]
    assert set(writer[1]) == ({"base"} if mode == "average" else {"global_params", "momentum"})
    resumed = _phase(cfg, 3, writer)
    assert resumed[0][0] == resumed[1][0]
    step = float((_values(0) - 1.0).abs().max()) / (127 if dtype == "int8" else 128)
    gap = float((torch.tensor(resumed[0][0]) - straight).abs().max())
    assert gap < 4 * step
    # Without its state the rule would restart its outer step (or base) from the resumed model.
    cold = _phase(cfg, 3, (writer[0], {}))
    if mode == "slowmo":
        assert float((torch.tensor(cold[0][0]) - straight).abs().max()) > 10 * gap


def test_the_meter_counts_what_each_wire_puts_on_the_link() -> None:
    """fp32 rounds move 2 (R-1)/R * 4n bytes per replica (ring all_reduce), int8 (R-1) * n plus
    one scale per chunk (all_gather), bf16 half of fp32; the control vector rides along."""
    n = 100 * CHUNK

    def sent(dtype: str, replicas: int) -> list[float]:
        def rank_fn(comm: Comm) -> float:
            rule = make_rule(SyncConfig(mode="average", dtype=dtype), comm)
            flat = _values(comm.rank, n)
            rule.prime(flat)
            sync_round(flat, rule)
            assert rule.meter.received == rule.meter.sent and rule.meter.seconds > 0
            return rule.meter.sent

        return run_ranks(replicas, rank_fn)

    for r in (2, 3):
        fp32, bf16, int8 = sent("fp32", r)[0], sent("bf16", r)[0], sent("int8", r)[0]
        assert fp32 == pytest.approx(2 * (r - 1) / r * 4 * n, rel=1e-3)
        assert bf16 == pytest.approx(fp32 / 2, rel=1e-2)
        assert int8 == pytest.approx((r - 1) * n * (1 + 4 / CHUNK), rel=1e-2)
    assert sent("fp32", 1) == [0.0]  # a lone replica meets nobody


def _weighted(cfg: SyncConfig, vals: list[list[float]], weights: list[float]) -> list[list[float]]:
    def rank_fn(comm: Comm) -> list[float]:
        rule = make_rule(cfg, comm)
        rule.prime(torch.zeros(len(vals[0])))
        flat = torch.tensor(vals[comm.rank])
        sync_round(flat, rule, mine=Measures(weight=weights[comm.rank]))
        return flat.tolist()

    return run_ranks(len(vals), rank_fn)


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "int8"])
def test_a_replica_weighs_as_much_as_the_work_behind_its_change(dtype: str) -> None:
    """A replica slowed to a third of the other's steps pulls the average a quarter of the way."""
    vals = [[4.0, 8.0, -4.0], [0.0, 0.0, 0.0]]
    tol = 0.05 if dtype != "fp32" else 1e-6
    for flat in _weighted(SyncConfig(mode="average", dtype=dtype), vals, [150.0, 50.0]):
        assert flat == pytest.approx([3.0, 6.0, -3.0], abs=tol)
    # Equal weights are plain averaging, bit for bit.
    assert _weighted(SyncConfig(mode="average"), vals, [1.0, 1.0])[0] == [2.0, 4.0, -2.0]


def test_an_outer_rule_steps_along_the_weighted_change() -> None:
    """slowmo's first round is a step of mu*0 + Δ, with Δ the weighted mean change."""
    vals = [[4.0, 8.0], [0.0, 4.0]]
    for flat in _weighted(SyncConfig(mode="slowmo"), vals, [3.0, 1.0]):
        assert flat == pytest.approx([3.0, 7.0])


def test_an_unhealthy_replica_carries_no_weight() -> None:
    vals = [[4.0, 8.0], [NAN, 1.0], [0.0, 4.0]]
    out = _weighted(SyncConfig(mode="average"), vals, [3.0, 100.0, 1.0])
    assert out == [[3.0, 7.0]] * 3


def test_weighting_by_steps_follows_each_replicas_real_interval() -> None:
    """Rounds weigh a replica by its steps since the last round's snapshot, counted from the
    position it resumed at, never from zero."""
    from hogwild.sync.rounds import RoundFlags, Rounds
    from hogwild.sync.schedule import SyncSchedule

    class Board:
        def __init__(self, pos: float) -> None:
            self.pos, self.control, self.workers = pos, {}, 1

        def replica_pos(self) -> float:
            return self.pos

        def busy_s(self) -> float:
            return 0.0

    def rank_fn(comm: Comm) -> list[float]:
        cfg = SyncConfig(mode="average", weighting="steps")
        board = Board(1000.0)  # resumed at 1000
        flat = torch.tensor([4.0 if comm.rank == 0 else 0.0])
        schedule = SyncSchedule.from_config(cfg)
        rounds = Rounds(flat, make_rule(cfg, comm), comm, board, schedule)  # type: ignore[arg-type]
        board.pos += 30.0 if comm.rank == 0 else 10.0
        rounds.run(RoundFlags(), timeout_s=10)
        return flat.tolist()

    assert run_ranks(2, rank_fn) == [[3.0], [3.0]]


def test_bad_link_settings_name_their_key() -> None:
    with pytest.raises(ConfigError, match="sync.weighting"):
        SyncConfig(mode="median", weighting="steps")
    with pytest.raises(ConfigError, match="sync.weighting"):
        SyncConfig(weighting="speed")
    with pytest.raises(ConfigError, match="sync.fragments"):
        SyncConfig(fragments=0)
    with pytest.raises(ConfigError, match="sync.dtype"):
        SyncConfig(dtype="int4")
    SyncConfig(dtype="int8", fragments=4, weighting="steps")
