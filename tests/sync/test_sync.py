"""Sync rules and ``sync_round`` in one process, on N ranks played by threads (fast tier)."""

from __future__ import annotations

import math
from typing import Callable

import pytest
import torch

from hogwild.config.schema import SyncConfig
from hogwild.errors import Fault
from hogwild.sync.comm import Comm, LocalComm, PeerLost
from hogwild.sync.rounds import Measures, RoundFlags, RoundOutcome, sync_round
from hogwild.sync.rules import Average, SyncContext, make_rule
from tests.dist_helpers import start_from, target_after
from tests.fake_comm import run_ranks
from tests.writer import Writer

pytestmark = pytest.mark.timeout(60)

NAN = float("nan")


def _targets(cfg: SyncConfig, values: list[list[float]], rounds: int = 1) -> list[list[float]]:
    """Each rank holds ``values[rank]``; the rule's target after ``rounds`` rounds."""
    return run_ranks(len(values), lambda comm: target_after(make_rule(cfg, comm), values, rounds,
                                                            comm.rank, comm.world_size))


def _rounds(cfg: SyncConfig, values: list[list[float]], **kw: bool) -> list[tuple[list[float], RoundOutcome]]:
    """One ``sync_round`` on each rank's live buffer: (buffer after, outcome)."""
    def rank_fn(comm: Comm) -> tuple[list[float], RoundOutcome]:
        flat, rule = torch.tensor(values[comm.rank]), make_rule(cfg, comm)
        rule.prime(start_from(values))
        out = sync_round(flat, rule, RoundFlags(**kw))
        return flat.tolist(), out

    return run_ranks(len(values), rank_fn)


def test_average_and_broadcast() -> None:
    vals = [[1.0, 2.0], [3.0, 6.0], [5.0, 1.0]]
    assert _targets(SyncConfig(mode="average"), vals) == [[3.0, 3.0]] * 3
    assert _targets(SyncConfig(mode="broadcast"), vals) == [[1.0, 2.0]] * 3


def test_nonfinite_replica_is_excluded_and_restored() -> None:
    vals = [[1.0, 2.0], [NAN, 0.0], [3.0, 4.0]]
    assert _targets(SyncConfig(mode="average"), vals) == [[2.0, 3.0]] * 3
    assert _targets(SyncConfig(mode="broadcast"), [vals[1], vals[0]]) == [[1.0, 2.0]] * 2


@pytest.mark.parametrize("final", [False, True])
def test_fused_average_round_restores_an_unhealthy_replica(final: bool) -> None:
    """The fp32 average sends flags and parameters in one all_reduce; a NaN replica sends
    zeros, is counted out, and lands on the healthy replicas' mean."""
    out = _rounds(SyncConfig(mode="average"), [[1.0, 2.0], [NAN, 5.0], [3.0, 4.0]], final=final)
    assert [flat for flat, _ in out] == [[2.0, 3.0]] * 3
    assert [o.healthy for _, o in out] == [True, False, True]
    assert math.isinf(out[1][1].drift) and out[0][1].drift > 0


def test_round_flags_reach_every_replica() -> None:
    vals = [[1.0], [2.0]]

    def rank_fn(comm: Comm) -> RoundOutcome:
        flat = torch.tensor(vals[comm.rank])
        flags = RoundFlags(done=True, stop=comm.rank == 1, checkpoint=comm.rank == 0)
        rule = make_rule(SyncConfig(mode="slowmo"), comm)
        rule.prime(start_from(vals))
        return sync_round(flat, rule, flags, Measures(last_drift=0.1 * (comm.rank + 1)))

    for o in run_ranks(2, rank_fn):
        assert o.all_done and o.any_stop and o.checkpoint and not o.reached
        assert o.last_drifts == pytest.approx([0.1, 0.2])


