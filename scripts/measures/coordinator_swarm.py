"""The coordinator under a swarm (issue 69, item 3): N synthetic members, no training.

Each member is the real client of elastic mode (``hogwild.elastic.membership.Membership``: its
heartbeat thread, its join, its epoch formation) in a thread of one of ``--procs`` member processes,
and does between rounds what a leader does at the coordinator, at a leader's cadence:

- a round every ``--round-s`` (jittered): ``changed()``, the leader's question before each round
  (leader/elastic.py ``before_round``), and if the group must change, ``advance()`` to the next epoch;
- during the round's collective, ``--collective-s`` long: ``superseded()`` and ``lost_peers()``
  every 0.5 s (elastic/comm.py ``CHECK_EVERY_S``), as a leader does while it waits on its peers;
  a member that finds a peer lost leaves the round and moves to the next epoch, as a leader re-forms;
- churn: every ``--churn-every-s`` one member, at random, dies (its threads stop, nothing said) and
  a new process takes its slot ``--rejoin-after-s`` later, as a restarted machine does.

What it measures, over the window after every member first joined:

- the coordinator's CPU (its process's utime + stime from /proc, in cores);
- each heartbeat's latency (its ``set`` at the coordinator, timed in the heartbeat thread), p50/p99;
- a store call's latency of every other kind, p50/p99, and calls a second per member;
- how long the first epoch took to publish with every member (start to the last member's join),
  and each churn's re-formation: a killed member's death to the first epoch without it, and a
  rejoin's request to the epoch that admits it.

With ``--light-calls-per-s C`` the members are light (:class:`LightMember`): raw store clients that
make only a steady-state member's calls, C a second each (6.2 measured from 100 real members),
a heartbeat among them. Real members' own client code fills this host's 2 cores at a few hundred;
light ones find the coordinator's limit past a thousand.

    python scripts/measures/coordinator_swarm.py --members 30 100 300 --duration 30 --procs 4
    python scripts/measures/coordinator_swarm.py --members 1000 2000 4000 --light-calls-per-s 6.2 --duration 20
    python scripts/measures/coordinator_swarm.py --members 300 --checkout /tmp/before   # an earlier tree's members

The host's own cores run the members as well as the coordinator: the heartbeat latencies are an
upper bound (a member thread waiting for a core counts as latency); the coordinator's CPU is its own.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts.harness
from scripts.harness.common import REPO, cpu_s, free_port, start_coordinator, table_head, write_results  # noqa: E402

logger = logging.getLogger("coordinator_swarm")


def percentile(xs: list[float], q: float) -> Optional[float]:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# ------------------------------------------------------------------------- one member process
class Member:
    """One synthetic member: a slot's Membership and a leader's calls, in a thread."""

    def __init__(self, swarm: "MemberProc", slot: int, incarnation: int) -> None:
        from hogwild.bench import swarm_member

        self.swarm, self.slot, self.incarnation = swarm, slot, incarnation
        a = swarm.args
        self.dead = threading.Event()
        self.m = swarm_member(swarm.endpoint, slot, a.slots, a.peer_timeout_s, a.timeout_s,
                              stopped=lambda: self.dead.is_set() or swarm.done.is_set())
        self.m.tick()  # a leader reports its loop's turns (elastic/liveness.py)

    def kill(self) -> None:
        """Silent from now on, as a killed process: its heartbeat stops at once, its loop at its next turn."""
        self.dead.set()
        self.m.close()

    def _timed(self, what: str, fn: Any) -> Any:
        t0 = time.monotonic()
        try:
            return fn()
        finally:
            self.swarm.record(what, time.monotonic() - t0)

    def run(self) -> None:
        a, rng = self.swarm.args, random.Random(self.slot * 1000 + self.incarnation)
        asked = time.time()
        try:
            ep = self._timed("join", self.m.join)
            self.m.settled(ep)  # healed: as a leader says once its heal is done (leader/elastic.py)
            self.swarm.event("joined", self.slot, ep.number, asked)
            time.sleep(rng.uniform(0, a.round_s))
            while not (self.dead.is_set() or self.swarm.done.is_set()):
                self.m.tick()
                for key in (f"pos/{self.slot}", f"done/{self.slot}"):  # what a leader publishes each round
                    self._timed("publish", lambda: self.m.keys.put(key, "0"))
                if self._timed("changed", self.m.changed) or self._collective(rng):
                    t0 = time.time()
                    ep = self._timed("advance", self.m.advance)
                    self.m.settled(ep)
                    self.swarm.event("advanced", self.slot, ep.number, t0)
                self.dead.wait(a.round_s * rng.uniform(0.8, 1.2))
        except Exception as e:  # noqa: BLE001 - a stop, a drop, a timeout: what ends a leader's wait
            if not (self.dead.is_set() or self.swarm.done.is_set()):
                self.swarm.event(f"stopped: {type(e).__name__}: {e}", self.slot, -1, time.time())
        finally:
            if self.dead.is_set():
                self.m.close()  # its heartbeat stops as a killed process's does

    def _collective(self, rng: random.Random) -> bool:
        """A round's wait on its peers; True if a peer is lost or a newer epoch exists."""
        end = time.monotonic() + self.swarm.args.collective_s * rng.uniform(0.5, 1.5)
        while time.monotonic() < end and not self.dead.is_set():
            self.m.tick()
            if self._timed("superseded", self.m.superseded) or self._timed("lost_peers", self.m.lost_peers):
                return True
            self.dead.wait(0.5)
        return False


