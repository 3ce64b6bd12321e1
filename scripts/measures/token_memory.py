"""Memory of ``data=tokens`` against the size of the token file: does any process of a run (the
leader, its workers) grow its anonymous memory by the size of the corpus?

A token file of ``--size-gb`` of random uint16 ids is written to a temporary folder, and a tiny
nanoGPT-style GPT (examples/gpt.py, context ``--block-size``) trains on it under hogwild, one
replica of two workers, for ``--steps`` steps or ``--max-time`` seconds. Every process of the run
(the launched leader and every process below it, found through /proc) is read every
``--every`` seconds; each one's peak ``RssAnon`` (private, anonymous memory: what a copy of the
file would add to), ``RssFile`` (file-backed pages, the mapped tokens among them: page cache,
shared by every process that maps the file and reclaimable) and ``VmRSS`` (their sum, with shared
memory) is reported. The same run on a file ``--ratio`` times smaller puts the two peaks side by
side: if the data were copied per process, the anonymous peaks would differ by the difference of
the sizes. The files are deleted afterwards.

    python scripts/measures/token_memory.py                    # 1 GB and 0.1 GB: bench_results/token_memory.{json,md}
    python scripts/measures/token_memory.py --size-gb 4 --name token_memory_4g
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts.harness, examples
import numpy as np

from scripts.harness.common import REPO, clean_env, write_results

logger = logging.getLogger("token_memory")
MIB = 1 << 20
FIELDS = ("RssAnon", "RssFile", "RssShmem", "VmRSS")
CHUNK_TOKENS = 16 << 20  # 32 MB of uint16 per write: the writer's own memory stays small


def write_tokens(path: Path, size_bytes: int, vocab: int, seed: int) -> int:
    """``size_bytes`` of random uint16 ids below ``vocab``, written in chunks; the file's size."""
    rng = np.random.default_rng(seed)
    left = size_bytes // 2
    with open(path, "wb") as f:
        while left:
            n = min(left, CHUNK_TOKENS)
            rng.integers(0, vocab, n, dtype=np.uint16).tofile(f)
            left -= n
    return path.stat().st_size


def sparse_tokens(path: Path, size_bytes: int) -> int:
    """A file of ``size_bytes`` that holds no disk blocks (every id 0): a corpus many times this
    host's memory, on a disk that could not hold its data. Reading it fills the page cache with zero
    pages as a real file would; the ids do not matter to a memory measurement."""
    with open(path, "wb") as f:
        f.truncate(size_bytes)
    return path.stat().st_size


def descendants(pid: int) -> dict[int, int]:
    """``pid`` and every live process below it, each with its depth below ``pid`` (Linux: each
    thread's children file)."""
    out, todo = {}, [(pid, 0)]
    while todo:
        p, depth = todo.pop()
        out[p] = depth
        for task in Path(f"/proc/{p}/task").glob("*") if Path(f"/proc/{p}/task").is_dir() else []:
            try:
                todo.extend((int(c), depth + 1) for c in (task / "children").read_text().split())
            except OSError:
                continue
    return out