def test_every_leader_sees_every_replicas_asked_intervals() -> None:
    """A paced schedule's asks ride in the round's control vector, so every leader takes its
    interval from the same list and all of them set the same one."""
    from hogwild.sync.schedule import SyncSchedule

    def rank_fn(comm: Comm) -> tuple[list[tuple[float, float]], int]:
        schedule = SyncSchedule.from_config(SyncConfig(interval="auto"))
        asked = (4.0, 1.0) if comm.rank == 0 else (9.0, 3.0)
        out = sync_round(torch.tensor([1.0]), make_rule(SyncConfig(mode="average"), comm), mine=Measures(pace=asked))
        schedule.record_pace(out.paces)
        return out.paces, schedule.interval

    for paces, interval in run_ranks(2, rank_fn):
        assert paces == [(4.0, 1.0), (9.0, 3.0)]
        assert interval == 5  # the shortest round's ask against the busiest leader's, halved at most


def test_every_replica_nonfinite_is_a_fault() -> None:
    with pytest.raises(Fault, match="every replica holds non-finite parameters"):
        _rounds(SyncConfig(mode="average"), [[NAN], [math.inf]])


def test_a_peer_that_never_comes_is_peer_lost_not_a_hang() -> None:
    def rank_fn(comm: Comm) -> None:
        if comm.rank == 0:
            sync_round(torch.ones(3), make_rule(SyncConfig(mode="slowmo"), comm), timeout_s=0.5)

    with pytest.raises(PeerLost, match="within"):
        run_ranks(2, rank_fn)


def test_snapshot_delta_keeps_every_concurrent_update() -> None:
    """A writer adds +1 to the whole live buffer while the round runs. Averaging preserves the
    total over replicas, so the sum after the round must equal every increment made. (The
    naive in-place all_reduce loses some: test_sync_gloo.py shows it on a real collective.)"""
    n = 200_000

    def rank_fn(comm: Comm) -> tuple[float, float]:
        flat = torch.zeros(n)
        writer = Writer(flat)

        class Rule(Average):
            def exchange(self, *a, **k):  # type: ignore[no-untyped-def]
                result = super().exchange(*a, **k)
                writer.stop()  # the writer runs for the whole collective, then stops
                return result

        sync_round(flat, Rule(SyncConfig(), comm))
        return float(flat.double().sum()), writer.increments

    out = run_ranks(2, rank_fn)
    mass, made = sum(r[0] for r in out), sum(r[1] for r in out)
    assert made > 0 and mass == made, "snapshot/delta sync lost or doubled concurrent updates"


def test_diloco_with_lr1_no_momentum_is_plain_averaging() -> None:
    cfg = SyncConfig(mode="diloco", outer_lr=1.0, outer_momentum=0.0)
    assert _targets(cfg, [[1.5, -2.0]], rounds=3) == [[1.5, -2.0]]
    vals = [[0.0, 4.0], [2.0, 0.0]]
    assert _targets(cfg, vals) == _targets(SyncConfig(mode="average"), vals)


def test_diloco_outer_state_is_shared_and_checkpointable() -> None:
    cfg = SyncConfig(mode="diloco", outer_lr=0.5, outer_momentum=0.9)
    vals = [[1.0, 0.0], [3.0, 2.0]]

    def rank_fn(comm: Comm) -> dict[str, list[float]]:
        rule = make_rule(cfg, comm)
        rule.prime(start_from(vals))
        ctx = SyncContext(comm.rank, 2, [True, True])
        rule.target(torch.tensor(vals[comm.rank]), ctx)
        rule.target(torch.tensor(vals[comm.rank]) + 1.0, ctx)
        return {k: v.tolist() for k, v in rule.state_dict().items()}

    a, b = run_ranks(2, rank_fn)
    assert a == b and set(a) == {"global_params", "momentum"}
    assert any(x != 0 for x in a["momentum"])


