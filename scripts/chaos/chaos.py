"""A seeded chaos campaign against elastic mode: random faults across long elastic runs on this
host, and the job's invariants checked after every run.

    python scripts/chaos/chaos.py --faults 500 --seed 1 --out bench_results/chaos   # benchmarks/faults.md §10
    python scripts/chaos/chaos.py --faults 8 --per-run 4 --out /tmp/chaos            # a quick look
    python scripts/chaos/chaos.py --faults 500 --seed 1 --first-run 17                # go on after run 16
    python scripts/chaos/chaos.py --slots 16 --kinds kill --distinct-slots --faults 20 --per-run 4 \
        --peer-timeout 10 --out bench_results/chaos16       # R = 16, a quarter of them killed each run (docs/scale.md)

Each run: a coordinator process and ``--slots`` replicas x 1 worker (3; mlp on digits, every step
slowed 20 ms so training outlasts the faults, ``elastic.peer_timeout_s=2``), then ``--per-run``
faults drawn from KINDS (or only ``--kinds``), one after another; ``--distinct-slots`` draws each
run's faults on slots not hit yet in it. Before the next fault the job must be whole again: every
slot a member of the newest epoch, no join pending, every slot training. That time is the
fault's recovery. Once the faults are over the job runs to its end at full speed and is checked:

- every last process exits 0, and every duplicate slot was refused (exit 2);
- at most one writer per epoch (from every process's log);
- checkpoints in write order: their sequence and rounds never go backwards, nor a slot's data
  position or the job's steps, beyond what a killed slot redoes (its steps after its last round);
- after every replica was killed, each restored a checkpoint at least as new as ``last.pt``;
- every shard read to its end, the replicas' final models, sync-rule state and rounds identical;
- steps counted: ``metrics.json``'s steps against the sum of the slots' data positions;
- no wait past BOUND_S (a recovery, or the end of the job).

Results: ``<out>/chaos.jsonl`` (a line per fault and per run, written as they happen),
``<out>/chaos.json`` and ``<out>/chaos.md`` (the table).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts.harness, examples
import numpy as np  # noqa: E402
from scripts.harness.common import clean_env, free_port, start_coordinator, write_results  # noqa: E402

from hogwild.bench import Coordinator, checkpoints, last_checkpoint, read_board  # noqa: E402

logger = logging.getLogger("chaos")
SLOTS, PEER_S, STEP_MS, INTERVAL = 3, 2.0, 20, 20  # main() sets SLOTS and PEER_S from --slots, --peer-timeout
REDO = 2 * INTERVAL  # sync.interval + sync.max_lag (its default, one interval): a slot's steps past its last round
BOUND_S = 120.0  # the longest a recovery, or the end of a run, may take on this host
END_BOUND_S = 300.0
KINDS = {  # kind: weight
    "kill": 5, "stop_short": 3, "stop_long": 3, "coordinator_killed": 2, "coordinator_stopped": 2,
    "joiner_killed_mid_heal": 2, "duplicate_slot": 2, "all_killed": 1,
}


class Broken(Exception):
    """An invariant does not hold (the run goes on to its checks where it can)."""


@dataclass
class Fault:
    run: int
    index: int
    kind: str
    slot: Optional[int]
    recovery_s: float = float("nan")
    steps_lost: Optional[float] = None
    broken: list[str] = field(default_factory=list)


class Run:
    def __init__(self, root: Path, index: int, seed: int, faults: int) -> None:
        self.index, self.rng = index, random.Random(f"{seed}-{index}")
        self.dir = root / f"run{index:03d}"
        shutil.rmtree(self.dir, ignore_errors=True)  # a run cut off earlier: its run_dir would be resumed
        self.dir.mkdir(parents=True)
        self.run_dir, self.slow = self.dir / "run", self.dir / "slow"
        self.slow.touch()
        self.port = free_port()
        self.coordinator: Optional[subprocess.Popen[bytes]] = None
        self.start_coordinator()
        # Training outlasts the faults (about 10 s each on a loaded host); the rest runs at full speed.
        # A slot's shard is 1 / SLOTS of the data: more slots, more epochs for as many steps.
        self.epochs = max(100, faults * 40) * max(1, SLOTS // 3)
        self.args = [f"elastic.coordinator=127.0.0.1:{self.port}", f"elastic.replicas={SLOTS}", "workers=1",
                     f"run_dir={self.run_dir}", f"elastic.peer_timeout_s={PEER_S}", f"sync.interval={INTERVAL}",
                     "sync.timeout_s=60", f"train.epochs={self.epochs}", "checkpoint.every_s=1",
                     "checkpoint.keep=100000", "eval.every_s=60", "train.log_every_s=5"]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.logs: dict[int, list[Path]] = {s: [] for s in range(SLOTS)}
        self.duplicates: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.resumes: list[tuple[int, list[str]]] = []  # (last.pt's sequence at the kill, paths restored)

    # ------------------------------------------------------------ processes
    def start_coordinator(self) -> None:
        self.view = Coordinator(self.port)  # a client of the driver's own, to read epochs
        log = (self.dir / "coordinator.log").open("ab")
        try:
            self.coordinator = start_coordinator(self.port, clean_env(OMP_NUM_THREADS="1"), log)
        except RuntimeError as e:
            raise Broken(str(e)) from None

    def start(self, slot: int) -> subprocess.Popen[bytes]:
        log = self.dir / f"slot{slot}_{len(self.logs[slot])}.log"
        self.logs[slot].append(log)
        self.procs[slot] = self._launch(slot, log)
        return self.procs[slot]

    def _launch(self, slot: int, log: Path) -> subprocess.Popen[bytes]:
        env = clean_env(OMP_NUM_THREADS="1", HOGWILD_SLOW_WHILE=str(self.slow),
                   HOGWILD_FAULT=",".join(f"slow:{g}:{STEP_MS}" for g in range(SLOTS)), LOCAL_WORLD_SIZE=str(SLOTS))
        return subprocess.Popen([sys.executable, "-m", "hogwild.cli.train", f"elastic.slot={slot}", *self.args],
                                cwd=self.dir, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)

    def kill(self, slot: int) -> None:
        self.procs[slot].send_signal(signal.SIGKILL)
        self.procs[slot].wait(30)

    def close(self) -> None:
        for p in [*self.procs.values(), *(d for d, _ in self.duplicates), self.coordinator]:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait(30)

    # ---------------------------------------------------------------- views
    def pos(self, slot: int) -> float:
        """The slot's data position (steps through its shard), from its progress board."""
        board = read_board(self.run_dir, slot)
        return board.pos if board is not None else 0.0

    def log(self, slot: int) -> str:
        return self.logs[slot][-1].read_text(errors="replace") if self.logs[slot] else ""

    def quota(self) -> Optional[float]:
        found = re.search(r"(\d+) steps each", self.log(0))
        return float(found.group(1)) if found else None

    def near_end(self) -> bool:
        quota = self.quota()
        return quota is not None and any(self.pos(s) > 0.8 * quota for s in range(SLOTS))

    def settle(self, since: float, what: str) -> float:
        """Until the job is whole and every slot trains again: seconds since ``since``."""
        def whole() -> bool:
            if any(p.poll() is not None for p in self.procs.values()):
                raise Broken(f"a replica exited during recovery from {what}: {self._exits()}")
            return self.view.whole(SLOTS)  # every slot a member of the newest epoch, no join pending
        _until(whole, BOUND_S, what)
        at = {s: self.pos(s) for s in range(SLOTS)}
        _until(lambda: all(self.pos(s) > at[s] for s in range(SLOTS)), BOUND_S, f"training after {what}")
        return time.monotonic() - since

    def _exits(self) -> dict[int, Optional[int]]:
        return {s: p.poll() for s, p in self.procs.items()}

    def gap(self) -> None:
        """A random stretch of training between faults (10 to 80 steps of one slot)."""
        slot = self.rng.randrange(SLOTS)
        target = self.pos(slot) + self.rng.randint(10, 80)
        _until(lambda: self.pos(slot) >= target or self.near_end(), BOUND_S, "training between faults")

    def last_sequence(self) -> int:
        last = last_checkpoint(self.run_dir)
        return last.sequence if last is not None else -1


