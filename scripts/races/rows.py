"""Embedding tables over slow links: row-sparse rounds against dense rounds (fp32, int8) and DDP
(dense and sparse gradients) on the clicks DLRM (examples/clicks.py), side by side in one run.

Each method trains one pass over the click log on N simulated machines (network namespaces with
``tbf``-shaped links, one core each: scripts/harness/links.py) and reports the time to a test log-loss,
the bytes a replica sent per step, the final log-loss and each replica's peak memory (PSS of its
process tree, the figure ``metrics.json`` gives). Needs root and iproute2 for shaped links;
``--loopback`` runs the machines as processes on 127.0.0.1.

    python scripts/races/rows.py --rows 1000000 --rate 1gbit --target 0.62 --out bench_results/rows
    python scripts/races/rows.py --rows 10000000 --rate 100mbit --methods rows,dense_int8,ddp_sparse

``--stop-at-target``: each run ends at the target (the time to it), otherwise it trains the
whole pass and the time to the target is read off its evaluations (the final log-loss too).
DDP with dense gradients all-reduces every table at every step: with ``--ddp-dense-steps K``
it runs K steps and its time to the target is projected from that step time and the steps DDP
with sparse gradients needed (the same updates: a sparse and a dense gradient of one batch
step Adagrad alike).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from scripts.harness import links  # noqa: E402
from scripts.harness.common import metrics, put_result, result_line  # noqa: E402

from hogwild.bench import round_rules  # noqa: E402

logger = logging.getLogger("rows")

METHODS: dict[str, Optional[list[str]]] = {
    "rows": ["sync.row_sparse=true"],
    "rows_int8": ["sync.row_sparse=true", "sync.dtype=int8"],
    "dense": ["sync.row_sparse=false"],  # +experiment=clicks sets it true
    "dense_int8": ["sync.row_sparse=false", "sync.dtype=int8"],
    "ddp_sparse": None,
    "ddp_dense": None,
}


def click_args(ap: argparse.ArgumentParser, samples: int, test_fraction: float,
               fraction_help: Optional[str] = None) -> None:
    """The clicks DLRM's options, which tables.py shares."""
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows per table")
    ap.add_argument("--tables", type=int, default=2)
    ap.add_argument("--lookups", type=int, default=20, help="per table and sample")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--samples", type=int, default=samples)
    ap.add_argument("--test-fraction", type=float, default=test_fraction, help=fraction_help)
    ap.add_argument("--target", type=float, required=True, help="test log-loss to reach")


def workload(a: argparse.Namespace) -> list[str]:
    return ["+experiment=clicks", f"data.kwargs.rows={a.rows}", f"data.kwargs.tables={a.tables}",
            f"data.kwargs.lookups={a.lookups}", f"data.kwargs.samples={a.samples}", f"model.kwargs.dim={a.dim}",
            f"+data.kwargs.test_fraction={a.test_fraction}"]


def hogwild(a: argparse.Namespace, extra: list[str], root: Path) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(dir=root))
    target = ["train.target.metric=logloss", f"train.target.value={a.target}"] if a.stop_at_target else []
    cmds = links.torchrun_on_machines(a.machines, [*workload(a), f"workers={a.workers}", f"sync.interval={a.interval}",
                                                   f"eval.every_s={a.eval_every_s}", "eval.max_fraction=0.5",
                                                   "checkpoint.every_s=3600", *target, f"run_dir={run_dir}", *extra])
    _, sent = links.on_machines(cmds, a.run_timeout_s)
    m = metrics(run_dir)
    steps = max(m["steps"], 1) / a.machines
    reached = m["time_to_target_s"] if a.stop_at_target else first_below(run_dir, a.target)
    return {"time_to_target_s": reached, "final_logloss": m["test_logloss"], "auc": m["test_auc"],
            "bytes_per_step": m["sync_bytes_per_step"], "tx_bytes_per_step": sent / steps, "syncs": m["syncs"],
            "bytes_per_round": m["sync_bytes_sent"] / max(m["syncs"], 1), "mean_sync_s": m["mean_sync_s"],
            "peak_memory_mb": m["peak_memory_mb"], "wall_s": m["wall_s"], "train_s": m["train_s"]}