@pytest.mark.parametrize("mode", ["median", "trimmed_mean"])
def test_robust_rules_ignore_a_byzantine_replica(mode: str) -> None:
    honest = [[1.0, -1.0], [1.2, -0.8], [0.8, -1.2], [1.1, -0.9]]
    vals = honest + [[1e6, -1e6]]
    robust = _targets(SyncConfig(mode=mode, trim=1), vals)[0]
    lo = [min(v[i] for v in honest) for i in range(2)]
    hi = [max(v[i] for v in honest) for i in range(2)]
    assert all(lo[i] <= robust[i] <= hi[i] for i in range(2))
    mean = _targets(SyncConfig(mode="average"), vals)[0]
    assert mean[0] > hi[0] * 1000  # plain averaging is dragged away


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_compressed_average_tracks_fp32_with_error_feedback(dtype: str) -> None:
    # Replicas a sync apart differ by little: the delta to the last mean is what travels.
    vals = [[1.0 + 1e-3 * i for i in range(64)], [1.01 - 1e-3 * i for i in range(64)]]
    exact = torch.tensor(_targets(SyncConfig(mode="average"), vals)[0])
    low = torch.tensor(_targets(SyncConfig(mode="average", dtype=dtype), vals, rounds=4)[0])
    # Rounding the parameters (~1.0) to bf16 would err by up to 4e-3; rounding the delta,
    # with its error fed back, stays at the delta's own rounding step.
    assert (low - exact).abs().max() < 5e-4
    assert not torch.equal(low, exact)  # it really went through the reduced-precision wire


def _outer_rounds(mode: str, replicas: int, rounds: int, local: Callable[[torch.Tensor], torch.Tensor]) -> list[float]:
    """``rounds`` sync rounds of a one-parameter model that starts at 1.0; between rounds every
    replica moves from the agreed value by ``local(agreed)``. The agreed value after each round."""
    def rank_fn(comm: Comm) -> list[float]:
        rule = make_rule(SyncConfig(mode=mode), comm)
        flat = torch.tensor([1.0])
        rule.prime(flat)
        seen = []
        for _ in range(rounds):
            flat += local(flat)
            sync_round(flat, rule)
            seen.append(float(flat))
        return seen

    out = run_ranks(replicas, rank_fn)
    assert all(o == out[0] for o in out), "replicas disagree after a round"
    return out[0]


@pytest.mark.parametrize("replicas", [2, 3, 4])
def test_slowmo_makes_r_replicas_progress_r_times_one(replicas: int) -> None:
    """Every replica makes the same progress d per interval (the early phase of training, when
    replicas move the same way): averaging keeps d per round, slowmo settles to R*d."""
    d = 0.01
    avg = _outer_rounds("average", replicas, 40, lambda x: torch.full_like(x, d))
    slow = _outer_rounds("slowmo", replicas, 40, lambda x: torch.full_like(x, d))
    assert avg[-1] - avg[-2] == pytest.approx(d, rel=1e-3)
    assert slow[-1] - slow[-2] == pytest.approx(replicas * d, rel=0.02)
    assert slow[0] - 1.0 == pytest.approx(d, rel=1e-3), "the first round already counts from the start"


@pytest.mark.parametrize("replicas", [2, 3, 4, 8])
def test_slowmo_settles_where_local_steps_settle(replicas: int) -> None:
    """A stiff direction: between rounds every replica's local steps reach the minimum at 0.
    Summing the replicas' changes would overshoot (to -(R-1), growing for R > 2); slowmo's
    heavy-ball step converges to the minimum like averaging does, if more slowly for many
    replicas (it oscillates with ratio sqrt(1 - 1/R) per round)."""
    slow = _outer_rounds("slowmo", replicas, 150, lambda x: -x)
    assert max(abs(v) for v in slow) <= 1.0
    assert abs(slow[-1]) < 1e-3, slow[-5:]


