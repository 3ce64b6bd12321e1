"""What an elastic leader's calls to the coordinator cost it each round, in CPU: its positions and
totals (2 puts) and "has the group changed?" (the epoch and the join requests), against a
coordinator in a process of its own on this host, made the two ways the code can make them:

- ``lone``: each call on its own, as a call outside a round is made: a thread a call, for its
  deadline (hogwild/native.py: ``Bounded``);
- ``batch``: the four on one thread under one deadline (``Link.start``), as a round makes them.

    python scripts/measures/round_calls_cpu.py --rounds 2000 --repeats 3 --out bench_results/round_calls_cpu

The figure is the member's process CPU a round (the coordinator's is not in it); the two ways are
interleaved, so a busy spell slows both alike. See docs/scale.md ("Many replicas on one host").
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts.harness
from scripts.harness.common import free_port, start_coordinator, table_head, write_results  # noqa: E402

logger = logging.getLogger("round_calls_cpu")
WAYS = ("lone", "batch")


def cpu_per_round(endpoint: str, way: str, rounds: int) -> float:
    """Milliseconds of this process's CPU a round, over ``rounds`` rounds made ``way``."""
    from hogwild.bench import swarm_member

    member = swarm_member(endpoint, 0, 8, 10.0, 30.0, lambda: False)
    record = {"pos/0": np.zeros(1).tobytes(), "done/0": np.zeros(4).tobytes()}

    def calls() -> bool:
        for key, raw in record.items():
            member.keys.put(key, raw)
        return member.changed()

    def lone() -> None:  # the four on a thread of their own, each on its own under a deadline
        t = threading.Thread(target=calls)
        t.start()
        t.join()

    one_round: Callable[[], object] = (lambda: member.start(calls, "a round's calls").result()) \
        if way == "batch" else lone
    for _ in range(50):  # connections made, keys created
        one_round()
    c0 = time.process_time()
    for _ in range(rounds):
        one_round()
    return 1e3 * (time.process_time() - c0) / rounds


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="[calls] %(asctime)s %(message)s", datefmt="%H:%M:%S")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.rounds < 1 or args.repeats < 1:
        ap.error("--rounds and --repeats at least 1")
    port = free_port()
    coord = start_coordinator(port)
    try:
        ms: dict[str, list[float]] = {w: [] for w in WAYS}
        for i in range(args.repeats):
            for way in WAYS:
                ms[way].append(cpu_per_round(f"127.0.0.1:{port}", way, args.rounds))
                logger.info("%s run %d/%d: %.3f ms of CPU a round", way, i + 1, args.repeats, ms[way][-1])
    finally:
        coord.kill()
        coord.wait()
    lines = [f"An elastic leader's four calls a round to a coordinator on this host ({args.rounds} rounds, "
             f"medians of {args.repeats})", "", *table_head("way", "member's CPU a round (ms)", "runs")]
    lines += [f"| {w} | {statistics.median(ms[w]):.3f} | {', '.join(f'{x:.3f}' for x in ms[w])} |" for w in WAYS]
    text = "\n".join(lines) + "\n"
    if args.out is not None:
        write_results(args.out, "round_calls_cpu", {"args": vars(args), "ms_per_round": ms}, text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
