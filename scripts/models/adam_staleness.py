"""Why two Hogwild workers with AdamW lose to one process on the GPT: a one-process model of
what they do, step by step, without races or timing.

Each "worker" keeps its own AdamW state (hogwild's default ``optim.state=worker``) and the two
alternate, each applying a gradient computed before the other's last update (staleness one,
what two Hogwild workers of equal speed see). Four variants train the GPT of ``examples/gpt.py``
for the same number of updates from the same start, with the §15 recipe (warm-up and cosine,
clipping, decay on matrices), and report the test loss on the first 512 test blocks:

- ``one``: one AdamW, fresh gradients (a single process);
- ``two``: two AdamW states alternating, fresh gradients;
- ``one_stale``: one AdamW, gradients one update old;
- ``two_stale``: two AdamW states alternating, gradients one update old (two Hogwild workers);
- ``two_stale_dc``: ``two_stale`` with the stale gradient corrected to first order for the update
  it missed (delay compensation, as DC-ASGD, Zheng et al. 2017, scaled by Adam's second moment):
  ``g + λ·g²·(w_now − w_read)/sqrt(v)``. An exploration, not a hogwild option.

    python scripts/models/adam_staleness.py --steps 600 --lr 3e-3 --out bench_results/adam_staleness.json

``--meet``: how W workers' gradients meet before one AdamW state steps, in virtual time (each
gradient takes about one time unit, ``--jitter`` its spread, ``--slow`` a straggler's factor), for
W = ``--workers``. A gradient is computed on the weights as they were when its worker read them and
reaches the model when the way of meeting lets it:

- ``ddp``: every step waits for every worker's fresh gradient and applies their mean (DDP, and a
  barrier with no bound on waiting);
- ``lbbsp``: the same, each worker's batch sized to its speed (the step's samples kept) and the mean
  weighted by samples, so a step's gradients arrive together (LB-BSP);
- ``lbbsp_prefix``: the fastest worker's batch whole, a slower one's cut to the samples it computes
  in that time (the step's samples shrink); ``lbbsp_accum``: a faster worker adds more whole
  batches (the step waits for the slowest one's batch, and its samples grow);
- ``bound``: the same barrier with a bound on waiting, ``--bound`` time units after the step's
  first fresh gradient, or with ``--median-bound`` after the median worker's (hogwild's rule; the
  same for 2 workers) (Chen et al. 2016's backup workers); a late gradient joins the next step
  (``bound_join``) or is dropped and its worker reads the new weights (``bound_drop``);
- ``async``: asynchronous accumulation; every W gradients make a step, nobody waits (Aji and
  Heafield 2019);
- ``hogwild``: every gradient is a step of its worker's own AdamW state (hogwild's Hogwild path);
- ``replicas_<rule>``: W replicas of one worker, each its own AdamW on fresh gradients, meeting
  every ``--intervals`` steps through hogwild's sync rule (slowmo, diloco, average), in lockstep;
- ``slowrep_<rule>``: 2 replicas of one worker under AdamW, replica 0 ``--slow`` times slower, for
  ``--until-time`` time units (a fast step takes one), averaging every ``--intervals`` of the fast
  replica's steps (issue 56's slow machine): ``wait`` (both make the interval's steps, the fast one
  waits for the slow one: today's rounds), ``scaled`` (a round every interval's time; each replica
  makes the steps its speed allows in it, and the mean weighs each by its steps: Liu et al. 2024's
  dynamic local updates, torchft #233's per-replica ``sync_every``), ``scaled_equal`` (the same, an
  equal mean), and ``ddp`` (every step waits for the slow rank; the two batches' mean gradient).

    python scripts/models/adam_staleness.py --meet ddp bound_join bound_drop async hogwild --workers 2 4 8 \
        --gradients-per-worker 600 --out bench_results/adam_meet.json
    python scripts/models/adam_staleness.py --meet ddp bound_join bound_drop --workers 2 --slow 2 --until-time \
        --out bench_results/adam_meet_straggler.json
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

logger = logging.getLogger("adam_staleness")
VARIANTS = ("one", "two", "one_stale", "two_stale", "two_stale_dc")
WD, WARMUP, CLIP, BATCH = 0.05, 100, 1.0, 32


def _rms(opt: torch.optim.Optimizer, p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Adam's running root mean square of ``p``'s gradient (the gradient's size before its first step)."""
    v = opt.state.get(p, {}).get("exp_avg_sq")
    return (v.sqrt() if v is not None else g.abs()) + 1e-8


