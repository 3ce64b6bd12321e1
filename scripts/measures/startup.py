"""What a run costs before it trains: wall time and CPU of a short default run, with every process
it starts counted (the leader, its fork server, the workers), side by side across versions.

    python scripts/measures/startup.py --repeats 3 --out bench_results/startup        # this checkout
    python scripts/measures/startup.py --tree spawn=/tmp/a --tree fork=/tmp/b --out /tmp/s   # benchmarks/memory.md §11

A ``--tree NAME=DIR`` is a source tree of hogwild (for instance ``git archive <commit> | tar -x
-C DIR``) put first on ``PYTHONPATH``; the runs of all trees are interleaved, so a busy machine
slows each alike. The command runs as a child subreaper, so processes that outlive their
parent (a fork server whose leader has exited) are still waited for and counted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts.harness, examples
from scripts.harness.common import table_head, write_results

logger = logging.getLogger("startup")
PR_SET_CHILD_SUBREAPER = 36


def measure(tree: Optional[Path], steps: int) -> dict[str, float]:
    """One run of ``steps`` steps in a child of a fresh subreaper process: its wall and CPU seconds."""
    code = ("import ctypes, os, resource, subprocess, sys, time, json\n"
            f"ctypes.CDLL(None).prctl({PR_SET_CHILD_SUBREAPER}, 1, 0, 0, 0)\n"
            "t0 = time.perf_counter()\n"
            "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL,\n"
            "                    stderr=subprocess.DEVNULL).returncode\n"
            "wall = time.perf_counter() - t0\n"
            "while True:\n"
            "    try:\n"
            "        os.wait()\n"
            "    except ChildProcessError:\n"
            "        break\n"
            "r = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
            "print(json.dumps({'rc': rc, 'wall_s': wall, 'cpu_s': r.ru_utime + r.ru_stime}))\n")
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "hogwild.cli.train",
                              f"train.max_steps={steps}", f"run_dir={d}/run"],
                             capture_output=True, text=True, env=env, cwd=d, timeout=600)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if res["rc"] != 0:
        raise SystemExit(f"startup: the run exited {res['rc']} ({tree or 'this checkout'})")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                    help="a hogwild source tree to measure (repeatable); default: this checkout")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="[startup] %(message)s")
    if not sys.platform.startswith("linux"):
        raise SystemExit("startup: needs Linux (a child subreaper counts orphaned processes)")
    trees: dict[str, Optional[Path]] = {"this checkout": None}
    if args.tree:
        trees = {}
        for item in args.tree:
            name, sep, path = item.partition("=")
            if not sep or not Path(path, "hogwild").is_dir():
                raise SystemExit(f"startup: --tree {item!r}: expected NAME=DIR with DIR/hogwild in it")
            trees[name] = Path(path).resolve()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for i in range(args.repeats):
        for name, tree in trees.items():
            runs[name].append(measure(tree, args.steps))
            logger.info("repeat %d/%d %s: %.2f s wall, %.2f CPU-s", i + 1, args.repeats, name,
                        runs[name][-1]["wall_s"], runs[name][-1]["cpu_s"])
    lines = table_head("version", f"wall s (median of {args.repeats})", "CPU-s, all processes (median)")
    for name, rs in runs.items():
        lines.append(f"| {name} | {statistics.median(r['wall_s'] for r in rs):.2f} | "
                     f"{statistics.median(r['cpu_s'] for r in rs):.2f} |")
    write_results(args.out, "startup", {"steps": args.steps, "runs": runs}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
