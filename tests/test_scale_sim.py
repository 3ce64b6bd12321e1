"""scripts/models/scale_sim.py: the model of a job at R replicas (docs/scale.md, "The simulator")
says what the code does where it can be worked out by hand, and its check reads every measured run."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, clean_env

sim = importlib.import_module("scripts.models.scale_sim")


def _job(**kw: object) -> object:
    base = dict(replicas=2, step_s=0.1, params=1_000_000, cores=1.0, rate_bps=1e9)
    return sim.Job(**{**base, **kw})  # type: ignore[arg-type]


def test_a_round_sends_what_gloo_s_ring_sends() -> None:
    # An fp32 all_reduce: 2 (R - 1) hops of B / R; int8's all_gather: R - 1 hops of a whole int8 model.
    hops, per_hop = sim.hops_and_bytes(_job(replicas=8), "fp32", 1)
    assert hops == 14 and per_hop * hops == 2 * 7 / 8 * 4_000_000
    hops, per_hop = sim.hops_and_bytes(_job(replicas=8), "int8", 4)
    assert hops == 7 and math.isclose(per_hop, 1_008_000 / 4)
    # A tree (halving-doubling) moves the ring's bytes in 2 log2 R hops.
    hops, per_hop = sim.hops_and_bytes(_job(replicas=1024, algo="tree"), "fp32", 1)
    assert hops == 20 and math.isclose(hops * per_hop, 2 * 1023 / 1024 * 4_000_000)


def test_on_a_fast_link_rounds_meet_every_two_steps_and_cost_the_workers_little() -> None:
    res = sim.simulate(_job(step_s=0.3), budget_s=60.0)
    assert res.interval == 2 and res.wire == "fp32"
    # The round overlaps the steps; what is lost is the leader's CPU on the workers' core.
    assert 0.9 < res.utilisation <= 1.0 and res.bottleneck in ("compute", "link", "leader_cpu")
    # Ten times the model on a 10 Mbit/s link: the ladder climbs and the interval grows.
    slow = sim.simulate(_job(step_s=0.3, params=10_000_000, rate_bps=1e7), budget_s=60.0)
    assert slow.wire == "int8 x4" and slow.interval > 2


def test_a_slow_link_at_many_replicas_takes_fp32_fragments_where_the_old_ladder_took_int8() -> None:
    # 64 replicas at 10 Mbit/s: int8 in four fragments sends twice fp32's bytes; the old ladder took it.
    now = sim.simulate(_job(replicas=64, rate_bps=1e7), budget_s=120.0)
    before = sim.simulate(_job(replicas=64, rate_bps=1e7, wire="before"), budget_s=120.0)
    assert now.wire == "fp32 x4" and before.wire == "int8 x4"
    assert now.interval < before.interval / 1.5, (now.interval, before.interval)


def test_failures_cost_more_at_more_machines_and_more_under_torchrun() -> None:
    def util(r: int, **kw: object) -> float:
        return float(sim.simulate(_job(replicas=r, mtbf_h=50.0, **kw), budget_s=60.0).utilisation)

    assert util(512, launch="elastic") < util(8, launch="elastic")
    assert util(512) < util(512, launch="elastic")  # torchrun, the default: every replica restarts
    assert sim.simulate(_job(replicas=8), budget_s=60.0).utilisation > util(8)


def test_an_uneven_fleet_rounds_so_its_slowest_machine_makes_a_step_a_round() -> None:
    res = sim.simulate(_job(replicas=3, speeds=(1.0, 0.5, 0.25)), budget_s=60.0)
    assert res.interval >= 4
    # Speeds steady (no quota bursts): nobody waits long; the fleet trains near its summed speed.
    assert res.utilisation > 0.85


def test_check_prints_predicted_against_every_measured_run(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "models" / "scale_sim.py"), "check", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=120, env=clean_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((tmp_path / "check.json").read_text())
    runs = {r["run"] for r in rows}
    for name in ("torchrun R = 32 on one host", "GPT 1.8M, 2 x 1 at 100 Mbit/s", "GPT 1.8M, 2 x 1 at 1 Gbit/s",
                 "GPT 1.8M, 4 x 4 at 1 Gbit/s (lent host)", "GPT 0.1M, 3 x 1 at 1, 1/2, 1/4 of a core",
                 "R = 16 elastic, 20 kills (chaos16_v2)",
                 "R = 8 at 100 Mbit/s, TCP cubic, 2 cores shared by the scheduler, 10 ms one way less 2 ms",
                 "R = 2 at 1gbit (namespaces), 1000 steps, against its loopback twin"):
        assert any(run.startswith(name) for run in runs), (name, runs)
    # Runs under BBR are shown beside, never judged: its pacing is not in the model.
    bbr = [r for r in rows if "TCP BBR" in r["run"]]
    assert bbr and all(r["outside"] for r in bbr), bbr
    # So are the latency runs whose machines each had a CFS quota: its stalls land in the hops.
    quota = [r for r in rows if "CFS quota of" in r["run"]]
    assert quota and all(r["outside"] for r in quota), quota
    assert not next(r for r in rows if r["run"].startswith("R = 8 at 100 Mbit/s, TCP cubic, 2 cores"))["outside"]
    # A namespace run is judged against its own twin: a ratio, its pairs' range beside it.
    twin = next(r for r in rows if r["run"].startswith("R = 2 at 10mbit (namespaces)"))
    assert twin["spread"][0] <= twin["measured"] <= twin["spread"][1] and twin["measured"] > 1.5, twin
    # So is an elastic run on one host, against torchrun's of its invocation: the launch's term is an
    # elastic leader's CPU a round (ELASTIC_CPU_S), a few per cent of a round of the digits MLP here.
    elastic = next(r for r in rows if r["run"].startswith("elastic R = 32 on one host, 200 steps, against"))
    assert elastic["figure"] == "train_s / twin's" and 1.01 < elastic["predicted"] < 1.1, elastic
    assert all(math.isfinite(r["error"]) for r in rows)
    assert "| run | figure | measured | repeats' range | predicted | error |" in proc.stdout
    # A repeated run shows its repeats' lowest and highest beside its median.
    repeated = next(r for r in rows if r["run"].startswith("torchrun R = 32 on one host") and r["primary"])
    assert repeated["spread"][0] <= repeated["measured"] <= repeated["spread"][1]


def test_a_step_fit_on_a_runs_time_trains_that_run_in_that_time() -> None:
    """A namespace run's step is fit on its loopback twin of the same invocation (this host's speed
    moves between invocations): the fit step gives the twin's time back, rounds and all."""
    job = sim.mlp_job(2, cores=1)
    for measured in (1.0, 2.0):
        step = sim.step_fit(job, measured, 1000)
        fit = sim.simulate(dataclasses.replace(job, step_s=step), max_steps=1000)
        assert fit.train_s == pytest.approx(measured, rel=0.01)
    assert sim.step_fit(job, 1.0, 1000) < sim.step_fit(job, 2.0, 1000)