@pytest.mark.parametrize("mode", ["average", "slowmo", "diloco"])
def test_drift_is_the_distance_to_the_replicas_mean_whatever_the_outer_step(mode: str) -> None:
    """Drift says how far replicas moved apart, ``‖θ_r − mean‖ / ‖θ_r‖``; an outer step past
    their mean must not count."""
    vals = [[1.0, 2.0], [3.0, 4.0], [5.0, 3.0]]
    mean = torch.tensor(vals).mean(0)

    def rank_fn(comm: Comm) -> float:
        rule = make_rule(SyncConfig(mode=mode), comm)
        rule.prime(torch.tensor([0.0, 0.0]))  # far from the replicas: the momentum builds up
        sync_round(torch.tensor(vals[comm.rank]), rule)
        return sync_round(torch.tensor(vals[comm.rank]), rule).drift  # momentum steps past the mean

    want = [float((torch.tensor(v) - mean).norm() / torch.tensor(v).norm()) for v in vals]
    assert run_ranks(3, rank_fn) == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("mode", ["slowmo", "diloco"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("ending", [{"done": True}, {"stop": True}, {"reached": True}, {"final": True}])
def test_a_round_that_ends_the_job_lands_an_outer_rule_on_the_replicas_mean(
        mode: str, dtype: str, ending: dict[str, bool]) -> None:
    """Every replica done, a stop, the target reached, or the final round: the job ends on a model
    the replicas trained to, not on the momentum's step past it; the momentum is kept, for a run
    that resumes. (Seen: the convnet at R = 4 ended at 0.89 after the outer step of the round
    where all replicas were done, against 0.95 for the replicas just before.)"""
    vals = [[1.0, 2.0], [3.0, 4.0]]

    def rank_fn(comm: Comm) -> tuple[list[float], list[float], list[float], list[float]]:
        rule = make_rule(SyncConfig(mode=mode, dtype=dtype), comm)
        rule.prime(torch.tensor([0.0, 0.0]))
        sync_round(torch.tensor(vals[comm.rank]), rule)  # builds up the momentum
        before = rule.state_dict()["momentum"].tolist()
        flat = torch.tensor(vals[comm.rank])
        sync_round(flat, rule, RoundFlags(**ending))
        state = rule.state_dict()
        return flat.tolist(), state["global_params"].tolist(), state["momentum"].tolist(), before

    for flat, global_params, momentum, before in run_ranks(2, rank_fn):
        assert flat == pytest.approx([2.0, 3.0], abs=2e-2) and global_params == flat  # bf16: the wire rounds
        assert momentum == before and any(before)


def test_slowmo_momentum_follows_the_live_group_size() -> None:
    """Elastic mode shrinks and grows the group: R-fold progress needs mu = 1 - 1/R of today's R."""
    comm = LocalComm()
    rule = make_rule(SyncConfig(mode="slowmo"), comm)
    seen = []
    for r in (3, 2, 4):
        comm.world_size = r
        seen.append(rule.mu)  # type: ignore[attr-defined]
    assert seen == pytest.approx([2 / 3, 1 / 2, 3 / 4])
    assert make_rule(SyncConfig(mode="slowmo", outer_momentum=0.3), comm).mu == 0.3  # type: ignore[attr-defined]


def test_slowmo_resumes_its_outer_state_instead_of_priming_over_it() -> None:
    def rank_fn(comm: Comm) -> list[float]:
        rule = make_rule(SyncConfig(mode="slowmo"), comm)
        rule.load_state_dict({"global_params": torch.tensor([5.0]), "momentum": torch.tensor([0.5])})
        rule.prime(torch.tensor([1.0]))
        return rule.state_dict()["global_params"].tolist()

    assert run_ranks(2, rank_fn) == [[5.0], [5.0]]


@pytest.mark.parametrize("mode", ["diloco", "slowmo"])
def test_outer_rules_fused_round_matches_their_reference_step(mode: str) -> None:
    """The fp32 round fuses flags and parameters into one all_reduce; it must land where the
    rule's reference target() lands, round after round, a NaN replica included."""
    vals = [[[1.0, 2.0], [3.0, 0.5], [2.0, 2.0]], [[1.5, 2.5], [NAN, 0.0], [2.5, 1.0]],
            [[0.5, 3.0], [3.5, 1.0], [1.0, 2.0]]]

    def rank_fn(comm: Comm) -> list[tuple[list[float], list[float]]]:
        fused, ref = make_rule(SyncConfig(mode=mode), comm), make_rule(SyncConfig(mode=mode), comm)
        for rule in (fused, ref):
            rule.prime(torch.tensor([1.0, 1.0]))
        out = []
        for rnd in vals:
            flat = torch.tensor(rnd[comm.rank])
            sync_round(flat, fused)
            healthy = [bool(torch.isfinite(torch.tensor(v)).all()) for v in rnd]
            want = ref.target(torch.tensor(rnd[comm.rank]), SyncContext(comm.rank, 3, healthy))
            out.append((flat.tolist(), want.tolist()))
        return out

    for per_rank in run_ranks(3, rank_fn):
        for got, want in per_rank:
            assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
