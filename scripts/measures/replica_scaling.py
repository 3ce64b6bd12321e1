"""What grows with the replica count R on one host: a round's time and its time in collectives,
a leader's CPU per round, start-up, an elastic epoch's formation and the coordinator's load, for
R = 2 to 32, under torchrun and in elastic mode (docs/scale.md, "Many replicas on one host").

    python scripts/measures/replica_scaling.py --replicas 2 4 8 16 32 --out bench_results/scaling
    python scripts/measures/replica_scaling.py --replicas 32 --launch torchrun --repeats 5   # R = 32, 5 runs
    python scripts/measures/replica_scaling.py --replicas 2 4 8 --launch shaped --rate 10mbit   # root: shaped links
    python scripts/measures/replica_scaling.py --replicas 2 4 8 --launch shaped --rate 1gbit --delay-ms 5   # + latency
    python scripts/measures/replica_scaling.py --replicas 2 4 8 --launch shaped --delay-ms 10 --congestion cubic
    python scripts/measures/replica_scaling.py --replicas 2 4 8 --launch shaped --delay-ms 10 --congestion cubic \
        --share pin   # the machines share the cores by the scheduler, not by CFS quotas
    python scripts/measures/replica_scaling.py --replicas 16 32 --launch torchrun --interval auto \
        --override optim.name=adamw --checkout /tmp/before   # the wire's ladder, against an earlier tree's

Every run is the digits MLP, one worker a replica, ``--steps`` steps each and a round every
``--interval`` (so every R has the same rounds), no evaluation or checkpoint on the way. On a host
of C cores, R replicas share them: past R = C a round waits for replicas the scheduler has not run
yet, so a round's time here is an upper bound on a real machine's, and the time inside
collectives (``sync_link_s``) is the figure that follows the network's share. Each run says
whether its replicas ended on one model (``replica_final_state``: one digest of every model).

Elastic runs start a coordinator (``hogwild.cli.coordinator``) and R members, each told the R
members share the host (``LOCAL_WORLD_SIZE``, as torchrun says it). Formation is the time from the
last member's setup (its "replica i/R" line) to the first epoch's group at slot 0, its workers'
warm-up included; the coordinator's load is its CPU seconds over the run's. ``--launch shaped`` is
torchrun with each replica a machine: a network namespace with its egress shaped to ``--rate``, an
equal share of the cores (a CFS quota each; ``--share pin``: machine i on core i mod the cores, no
quota), and ``--delay-ms`` of one-way latency between machines (netem where the
kernel has it; this host's kernel has none, so there every packet goes through a userspace router
that holds it that long, scripts/harness/delay_router.py, which carries some hundreds of Mbit/s at
most); rounds at two rates tell a round's bandwidth term (bytes over the rate) from the rest, and
rounds at two delays its latency term (hops times the delay) from CPU and waiting.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts.harness, examples
from scripts.harness.common import (clean_env, cpu_s, free_port, metrics, start_coordinator, table_head,  # noqa: E402
                                    train_cmd, write_results)

logger = logging.getLogger("scaling")
REPO = Path(__file__).resolve().parents[2]
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


OVERRIDES: list[str] = []
"""``--override``: more of the job's settings, after the run's own (an optimizer, a wire)."""
CHECKOUT = REPO
"""``--checkout``: the tree whose hogwild the runs import (an earlier commit's, to race against)."""


def _args(run_dir: Path, steps: int, interval: str) -> list[str]:
    return ["workers=1", f"train.max_steps={steps}", f"sync.interval={interval}", "eval.every_s=100000",
            "checkpoint.every_s=100000", f"run_dir={run_dir}", "resume=false", *OVERRIDES]


def _when(log: str, pattern: str) -> Optional[float]:
    """The time (epoch seconds) of the first line of ``log`` that holds ``pattern``."""
    for line in log.splitlines():
        if pattern in line:
            m = STAMP.match(line)
            if m:
                return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def _figures(m: dict[str, Any], wall_s: float, replicas: int) -> dict[str, Any]:
    syncs = max(int(m.get("syncs") or 0), 1)
    models = {s["model"] for s in m.get("replica_final_state") or []}
    return {"wall_s": wall_s, "startup_s": m["startup_s"], "train_s": m["train_s"], "syncs": m["syncs"],
            "round_s": m["mean_sync_s"], "in_collectives_s": m["sync_link_s"] / syncs,
            "leader_cpu_ms_per_round": 1000 * m["sync_cpu_s"] / syncs,
            "bytes_sent_per_round": m["sync_bytes_sent"] / syncs, "test_accuracy": m["test_accuracy"],
            "wire": m.get("sync_wire"), "steps_per_sync": m.get("steps_per_sync"), "lag_wait_s": m.get("lag_wait_s"),
            "time_s": m.get("time_s"),
            "one_model": len(models) == 1 and len(m.get("replica_final_state") or []) == replicas}


PIN = False
"""--pin: with no more replicas than cores, each replica (its leader and its worker) on a core of its
own, as R machines of one core would be; else the scheduler places them."""


def _pinned(replicas: int) -> bool:
    return PIN and replicas <= (os.cpu_count() or 1)


def torchrun(replicas: int, steps: int, interval: str, work: Path, timeout_s: float) -> dict[str, Any]:
    run_dir = work / f"torchrun{replicas}"
    cmd = train_cmd(_args(run_dir, steps, interval), replicas)
    if _pinned(replicas):  # each rank's process tree on the core of its local rank
        launcher, script = cmd[:cmd.index("-m", 3)], cmd[cmd.index("-m", 3):]
        cmd = [*launcher, "--no-python", "sh", "-c", 'exec taskset -c "$LOCAL_RANK" "$@"', "sh", sys.executable,
               *script]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=CHECKOUT, capture_output=True,
                          text=True, timeout=timeout_s, env=clean_env(OMP_NUM_THREADS="1"))
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"}
    return _figures(metrics(run_dir), wall, replicas)