def _data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The training windows and the first 512 test blocks of the standard library's characters."""
    from examples.charlm import stdlib_text

    train, test = stdlib_text(test_chars=120_000)
    x_all, y_all = torch.stack([train[i][0] for i in range(len(train))]), train.targets
    return x_all, y_all, torch.stack([test[i][0] for i in range(512)]), test.targets[:512]


def _gpt(seed: int) -> torch.nn.Module:
    from examples.gpt import GPT, GPTConfig

    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=4))


def _adamw(model: torch.nn.Module, lr: float, beta1: float = 0.9) -> torch.optim.AdamW:
    """The recipe's AdamW: decay on matrices only."""
    ps = list(model.parameters())
    groups = [{"params": [p for p in ps if p.dim() > 1], "weight_decay": WD},
              {"params": [p for p in ps if p.dim() <= 1], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(beta1, 0.999))


def _test_loss(model: torch.nn.Module, x_test: torch.Tensor, y_test: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return float(model(x_test, y_test)[1])


def run(variant: str, steps: int, lr: float, beta1: float, seed: int, dc_lambda: float = 32.0) -> float:
    x_all, y_all, x_test, y_test = _data()
    model = _gpt(seed)
    ps = list(model.parameters())
    opts = [_adamw(model, lr, beta1) for _ in range(2 if variant.startswith("two") else 1)]
    gen = torch.Generator().manual_seed(seed + 1)
    previous: Any = None
    for t in range(steps):
        rate = lr * min(1.0, (t + 1) / WARMUP) * 0.5 * (1 + math.cos(math.pi * t / steps))
        idx = torch.randint(len(x_all), (BATCH,), generator=gen)
        for p in ps:
            p.grad = None
        model(x_all[idx], y_all[idx])[1].backward()
        fresh = [p.grad.clone() for p in ps]
        use = fresh
        opt = opts[t % len(opts)]
        if "stale" in variant:  # the gradient of the state before the last update, and that state
            now = [p.detach().clone() for p in ps]
            (use, read), previous = (previous if previous is not None else (fresh, now)), (fresh, now)
            if variant.endswith("dc"):
                use = [g + dc_lambda * g * g * (p.detach() - w) / _rms(opt, p, g) for p, g, w in zip(ps, use, read)]
        for p, g in zip(ps, use):
            p.grad = g
        torch.nn.utils.clip_grad_norm_(ps, CLIP)
        for group in opt.param_groups:
            group["lr"] = rate
        opt.step()
    return _test_loss(model, x_test, y_test)


MEETS = ("ddp", "lbbsp", "lbbsp_prefix", "lbbsp_accum", "bound_join", "bound_adaptive", "bound_drop", "async",
         "hogwild",
         "replicas_slowmo", "replicas_diloco", "replicas_average",
         "slowrep_ddp", "slowrep_wait", "slowrep_scaled", "slowrep_scaled_equal")


@dataclass
class Pending:
    """A gradient on its way: its worker, its values, and the step count of the weights it read."""

    worker: int
    grads: list[torch.Tensor]
    version: int
    samples: int = BATCH
    """The batch it was computed on: a step's mean weighs each gradient by its samples."""


class Pattern:
    """How fast each worker computes over virtual time (issue 56's stragglers): ``none`` (full speed),
    ``stalls`` (worker 0 stopped ``stall`` time units every ``every``: 1 s every 3 s at a batch of
    about 0.17 s), ``busy`` (a core shared with a busy process: one worker at a time runs at half speed,
    which one changing at random, each spell ``hold`` units on average, as the scheduler moves the
    three runnable processes between two cores), ``shared`` (the same spells, but the slowed worker
    runs at full speed while the other waits at the barrier: a waiting worker's core goes to the
    late one, as it does beside a busy process, where ``busy`` counts it lost)."""

    def __init__(self, name: str, seed: int, stall: float = 6.0, every: float = 18.0, hold: float = 3.0) -> None:
        self.name, self.stall, self.every = name, stall, every
        rng = random.Random(seed + 3)
        self.spells: list[tuple[float, int]] = []  # (start, the worker slowed from then on)
        t = 0.0
        while name in ("busy", "shared") and t < 1e5:
            self.spells.append((t, rng.randrange(2)))
            t += rng.expovariate(1.0 / hold)

    def speed(self, w: int, t: float) -> float:
        if self.name == "stalls":
            return 0.0 if w == 0 and t % self.every >= self.every - self.stall else 1.0
        if self.name in ("busy", "shared"):
            i = max(0, min(len(self.spells) - 1, int(self._index(t))))
            return 0.5 if self.spells[i][1] == w else 1.0
        return 1.0

    def speed_beside(self, w: int, t: float, others_computing: bool) -> float:
        """``shared``: worker ``w``'s speed at ``t``, full when no other worker computes."""
        return self.speed(w, t) if others_computing else 1.0

    def _index(self, t: float) -> int:
        lo, hi = 0, len(self.spells)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.spells[mid][0] <= t else (lo, mid)
        return lo

    def duration(self, w: int, t: float, work: float, dt: float = 0.01) -> float:
        """The virtual time worker ``w`` takes from ``t`` for ``work`` units at full speed."""
        if self.name == "none":
            return work
        done, at = 0.0, t
        while done < work:
            done += self.speed(w, at) * dt
            at += dt
        return at - t


def adaptive_bound(lags: list[float], k: float, floor: float, cap: float) -> float:
    """The median plus ``k`` times the median absolute deviation of the recent lags (each a late
    arrival's distance behind its step's pivot, in the pivot's compute times), within [floor, cap]
    (hivemind #676); ``floor`` until there are a few."""
    if len(lags) < 4:
        return floor
    q = sorted(lags)
    med = q[len(q) // 2]
    mad = sorted(abs(x - med) for x in q)[len(q) // 2]
    return max(floor, min(cap, med + k * mad))


def meet(kind: str, workers: int, gradients: int, lr: float, seed: int, *, bound: float = 0.25,
         jitter: float = 0.1, slow: float = 1.0, until_time: Optional[float] = None,
         median_bound: bool = False, straggler_bound: Optional[float] = None, pattern: str = "none",
         k: float = 3.0, window: int = 16, cap: float = 4.0) -> dict[str, Any]:
    """W workers whose gradients meet as ``kind`` says, in virtual time: each gradient takes
    ``exp(jitter * N(0, 1))`` time units (``slow`` times that for worker 0; ``pattern``: see
    :class:`Pattern`). Stops once ``gradients`` have been computed, or at virtual time ``until_time``
    (a wall-clock budget: the schedule's cosine then follows the clock and warm-up is 100 steps, as in
    the §15 race). ``bound_adaptive``: the bound is :func:`adaptive_bound` of the last ``window`` lags
    (``bound`` its floor, ``cap`` its ceiling; ``straggler_bound`` for a worker missing from the step
    before too, hogwild's rule)."""
    x_all, y_all, x_test, y_test = _data()
    model = _gpt(seed)
    ps = list(model.parameters())
    opts = [_adamw(model, lr) for _ in range(workers if kind == "hogwild" else 1)]
    planned = max(1, gradients // (1 if kind == "hogwild" else workers))
    warmup = WARMUP if until_time is not None else max(1, planned // 6)
    batches = torch.Generator().manual_seed(seed + 1)
    clock = random.Random(seed + 2)
    events: list[tuple[float, int, str, Any]] = []
    n = {"version": 0, "computed": 0, "applied": 0, "dropped": 0, "seq": 0, "step_id": 0}
    acc: list[Pending] = []
    waiting: set[int] = set()
    late = kind in ("bound_join", "bound_drop", "bound_adaptive")
    speeds_of = Pattern(pattern, seed)
    lags: list[float] = []
    pivots: dict[int, tuple[float, float]] = {}  # step: (its pivot's arrival, its pivot's compute time)
    wait_bound = bound if late else math.inf
    # lbbsp: each worker's batch sized to its rate (known here; measured in a real run), the step's
    # total kept, so a step's gradients arrive together and none is late (LB-BSP, Chen et al. 2020).
    speeds = [1.0 / slow if w == 0 else 1.0 for w in range(workers)]
    # lbbsp_prefix: what a fixed-size data path allows: the fastest worker keeps its batch, a slower
    # one takes the first samples of its batch in proportion to its speed (the step's total shrinks).
    # lbbsp_accum: whole batches instead: a faster worker adds more of them to its gradient (the
    # step's total grows, the step waits for the slowest worker's one batch).
    sizes = ([max(1, round(workers * BATCH * v / sum(speeds))) for v in speeds] if kind == "lbbsp"
             else [max(1, round(BATCH * v / max(speeds))) for v in speeds] if kind == "lbbsp_prefix"
             else [BATCH * max(1, round(v / min(speeds))) for v in speeds] if kind == "lbbsp_accum"
             else [BATCH] * workers)

    def push(t: float, what: str, payload: Any) -> None:
        n["seq"] += 1
        heapq.heappush(events, (t, n["seq"], what, payload))

    def start(w: int, t: float) -> None:
        """Worker ``w`` reads the weights at ``t`` and computes a gradient on them."""
        if (until_time is None and n["computed"] >= gradients) or (until_time is not None and t >= until_time):
            return
        idx = torch.randint(len(x_all), (sizes[w],), generator=batches)
        for p in ps:
            p.grad = None
        model(x_all[idx], y_all[idx])[1].backward()
        n["computed"] += 1
        d = (slow if w == 0 else 1.0) * sizes[w] / BATCH * math.exp(jitter * clock.gauss(0.0, 1.0))
        payload = Pending(w, [p.grad.clone() for p in ps], n["version"], sizes[w])
        if pattern == "shared":  # its speed changes as the other starts and stops: see reschedule
            inflight[w] = [d, t, 0.0, 0, payload, t]
            reschedule(t)
            return
        d = speeds_of.duration(w, t, d)
        push(t + d, "arrive", (payload, d))

    # pattern "shared": worker -> [work left, when last counted, speed since then, generation (an
    # arrival pushed under an older one is void), its gradient, when it started].
    inflight: dict[int, list[Any]] = {}

    def reschedule(t: float) -> None:
        for w, f in inflight.items():
            f[0] -= f[2] * (t - f[1])
            f[1] = t
            f[2] = speeds_of.speed_beside(w, t, len(inflight) > 1)
            f[3] += 1
            push(t + max(0.0, f[0]) / f[2], "arrive_shared", (w, f[3]))

    def step(pending: list[Pending], opt: torch.optim.Optimizer, t: float) -> None:
        total = sum(q.samples for q in pending)
        for i, p in enumerate(ps):
            p.grad = sum(q.grads[i] * (q.samples / total) for q in pending)
        torch.nn.utils.clip_grad_norm_(ps, CLIP)
        s = n["version"]
        cos = min(t / until_time, 1.0) if until_time is not None else min(s / planned, 1.0)
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * cos))
        opt.step()
        n["version"] += 1
        n["applied"] += len(pending)

    late_before: set[int] = set()
    missing_before: set[int] = set()  # not in the last step: still computing on older weights

    def close(t: float) -> None:
        members = sorted(waiting)
        late_before.clear()
        late_before.update(set(range(workers)) - waiting)  # not in this step: late to it
        late_before.update(q.worker for q in acc if q.version < n["version"])  # came late, joined
        missing_before.clear()
        missing_before.update(set(range(workers)) - waiting)
        step(list(acc), opts[0], t)
        acc.clear()
        waiting.clear()
        n["step_id"] += 1
        for w in members:
            start(w, t)

    for at, _ in speeds_of.spells if pattern == "shared" else []:
        if at < (until_time or math.inf):
            push(at, "spell", None)
    for w in range(workers):
        start(w, 0.0)
    t = 0.0
    while events:
        if until_time is not None and events[0][0] > until_time:
            break  # the budget is spent: gradients still on their way never land
        t, _, what, item = heapq.heappop(events)
        if what == "timer":
            if item == n["step_id"] and acc:
                close(t)
            continue
        if what == "spell":
            reschedule(t)
            continue
        if what == "arrive_shared":
            w, gen = item
            if w not in inflight or inflight[w][3] != gen:
                continue
            f = inflight.pop(w)
            reschedule(t)  # the others run alone, or beside one fewer
            item = (f[4], t - f[5])
        item, took = item
        if item.version in pivots and kind == "bound_adaptive":
            at, pc = pivots[item.version]
            lags[:] = (lags + [(t - at) / pc])[-window:]  # how far behind its step's pivot it came
        if kind == "hogwild":
            step([item], opts[item.worker], t)
            start(item.worker, t)
            continue
        if kind == "async":
            acc.append(item)
            if len(acc) >= workers:
                step(list(acc), opts[0], t)
                acc.clear()
            start(item.worker, t)
            continue
        if item.version < n["version"] and kind == "bound_drop":
            n["dropped"] += 1  # its step went without it: read the new weights
            start(item.worker, t)
            continue
        fresh = item.version == n["version"]
        pivot = max(1, -(-workers // 2)) if median_bound else 1
        if fresh and math.isfinite(wait_bound) and sum(q.version == n["version"] for q in acc) == pivot - 1:
            # The bound runs from the step's first fresh gradient (with --median-bound, the median
            # worker's: hogwild's rule): a late one that joins does not start it, or two workers a
            # little apart would keep missing each other's steps. With --straggler-bound, a step
            # whose missing workers were all late to the step before waits only that long for them.
            missing = set(range(workers)) - waiting - {item.worker}
            short = straggler_bound is not None and missing and missing <= late_before
            if kind == "bound_adaptive":
                # A worker missing from the last step too brings a stale gradient whenever it comes:
                # waiting for it gains no freshness (the floor); one that joined the last step late
                # computes on these weights and gets the adaptive bound.
                pivots[n["version"]] = (t, took)
                stale = missing and missing <= missing_before and straggler_bound is not None
                wait = straggler_bound if stale else adaptive_bound(lags, k, bound, cap)
                push(t + wait * took, "timer", n["step_id"])
            else:
                push(t + (straggler_bound if short else wait_bound), "timer", n["step_id"])
        acc.append(item)
        waiting.add(item.worker)
        if len(waiting) == workers:
            close(t)
    if acc and until_time is None:  # the last gradients of a fixed count still land
        step(list(acc), opts[0], t)
    return {"test_loss": _test_loss(model, x_test, y_test), "steps": n["version"], "computed": n["computed"],
            "applied": n["applied"], "dropped": n["dropped"], "virtual_time": t}


@dataclass(frozen=True)
class Outer:
    """How the modelled replicas meet beyond the rule and interval (designs tried for issue 55)."""

    outer_lr: Optional[float] = None
    outer_momentum: Optional[float] = None
    moments_every: int = 0
    """Every this many rounds also average the replicas' AdamW moments (DES-LOC: the moments on a
    slower schedule than the weights); 0: never."""
    dense_steps: int = 0
    """The first steps average the replicas after every step, as post-local SGD (Lin et al. 2020)
    runs synchronously before it goes local; the rule starts from their mean."""
    growth: float = 1.0
    """Rounds space out as the rate decays: the interval at rate r is ``interval * (peak / r)**2``
    (QSR, Gu et al. 2023: H proportional to 1/lr^2), at most ``growth`` times ``interval``."""
    last_mean: bool = False
    """The last round lands on the replicas' mean (a hogwild job's final round) instead of the
    rule's ordinary step."""
    delay: int = 0
    """A round's target reaches the replicas this many steps after its snapshot, as the change
    ``target - snapshot`` (a hogwild round overlapped with the workers' next steps); 0: at once."""

    def tag(self) -> str:
        return "".join([f"_olr{self.outer_lr:g}" if self.outer_lr is not None else "",
                        f"_mu{self.outer_momentum:g}" if self.outer_momentum is not None else "",
                        f"_dense{self.dense_steps}" if self.dense_steps else "",
                        f"_moments{self.moments_every}" if self.moments_every else "",
                        f"_growth{self.growth:g}" if self.growth > 1 else "",
                        "_lastmean" if self.last_mean else "", f"_delay{self.delay}" if self.delay else ""])


def replicas_run(mode: str, replicas: int, interval: int, gradients: int, lr: float, seed: int,
                 outer: Outer = Outer(), batch: int = BATCH) -> dict[str, Any]:
    """R replicas of one worker each, each with its own AdamW on fresh gradients of ``batch``
    samples, meeting every ``interval`` steps through hogwild's own sync rule classes (R x 1 with
    the default slowmo, or DiLoCo), in lockstep: the outer rule alone, at ``gradients`` in all;
    ``outer``: the rest of how they meet (designs tried in the model before any became an option)."""
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    from hogwild.bench import sync_round, sync_rule

    x_all, y_all, x_test, y_test = _data()
    models = [_gpt(seed) for _ in range(replicas)]  # one seed: the same initial weights
    opts = [_adamw(m, lr) for m in models]

    def rule_from(flat: torch.Tensor) -> Any:  # the rule as an R-replica job gets it
        return sync_rule(flat, mode, lockstep=replicas, outer_lr=outer.outer_lr, outer_momentum=outer.outer_momentum)

    def mean_of() -> torch.Tensor:
        return torch.stack([parameters_to_vector(m.parameters()).detach() for m in models]).mean(0)

    def land(flat: torch.Tensor) -> None:
        with torch.no_grad():
            for m in models:
                vector_to_parameters(flat.clone(), m.parameters())

    pending: list[tuple[int, torch.Tensor, list[torch.Tensor]]] = []  # (due step, target, snapshots)

    def arrive(now: int) -> None:
        """Rounds whose target is due move each replica by ``target - its snapshot``: the steps it
        made since the snapshot stay."""
        for item in [p for p in pending if p[0] <= now]:
            pending.remove(item)
            with torch.no_grad():
                for m, snap in zip(models, item[2]):
                    vector_to_parameters(parameters_to_vector(m.parameters()) + item[1] - snap, m.parameters())

    rule = rule_from(parameters_to_vector(models[0].parameters()).detach().clone())
    gens = [torch.Generator().manual_seed(seed + 1 + r) for r in range(replicas)]
    steps = gradients // replicas
    warmup = max(1, steps // 6)
    next_round, rounds = interval, 0
    for t in range(steps):
        rate = lr * min(1.0, (t + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * t / steps))
        for m, opt, gen in zip(models, opts, gens):
            idx = torch.randint(len(x_all), (batch,), generator=gen)
            opt.zero_grad(set_to_none=True)
            m(x_all[idx], y_all[idx])[1].backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), CLIP)
            for group in opt.param_groups:
                group["lr"] = rate
            opt.step()
        if t < outer.dense_steps:  # synchronous phase: every step ends on the replicas' mean
            mean = mean_of()
            land(mean)
            if t + 1 == outer.dense_steps:
                rule = rule_from(mean)  # the outer rule goes on from where the synchronous phase left
                next_round = t + 1 + interval
            continue
        last = t + 1 == steps
        arrive(steps if last else t + 1)  # the last round finds none on its way
        if t + 1 < next_round and not last:
            continue
        snaps = [parameters_to_vector(m.parameters()).detach().clone() for m in models]
        target = torch.stack(snaps).mean(0)
        sync_round(target, rule, final=last and outer.last_mean)
        if outer.delay and not last:
            pending.append((t + 1 + outer.delay, target, snaps))
        else:
            land(target)
        rounds += 1
        if outer.moments_every and rounds % outer.moments_every == 0:
            with torch.no_grad():
                for ps in zip(*(m.parameters() for m in models)):
                    for key in ("exp_avg", "exp_avg_sq"):
                        avg = torch.stack([o.state[p][key] for o, p in zip(opts, ps)]).mean(0)
                        for o, p in zip(opts, ps):
                            o.state[p][key].copy_(avg)
        # The next interval, spaced out as the rate decays past its peak (QSR); warm-up counts as the peak.
        relative = rate / lr if t + 1 >= warmup else 1.0
        next_round = t + 1 + round(interval * min(outer.growth, 1.0 / max(relative, 1e-12) ** 2))
    return {"test_loss": _test_loss(models[0], x_test, y_test), "steps": steps, "computed": steps * replicas,
            "applied": steps * replicas, "dropped": 0, "virtual_time": 0.0, "rounds": rounds}


def slow_replicas_run(mode: str, interval: int, budget: float, lr: float, seed: int, slow: float) -> dict[str, Any]:
    """Two replicas under AdamW, replica 0 ``slow`` times slower, for ``budget`` time units (module
    docstring, ``slowrep_*``). The rate follows the clock (warm-up, then a cosine that ends with the
    budget), as a time-budgeted job's schedule does."""
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    x_all, y_all, x_test, y_test = _data()
    step_s = [slow, 1.0]
    warm = budget / 6

    def rate(at: float) -> float:
        return lr * min(1.0, at / warm) * 0.5 * (1 + math.cos(math.pi * min(at, budget) / budget))

    def train(m: torch.nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator, at: float, copies: int = 1) -> None:
        idx = torch.randint(len(x_all), (BATCH * copies,), generator=gen)
        opt.zero_grad(set_to_none=True)
        m(x_all[idx], y_all[idx])[1].backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), CLIP)
        for group in opt.param_groups:
            group["lr"] = rate(at)
        opt.step()

    if mode == "ddp":  # each step at the slow rank's pace, on both ranks' batches
        model, gen = _gpt(seed), torch.Generator().manual_seed(seed + 1)
        opt = _adamw(model, lr)
        steps = int(budget // slow)
        for t in range(steps):
            train(model, opt, gen, (t + 1) * slow, copies=2)
        return {"test_loss": _test_loss(model, x_test, y_test), "steps": steps, "computed": 2 * steps,
                "applied": 2 * steps, "dropped": 0, "virtual_time": steps * slow, "rounds": 0}
    models = [_gpt(seed) for _ in range(2)]
    opts = [_adamw(m, lr) for m in models]
    gens = [torch.Generator().manual_seed(seed + 1 + r) for r in range(2)]
    now, rounds, made = 0.0, 0, [0, 0]
    while now < budget:
        span = min(interval * (slow if mode == "wait" else 1.0), budget - now)
        counts = []
        for r, (m, opt, gen) in enumerate(zip(models, opts, gens)):
            n = interval if mode == "wait" else max(1, round(interval / step_s[r]))
            n = min(n, max(1, int(span // (step_s[r] if mode != "wait" else slow))))
            for j in range(n):
                train(m, opt, gen, now + (j + 1) * span / n)
            counts.append(n)
            made[r] += n
        snaps = torch.stack([parameters_to_vector(m.parameters()).detach() for m in models])
        w = torch.tensor(counts if mode == "scaled" else [1, 1], dtype=snaps.dtype)
        target = (snaps * (w / w.sum())[:, None]).sum(0)
        with torch.no_grad():
            for m in models:
                vector_to_parameters(target.clone(), m.parameters())
        now += span
        rounds += 1
    return {"test_loss": _test_loss(models[0], x_test, y_test), "steps": made[1], "computed": sum(made),
            "applied": sum(made), "dropped": 0, "virtual_time": now, "rounds": rounds, "slow_steps": made[0]}


def main_meet(args: argparse.Namespace) -> None:
    rows = []
    outer = Outer(args.outer_lr, args.outer_momentum, 1 if args.sync_moments else args.moments_every,
                  args.dense_steps, args.growth, args.last_mean, args.delay)
    for workers in args.workers:
        for kind in args.meet:
            for lr in args.lr:
                rounds_of = kind.startswith(("replicas", "slowrep")) and kind != "slowrep_ddp"
                for interval in args.intervals if rounds_of else [0]:
                    if kind.startswith("slowrep"):
                        assert args.until_time is not None, "--meet slowrep_*: --until-time is the budget"
                        r = slow_replicas_run(kind.split("_", 1)[1], interval, args.until_time, lr, args.seed,
                                              args.slow)
                    elif kind.startswith("replicas"):  # "replicas_slowmo": W replicas x 1 worker, rule slowmo
                        r = replicas_run(kind.split("_", 1)[1], workers, interval, args.gradients_per_worker * workers,
                                         lr, args.seed, outer,
                                         args.global_batch // workers if args.global_batch else BATCH)
                    else:
                        r = meet(kind, workers, args.gradients_per_worker * workers, lr, args.seed, bound=args.bound,
                                 jitter=args.jitter, slow=args.slow, until_time=args.until_time,
                                 median_bound=args.median_bound, straggler_bound=args.straggler_bound,
                                 pattern=args.pattern, k=args.k, window=args.window, cap=args.cap)
                    replicas = kind.startswith("replicas")
                    r.update(meet=kind + (f"_every{interval}" if interval else "")
                             + ("_median" if args.median_bound and kind.startswith("bound") else "")
                             + (f"_straggler{args.straggler_bound:g}" if args.straggler_bound is not None
                                and kind.startswith("bound") else "")
                             + (outer.tag() if replicas else ""),
                             workers=workers, lr=lr, bound=args.bound, slow=args.slow, seed=args.seed,
                             global_batch=args.global_batch,
                             pattern=args.pattern)
                    logger.info("%s", json.dumps(r))
                    rows.append(r)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": sys.argv, "runs": rows}, indent=1))
    sys.stdout.write("| workers | meeting | lr | test loss | steps | gradients applied / computed | virtual time |\n"
                     "|---|---|---|---|---|---|---|\n")
    for r in rows:
        sys.stdout.write(f"| {r['workers']} | {r['meet']} | {r['lr']:g} | {r['test_loss']:.4f} | {r['steps']} | "
                         f"{r['applied']} / {r['computed']} | {r['virtual_time']:.0f} |\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600, help="updates per variant")
    ap.add_argument("--lr", type=float, nargs="+", default=[3e-3], help="peak learning rates to try")
    ap.add_argument("--beta1", type=float, nargs="+", default=[0.9], help="AdamW beta1 values to try")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--dc-lambda", type=float, default=32.0, help="two_stale_dc: the correction's weight")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "bench_results" / "adam_staleness.json")
    ap.add_argument("--meet", nargs="+", choices=MEETS, default=None,
                    help="model how W workers' gradients meet before one AdamW step (see the module's text)")
    ap.add_argument("--workers", type=int, nargs="+", default=[2], help="--meet: W")
    ap.add_argument("--gradients-per-worker", type=int, default=600, help="--meet: gradients computed = this x W")
    ap.add_argument("--until-time", type=float, default=None,
                    help="--meet: stop at this virtual time (a wall-clock budget) instead of a gradient count")
    ap.add_argument("--bound", type=float, default=0.25, help="--meet bound_*: the bound on waiting, in time units")
    ap.add_argument("--straggler-bound", type=float, default=None,
                    help="--meet bound_*: a shorter bound for a step whose missing workers were late to the last")
    ap.add_argument("--median-bound", action="store_true",
                    help="--meet bound_*: the bound runs from the median worker's fresh gradient, not the first")
    ap.add_argument("--jitter", type=float, default=0.1, help="--meet: spread of a gradient's compute time")
    ap.add_argument("--slow", type=float, default=1.0, help="--meet: worker 0 takes this many times as long")
    ap.add_argument("--pattern", choices=("none", "stalls", "busy", "shared"), default="none",
                    help="--meet: how the workers' speed changes over time (Pattern)")
    ap.add_argument("--k", type=float, default=3.0, help="--meet bound_adaptive: the MADs above the median lag")
    ap.add_argument("--window", type=int, default=16, help="--meet bound_adaptive: the lags remembered")
    ap.add_argument("--cap", type=float, default=4.0, help="--meet bound_adaptive: the bound's ceiling")
    ap.add_argument("--intervals", type=int, nargs="+", default=[50], help="--meet replicas_*: steps between rounds")
    ap.add_argument("--outer-lr", type=float, default=None, help="--meet replicas_*: sync.outer_lr")
    ap.add_argument("--outer-momentum", type=float, default=None, help="--meet replicas_*: sync.outer_momentum")
    ap.add_argument("--sync-moments", action="store_true",
                    help="--meet replicas_*: rounds also average AdamW's moments")
    ap.add_argument("--dense-steps", type=int, default=0,
                    help="--meet replicas_*: the first steps average the replicas after every step (post-local SGD)")
    ap.add_argument("--moments-every", type=int, default=0,
                    help="--meet replicas_*: every this many rounds also average AdamW's moments (DES-LOC)")
    ap.add_argument("--growth", type=float, default=1.0,
                    help="--meet replicas_*: rounds space out as (peak lr / lr)^2 past the peak, up to x this (QSR)")
    ap.add_argument("--delay", type=int, default=0,
                    help="--meet replicas_*: a round's target reaches the replicas this many steps after its snapshot")
    ap.add_argument("--last-mean", action="store_true",
                    help="--meet replicas_*: the last round lands on the replicas' mean, as a job's final round")
    ap.add_argument("--global-batch", type=int, default=0,
                    help="--meet replicas_*: a batch of this over W a replica (default: 32 a replica, whatever W)")
    args = ap.parse_args()
    if args.global_batch and any(args.global_batch % w for w in args.workers):
        ap.error(f"--global-batch {args.global_batch}: not a multiple of every --workers count")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    if args.meet:
        main_meet(args)
        return
    rows = []
    for lr in args.lr:
        for beta1 in args.beta1:
            for variant in args.variants:
                loss = run(variant, args.steps, lr, beta1, args.seed, args.dc_lambda)
                logger.info("%s lr=%g beta1=%g: test loss %.4f", variant, lr, beta1, loss)
                rows.append({"variant": variant, "lr": lr, "beta1": beta1, "steps": args.steps, "test_loss": loss})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": sys.argv, "runs": rows}, indent=1))
    sys.stdout.write("| variant | lr | beta1 | test loss |\n|---|---|---|---|\n")
    for r in rows:
        sys.stdout.write(f"| {r['variant']} | {r['lr']:g} | {r['beta1']:g} | {r['test_loss']:.4f} |\n")


if __name__ == "__main__":
    main()