def status_kb(pid: int) -> dict[str, int]:
    """The memory fields of /proc/PID/status, in kB; empty when the process is gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key in FIELDS:
            found[key] = int(value.split()[0])
    return found


def role(pid: int, depth: int) -> str:
    """What a process of the run is: the leader starts a resource tracker and a fork server (a
    fresh interpreter that imported torch once), and the fork server forks the workers
    (hogwild/replica/start.py); a run started by spawn has its workers one level up."""
    if depth == 0:
        return "leader"
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    if "resource_tracker" in cmd:
        return "resource tracker"
    if "spawn_main" in cmd or depth >= 2:
        return "worker"
    return "fork server"


def train_and_sample(token_file: Path, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One run on ``token_file``, every process's memory read every ``args.every`` seconds."""
    run = work / "run"
    cmd = [sys.executable, "-m", "hogwild.cli.train", "data=tokens", f"data.path={token_file}",
           f"data.block_size={args.block_size}", "model._target_=examples.gpt.GPT",
           "+model.config._target_=examples.gpt.GPTConfig", f"+model.config.block_size={args.block_size}",
           f"+model.config.vocab_size={args.vocab}", "+model.config.n_layer=1", "+model.config.n_embd=32",
           "optim=adamw", "optim.lr=0.003", f"train.max_steps={args.steps}", f"train.max_time={args.max_time}",
           "train.batch_size=32", "workers=2", "eval.every_s=30", "checkpoint.every_s=60", f"run_dir={run}"]
    peaks: dict[int, dict[str, Any]] = {}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    samples = 0
    while proc.poll() is None:
        for pid, depth in descendants(proc.pid).items():
            mem = status_kb(pid)
            if not mem:
                continue
            seen = peaks.setdefault(pid, {"role": role(pid, depth), **{k: 0 for k in FIELDS}})
            for k in FIELDS:
                seen[k] = max(seen[k], mem.get(k, 0))
        samples += 1
        time.sleep(args.every)
    err = proc.stderr.read() if proc.stderr else ""
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"token_memory: the run on {token_file} exited {proc.returncode}: {err.strip()[-1500:]}")
    metrics = json.loads((run / "metrics.json").read_text())
    processes = [{"pid": pid, **{k: round(v / 1024, 1) if k in FIELDS else v for k, v in p.items()}}
                 for pid, p in sorted(peaks.items())]
    return {"wall_s": round(wall, 1), "samples": samples, "steps": metrics.get("steps"),
            "test_perplexity": metrics.get("test_perplexity"), "peak_memory_mb": metrics.get("peak_memory_mb"),
            "processes_mib": processes}