def test_a_ring_hop_pays_the_one_way_latency_twice() -> None:
    """Gloo's pairs are a rendezvous (the receiver's notice, then the bytes): 2 (R - 1) hops, each
    two one-way latencies, as measured through delay_router.py."""
    near, far = _job(replicas=8, latency_s=0.002), _job(replicas=8, latency_s=0.010)
    extra = sim.round_cost(far, "fp32", 1)[0] - sim.round_cost(near, "fp32", 1)[0]
    assert extra == pytest.approx(2 * 7 * 2 * 0.008)


def test_a_shaper_s_bucket_lets_a_round_s_bytes_through_at_line_speed_when_the_link_idled() -> None:
    """tbf's burst (links.py): a round after an idle spell sends what the bucket refilled at line speed,
    so at 10 Mbit/s a small model's round is mostly latency; without a bucket every byte pays the rate."""
    plain = _job(params=10_000, rate_bps=1e7, interval=10, step_s=0.01, wire="fp32")  # 40 KB: 32 ms at the rate
    shaped = dataclasses.replace(plain, burst_bytes=256 * 1024)
    assert sim.simulate(plain, max_steps=200).round_s > 0.032
    assert sim.simulate(shaped, max_steps=200).round_s < 0.032 / 2
    # A bucket smaller than a round's bytes frees only itself.
    assert sim.simulate(dataclasses.replace(plain, burst_bytes=10_000), max_steps=200).round_s > 0.032 * 0.7


def test_project_fills_every_cell_with_a_utilisation_a_bottleneck_and_settings(tmp_path: Path) -> None:
    rows = []
    sim.SCALES, sim.LINKS = (2, 1024), sim.LINKS[:1] + sim.LINKS[-1:]  # two of each, for time
    try:
        assert sim.project(tmp_path) == 0
        rows = json.loads((tmp_path / "projection.json").read_text())
    finally:
        importlib.reload(sim)
    assert {(r["replicas"], r["link"]) for r in rows} == {(2, "10 Mbit/s"), (2, "100 Gbit/s"), (1024, "10 Mbit/s"),
                                                         (1024, "100 Gbit/s")}
    for r in rows:
        assert 0 < r["utilisation"] <= 1 and r["bottleneck"] and r["interval"] >= 2 and r["wire"]
    # At 1,024 replicas a tree reduction's rounds are shorter than the ring's: its interval is too.
    far = next(r for r in rows if r["replicas"] == 1024 and r["link"] == "100 Gbit/s")
    assert far["tree_interval"] < far["interval"]
    assert dataclasses.is_dataclass(sim.Job)
