"""What a hogwild job does at R replicas, before renting them: a discrete-event model of its rounds,
calibrated on the runs measured on this host, and a projection to R = 1,024.

The model follows one job round by round (every replica in numpy, so R = 1,024 runs in seconds):

- **Steps.** A worker's optimizer step takes ``step_s`` at full speed, spread lognormally
  (``step_cv``); a replica on a machine at a fraction of its cores (``speeds``) is that much slower.
  Under the barrier (AdamW: one optimizer state a replica) a replica's step waits for its slowest
  worker; on the Hogwild path (SGD) its W workers step on their own.
- **A round** begins when every replica has made its interval's steps since the last one (each
  replica its share under ``sync.interval_by_speed``) and the previous round has ended; it takes the
  collective's time (below). Meanwhile the workers run on, up to ``sync.max_lag`` (one interval),
  then wait for it: what the code does (docs/sync.md, "Slow links").
- **The collective** is Gloo's ring: an fp32 or bf16 all_reduce in 2(R - 1) hops of B / R bytes each,
  an int8 all_gather in R - 1 hops of B / 4, a fragment of 1 / F of either. Each hop costs the link's
  one-way latency twice (``LATENCY_TRIPS``: Gloo's rendezvous) plus its bytes over the rate, plus, where
  the host runs more processes than it has cores,
  the wait for a receiver the scheduler has not run yet (``SCHED_WAIT_S``). Behind a token-bucket
  shaper (this host's shaped runs: ``burst_bytes``) the bytes the bucket refilled while the link idled
  leave at line speed. ``algo="tree"``
  (halving-doubling: 2 log2 R hops, the same bytes) is what a tree reduction would do.
- **The leader's CPU** per round (a fixed part, one per hop, one per value synced, and in elastic
  mode its calls to the coordinator and its polled wait) comes out of the cores its workers use.
- **The interval**: fixed, or paced as the code paces an adaptive optimizer's rounds (the shortest
  whose round takes at most 3/4 of it on the clock and 5 % of it in the leader's CPU, at least two
  steps), climbing the wire's ladder (fp32, int8, int8 in 4 fragments) while the link asks for two
  steps or more.
- **Failures** come at ``mtbf_h`` per machine. In elastic mode the survivors stall for the detection
  (``elastic.peer_timeout_s``) and a formation; the lost replica trains again after its restart and
  heal. Under torchrun every replica restarts and loses the work since the last checkpoint.
- **Quality**: the samples to a target grow with R as item 2's races measured (``--samples-at-2``,
  ``--samples-exponent``); time to the target is those samples over the job's samples a second.

    python scripts/models/scale_sim.py check      # predicted against every measured run it can be given
    python scripts/models/scale_sim.py project    # R = 2 .. 1,024 against links of 10 Mbit/s .. 100 Gbit/s

Calibrated constants (each fit on the runs named, then used everywhere): see the block below.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hogwild.bench import round_rules  # noqa: E402  (the paced interval and the wire's ladder, the code's)
from scripts.harness.links import TBF_BURST_BYTES  # noqa: E402

_RULES = round_rules()
PACE_WALL, PACE_CPU, PACE_FLOOR, UNEVEN = _RULES["wall"], _RULES["cpu"], _RULES["floor"], _RULES["uneven"]
RUNGS, fitting = _RULES["rungs"], _RULES["fitting"]

logger = logging.getLogger("scale_sim")

# --- calibrated on this host (bench_results/scaling*, link/, device/); docs/scale.md "The simulator"
ROUND_CPU_S = 1.0e-3
"""A round's fixed leader CPU (snapshot, control vector, apply): R = 2 loopback, 1.4-1.8 ms a round."""
HOP_CPU_S = 0.235e-3
"""Leader CPU per ring hop (a Gloo send and receive): the slope of 1.8 -> 15.9 ms from R = 2 to 32."""
VALUE_CPU_S = 12e-9
"""Leader CPU per value synced (copy, subtract, quantise): the GPT's rounds, 18-29 ms for 1.8M values."""
HOP_S = 1.2e-3
"""A hop's cost on loopback between processes that are running: R = 2 on this host, 5 ms a round."""
SCHED_WAIT_S = 2.9e-3
"""A hop's wait for a receiver the scheduler has not run, on a host with more processes than cores:
R = 4 on 2 cores, the median of 3 runs (26 ms for 6 hops)."""
LATENCY_TRIPS = 2
"""One-way link latencies a hop pays. Gloo's TCP pairs are a rendezvous: a send leaves only once the
receiver's "ready to receive" notice has arrived, and a ring posts each step's receive when the last
step ends, so every hop waits for the notice, then the bytes. Not fit: it is the protocol's; checked
by delay_router.py under TCP cubic (a round at 10 ms one way less at 2 ms: 1.9, 2.3 and 1.7 times
hops x 8 ms at R = 2, 4 and 8; BBR's pacing adds a cost of the bytes that grows with the delay)."""
ELASTIC_CPU_S = 0.85e-3
"""An elastic leader's CPU a round beyond a torchrun leader's: its round's calls to the coordinator
on their thread, the polled wait of its collective, the record taken before the round. Measured
apart from the runs the check judges: R = 2 on this host's 2 cores, 5,000 steps, the median over 6
pairs of the writer's CPU over training (all its threads), elastic less torchrun, over the twin's
rounds (0.30-1.68 ms; bench_results/elastic_member_cpu). It comes out of the cores the workers use,
as the rest of a leader's round does; the calls alone cost 0.21 ms on an idle host."""
WIRE_BYTES = {"fp32": 4.0, "bf16": 2.0, "int8": 1.008}