def _labelled(processes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Roles numbered in pid order (spawned 1, spawned 2), so two runs line up row by row."""
    counts: dict[str, int] = {}
    out = []
    for p in processes:
        counts[p["role"]] = counts.get(p["role"], 0) + 1
        name = p["role"] if p["role"] == "leader" else f"{p['role']} {counts[p['role']]}"
        out.append({**p, "name": name})
    return out


# hogwild's sampler holds a shard's indices as lists only up to this many training items
# (hogwild.data.datasets.LAZY_ABOVE); above, it computes them.
LAZY_ABOVE = 1 << 22


def index_mib(file_bytes: int, block_size: int, workers: int = 2) -> float:
    """A worker's item indices: its shard of the training blocks and that epoch's shuffle of it
    (int64 each; hogwild's sampler, for any dataset), with the default data.test_fraction of 0.2;
    0 where the sampler computes them instead."""
    tokens = file_bytes // 2
    blocks = (tokens - round(tokens * 0.2) - 1) // block_size
    return 0.0 if blocks > LAZY_ABOVE else 2 * 8 * blocks / workers / MIB


def table(runs: list[dict[str, Any]], block_size: int) -> list[str]:
    small, big = runs[1], runs[0]
    grown = big["file_mib"] - small["file_mib"]
    lines = [f"| process | peak RssAnon MiB, {small['file_mib']:.0f} MiB file | peak RssAnon MiB, "
             f"{big['file_mib']:.0f} MiB file | growth MiB | peak RssFile MiB (small / big) | "
             "peak VmRSS MiB (small / big) |",
             "|---|---|---|---|---|---|"]
    by_name = {p["name"]: p for p in _labelled(small["processes_mib"])}
    worst = 0.0
    for p in _labelled(big["processes_mib"]):
        s = by_name.get(p["name"], {k: float("nan") for k in FIELDS})
        growth = p["RssAnon"] - s["RssAnon"]
        worst = worst if math.isnan(growth) else max(worst, growth)
        lines.append(f"| {p['name']} | {s['RssAnon']:.1f} | {p['RssAnon']:.1f} | {growth:+.1f} | "
                     f"{s['RssFile']:.1f} / {p['RssFile']:.1f} | {s['VmRSS']:.1f} / {p['VmRSS']:.1f} |")
    held = worst < 0.1 * grown
    lines += ["", "RssFile is file-backed pages mapped into the process (the libraries', and the token file's that "
              "it read): page cache, shared by every process that maps the file and reclaimable. A read maps the "
              "whole page-cache folio around it (large folios, up to MiBs on recent kernels), so RssFile and VmRSS "
              "can near the file's size with nothing copied; RssAnon is what a copy would add to.",
              "", (f"Each worker also holds its shard of the training items' indices and that epoch's shuffle of "
                   f"it (int64, 8 bytes per training block between the workers, twice) while the training set has "
                   f"at most {LAZY_ABOVE} blocks, and computes them beyond: "
                   f"{index_mib(small['file_bytes'], block_size):.1f} MiB per worker for the small file, "
                   f"{index_mib(big['file_bytes'], block_size):.1f} MiB for the large one; indices, not tokens."),
              "", f"The file grew by {grown:.0f} MiB; the largest growth of any process's peak anonymous memory was "
              f"{worst:.1f} MiB: the claim (no process copies the corpus) "
              f"{'holds' if held else 'does NOT hold'}."]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=1.0, help="the large token file's size (default 1 GB)")
    ap.add_argument("--ratio", type=float, default=10.0, help="the small file is this many times smaller")
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--max-time", type=float, default=60.0, help="each run stops after this many seconds of training")
    ap.add_argument("--every", type=float, default=0.2, help="seconds between two reads of /proc")
    ap.add_argument("--tmp", type=Path, default=None, help="folder for the token files (default: the system's)")
    ap.add_argument("--out", type=Path, default=REPO / "bench_results")
    ap.add_argument("--name", default="token_memory")
    ap.add_argument("--sparse", action="store_true",
                    help="sparse files of zeros (no disk blocks): sizes past the disk's and the memory's")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="[token_memory] %(message)s")
    if not sys.platform.startswith("linux"):
        raise SystemExit("token_memory: needs Linux (/proc)")
    runs = []
    for gb in (args.size_gb, args.size_gb / args.ratio):
        with tempfile.TemporaryDirectory(dir=args.tmp, prefix="token_memory_") as d:
            path = Path(d) / "train.bin"
            t0 = time.monotonic()
            size = sparse_tokens(path, int(gb * 1e9) // 2 * 2) if args.sparse else \
                write_tokens(path, int(gb * 1e9) // 2 * 2, args.vocab, seed=0)
            logger.info("wrote %s: %.0f MiB in %.1f s", path, size / MIB, time.monotonic() - t0)
            res = train_and_sample(path, args, Path(d))
            runs.append({"file_bytes": size, "file_mib": round(size / MIB, 1), **res})
            logger.info("%.0f MiB file: %d steps in %.1f s, %d samples; peak RssAnon %s MiB", size / MIB, res["steps"],
                        res["wall_s"], res["samples"],
                        ", ".join(f"{p['role']} {p['RssAnon']:.0f}" for p in res["processes_mib"]))
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    machine = {"kernel": platform.release(), "cpus": os.cpu_count()}
    lines = [f"# data=tokens: memory against the token file's size ({args.name})", "",
             f"hogwild 1 replica x 2 workers, a 1-layer GPT (context {args.block_size}, vocab {args.vocab}), "
             f"up to {args.steps} steps or {args.max_time:.0f} s; every process read every {args.every} s "
             f"(Linux {machine['kernel']}, {machine['cpus']} CPUs)"
             f"{'; sparse files of zeros' if args.sparse else ''}.",
             "", *(f"- {r['file_mib']:.0f} MiB file: {r['steps']} steps, {r['wall_s']} s, {r['samples']} samples, "
                   f"test perplexity {r['test_perplexity']:.1f}" for r in runs), "", *table(runs, args.block_size)]
    write_results(args.out, args.name, {"config": config, "machine": machine, "runs": runs}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