def shaped(replicas: int, steps: int, interval: str, work: Path, timeout_s: float, rate: str = "100mbit",
           delay_ms: float = 0.0) -> dict[str, Any]:
    """torchrun with each replica a machine of its own: a network namespace whose egress is
    shaped to ``--rate``, ``delay_ms`` one way between machines (scripts/harness/links.py), an
    equal share of the host's cores."""
    from scripts.harness import links

    shaping = links.setup(replicas, rate, delay_ms)
    shares = links.cpu_shares(replicas)
    run_dir = work / f"shaped{replicas}"
    cmds = links.torchrun_on_machines(replicas, _args(run_dir, steps, interval))
    t0 = time.perf_counter()
    try:
        links.on_machines(cmds, timeout_s)
    except RuntimeError as e:
        return {"error": str(e).strip().splitlines()[-1:], "delay_ms": delay_ms, "shaping": shaping,
                "cpu_share": shares}
    finally:
        links.teardown(replicas)
        links.drop_cpu_shares(replicas)
    return {**_figures(metrics(run_dir), time.perf_counter() - t0, replicas), "delay_ms": delay_ms,
            "shaping": shaping, "cpu_share": shares}




def elastic(replicas: int, steps: int, interval: str, work: Path, timeout_s: float,
            peer_timeout_s: float = 10.0) -> dict[str, Any]:
    run_dir, port = work / f"elastic{replicas}", free_port()
    work.mkdir(parents=True, exist_ok=True)
    env = clean_env(OMP_NUM_THREADS="1", LOCAL_WORLD_SIZE=str(replicas))
    # Its load counts from when it listens: the CPU of its own import of torch (1-2 s on this host)
    # was counted before 2026-11-30, and made most of the 0.06 cores it showed at R = 2.
    coord = start_coordinator(port, env, timeout_s=timeout_s)
    logs = [work / f"elastic{replicas}_slot{s}.log" for s in range(replicas)]
    members: list[subprocess.Popen[bytes]] = []
    # Each member in a session of its own, as torchrun starts each rank: where the kernel groups the
    # scheduler's shares by session (sched_autogroup), R members in one session share one group, and
    # on this 2-core host R = 16 members of one session trained in 2.5 s what 16 sessions, Popen's or
    # torchrun's, trained in 1.1-1.4 s (sync.max_lag=1000, 2 runs each; docs/scale.md).
    try:
        cpu0, t0 = cpu_s(coord.pid), time.perf_counter()
        pin = (lambda s: ["taskset", "-c", str(s)]) if _pinned(replicas) else (lambda s: [])
        for s, log in enumerate(logs):
            members.append(subprocess.Popen(
                [*pin(s), sys.executable, "-m", "hogwild.cli.train", *_args(run_dir, steps, interval),
                 f"elastic.coordinator=127.0.0.1:{port}", f"elastic.replicas={replicas}", f"elastic.slot={s}",
                 f"elastic.peer_timeout_s={peer_timeout_s:g}"], cwd=CHECKOUT, env=env, stdout=log.open("wb"),
                stderr=subprocess.STDOUT, start_new_session=True))
        codes = [p.wait(timeout=timeout_s) for p in members]
        wall, coord_cpu = time.perf_counter() - t0, cpu_s(coord.pid) - cpu0
    finally:
        for p in [*members, coord]:
            if p.poll() is None:
                p.kill()
                p.wait()
    texts = [log.read_text(errors="replace") for log in logs]
    if any(codes):
        return {"error": f"exit codes {codes}: {texts[codes.index(next(c for c in codes if c))][-300:]}"}
    ready = [_when(t, f"replica {s}/{replicas}:") for s, t in enumerate(texts)]
    formed = min((t for t in (_when(x, "formed epoch 1:") for x in texts) if t is not None), default=None)
    out = _figures(metrics(run_dir), wall, replicas)
    out.update(formation_s=(formed - max(r for r in ready if r is not None)) if formed and any(ready) else None,
               coordinator_cores=coord_cpu / wall)
    return out