@dataclass
class Job:
    """One job's shape, its machines and its link."""

    replicas: int
    step_s: float
    """One worker's optimizer step at full speed (forward, backward, update), seconds."""
    params: int
    workers: int = 1
    samples_per_step: int = 32
    step_cv: float = 0.05
    speeds: tuple[float, ...] = ()
    """Each replica's share of its machine's speed (a fleet); empty: all 1."""
    quota_period_s: float = 0.0
    """A machine held to a share of a core by a CFS quota runs in bursts: it stops for the rest of
    each period (cgroup's ``cpu.cfs_period_us``, 0.1 s by default), so its arrival at a round comes up
    to ``(1 - share) x period`` late. 0: shares are steady (a slower CPU, not a quota)."""
    barrier: bool = True
    cores: float = 1.0
    """A machine's cores; a leader's CPU comes out of them where its workers fill them."""
    host_cores: Optional[float] = None
    """All replicas on one host of this many cores (this host's runs); None: a machine each."""
    rate_bps: float = math.inf
    burst_bytes: float = 0.0
    """A token-bucket shaper's burst (links.py's tbf: TBF_BURST_BYTES): the bytes a machine sends at
    line speed after its link idled, refilled at the rate while idle. 0: a plain link, every byte at the rate."""
    latency_s: float = 0.0
    """The link's one-way latency (a real link: 50 us in a rack, 1-10 ms across); a hop pays it
    LATENCY_TRIPS times, on top of HOP_S."""
    wire: str = "auto"
    """fp32 | bf16 | int8 | auto (the ladder, with a paced interval) | before (the ladder as it was)."""
    fragments: int = 1
    algo: str = "ring"
    interval: Optional[int] = None
    """Steps a replica between rounds; None: paced."""
    max_lag: Optional[float] = None
    eval_share: float = 0.0
    mtbf_h: float = math.inf
    detect_s: float = 10.0
    form_s: float = 3.5
    heal_s: float = 3.0
    launch: str = "torchrun"
    """torchrun | elastic: elastic survivors ride out a failure (detection, formation), and each
    elastic leader's round costs ELASTIC_CPU_S more of its machine's CPU."""
    restart_s: float = 30.0
    checkpoint_s: float = 60.0
    samples_at_2: float = 7_700.0
    samples_exponent: float = 1.0

    def speed(self) -> np.ndarray:
        s = np.ones(self.replicas) if not self.speeds else np.array(self.speeds, dtype=float)
        if self.host_cores is not None:  # R x (W + leader) processes share the host's cores
            s = s * min(1.0, self.host_cores / (self.replicas * self.workers))
        return s

    def oversubscribed(self) -> bool:
        """More workers than the host has cores: a hop may wait for a receiver not running (a leader
        sleeps in its collective, so the workers are what compete)."""
        return self.host_cores is not None and self.replicas * self.workers > self.host_cores


def hops_and_bytes(job: Job, wire: str, fragments: int) -> tuple[int, float]:
    """The collective's hops and the bytes each hop carries (docs/sync.md "What a round sends")."""
    r = job.replicas
    if r < 2:
        return 0, 0.0
    payload = job.params * WIRE_BYTES[wire] / fragments
    if wire == "int8":  # an all_gather of every replica's int8 chunks
        return r - 1, payload
    if job.algo == "tree":
        steps = 2 * math.ceil(math.log2(r))
        return steps, 2 * (r - 1) / r * payload / steps
    return 2 * (r - 1), payload / r


def round_cost(job: Job, wire: str, fragments: int) -> tuple[float, float, float]:
    """(the collective's seconds on the clock, its latency part, the leader's CPU seconds)."""
    hops, per_hop = hops_and_bytes(job, wire, fragments)
    wait = HOP_S + LATENCY_TRIPS * job.latency_s + (SCHED_WAIT_S if job.oversubscribed() else 0.0)
    latency = hops * wait
    clock = latency + hops * per_hop * 8 / job.rate_bps
    cpu = ROUND_CPU_S + hops * HOP_CPU_S + VALUE_CPU_S * job.params / fragments
    return clock, latency, cpu


def replica_step_s(job: Job) -> float:
    """A replica's optimizer step at full speed: the barrier waits for its slowest of W workers."""
    if not job.barrier:
        return job.step_s / job.workers
    rng = np.random.default_rng(0)
    draws = rng.lognormal(0.0, job.step_cv, size=(4096, job.workers)).max(axis=1)
    return job.step_s * float(draws.mean() / math.exp(job.step_cv ** 2 / 2))


def fitting_before(ask: float, replicas: int) -> int:
    """The ladder before 2026-11-28: int8's cost capped at fp32's, and the top rung (int8 in four
    fragments) taken where nothing fit, whatever it sent."""
    capped = [1.0, min(1.0, replicas / 8), min(1.0, replicas / 8) / 4]
    if ask < PACE_FLOOR:
        return 0
    return next((r for r in (1, 2) if ask * capped[r] < PACE_FLOOR), 2)