def evaluations(run_dir: Path) -> list[tuple[float, float]]:
    """(seconds of training, test log-loss) of each evaluation during the run: TensorBoard's
    ``test/logloss`` against the first training point's wall time."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    start = min(e.wall_time for tag in scalars if tag.startswith("train/") for e in acc.Scalars(tag))
    return [(e.wall_time - start, e.value) for e in acc.Scalars("test/logloss")]


def first_below(run_dir: Path, target: float) -> Optional[float]:
    """Seconds of training at the first evaluation whose test log-loss met ``target``, or None."""
    return min((t for t, v in evaluations(run_dir) if v <= target), default=None)


def ddp(a: argparse.Namespace, sparse: bool, steps: Optional[int]) -> dict[str, Any]:
    port = links.port()
    cmds = [_on_one_machine([ddp_rank_cmd(a, i * a.workers + j, port, sparse, steps) for j in range(a.workers)])
            for i in range(a.machines)]
    logs, sent = links.on_machines(cmds, a.run_timeout_s)
    r = result_line(logs[0])
    # The rank's own count of its steps' traffic; the outside count also holds DDP's start-up
    # broadcast of the whole model (most of it, for a large table and a few hundred steps).
    return {**r, "tx_bytes_per_step_with_start": sent / max(r["steps"], 1)}


def ddp_rank_cmd(a: argparse.Namespace, rank: int, port: int, sparse: bool, steps: Optional[int] = None,
                 full_pass: bool = False) -> list[str]:
    """One DDP rank of ``a.machines`` x ``a.workers`` (this script again, with ``--ddp-rank``)."""
    return [sys.executable, str(Path(__file__).resolve()), "--ddp-rank", str(rank), "--machines", str(a.machines),
            "--workers", str(a.workers), "--port", str(port), "--rows", str(a.rows), "--tables", str(a.tables),
            "--lookups", str(a.lookups), "--samples", str(a.samples), "--dim", str(a.dim), "--target", str(a.target),
            "--test-fraction", str(a.test_fraction),
            "--ddp-eval-every", str(a.ddp_eval_every), *(["--sparse"] if sparse else []),
            *(["--max-steps", str(steps)] if steps else []), *(["--loopback"] if a.loopback else []),
            *(["--ddp-full-pass"] if full_pass else []), "--eval-samples", str(getattr(a, "eval_samples", 0))]


def _on_one_machine(cmds: list[list[str]]) -> list[str]:
    """One command that runs ``cmds`` side by side (a machine's DDP ranks) and fails if one does."""
    if len(cmds) == 1:
        return cmds[0]
    script = " & ".join(shlex.join(c) for c in cmds) + " & for p in $(jobs -p); do wait $p || exit 1; done"
    return ["bash", "-c", script]


def ddp_rank(a: argparse.Namespace) -> None:
    """One DDP rank: the same model, data shard, batch and Adagrad as a hogwild replica's worker.
    Evaluation (rank 0, every ``--eval-every`` steps) is off the clock."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from examples.clicks import DLRM, click_log

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1" if a.loopback else links.addr(0), MASTER_PORT=str(a.port))
    world = a.machines * a.workers
    dist.init_process_group("gloo", rank=a.ddp_rank, world_size=world)
    train, test = click_log(samples=a.samples, tables=a.tables, rows=a.rows, lookups=a.lookups,
                            test_fraction=a.test_fraction)
    torch.manual_seed(0)
    model = DLRM(dense=train.dense.shape[1], tables=a.tables, rows=a.rows, dim=a.dim)
    for table in model.tables:
        table.sparse = a.sparse
    net = DDP(model)
    # DDP's constructor broadcast rank 0's whole model; the steps' own traffic is counted from here.
    tx0 = links.own_tx_bytes(a.ddp_rank)
    opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
    mine = torch.arange(a.ddp_rank, len(train), world)
    mine = mine[torch.randperm(len(mine), generator=torch.Generator().manual_seed(a.ddp_rank))]
    steps = len(mine) // 64 if not a.max_steps else a.max_steps
    clock, reached, last = 0.0, None, math.nan
    curve: list[tuple[float, float]] = []  # (seconds on the clock, test log-loss) of each evaluation

    def logloss(n: Optional[int] = None) -> float:
        """On the first ``n`` test samples (all by default)."""
        with torch.no_grad():
            p = model(test.dense[:n], test.ids[:n])
            return float(F.binary_cross_entropy_with_logits(p, test.clicks[:n].float()))

    for s in range(steps):
        t0 = time.perf_counter()
        b = mine[s * 64:(s + 1) * 64]
        loss = F.binary_cross_entropy_with_logits(net(train.dense[b], train.ids[b]), train.clicks[b].float())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        clock += time.perf_counter() - t0
        if (s + 1) % a.ddp_eval_every == 0 or s + 1 == steps:
            flag = torch.zeros(1)
            if a.ddp_rank == 0:
                last = logloss(a.eval_samples or None)
                curve.append((round(clock, 3), round(last, 5)))
                flag[0] = float(last <= a.target)
            dist.broadcast(flag, 0)  # off the clock; every rank stops at the same step
            if flag[0] > 0 and reached is None:
                reached = (clock, s + 1)
                if not a.ddp_full_pass:
                    break
    if a.ddp_rank == 0:
        if math.isnan(last) or a.eval_samples or (reached is None and not a.ddp_full_pass):
            last = logloss()
        grads = sum(p.numel() for p in model.parameters())
        put_result({
            "time_to_target_s": reached[0] if reached else None, "steps_to_target": reached[1] if reached else None,
            "steps": s + 1, "step_s": clock / (s + 1), "final_logloss": last, "curve": curve,
            "tx_bytes_per_step": (links.own_tx_bytes(a.ddp_rank) - tx0) / (s + 1),
            # Ring all_reduce of the dense gradients; a sparse one all_gathers indices and rows.
            "bytes_per_step": round_rules()["ring_bytes"](4 * grads, world) if not a.sparse else float("nan")})
    sys.stdout.flush()
    os._exit(0)  # torch's exit after a Gloo DDP run can abort in a destructor (scripts/races/link.py)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--machines", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1, help="hogwild workers per machine; DDP ranks per machine")
    ap.add_argument("--rate", default="1gbit")
    click_args(ap, samples=200_000, test_fraction=0.2)
    ap.add_argument("--interval", type=int, default=50)
    ap.add_argument("--stop-at-target", action="store_true")
    ap.add_argument("--eval-every-s", type=float, default=2.0)
    ap.add_argument("--ddp-eval-every", type=int, default=50)
    ap.add_argument("--ddp-dense-steps", type=int, default=20)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=OVERRIDE[,OVERRIDE...]",
                    help="one more hogwild method, e.g. rows_avg=sync.row_sparse=true,sync.mode=average")
    ap.add_argument("--loopback", action="store_true")
    ap.add_argument("--run-timeout-s", type=float, default=3600.0)
    ap.add_argument("--out", type=Path, default=Path("bench_results/rows"))
    ap.add_argument("--ddp-rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--sparse", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--max-steps", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--ddp-full-pass", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--eval-samples", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="[rows] %(message)s")
    os.chdir(REPO)  # +experiment=clicks imports examples/ from the working directory
    links.LOOPBACK, links.RUN_TIMEOUT_S = a.loopback, a.run_timeout_s
    if a.ddp_rank is not None:
        ddp_rank(a)
        return
    if links.cannot_run():
        return
    methods = links.known(links.chosen_methods(a.methods, a.variant, METHODS), METHODS, list(METHODS))
    root = links.runs_folder(a.out)
    shaping = "loopback" if a.loopback else links.setup(a.machines, a.rate, 0)
    shares = links.cpu_shares(a.machines)  # more machines than cores: an equal share of them each
    if shares:
        shaping += f"; CPU: {shares}"
    label = f"clicks_{a.tables}x{a.rows}_{a.machines}x{'' if a.workers == 1 else a.workers}_" \
        f"{'loopback' if a.loopback else a.rate}"
    res: dict[str, Any] = {"shaping": shaping, "args": {k: str(v) for k, v in vars(a).items()}, "methods": {}}
    try:
        for m in methods:
            logger.info("%s: %s", label, m)
            try:
                if m == "ddp_sparse":
                    r = ddp(a, True, None)
                elif m == "ddp_dense":
                    r = ddp(a, False, a.ddp_dense_steps)
                    sparse = res["methods"].get("ddp_sparse", {})
                    if sparse.get("steps_to_target"):
                        r["time_to_target_s"] = r["step_s"] * sparse["steps_to_target"]
                        r["projected"] = True
                    else:
                        r["time_to_target_s"] = None
                else:
                    r = hogwild(a, METHODS[m] or [], root)
            except Exception as e:  # noqa: BLE001 - one failed method must not lose the others' figures
                logger.error("%s failed: %s", m, str(e)[-1500:])
                r = {"error": str(e)[-1500:]}
            res["methods"][m] = r
            logger.info("%s: %s", m, json.dumps(r))
            (a.out / f"{label}.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    finally:
        if not a.loopback:
            links.teardown(a.machines)
        links.drop_cpu_shares(a.machines)
    logger.info("results in %s", a.out / f"{label}.json")


if __name__ == "__main__":
    main()