COLUMNS = ("launch", "R", "wall s", "start-up s", "formation s", "round s", "in collectives s",
           "leader CPU ms / round", "KB sent / round", "coordinator cores", "one model", "accuracy")


def _row(launch: str, r: int, rs: list[dict[str, Any]]) -> str:
    ok = [x for x in rs if "error" not in x]
    if not ok:
        return f"| {launch} | {r} | failed: {rs[0]['error']} |"

    def med(key: str, fmt: str, scale: float = 1.0) -> str:
        vals = [x[key] for x in ok if x.get(key) is not None]
        return format(statistics.median(vals) * scale, fmt) if vals else "–"
    agree = f"{sum(x['one_model'] for x in ok)} of {len(rs)}"
    return (f"| {launch} | {r} | {med('wall_s', '.1f')} | {med('startup_s', '.1f')} | {med('formation_s', '.2f')} | "
            f"{med('round_s', '.3f')} | {med('in_collectives_s', '.3f')} | {med('leader_cpu_ms_per_round', '.1f')} | "
            f"{med('bytes_sent_per_round', '.1f', 1 / 1024)} | {med('coordinator_cores', '.3f')} | {agree} | "
            f"{med('test_accuracy', '.3f')} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    ap.add_argument("--launch", nargs="+", default=["torchrun", "elastic"], choices=["torchrun", "elastic", "shaped"],
                    help="shaped: torchrun with each replica in a network namespace of its own, its egress "
                         "at --rate (root, iproute2)")
    ap.add_argument("--rate", default="100mbit", help="tc's rate of each machine's egress (--launch shaped)")
    ap.add_argument("--delay-ms", type=float, default=0.0,
                    help="one-way latency between machines (--launch shaped): netem, else a userspace router")
    ap.add_argument("--congestion", default=None, metavar="NAME",
                    help="every machine's TCP congestion control, e.g. cubic (--launch shaped; default: the host's, "
                         "which its results name)")
    ap.add_argument("--share", choices=["quota", "pin"], default="quota",
                    help="--launch shaped with more machines than cores: an equal CFS quota each (default), or "
                         "machine i on core i mod the cores, no quota (scripts/harness/links.py: SHARE)")
    ap.add_argument("--pin", action="store_true",
                    help="with R at most the cores: each replica on a core of its own (torchrun and elastic)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--steps", type=int, default=200, help="steps of each replica")
    ap.add_argument("--interval", default="10", help="sync.interval (steps of a replica, or auto: paced)")
    ap.add_argument("--override", nargs="*", default=[], metavar="KEY=VALUE",
                    help="more settings of every run (optim.name=adamw: the paced interval and its wire's ladder)")
    ap.add_argument("--checkout", type=Path, default=None,
                    help="run the hogwild of this tree (an earlier commit's: git worktree add DIR COMMIT)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one run may take")
    ap.add_argument("--peer-timeout", type=float, default=10.0, help="elastic.peer_timeout_s (elastic runs)")
    ap.add_argument("--out", type=Path, default=Path("bench_results/scaling"))
    args = ap.parse_args()
    fixed = args.interval.isdigit()
    if args.delay_ms < 0:
        ap.error("--delay-ms at least 0")
    if min(args.replicas) < 2 or args.repeats < 1 or (fixed and not 1 <= int(args.interval) <= args.steps) or (
            not fixed and args.interval != "auto"):
        ap.error("--replicas at least 2, --repeats at least 1, --interval auto or at least 1 and at most --steps")
    if args.checkout is not None and not (args.checkout / "hogwild" / "cli" / "train.py").is_file():
        ap.error(f"--checkout {args.checkout}: no hogwild/cli/train.py there")
    if args.congestion is not None and "shaped" not in args.launch:
        ap.error("--congestion: shaped machines only (--launch shaped)")
    if args.checkout is not None and "shaped" in args.launch:
        ap.error("--checkout: torchrun and elastic runs only (shaped machines run this tree)")
    global CHECKOUT, PIN
    PIN = args.pin
    OVERRIDES.extend(args.override)
    CHECKOUT = (args.checkout or REPO).resolve()
    logging.basicConfig(level=logging.INFO, format="[scaling] %(asctime)s %(message)s", datefmt="%H:%M:%S")
    if "shaped" in args.launch:
        from scripts.harness import links

        why = links.available()
        if why:
            ap.error(f"--launch shaped: {why}")
        problem = links.congestion_problem(args.congestion) if args.congestion is not None else None
        if problem:
            ap.error(f"--congestion {args.congestion}: {problem}")
        links.CONGESTION, links.SHARE = args.congestion, args.share
    runners = {"torchrun": torchrun, "elastic": partial(elastic, peer_timeout_s=args.peer_timeout),
               "shaped": partial(shaped, rate=args.rate, delay_ms=args.delay_ms)}
    results: dict[str, dict[int, list[dict[str, Any]]]] = {k: {r: [] for r in args.replicas} for k in args.launch}
    with tempfile.TemporaryDirectory(prefix="hogwild-scaling-") as tmp:
        for i in range(args.repeats):  # repeats interleaved: a busy spell slows every R alike
            for launch in args.launch:
                for r in args.replicas:
                    got = runners[launch](r, args.steps, args.interval, Path(tmp) / f"{i}", args.timeout)
                    results[launch][r].append(got)
                    logger.info("%s R=%d run %d/%d: %s", launch, r, i + 1, args.repeats,
                                got.get("error") or f"{got['wall_s']:.1f}s, round {got['round_s']:.3f}s, "
                                f"{got['bytes_sent_per_round'] / 1024:.1f} KB on {got['wire']}, one model "
                                f"{got['one_model']}")
    lines = [f"Replicas on this host ({args.steps} steps each, a round every {args.interval}, digits MLP, 1 worker "
             f"a replica, elastic.peer_timeout_s={args.peer_timeout:g}, shaped links at {args.rate}, "
             f"{args.delay_ms:g} ms one way; medians of {args.repeats} run(s))", "",
             *table_head(*COLUMNS)]
    lines += [_row(launch, r, results[launch][r]) for launch in args.launch for r in args.replicas]
    write_results(args.out, "scaling", {"args": {k: str(v) for k, v in vars(args).items()}, "results": results},
                  "\n".join(lines) + "\n")
    if any("error" in x or not x["one_model"] for per in results.values() for rs in per.values() for x in rs):
        sys.exit(1)


if __name__ == "__main__":
    main()