def pick_wire(job: Job, step: float) -> tuple[str, int, int]:
    """(wire, fragments, interval): fixed, or paced with the wire's ladder as the code climbs it
    (``job.wire="before"``: as it climbed before 2026-11-28)."""
    wire, frags = job.wire, job.fragments
    if wire in ("auto", "before"):
        clock, _, _ = round_cost(job, "fp32", 1)
        link = clock / (PACE_WALL * step)
        rung = fitting(0, link, PACE_FLOOR, job.replicas) if wire == "auto" else fitting_before(link, job.replicas)
        wire, frags = RUNGS[rung]
    clock, _, cpu = round_cost(job, wire, frags)
    ask = max(clock / (PACE_WALL * step), cpu / (PACE_CPU * step))
    return wire, frags, job.interval or max(PACE_FLOOR, math.ceil(ask))


@dataclass
class Result:
    train_s: float
    samples_per_s: float
    utilisation: float
    round_s: float
    """A leader's time in a round, from its arrival (its wait for the others included)."""
    interval: int
    wire: str
    bottleneck: str
    steps_per_replica: float
    time_to_target_s: float
    shares: dict[str, float] = field(default_factory=dict)


def simulate(job: Job, budget_s: float = 600.0, seed: int = 0, max_steps: Optional[int] = None) -> Result:
    """Follow the job round by round for ``budget_s`` of training (or until every replica made
    ``max_steps``); failures cut from what it made."""
    rng = np.random.default_rng(seed)
    step = replica_step_s(job)
    wire, frags, interval = pick_wire(job, step)
    clock, latency, cpu = round_cost(job, wire, frags)
    speed = job.speed()
    slow = speed / speed.max()
    if job.barrier and job.speeds and job.interval is None and slow.min() <= UNEVEN:
        # An uneven fleet's paced interval covers its slowest machine: at least a step of its own.
        interval = max(interval, math.ceil(1 / slow.min()))
    # Each replica's interval: its share under interval_by_speed (the barrier's default), else equal.
    h = np.maximum(1, np.round(interval * slow)) if job.barrier and job.speeds else np.full(job.replicas, interval)
    lag = h if job.max_lag is None else np.full(job.replicas, job.max_lag)
    # A leader's CPU slows its own workers where they fill its machine's cores. On one host the hops'
    # CPU is inside the hops' time (every leader is in the ring at once); the rest of every leader's
    # round comes out of the host's cores.
    hops, per_hop = hops_and_bytes(job, wire, frags)
    own = cpu + (ELASTIC_CPU_S if job.launch == "elastic" else 0.0)
    if job.host_cores is None:
        steal = own / job.cores if job.workers >= job.cores else 0.0
    else:
        steal = (own - hops * HOP_CPU_S) * job.replicas / job.host_cores
    credit = job.burst_bytes  # the shaper's bucket, full at the start
    arrive = np.zeros(job.replicas)
    end = 0.0
    steps = np.zeros(job.replicas)
    waited = np.zeros(job.replicas)
    in_round = []
    rounds = 0
    while (end < budget_s if max_steps is None else steps.min() < max_steps) and rounds < 100_000:
        # H steps, each a draw of the replica's step spread (the sum's spread shrinks as sqrt(H)).
        spread = rng.normal(1.0, job.step_cv / np.sqrt(h))
        made = arrive + h * step / speed * np.maximum(spread, 0.5) + steal
        if job.quota_period_s:
            made += rng.uniform(0.0, 1.0, job.replicas) * (1 - np.minimum(speed, 1.0)) * job.quota_period_s
        start = max(made.max(), end)
        finish = start + clock
        if job.burst_bytes:  # the bucket refills while the link idles between rounds; what it holds leaves at once
            credit = min(job.burst_bytes, credit + (start - end) * job.rate_bps / 8)
            free = min(credit, hops * per_hop)
            credit -= free
            finish -= free * 8 / job.rate_bps
        in_round.append(float((finish - made).mean()))
        # Workers ran on from their arrival; past max_lag steps they waited for the round's end.
        ahead = made + lag * step / speed
        blocked = np.maximum(0.0, finish - ahead)
        waited += blocked
        steps += h
        arrive = np.maximum(made, finish - lag * step / speed)
        end = finish
        rounds += 1
    train = end
    steps_made = steps * (1 - job.eval_share)
    lost_s = failure_loss_s(job, train, step, interval)
    useful = max(0.0, 1 - lost_s / train)
    # A barrier step takes a batch from every worker; a Hogwild replica's step is one worker's.
    per_step = job.samples_per_step * (job.workers if job.barrier else 1)
    samples_per_s = float(steps_made.sum() * per_step / train) * useful
    ideal = float(speed.sum() * job.samples_per_step * job.workers / job.step_s)
    # Seconds a round: its steps, and what could hold them back ("hops": each hop's latency, on the
    # link and in Gloo, 2 (R - 1) of them in a ring; "link": the bytes over the rate).
    shares = {"compute": interval * step, "link": clock - latency, "hops": latency, "leader_cpu": cpu,
              "waits": float(waited.mean() / max(rounds, 1)), "failures": lost_s / max(rounds, 1),
              "evaluation": job.eval_share * interval * step}
    bottleneck = bottleneck_of(shares, step)
    target = job.samples_at_2 * (job.replicas / 2) ** job.samples_exponent
    return Result(train_s=train, samples_per_s=samples_per_s, utilisation=samples_per_s / ideal,
                  round_s=float(np.mean(in_round)), interval=int(interval), wire=f"{wire}" + (
                      f" x{frags}" if frags > 1 else ""), bottleneck=bottleneck,
                  steps_per_replica=float(steps_made.mean() * useful), time_to_target_s=target / samples_per_s,
                  shares={k: round(v, 6) for k, v in shares.items()})