# ------------------------------------------------------------------- faults
def kill(run: Run, f: Fault) -> None:
    assert f.slot is not None
    before = run.pos(f.slot)
    run.kill(f.slot)
    t0 = time.monotonic()
    run.start(f.slot)
    _until(lambda: "healed from slot" in run.log(f.slot), BOUND_S, "the heal of a killed replica")
    f.steps_lost = max(0.0, before - run.pos(f.slot))  # made after its last round: redone
    f.recovery_s = run.settle(t0, "a kill")


def stop(run: Run, f: Fault, seconds: float) -> None:
    assert f.slot is not None
    run.procs[f.slot].send_signal(signal.SIGSTOP)
    time.sleep(seconds)
    run.procs[f.slot].send_signal(signal.SIGCONT)
    f.recovery_s = run.settle(time.monotonic(), f.kind)


def coordinator_killed(run: Run, f: Fault) -> None:
    assert run.coordinator is not None
    run.coordinator.kill()
    run.coordinator.wait(30)
    time.sleep(run.rng.uniform(0.5, 3.0))
    t0 = time.monotonic()
    run.start_coordinator()
    f.recovery_s = run.settle(t0, "a coordinator restart")


def coordinator_stopped(run: Run, f: Fault) -> None:
    assert run.coordinator is not None
    run.coordinator.send_signal(signal.SIGSTOP)
    time.sleep(run.rng.uniform(1.0, 5.0))
    run.coordinator.send_signal(signal.SIGCONT)
    f.recovery_s = run.settle(time.monotonic(), "a stopped coordinator")