class LightMember:
    """A member that only makes a steady-state member's calls at its rate: a heartbeat every
    ``heartbeat_s`` and reads of other members' keys between, on a raw store client (no signing,
    no deadline thread). Thousands fit on this host's 2 cores, where real members stop at a few
    hundred: their own client code, not the coordinator, is what a small host runs out of."""

    def __init__(self, swarm: "MemberProc", slot: int) -> None:
        self.swarm, self.slot, self.dead = swarm, slot, threading.Event()

    def kill(self) -> None:
        self.dead.set()

    def run(self) -> None:
        import torch.distributed as dist

        a, rng = self.swarm.args, random.Random(self.slot)
        store = dist.TCPStore("127.0.0.1", a.port, is_master=False, timeout=timedelta(seconds=a.timeout_s))
        hb_s = a.peer_timeout_s / 5
        gap = 1.0 / max(a.light_calls_per_s - 1.0 / hb_s, 1e-3)  # the reads between heartbeats
        beats, next_beat = 0, time.monotonic() + rng.uniform(0, hb_s)
        while not (self.dead.is_set() or self.swarm.done.is_set()):
            now = time.monotonic()
            if now >= next_beat:
                beats += 1
                t0 = time.monotonic()
                store.set(f"hb/{self.slot}", f"{beats}:{beats}:0:0")
                self.swarm.record("heartbeat", time.monotonic() - t0)
                self.swarm.store_calls += 1
                next_beat += hb_s
            t0 = time.monotonic()
            store.check([f"hb/{rng.randrange(a.slots)}"])  # a read: one round trip, one lookup
            self.swarm.record("read", time.monotonic() - t0)
            self.swarm.store_calls += 1
            self.dead.wait(rng.expovariate(1.0 / gap))