def failure_loss_s(job: Job, train_s: float, step: float, interval: int) -> float:
    """Job-seconds of all replicas' training lost to failures in ``train_s`` (an expectation)."""
    if not math.isfinite(job.mtbf_h):
        return 0.0
    failures = job.replicas * train_s / (job.mtbf_h * 3600)
    if job.launch == "torchrun":  # every replica restarts from the last checkpoint
        return failures * (job.restart_s + job.checkpoint_s / 2)
    r = job.replicas
    # The survivors' workers run on for max_lag (one interval) while the loss is detected and a group
    # formed, then wait; the lost replica is away until it is back and healed, and its steps since
    # the last round are lost (half an interval on average).
    run_on = interval * step
    per = ((r - 1) * max(0.0, job.detect_s + job.form_s - run_on) + recovery_s(job) + interval * step / 2) / r
    return failures * per


def recovery_s(job: Job) -> float:
    """From a replica's loss to its training again: its restart runs while the others detect the
    loss (a restart loop starts it at once), then it joins at the next formation and heals."""
    return max(job.detect_s, job.restart_s) + job.form_s + job.heal_s


def bottleneck_of(shares: dict[str, float], step_s: float) -> str:
    """The first thing that holds the job back: failures where they cost 5 % of its time; else what
    set the paced interval above its floor of two steps (the round's bytes or its hops against 3/4 of
    the interval, the leader's CPU against 5 %); else waits for the others where they cost 5 %; else
    its own steps."""
    interval_s = shares["compute"]
    if shares["failures"] > 0.05 * interval_s:
        return "failures"
    asks = {"link": shares["link"] / PACE_WALL, "hops": shares["hops"] / PACE_WALL,
            "leader_cpu": shares["leader_cpu"] / PACE_CPU}  # seconds of steps each asks for
    worst = max(asks, key=lambda k: asks[k])
    if asks[worst] > PACE_FLOOR * step_s:
        return worst
    return "waits" if shares["waits"] > 0.05 * interval_s else "compute"


# --- the check: every measured run the model can be given -------------------------------------------

RESULTS = Path(__file__).resolve().parents[2] / "bench_results"
MLP_PARAMS = 9_627  # the digits MLP: 38,508 bytes a round at R = 2 (replica_scaling.py)
GPT_LARGE = 1_816_704
TOKENS = 8 * 64  # the GPT races' batch: 8 blocks of 64 tokens (a sample here is a token)


@dataclass
class Case:
    name: str
    job: Job
    measured: dict[str, float]
    budget_s: float = 600.0
    max_steps: Optional[int] = None
    fit: str = ""
    """What this run calibrated (its figures then match by construction, not as a prediction)."""
    outside: str = ""
    """Why the model cannot be given this run (shown, not counted)."""
    spread: Optional[tuple[float, float]] = None
    """The first figure's lowest and highest among the run's repeats (this host's noise)."""


def _load(path: str) -> dict:  # type: ignore[type-arg]
    return json.loads((RESULTS / path).read_text())


def _run(path: str, arm: str = "hogwild") -> dict:  # type: ignore[type-arg]
    return _load(path)["arms"][arm]["runs"][0]