def joiner_killed_mid_heal(run: Run, f: Fault) -> None:
    assert f.slot is not None
    before = run.pos(f.slot)
    run.kill(f.slot)
    run.start(f.slot)
    # Killed once it has asked to join (its log shows its start), at a random point of its heal.
    _until(lambda: "workers x" in run.log(f.slot), BOUND_S, "a restarted replica's start")
    time.sleep(run.rng.uniform(0.0, 2.0))
    run.kill(f.slot)
    t0 = time.monotonic()
    run.start(f.slot)
    _until(lambda: "healed from slot" in run.log(f.slot), BOUND_S, "the heal after a joiner was killed")
    f.steps_lost = max(0.0, before - run.pos(f.slot))
    f.recovery_s = run.settle(t0, "a joiner killed mid-heal")


def duplicate_slot(run: Run, f: Fault) -> None:
    assert f.slot is not None
    log = run.dir / f"duplicate{len(run.duplicates)}_slot{f.slot}.log"
    t0 = time.monotonic()
    dup = run._launch(f.slot, log)
    run.duplicates.append((dup, log))
    try:
        code = dup.wait(BOUND_S)
    except subprocess.TimeoutExpired:
        dup.kill()
        raise Broken(f"a duplicate of slot {f.slot} still ran after {BOUND_S:.0f}s") from None
    if code != 2:
        f.broken.append(f"a duplicate of slot {f.slot} exited {code}, not 2 (refused)")
    f.recovery_s = run.settle(t0, "a duplicate slot")


def all_killed(run: Run, f: Fault) -> None:
    before = sum(run.pos(s) for s in range(SLOTS))
    for s in range(SLOTS):
        run.kill(s)
    t0 = time.monotonic()
    last = run.last_sequence()
    for s in range(SLOTS):
        run.start(s)
    _until(lambda: all(f"[slot {s} epoch " in run.log(s) for s in range(SLOTS)), BOUND_S,
           "the restarted replicas' epoch")
    f.steps_lost = max(0.0, before - sum(run.pos(s) for s in range(SLOTS)))  # back to the checkpoint: redone
    f.recovery_s = run.settle(t0, "every replica killed")
    run.resumes.append((last, [m for s in range(SLOTS) for m in re.findall(r"resumed from (\S+)", run.log(s))]))


