"""The CUDA path, measured: a round's cost against NCCL's (and Gloo's) bare all_reduce of the same
buffer on the GPU, samples/s of one replica on the GPU against the same replica on the CPU, and a
2-replica job whose models live on the GPU.

    python scripts/device/gpu.py --out bench_results/gpu               # everything (a machine with a GPU)
    python scripts/device/gpu.py --only sync --sizes 1000000 --reps 20 --out /tmp/g

NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so on a one-GPU machine the NCCL
rows have one rank (the round's own passes and a world-1 collective), and the two-rank rows use
Gloo, which stages CUDA tensors through host memory. The 2-replica job is two torchrun "machines"
on 127.0.0.1, each with LOCAL_RANK 0, so both models live on GPU 0; ``sync.backend=gloo``.
Results: ``<out>/gpu.json`` and ``<out>/gpu.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts.harness, examples
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from scripts.harness.baselines import MLP, RESNET, Workload, spawn_ranks, time_bare_and_round  # noqa: E402
from scripts.harness.common import free_port, metrics, names, table_head, train_cmd  # noqa: E402

from hogwild.bench import sync_rule  # noqa: E402

logger = logging.getLogger("gpu")
SECTIONS = ("sync", "train", "replicas")
RULES = (("average", "fp32"), ("slowmo", "fp32"), ("slowmo", "int8"))


def _sync_rank(rank: int, world: int, port: int, out: Any, backend: str, sizes: tuple[int, ...],
               reps: int) -> None:
    """Per size and rule: the median bare all_reduce and sync round on CUDA tensors, interleaved."""
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    for n in sizes:
        flat = torch.randn(n, device=dev)
        for mode, dtype in RULES:
            # Two warm-ups: NCCL builds its communicator on first use.
            bare, ours = time_bare_and_round(flat, sync_rule(flat, mode, dtype=dtype), reps, warmup=2,
                                             settle=torch.cuda.synchronize)
            if rank == 0:
                out[f"{backend}/{world}/{n}/{mode}/{dtype}"] = {
                    "backend": backend, "ranks": world, "floats": n, "rule": mode, "wire": dtype,
                    "bare_allreduce_s": bare, "sync_round_s": ours}
    dist.destroy_process_group()


def sync_section(sizes: tuple[int, ...], reps: int) -> list[dict[str, Any]]:
    rows: dict[str, Any] = {}
    rows.update(spawn_ranks(_sync_rank, 1, "nccl", sizes, reps))
    rows.update(spawn_ranks(_sync_rank, 2, "gloo", sizes, reps))
    return list(rows.values())


def _train(args: list[str], run_root: Path, torchrun_nodes: int = 0, timeout: float = 900) -> dict[str, Any]:
    """One hogwild job (``torchrun_nodes`` > 0: that many one-replica "machines" on 127.0.0.1)."""
    run_dir = Path(tempfile.mkdtemp(dir=run_root))
    hydra = [*args, f"run_dir={run_dir}", "checkpoint.every_s=3600"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if torchrun_nodes:
        port, rid = free_port(), f"gpu{time.time_ns()}"
        cmds = [[sys.executable, "-m", "torch.distributed.run", f"--nnodes={torchrun_nodes}", "--nproc-per-node=1",
                 "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={rid}",
                 *train_cmd(hydra)[1:]] for _ in range(torchrun_nodes)]
    else:
        cmds = [train_cmd(hydra)]
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for c in cmds]
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{' '.join(cmds[0])} failed:\n" + "\n".join(log[-3000:] for log in logs))
    return metrics(run_dir)


def _keep(m: dict[str, Any]) -> dict[str, Any]:
    keys = ("samples_per_s", "steps", "train_s", "time_to_target_s", "test_accuracy", "syncs", "mean_sync_s",
            "sync_link_s", "steps_per_sync", "threads_per_worker", "workers", "replicas")
    return {k: m.get(k) for k in keys}


def train_section(run_root: Path, steps: int, workers: tuple[int, ...]) -> list[dict[str, Any]]:
    """samples/s of one replica, on the GPU and on the CPU, at a fixed number of steps per worker."""
    rows = []
    for w in (RESNET, MLP):
        w = dataclasses.replace(w, eval_every_s=3600.0)
        for device in ("cuda", "cpu"):
            for k in workers:
                args = [f"device={device}", f"workers={k}", *w.hydra(), f"train.max_steps={steps}",
                        "train.target_accuracy=null"]
                m = _train(args, run_root)
                rows.append({"workload": w.name, "device": device, **_keep(m)})
                logger.info("%s %s x%d: %.0f samples/s", w.name, device, k, m["samples_per_s"])
    return rows


def replicas_section(run_root: Path, repeats: int) -> list[dict[str, Any]]:
    """2 replicas x 1 worker on the GPU (Gloo between them) against 1 x 1 and 1 x 2, to the target."""
    rows = []
    w: Workload = dataclasses.replace(RESNET, eval_every_s=0.25)  # a GPU step takes milliseconds
    base = [*w.hydra(), "device=cuda", f"train.target_accuracy={w.target}", "sync.interval=10"]
    for _ in range(repeats):
        for label, extra, nodes in (("1 replica x 1 worker", ["workers=1"], 0),
                                    ("1 replica x 2 workers", ["workers=2"], 0),
                                    ("2 replicas x 1 worker (gloo)", ["workers=1", "sync.backend=gloo"], 2)):
            m = _train([*base, *extra], run_root, torchrun_nodes=nodes)
            rows.append({"workload": w.name, "setup": label, **_keep(m)})
            logger.info("%s: %.1fs to %.2f (acc %.3f)", label, m["time_to_target_s"] or float("nan"), w.target,
                        m["test_accuracy"])
    return rows


def _md(res: dict[str, Any]) -> str:
    out = [f"# GPU: {res['gpu']}, torch {res['torch']}, NCCL {res['nccl']}\n"]
    if "sync" in res:
        out += table_head("backend", "ranks", "floats", "rule", "wire", "bare all_reduce ms", "round ms",
                          "round / bare")
        for r in res["sync"]:
            out.append(f"| {r['backend']} | {r['ranks']} | {r['floats']:,} | {r['rule']} | {r['wire']} | "
                       f"{r['bare_allreduce_s'] * 1e3:.3f} | {r['sync_round_s'] * 1e3:.3f} | "
                       f"{r['sync_round_s'] / r['bare_allreduce_s']:.2f}x |")
        out.append("")
    if "train" in res:
        out += table_head("workload", "device", "workers", "threads/worker", "steps", "samples/s")
        out += [f"| {r['workload']} | {r['device']} | {r['workers']} | {r['threads_per_worker']} | {r['steps']} | "
                f"{r['samples_per_s']:,.0f} |" for r in res["train"]]
        out.append("")
    if "replicas" in res:
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in res["replicas"]:
            groups.setdefault(r["setup"], []).append(r)
        out += table_head("setup", "median s to target", "runs", "median steps", "median final acc", "mean round s")
        for label, rs in groups.items():
            tt = [r["time_to_target_s"] for r in rs if r["time_to_target_s"] is not None]
            out.append(f"| {label} | {statistics.median(tt) if tt else float('nan'):.2f} | "
                       f"{', '.join(f'{t:.2f}' for t in tt)} | {statistics.median(r['steps'] for r in rs):.0f} | "
                       f"{statistics.median(r['test_accuracy'] for r in rs):.3f} | "
                       f"{statistics.median((r['mean_sync_s'] or 0.0) for r in rs):.4f} |")
    return "\n".join(out) + "\n"


def _tuple(v: Any) -> tuple[Any, ...]:
    return v if isinstance(v, tuple) else (v,)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench_results/gpu"))
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {SECTIONS}")
    ap.add_argument("--sizes", default="1000000,11181642", help="floats per synced buffer (11,181,642: ResNet-18)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--steps", type=int, default=200, help="train: steps per worker")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--repeats", type=int, default=3, help="replicas: interleaved repeats")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    only = set(names(ap, "--only", a.only, SECTIONS, "section(s) "))
    if not torch.cuda.is_available():
        raise SystemExit("gpu.py: no CUDA GPU is visible (torch.cuda.is_available() is False)")
    a.out.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                           "nccl": ".".join(map(str, _tuple(torch.cuda.nccl.version()))), "cpus": os.cpu_count()}
    sections = {"sync": lambda tmp: sync_section(tuple(int(s) for s in a.sizes.split(",")), a.reps),
                "train": lambda tmp: train_section(tmp, a.steps, tuple(int(k) for k in a.workers.split(","))),
                "replicas": lambda tmp: replicas_section(tmp, a.repeats)}
    with tempfile.TemporaryDirectory() as tmp:
        for name in SECTIONS:
            if name in only:
                res[name] = sections[name](Path(tmp))
                # After every section: a long run cut short keeps what it measured.
                (a.out / "gpu.json").write_text(json.dumps(res, indent=2) + "\n")
                (a.out / "gpu.md").write_text(_md(res))
    sys.stdout.write(_md(res))


if __name__ == "__main__":
    main()