def _median_run(path: str, key: str, arm: str = "hogwild") -> dict:  # type: ignore[type-arg]
    """The arm's run whose ``key`` is the median (the upper one of an even count)."""
    runs = sorted(_load(path)["arms"][arm]["runs"], key=lambda r: r[key])
    return runs[len(runs) // 2]


def worker_step_s(run: dict, steps: float) -> float:  # type: ignore[type-arg]
    """One worker's compute a step (forward, backward, update), from a run's time_s."""
    w = run["time_s"]["per_worker"][0]
    return (w["forward_backward"] + w["update"]) / steps


def _repeats(name: str, runs: list[dict], job: Job, max_steps: int, fit: str = "") -> Case:  # type: ignore[type-arg]
    """A case of repeated runs of one command: the median of each figure, the repeats' range beside it."""
    train = [m["train_s"] for m in runs]
    return Case(name + (f" (median of {len(runs)})" if len(runs) > 1 else ""), job,
                {"train_s": statistics.median(train),
                 "round_s": statistics.median(m["in_collectives_s"] for m in runs)},
                max_steps=max_steps, fit=fit, spread=(min(train), max(train)))


def mlp_job(replicas: int, **shape: Any) -> Job:
    """The digits MLP of replica_scaling.py: one worker a replica, a round every 10 steps on fp32 (the
    interval leaves a round's own cost unchanged), ``shape`` the host or machines and link."""
    return Job(replicas=replicas, step_s=MLP_STEP_S, params=MLP_PARAMS, interval=10, wire="fp32", **shape)


def one_host_cases() -> list[Case]:
    """R = 2..32 replicas of the digits MLP under torchrun on this host's 2 cores, a round every 10
    steps: 200 steps (scaling_r3) and, for the short runs of R = 2 and 4, 1,000 steps
    (scaling_long), medians of 3; R = 2 with each replica pinned to a core (scaling_pinned, medians
    of 5). Elastic runs are judged against torchrun twins (:func:`elastic_twin_rows`)."""
    out = []
    for path, steps in (("scaling_r3/scaling.json", 200), ("scaling_long/scaling.json", 1000)):
        for r, runs in _load(path)["results"]["torchrun"].items():
            job = mlp_job(int(r), host_cores=2)
            fit = {"2": "MLP_STEP_S", "4": "SCHED_WAIT_S"}.get(r, "") if steps == 200 else ""
            out.append(_repeats(f"torchrun R = {r} on one host, {steps} steps", runs, job, steps, fit))
    job = mlp_job(2, cores=1)  # a core each: a machine each
    out.append(_repeats("torchrun R = 2 on one host, a core each, 1000 steps",
                        _load("scaling_pinned/scaling.json")["results"]["torchrun"]["2"], job, 1000))
    return out


def elastic_twin_rows() -> list[dict[str, object]]:
    """Elastic runs on one host, each beside a torchrun run of the same invocation, with a round's
    calls to the coordinator batched on one thread: R = 8, 16 and 32 at 200 steps
    (scaling_round_batch: 10, 11 and 6 pairs), R = 2 and 4 at 1,000 steps (scaling_long_v3: 16 and 8;
    R = 2 pools them with the 24 pairs of scaling_long_v4, half of them with the torchrun run first,
    as decided before they ran) and R = 2 pinned a core each (scaling_pinned_v3: 10). This host's
    speed moved by a quarter between the days these were measured (torchrun R = 2, 1,000 steps:
    1.43 s in scaling_long, 1.05-1.22 in scaling_long_v2), more than the launches differ, so each
    pair is judged on its own: the figure is the elastic run's time over its twin's (the median of
    the pairs). The launch's term is an elastic leader's CPU a round (:data:`ELASTIC_CPU_S`)."""
    rows: list[dict[str, object]] = []
    for paths, steps, shape, cores in ((("scaling_round_batch",), 200, "", None),
                                       (("scaling_long_v3", "scaling_long_v4"), 1000, "", None),
                                       (("scaling_pinned_v3",), 1000, ", a core each", 1.0)):
        sets = [_load(f"{path}/scaling.json")["results"] for path in paths]
        for r in sorted(sets[0]["elastic"], key=int):
            ratios = [e["train_s"] / t["train_s"] for runs in sets if r in runs["elastic"]
                      for e, t in zip(runs["elastic"][r], runs["torchrun"][r])]
            job = mlp_job(int(r), cores=cores) if cores else mlp_job(int(r), host_cores=2)
            predicted = simulate(replace(job, launch="elastic"), max_steps=steps).train_s / simulate(
                replace(job, launch="torchrun"), max_steps=steps).train_s
            rows.append(_pairs_row(f"elastic R = {r} on one host{shape}, {steps} steps, against its torchrun twin",
                                   ratios, predicted))
    return rows


def _pairs_row(run: str, measured: list[float], predicted: float) -> dict[str, object]:
    """A check row of runs judged pair by pair against their twins: the median of the pairs' ratios,
    their range beside it."""
    return {"run": f"{run} (median of {len(measured)} pairs)", "figure": "train_s / twin's",
            "measured": statistics.median(measured), "predicted": predicted,
            "spread": (min(measured), max(measured))}


def step_fit(job: Job, train_s: float, steps: int) -> float:
    """The step at which ``job`` trains ``steps`` steps in ``train_s`` (its rounds' cost kept)."""
    step = job.step_s
    for _ in range(4):  # train_s is near-linear in the step: a few rescalings converge
        step *= train_s / simulate(replace(job, step_s=step), max_steps=steps).train_s
    return step


MLP_STEP_S = 1.36e-3
"""The digits MLP's step on one thread of this host (batch 32), the run's fixed costs spread over it:
fit on R = 2's 200 steps in 0.30 s, the median of 3 runs (0.27-0.34 s)."""


def link_cases() -> list[Case]:
    out = []
    for rate, bps, path in (("100 Mbit/s", 1e8, "link/gpt_large_2x_100mbit_auto2.json"),
                            ("1 Gbit/s", 1e9, "link/gpt_large_2x_1gbit_defaults3.json")):
        m = _median_run(path, "steps_per_replica")
        job = Job(replicas=2, step_s=worker_step_s(m, m["steps_per_replica"]), params=GPT_LARGE, cores=1,
                  rate_bps=bps, burst_bytes=TBF_BURST_BYTES, eval_share=m["eval_fraction"], samples_per_step=TOKENS)
        out.append(Case(f"GPT 1.8M, 2 x 1 at {rate}", job, {
            "steps_per_replica": m["steps_per_replica"], "interval": m["steps_per_sync"],
            "round_s": m["link_s"] / m["syncs"]}, budget_s=m["train_s"]))
    m = _run("device/lm16_4x4_1gbit.json")
    w = m["time_s"]["workers"]
    step = (w["forward_backward"] + w["update"]) / 16 / m["steps_per_replica"]
    job = Job(replicas=4, workers=4, cores=4, step_s=step, params=GPT_LARGE, rate_bps=1e9, step_cv=LENT_CV,
              eval_share=m["eval_fraction"], samples_per_step=TOKENS)
    out.append(Case("GPT 1.8M, 4 x 4 at 1 Gbit/s (lent host)", job, {
        "steps_per_replica": m["steps_per_replica"], "interval": m["steps_per_sync"],
        "round_s": m["link_s"] / m["syncs"]}, budget_s=m["train_s"], fit="LENT_CV"))
    for rate, bps in (("1gbit", 1e9), ("100mbit", 1e8), ("10mbit", 1e7)):
        for r, m in _load(f"scaling_shaped_{rate}/scaling.json")["results"]["shaped"].items():
            if r == "2":
                continue
            # A machine each in a network namespace, each held to an equal share of the 2 cores.
            job = mlp_job(int(r), cores=1, rate_bps=bps, burst_bytes=TBF_BURST_BYTES, speeds=(2 / int(r),) * int(r),
                          quota_period_s=LINKS_PERIOD_S)
            out.append(Case(f"R = {r} at {rate} (namespaces, {2 / int(r):g} core each)", job, {
                "train_s": m[0]["train_s"], "round_s": m[0]["in_collectives_s"]}, max_steps=200,
                outside="CFS quota slices: a throttled machine stalls its peers' hops"))
    m = _median_run("stragglers/fleet3.json", "steps_per_replica")
    own = m["steps_per_sync_per_replica"][0] * m["syncs"]
    job = Job(replicas=3, step_s=worker_step_s(m, own), params=112_384, speeds=(1.0, 0.5, 0.25), cores=1,
              rate_bps=math.inf, eval_share=m["eval_fraction"], samples_per_step=TOKENS, quota_period_s=0.1)
    out.append(Case("GPT 0.1M, 3 x 1 at 1, 1/2, 1/4 of a core", job, {
        "steps_per_replica": m["steps_per_replica"], "interval": m["steps_per_sync"]}, budget_s=m["train_s"]))
    return out


LINKS_PERIOD_S = 0.01
"""scripts/harness/links.py CFS_PERIOD_US: machines sharing this host's cores are held to 10 ms periods."""

LENT_CV = 0.25
"""The spread of a worker's step on the lent host (16 workers on 16 cores): fit on its barrier's waits."""


def failure_rows() -> list[dict[str, object]]:
    """R = 16 elastic, a quarter of its replicas SIGKILLed: the recovery (chaos16_v2, the tree of
    2026-11-30 with a round's calls batched; chaos16 was the tree of 2026-11-28) and the steps a kill
    lost, from the elastic R = 16 run's start-up and formation (scaling_elastic)."""
    kills = [f for f in _load("chaos16_v2/chaos.json")["faults"] if f["kind"] == "kill"]
    earlier = [f for f in _load("chaos16/chaos.json")["faults"] if f["kind"] == "kill"]
    formed = _load("scaling_elastic/scaling.json")["results"]["elastic"]["16"][0]
    job = Job(replicas=16, step_s=0.0, params=MLP_PARAMS, detect_s=10.0, restart_s=formed["startup_s"],
              form_s=formed["formation_s"], heal_s=0.0, interval=20, launch="elastic")
    recovery = statistics.median(f["recovery_s"] for f in kills)
    # The steps a kill loses are where in its interval it landed, whatever R: a mean of 20 kills has a
    # standard error of about 15 % of it (8.1 +- 1.4 here), so both R = 16 campaigns and the R = 3
    # campaign's 60 kills of the same interval (chaos_kills3) are pooled.
    lost = [f["steps_lost"] for f in kills + earlier + _load("chaos_kills3/chaos.json")["faults"]
            if f["kind"] == "kill" and f["steps_lost"] is not None]
    return [{"run": f"R = 16 elastic, {len(kills)} kills (chaos16_v2)", "figure": "recovery_s (p50)",
             "measured": recovery, "predicted": recovery_s(job)},
            {"run": f"R = 16 and R = 3 elastic, {len(lost)} kills (chaos16, chaos16_v2, chaos_kills3)", "figure":
             "steps lost a kill", "measured": statistics.mean(lost), "predicted": job.interval / 2}]


def twin_rows() -> list[dict[str, object]]:
    """R = 2 in namespaces at three rates, 1,000 steps, each run interleaved with a loopback twin (each
    replica pinned to a core; scaling_twin_*, 5 pairs): this host's speed moves by a quarter between
    runs, more than the link does at 1 Gbit/s, so each pair is judged on its own: the step fit on the
    twin, the namespaces run predicted at that step, and the figure is the run's time over its twin's
    (the median of the pairs; taking each arm's median apart put +23 % at 100 Mbit/s on noise)."""
    rows: list[dict[str, object]] = []
    for rate, bps in (("1gbit", 1e9), ("100mbit", 1e8), ("10mbit", 1e7)):
        twin = _load(f"scaling_twin_{rate}/scaling.json")["results"]
        measured, predicted = [], []
        for loop, shaped in zip(twin["torchrun"]["2"], twin["shaped"]["2"]):
            step = step_fit(mlp_job(2, cores=1), loop["train_s"], 1000)
            job = replace(mlp_job(2, cores=1, rate_bps=bps, burst_bytes=TBF_BURST_BYTES), step_s=step)
            measured.append(shaped["train_s"] / loop["train_s"])
            predicted.append(simulate(job, max_steps=1000).train_s / loop["train_s"])
        rows.append(_pairs_row(f"R = 2 at {rate} (namespaces), 1000 steps, against its loopback twin", measured,
                               statistics.median(predicted)))
    return rows


def _delays(paths: list[Path]) -> dict[float, dict[str, list[float]]]:
    """A round's time in collectives of every shaped run in ``paths``, by its delay and R."""
    at: dict[float, dict[str, list[float]]] = {}
    for path in paths:
        for r, runs in json.loads(path.read_text())["results"]["shaped"].items():
            for m in runs:
                at.setdefault(m["delay_ms"], {}).setdefault(r, []).append(m["in_collectives_s"])
    return at


THIS_HOST_CORES = 2
"""The cores of the host the namespace runs shared: past that many machines they share cores."""


def latency_rows() -> list[dict[str, object]]:
    """The latency term alone: R = 2, 4, 8 machines at 100 Mbit/s through delay_router.py at 2 and
    10 ms one way, a round's time in collectives at 10 ms less at 2 ms (medians of the runs), against
    the model's (everything but the latency cancels). Judged under TCP cubic, with the machines past
    the host's cores sharing them by the scheduler (scaling_delay_cubic_pinned/, ``--share pin``);
    shown, not counted, with each of them under a CFS quota instead (scaling_delay_cubic/, R = 4 and
    8: a machine throttled mid-round stalls its peers' hops, and at 10 ms part of that stall hides
    in the wait, so the difference falls short of the latency: 24 one-way delays at R = 8 against 25
    pinned, the model's 28), and under this host's default BBR (scaling_delay_*), which paces a round's burst at a
    rate it estimates from the round trip, so the bytes cost more at 10 ms than at 2 and the
    difference is not the latency alone (the R = 2 sweep of bench_results/congestion/: 34, 45 and 47
    ms under BBR as a hop grows from 7 to 19 to 77 KB, 31, 31 and 33 under cubic, the model's 32).
    With no more machines than cores each has a core of its own either way: those runs are pooled."""
    quota = _delays(sorted((RESULTS / "scaling_delay_cubic").glob("*/scaling.json")))
    pinned = _delays(sorted((RESULTS / "scaling_delay_cubic_pinned").glob("*/scaling.json")))
    bbr = _delays([RESULTS / f"scaling_delay_{d}/scaling.json" for d in (2, 10)])

    def runs(at: dict[float, dict[str, list[float]]], r: str) -> tuple[list[float], list[float]]:
        return at.get(2.0, {}).get(r, []), at.get(10.0, {}).get(r, [])

    sets: list[tuple[str, str, tuple[list[float], list[float]], str]] = []
    for r in sorted(set(quota.get(2.0, {})) | set(pinned.get(2.0, {})), key=int):
        (qn, qf), (pn, pf) = runs(quota, r), runs(pinned, r)
        if int(r) <= THIS_HOST_CORES:
            sets.append((r, "TCP cubic, a core each", (qn + pn, qf + pf), ""))
        else:
            sets.append((r, f"TCP cubic, {THIS_HOST_CORES} cores shared by the scheduler", (pn, pf), ""))
            sets.append((r, f"TCP cubic, a CFS quota of {THIS_HOST_CORES}/{r} core each", (qn, qf),
                         "CFS quota slices: a throttled machine stalls its peers' hops"))
    for r in sorted(bbr.get(2.0, {}), key=int):
        sets.append((r, "TCP BBR", runs(bbr, r), "TCP BBR's pacing: a round's bytes cost more at 10 ms than at 2"))
    rows: list[dict[str, object]] = []
    for r, how, (near, far), outside in sets:
        if not near or not far:
            continue
        job = mlp_job(int(r), rate_bps=1e8)
        predicted = (round_cost(replace(job, latency_s=0.010), "fp32", 1)[0]
                     - round_cost(replace(job, latency_s=0.002), "fp32", 1)[0])
        rows.append({"run": f"R = {r} at 100 Mbit/s, {how}, 10 ms one way less 2 ms (medians of {len(far)} "
                            f"and {len(near)})", "figure": "round's latency term (s)",
                     "measured": statistics.median(far) - statistics.median(near), "predicted": predicted,
                     "outside": outside})
    return rows


def check(out: Optional[Path]) -> int:
    """Predicted against measured for every run the model can be given. A run's first figure is its
    throughput (training time for a fixed number of steps, or steps in a fixed time): the one the
    model is judged on; the rest (a round's time, the interval) say where it goes wrong."""
    rows: list[dict[str, object]] = []
    for case in one_host_cases() + link_cases():
        res = simulate(case.job, budget_s=case.budget_s, max_steps=case.max_steps)
        predicted = {"train_s": res.train_s, "round_s": res.round_s, "steps_per_replica": res.steps_per_replica,
                     "interval": res.interval}
        for i, (key, measured) in enumerate(case.measured.items()):
            rows.append({"run": case.name, "figure": key, "measured": measured, "predicted": float(predicted[key]),
                         "error": float(predicted[key]) / measured - 1, "fit": case.fit, "outside": case.outside,
                         "primary": i == 0, "spread": case.spread if i == 0 else None})
    for row in elastic_twin_rows() + twin_rows() + latency_rows() + failure_rows():
        row.update(error=float(row["predicted"]) / float(row["measured"]) - 1,  # type: ignore[arg-type]
                   fit="", primary=True)
        row.setdefault("outside", "")
        rows.append(row)
    lines = ["| run | figure | measured | repeats' range | predicted | error |", "|---|---|---|---|---|---|"]
    for r in rows:
        note = f" (fit: {r['fit']})" if r["fit"] else f" (outside the model: {r['outside']})" if r["outside"] else ""
        figure = f"**{r['figure']}**" if r["primary"] else r["figure"]
        spread = r.get("spread")
        span = f"{spread[0]:.4g}-{spread[1]:.4g}" if spread else ""
        lines.append(f"| {r['run']}{note} | {figure} | {r['measured']:.4g} | {span} | {r['predicted']:.4g} | "
                     f"{r['error']:+.0%} |")
    judged = [r for r in rows if r["primary"] and not r["fit"] and not r["outside"]]
    within = [r for r in judged if abs(float(r["error"])) <= 0.15]  # type: ignore[arg-type]
    missed = [r for r in judged if r not in within]

    def inside(r: dict[str, object]) -> bool:
        lo_hi = r.get("spread")
        return bool(lo_hi) and lo_hi[0] <= float(r["predicted"]) <= lo_hi[1]  # type: ignore[index, arg-type]

    summary = (f"{len(within)} of {len(judged)} predicted figures in bold within 15 % of the measured "
               f"(calibration runs and runs outside the model left out); the others: "
               + (", ".join(f"{r['run']} {float(r['error']):+.0%}" + (" (inside its repeats' range)" if inside(r)
                                                                     else "") for r in missed) or "none"))
    print("\n".join(lines) + "\n\n" + summary)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "check.json").write_text(json.dumps(rows, indent=1))
        (out / "check.md").write_text("\n".join(lines) + "\n\n" + summary + "\n")
    return 0