INJECT: dict[str, Callable[[Run, Fault], None]] = {  # KINDS' faults
    "kill": kill, "stop_short": lambda run, f: stop(run, f, run.rng.uniform(0.2, 0.6) * PEER_S),
    "stop_long": lambda run, f: stop(run, f, run.rng.uniform(1.5, 3.0) * PEER_S),
    "coordinator_killed": coordinator_killed, "coordinator_stopped": coordinator_stopped,
    "joiner_killed_mid_heal": joiner_killed_mid_heal, "duplicate_slot": duplicate_slot, "all_killed": all_killed,
}


# ------------------------------------------------------------------- checks
def check_end(run: Run) -> dict[str, Any]:
    """The invariants of a finished run: a list of what broke, and the run's figures."""
    broken: list[str] = []
    t0 = time.monotonic()
    run.slow.unlink(missing_ok=True)
    codes: dict[int, Optional[int]] = {}
    for s, p in run.procs.items():
        try:
            codes[s] = p.wait(max(1.0, END_BOUND_S - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            codes[s] = None
            broken.append(f"slot {s} still ran {END_BOUND_S:.0f}s after the faults")
    end_s = time.monotonic() - t0
    if any(c != 0 for c in codes.values()):
        broken.append(f"exit codes {codes}")
    logs = [p for ps in run.logs.values() for p in ps] + [log for _, log in run.duplicates]
    writers: dict[int, set[int]] = {}
    for log in logs:
        text = log.read_text(errors="replace")
        for slot, epoch in re.findall(r"\[slot (\d+) epoch (\d+)\] members .*\(writer\)", text):
            writers.setdefault(int(epoch), set()).add(int(slot))
    broken += [f"epoch {e} had writers {sorted(w)}" for e, w in writers.items() if len(w) > 1]
    found = checkpoints(run.run_dir)  # the earliest written first
    ckpts = [((c.sequence, c.steps, c.syncs), c.positions.sum(dim=1)) for c in found]
    for (a, pa), (b, pb) in zip(ckpts, ckpts[1:]):
        # A killed slot redoes the steps it made after its last round: at most REDO a slot.
        if b[0] <= a[0] or b[2] < a[2] or b[1] < a[1] - REDO * SLOTS or bool((pb < pa - REDO).any()):
            broken.append(f"checkpoints went backwards: (sequence, steps, syncs, positions) {a} "
                          f"{pa.tolist()} then {b} {pb.tolist()}")
    sequences = {c.path.name: c.sequence for c in found}
    for last, paths in run.resumes:
        older = [p for p in paths if sequences.get(Path(p).name, -1) < last]
        if older:
            broken.append(f"restored {older} though last.pt had sequence {last}")
    steps_diff = float("nan")
    try:
        m = json.loads((run.run_dir / "metrics.json").read_text())
        positions, quota = m["slot_positions"], run.quota()
        if quota is None or any(p != quota for p in positions):
            broken.append(f"shards not read to their end: {positions}, {quota} each")
        steps_diff = float(m["steps"] - sum(positions))
        if abs(steps_diff) > 0.01 * sum(positions):
            broken.append(f"steps {m['steps']} against {sum(positions)} read")
        states = m["replica_final_state"]  # a digest of each replica's model, rule state and rounds
        if len(states) != SLOTS or any(st["model"] != states[0]["model"] for st in states[1:]):
            broken.append(f"the replicas' final models differ: {states}")
        elif any(st != states[0] for st in states[1:]):
            broken.append(f"the replicas' sync-rule state or rounds differ: {states}")
        accuracy = m["test_accuracy"]
    except (OSError, KeyError, ValueError) as e:
        broken.append(f"no complete result: {e}")
        accuracy = float("nan")
    return {"broken": broken, "end_s": end_s, "checkpoints": len(ckpts), "epochs": max(writers, default=0),
            "steps_diff": steps_diff, "test_accuracy": accuracy}


# ----------------------------------------------------------------- campaign
def campaign(out: Path, total: int, per_run: int, seed: int, first_run: int = 0,
             kinds: Optional[dict[str, int]] = None, distinct: bool = False) -> None:
    """Runs ``first_run`` onwards; a later start appends to the journal (a campaign that was cut off).
    ``kinds``: the faults drawn and their weights (KINDS); ``distinct``: no slot hit twice in a run."""
    kinds = kinds or KINDS
    out.mkdir(parents=True, exist_ok=True)
    journal = (out / "chaos.jsonl").open("a" if first_run else "w")
    injected = first_run * per_run  # the earlier runs' share
    index = first_run
    while injected < total:
        run = Run(out / "runs", index, seed, min(per_run, total - injected))
        t_run = time.monotonic()
        done: list[Fault] = []
        result: dict[str, Any] = {}
        try:
            for s in range(SLOTS):
                run.start(s)
            run.settle(time.monotonic(), "the start")
            while len(done) < per_run and injected + len(done) < total and not run.near_end():
                run.gap()
                kind = run.rng.choices(list(kinds), weights=list(kinds.values()))[0]
                hit = {d.slot for d in done} if distinct and len(done) < SLOTS else set()
                f = Fault(index, len(done), kind, None if kind.startswith(("coordinator", "all")) else
                          run.rng.choice([s for s in range(SLOTS) if s not in hit]))
                try:
                    INJECT[f.kind](run, f)
                except Broken as e:
                    f.broken.append(str(e))
                done.append(f)
                journal.write(json.dumps({"fault": asdict(f)}) + "\n")
                journal.flush()
                logger.info("run %d fault %d/%d %-24s slot %s: %s", index, injected + len(done), total, kind,
                            f.slot, f"recovered in {f.recovery_s:.1f}s" if not f.broken else f"BROKEN {f.broken}")
                if f.broken:
                    break  # the job is not whole: its end checks say the rest
            result = check_end(run)
        finally:
            run.close()
        result.update(run=index, faults=len(done), wall_s=time.monotonic() - t_run)
        injected += len(done)
        journal.write(json.dumps({"run": result}) + "\n")
        journal.flush()
        logger.info("run %d: %d faults, %s", index, len(done), "invariants hold" if not result["broken"]
                    else f"BROKEN {result['broken']}")
        index += 1


def finished(journal: Path) -> tuple[list[Fault], list[dict[str, Any]]]:
    """The faults and checks of every run the journal saw to its end, the latest attempt of each.

    A run cut off before its end checks (the host went away) counts for nothing: its faults
    were survived one by one, but nobody checked the job they left behind.
    """
    done: dict[int, tuple[list[Fault], dict[str, Any]]] = {}
    pending: list[Fault] = []
    for line in journal.read_text().splitlines():
        row = json.loads(line)
        if "fault" in row:
            f = Fault(**row["fault"])
            if pending and (pending[-1].run != f.run or f.index == 0):  # a new run, or the same one again
                logger.warning("run %d was cut off after %d faults: left out", pending[-1].run, len(pending))
                pending = []
            pending.append(f)
        else:
            run = row["run"]
            done[run["run"]] = ([f for f in pending if f.run == run["run"]], run)
            pending = []
    if pending:
        logger.warning("run %d was cut off after %d faults: left out", pending[-1].run, len(pending))
    order = sorted(done)
    return [f for i in order for f in done[i][0]], [done[i][1] for i in order]


def table(faults: list[Fault], runs: list[dict[str, Any]], seed: int, kinds: Optional[dict[str, int]] = None
          ) -> str:
    def pct(xs: list[float], q: float) -> float:
        return float(np.percentile(xs, q)) if xs else float("nan")
    lines = [f"{len(faults)} faults in {len(runs)} runs (seed {seed}); {SLOTS} replicas x 1 worker on this host, "
             f"elastic.peer_timeout_s={PEER_S:g}, every step slowed {STEP_MS} ms", "",
             "| fault | injected | survived | recovery p50 s | recovery p95 s | steps lost per fault (mean) |",
             "|---|---|---|---|---|---|"]
    for kind in kinds or KINDS:
        fs = [f for f in faults if f.kind == kind]
        rec = [f.recovery_s for f in fs if not f.broken]
        lost = [f.steps_lost for f in fs if f.steps_lost is not None]
        lines.append(f"| {kind} | {len(fs)} | {len(rec)} | {pct(rec, 50):.1f} | {pct(rec, 95):.1f} | "
                     + (f"{statistics.mean(lost):.1f} |" if lost else "— |"))
    broken = [b for r in runs for b in r["broken"]] + [b for f in faults for b in f.broken]
    lines += ["", f"Invariants broken: {len(broken)}" + ("" if not broken else ": " + "; ".join(broken[:20]))]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ helpers
def _until(cond: Callable[[], bool], bound_s: float, what: str) -> None:
    deadline = time.monotonic() + bound_s
    while not cond():
        if time.monotonic() > deadline:
            raise Broken(f"waited past {bound_s:.0f}s for {what}")
        time.sleep(0.05)


def main() -> None:
    global SLOTS, PEER_S
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--faults", type=int, default=500, help="faults in all")
    ap.add_argument("--per-run", type=int, default=25, help="faults in one elastic run")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("bench_results/chaos"))
    ap.add_argument("--first-run", type=int, default=0,
                    help="go on with a campaign that was cut off: same seed, runs from this one, "
                         "appended to its journal")
    ap.add_argument("--slots", type=int, default=SLOTS, help="replicas in each elastic run")
    ap.add_argument("--kinds", default="", help=f"comma-separated faults to draw (default all: {', '.join(KINDS)})")
    ap.add_argument("--distinct-slots", action="store_true", help="never hit a slot twice in one run")
    ap.add_argument("--peer-timeout", type=float, default=PEER_S, help="elastic.peer_timeout_s")
    args = ap.parse_args()
    if args.faults < 1 or args.per_run < 1 or args.first_run < 0 or args.slots < 2 or args.peer_timeout <= 0:
        ap.error("--faults and --per-run must be at least 1, --first-run at least 0, --slots at least 2, "
                 "--peer-timeout above 0")
    chosen = [k for k in args.kinds.split(",") if k]
    if any(k not in KINDS for k in chosen):
        ap.error(f"--kinds: unknown {[k for k in chosen if k not in KINDS]}; choose from {', '.join(KINDS)}")
    SLOTS, PEER_S = args.slots, args.peer_timeout
    args.out = args.out.resolve()  # the replicas run in their own folders: no relative paths
    if args.first_run and not (args.out / "chaos.jsonl").is_file():
        ap.error(f"--first-run: no journal to go on with at {args.out / 'chaos.jsonl'}")
    logging.basicConfig(level=logging.INFO, format="[chaos] %(asctime)s %(message)s", datefmt="%H:%M:%S")
    kinds = {k: KINDS[k] for k in chosen} or KINDS
    campaign(args.out, args.faults, args.per_run, args.seed, args.first_run, kinds, args.distinct_slots)
    faults, runs = finished(args.out / "chaos.jsonl")
    text = table(faults, runs, args.seed, kinds) + (f"\nRuns' wall time in all: "
                                             f"{sum(r['wall_s'] for r in runs) / 60:.0f} min\n")
    write_results(args.out, "chaos", {"seed": args.seed, "faults": [asdict(f) for f in faults], "runs": runs}, text,
                  indent=1)
    if any(r["broken"] for r in runs) or any(f.broken for f in faults):
        sys.exit(1)


if __name__ == "__main__":
    main()