class MemberProc:
    """The members of one process: slots ``index::procs``, reports to stdout as JSON lines."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.endpoint = args, f"127.0.0.1:{args.port}"
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.calls: dict[str, list[float]] = {}
        self.events: list[tuple[str, int, int, float, float]] = []
        self.members: dict[int, Member] = {}
        self.store_calls = 0
        self.by_key: dict[str, int] = {}  # store calls by operation and key family

    def record(self, what: str, seconds: float) -> None:
        with self.lock:
            self.calls.setdefault(what, []).append(seconds)

    def event(self, what: str, slot: int, epoch: int, since: float) -> None:
        with self.lock:
            self.events.append((what, slot, epoch, since, time.time()))

    def start(self, slot: int, incarnation: int) -> None:
        member: Any = LightMember(self, slot) if self.args.light_calls_per_s else Member(self, slot, incarnation)
        self.members[slot] = member
        threading.Thread(target=member.run, daemon=True, name=f"member-{slot}").start()

    def serve(self) -> None:
        from hogwild.bench import watch_members

        def on_call(op: str, key: str, seconds: float) -> None:
            self.store_calls += 1  # racy across threads: a count, off by a few at worst
            what = f"{op} {key.split('/')[0]}"
            self.by_key[what] = self.by_key.get(what, 0) + 1
            if what == "set hb":
                self.record("heartbeat", seconds)
        watch_members(on_call)
        a = self.args
        for slot in range(a.index, a.slots, a.procs):
            self.start(slot, 0)
            if a.light_calls_per_s:
                self.event("joined", slot, 0, time.time())
        for line in sys.stdin:  # the driver's orders: "kill SLOT", "start SLOT N", "report", "stop"
            cmd = line.split()
            if cmd[0] == "kill":
                self.members[int(cmd[1])].kill()
                self.event("killed", int(cmd[1]), -1, time.time())
            elif cmd[0] == "start":
                self.start(int(cmd[1]), int(cmd[2]))
                if a.light_calls_per_s:
                    self.event("joined", int(cmd[1]), 0, time.time())
            elif cmd[0] == "report":
                with self.lock:
                    out = {"calls": self.calls, "events": self.events, "store_calls": self.store_calls,
                           "by_key": self.by_key}
                    self.calls, self.events, self.store_calls, self.by_key = {}, [], 0, {}
                print(json.dumps(out), flush=True)
            elif cmd[0] == "stop":
                break
        self.done.set()
        os._exit(0)  # member threads may sit in store calls (hogwild/native.py: left_running)


# ------------------------------------------------------------------------------- the driver
def swarm(n: int, args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(args.checkout), "OMP_NUM_THREADS": "1"}
    coord = start_coordinator(port, env)
    procs_n = min(args.procs, n)
    procs: list[subprocess.Popen[str]] = []
    t_start = time.time()
    try:
        for i in range(procs_n):
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--member-proc", "--index", str(i), "--procs", str(procs_n), "--slots",
                 str(n), "--port", str(port), "--round-s", str(args.round_s), "--collective-s",
                 str(args.collective_s), "--peer-timeout-s", str(args.peer_timeout_s), "--timeout-s",
                 str(args.timeout_s), "--light-calls-per-s", str(args.light_calls_per_s)],
                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        calls: dict[str, list[float]] = {}
        events: list[list[Any]] = []
        store_calls = [0]
        by_key: dict[str, int] = {}

        def collect() -> None:
            for p in procs:
                assert p.stdin is not None and p.stdout is not None
                p.stdin.write("report\n")
                p.stdin.flush()
            for p in procs:
                assert p.stdout is not None
                got = json.loads(p.stdout.readline())
                for k, v in got["calls"].items():
                    calls.setdefault(k, []).extend(v)
                events.extend(got["events"])
                store_calls[0] += got["store_calls"]
                for k, v in got["by_key"].items():
                    by_key[k] = by_key.get(k, 0) + v

        # Until every member has joined (or the limit): the first epoch with all of them.
        joined: set[int] = set()
        deadline = time.monotonic() + args.timeout_s
        while len(joined) < n and time.monotonic() < deadline:
            time.sleep(2.0)
            collect()
            joined |= {e[1] for e in events if e[0] == "joined"}
            logger.info("%d members: %d joined after %.0fs", n, len(joined), time.time() - t_start)
        all_joined_s = time.time() - t_start if len(joined) == n else None
        # Two rounds more: each member's first look at the join requests reads every slot's key,
        # once (elastic/membership.py, wanting), a job's start, not its steady state.
        time.sleep(2 * args.round_s)
        collect()
        calls.clear()
        store_calls[0] = 0
        by_key.clear()
        # The window: churn at its rate, the coordinator's CPU over it.
        rng = random.Random(n)
        c0, w0 = cpu_s(coord.pid), time.monotonic()
        incarnation: dict[int, int] = {}
        pending: list[tuple[float, int]] = []
        next_kill = w0 + args.churn_every_s
        while time.monotonic() - w0 < args.duration:
            now = time.monotonic()
            if args.churn_every_s > 0 and now >= next_kill:
                slot = rng.randrange(n)
                if all(s != slot for _, s in pending):
                    procs[slot % procs_n].stdin.write(f"kill {slot}\n")  # type: ignore[union-attr]
                    pending.append((now + args.rejoin_after_s, slot))
                next_kill = now + args.churn_every_s
            for due, slot in [p for p in pending if p[0] <= now]:
                incarnation[slot] = incarnation.get(slot, 0) + 1
                procs[slot % procs_n].stdin.write(f"start {slot} {incarnation[slot]}\n")  # type: ignore[union-attr]
                pending.remove((due, slot))
            for p in procs:
                p.stdin.flush()  # type: ignore[union-attr]
            time.sleep(0.2)
        window_s = time.monotonic() - w0
        coord_cores = (cpu_s(coord.pid) - c0) / window_s
        collect()
    finally:
        for p in procs:
            try:
                p.stdin.write("stop\n")  # type: ignore[union-attr]
                p.stdin.flush()  # type: ignore[union-attr]
            except OSError:
                pass
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        coord.terminate()
        coord.wait(20)
    stopped = [e for e in events if e[0].startswith("stopped")]
    rejoins = [e[4] - e[3] for e in events if e[0] == "joined" and e[3] > t_start + (all_joined_s or 0)]
    out = {"members": n, "window_s": round(window_s, 1), "first_epoch_all_s": all_joined_s,
           "coordinator_cores": round(coord_cores, 3),
           "store_calls_per_s": round(store_calls[0] / window_s), "heartbeat_s": args.peer_timeout_s / 5,
           "store_calls_by_key_per_s": {k: round(v / window_s, 1)
                                        for k, v in sorted(by_key.items(), key=lambda x: -x[1])},
           "rejoin_s": [round(x, 1) for x in sorted(rejoins)], "stopped": [e[0] for e in stopped][:5],
           "stopped_count": len(stopped)}
    for what, xs in sorted(calls.items()):
        out[what] = {"count": len(xs), "p50_ms": round(1000 * (percentile(xs, 0.5) or 0), 2),
                     "p99_ms": round(1000 * (percentile(xs, 0.99) or 0), 2)}
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = table_head("members", "first epoch with all (s)", "coordinator (cores)", "heartbeat p50 / p99 (ms)",
                       "lost_peers p99 (ms)", "changed p99 (ms)", "store calls/s", "rejoin (s, median)", "stopped")
    for r in rows:
        hb, lp, ch = r.get("heartbeat", {}), r.get("lost_peers", {}), r.get("changed", {})
        rj = statistics.median(r["rejoin_s"]) if r["rejoin_s"] else None
        lines.append(f"| {r['members']:,} | {r['first_epoch_all_s'] and round(r['first_epoch_all_s'], 1)} | "
                     f"{r['coordinator_cores']:.2f} | {hb.get('p50_ms')} / {hb.get('p99_ms')} | {lp.get('p99_ms')} | "
                     f"{ch.get('p99_ms')} | {r['store_calls_per_s']:,} | {rj} | {r['stopped_count']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--members", type=int, nargs="+", default=[100])
    p.add_argument("--procs", type=int, default=8, help="member processes (members are threads in them)")
    p.add_argument("--duration", type=float, default=60.0, help="the measured window, after all joined")
    p.add_argument("--round-s", type=float, default=5.0, help="a round's period at each member")
    p.add_argument("--collective-s", type=float, default=1.0, help="how long a round's collective waits")
    p.add_argument("--peer-timeout-s", type=float, default=10.0, help="elastic.peer_timeout_s (its default)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="sync.timeout_s: the limit on joining")
    p.add_argument("--churn-every-s", type=float, default=10.0, help="one member killed every so often (0: none)")
    p.add_argument("--rejoin-after-s", type=float, default=5.0, help="its slot restarted after")
    p.add_argument("--light-calls-per-s", type=float, default=0.0,
                   help="light members (LightMember) making this many store calls a second each, instead of real ones")
    p.add_argument("--checkout", type=Path, default=REPO,
                   help="the source tree whose coordinator and members run (git worktree add DIR REV: an earlier one)")
    p.add_argument("--out", type=Path, default=REPO / "bench_results" / "swarm")
    p.add_argument("--name", default="swarm")
    # a member process (started by the driver)
    p.add_argument("--member-proc", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--slots", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.member_proc:
        sys.path.insert(0, os.environ["PYTHONPATH"])  # the checkout's hogwild before this tree's
        logging.basicConfig(level=logging.WARNING)
        MemberProc(args).serve()
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    bad = [n for n in args.members if n < 2]
    if bad or args.procs < 1 or args.duration <= 0:
        p.error(f"--members must each be at least 2, --procs at least 1, --duration positive (got {bad or args})")
    rows = []
    for n in args.members:
        row = swarm(n, args)
        logger.info("%s", json.dumps({k: v for k, v in row.items() if k != "rejoin_s"}))
        rows.append(row)
        write_results(args.out, args.name, {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows},
                      table(rows))
    print(table(rows))


if __name__ == "__main__":
    main()