# --- the projection ----------------------------------------------------------------------------------

LINKS = (("10 Mbit/s", 1e7, 20e-3), ("100 Mbit/s", 1e8, 5e-3), ("1 Gbit/s", 1e9, 0.2e-3),
         ("10 Gbit/s", 1e10, 50e-6), ("100 Gbit/s", 1e11, 10e-6))
"""Each link's rate and one-way latency: a WAN at 10 and 100 Mbit/s, a LAN, a data centre."""
SCALES = (2, 8, 32, 128, 512, 1024)
MTBF_H = 1500.0
"""A machine's mean time between failures: at 500 machines, one fails every 3 hours."""


def reference_job(replicas: int, rate_bps: float, latency_s: float) -> Job:
    """The §20 race's machine (the 1.8M GPT under AdamW, one worker on a core, 0.33 s a step),
    repeated R times, in elastic mode, failing at MTBF_H; a formation reads every member's heartbeat."""
    return Job(replicas=replicas, step_s=0.334, params=GPT_LARGE, samples_per_step=TOKENS, cores=1,
               rate_bps=rate_bps, latency_s=latency_s, mtbf_h=MTBF_H, detect_s=10.0,
               form_s=5.0 + replicas * (0.2e-3 + latency_s), heal_s=3.0, restart_s=30.0, launch="elastic")


def settings_of(res: Result, algo: str) -> str:
    return f"{res.wire}, every {res.interval}" + (", tree" if algo == "tree" else "")


def project(out: Optional[Path]) -> int:
    """Every cell: the default (a ring, the wire's ladder, a paced interval), the ladder as it was
    before 2026-11-28, and a tree reduction; utilisation, what limits it, and what to set."""
    rows = []
    for r in SCALES:
        for name, bps, lat in LINKS:
            job = reference_job(r, bps, lat)
            now = simulate(job, budget_s=300.0)
            before = simulate(replace(job, wire="before"), budget_s=300.0)
            tree = simulate(replace(job, algo="tree"), budget_s=300.0)
            rows.append({"replicas": r, "link": name, "utilisation": now.utilisation, "bottleneck": now.bottleneck,
                         "round_s": now.round_s, "interval": now.interval, "wire": now.wire,
                         "before_utilisation": before.utilisation, "before_interval": before.interval,
                         "before_wire": before.wire, "tree_utilisation": tree.utilisation,
                         "tree_interval": tree.interval, "tree_wire": tree.wire, "shares": now.shares})
            logger.info("R = %d, %s: %.2f (%s) every %d; before every %d; tree every %d", r, name, now.utilisation,
                        now.bottleneck, now.interval, before.interval, tree.interval)
    names = [n for n, _, _ in LINKS]
    lines = ["| R | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for r in SCALES:
        cells = [f"{x['utilisation']:.2f}, {x['bottleneck']}; {x['wire']} every {x['interval']}"
                 for x in rows if x["replicas"] == r]
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    lines += ["", "What the two changes buy: a round every N steps (the default, the ladder before 2026-11-28,"
              " a tree reduction), and the utilisation where it moves.", "",
              "| R | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for r in SCALES:
        cells = []
        for x in (x for x in rows if x["replicas"] == r):
            cell = f"{x['interval']} / {x['before_interval']} ({x['before_wire']}) / {x['tree_interval']}"
            for key, label in (("before_utilisation", "before"), ("tree_utilisation", "tree")):
                if abs(x[key] - x["utilisation"]) >= 0.01:
                    cell += f"; {label} {x[key]:.2f}"
            cells.append(cell)
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "projection.json").write_text(json.dumps(rows, indent=1))
        (out / "projection.md").write_text("\n".join(lines) + "\n")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("check", "project"))
    ap.add_argument("--out", type=Path, default=None, help="write check.* or projection.* here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.what == "check":
        return check(args.out)
    return project(args.out)


if __name__ == "__main__":
    sys.exit(main())
