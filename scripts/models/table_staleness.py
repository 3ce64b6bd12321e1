"""Why many Hogwild workers can kill the clicks DLRM's dense layers: a one-process model of what W
workers do with one shared Adagrad state, without races or timing.

W workers of equal speed read the same weights and the same shared Adagrad state, each computes
its gradient on its own batch, and each applies its step to the live weights (additively, as a
Hogwild write does) with the state it read plus its own squared gradient: none of them has seen
the others' contributions yet (the worst case of the race, and what W workers starting together
on W cores see). The state then holds all W. Tables are row-wise (``optim.rowwise``), as
``+experiment=clicks`` runs them. Variants:

- ``hogwild``: every parameter so (the clicks experiment's ``optim.update=hogwild``);
- ``warmup``: the same, the rate warmed up linearly over the first ``--warmup`` replica steps;
- ``barrier_dense``: the dense layers take one step per wave on the mean of the W gradients (the
  barrier, ``optim.update=barrier``), the tables' rows as ``hogwild``;
- ``ddp``: every parameter one step per wave on the mean gradient (DDP with W processes).

Reported per variant and W over ``--seeds``: the final test log-loss and AUC, and how many runs
collapsed (AUC under 0.55: the dense layers' ReLUs dead, a constant prediction).

    python scripts/models/table_staleness.py --workers 2 16 --seeds 3 --out bench_results/table_staleness.json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from examples.clicks import DLRM, click_log  # noqa: E402

logger = logging.getLogger("table_staleness")
VARIANTS = ("hogwild", "warmup", "barrier_dense", "ddp")


def run(variant: str, workers: int, seed: int, a: argparse.Namespace) -> dict[str, Any]:
    train, test = click_log(samples=a.samples, tables=a.tables, rows=a.rows, lookups=a.lookups, test_fraction=0.1)
    torch.manual_seed(seed)
    model = DLRM(dense=train.dense.shape[1], tables=a.tables, rows=a.rows, dim=16)
    params = list(model.parameters())
    tables = {id(t.weight) for t in model.tables}
    state = [torch.zeros(p.shape[0]) if id(p) in tables else torch.zeros_like(p) for p in params]
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))
    batches = order[: len(order) // 64 * 64].view(-1, 64)
    step = 0
    for wave in range(0, len(batches) - workers + 1, workers):
        grads = []
        for b in batches[wave:wave + workers]:  # every worker reads the same weights
            model.zero_grad()
            F.binary_cross_entropy_with_logits(model(train.dense[b], train.ids[b]), train.clicks[b].float()).backward()
            grads.append([p.grad.coalesce() if p.grad.is_sparse else p.grad.clone() for p in params])
        lr = a.lr * min(1.0, (step + 1) / a.warmup) if variant == "warmup" else a.lr
        with torch.no_grad():
            for i, (p, s) in enumerate(zip(params, state)):
                table = id(p) in tables
                mean = variant == "ddp" or (variant == "barrier_dense" and not table)
                if mean:  # one step on the mean gradient
                    g = torch.stack([gs[i].to_dense() for gs in grads]).mean(0)
                    _adagrad(p, s, [g], lr, table)
                else:  # W steps, each with the state as read plus its own gradient
                    _adagrad(p, s, [gs[i].to_dense() for gs in grads], lr, table)
        step += 1 if variant == "ddp" else workers
    with torch.no_grad():
        logits = model(test.dense, test.ids)
        loss = float(F.binary_cross_entropy_with_logits(logits, test.clicks.float()))
    return {"logloss": loss, "auc": auc(logits, test.clicks)}


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """The probability that a random click scores above a random non-click (ties: no matter here)."""
    ranks = torch.empty(len(scores))
    ranks[scores.argsort()] = torch.arange(1, len(scores) + 1, dtype=torch.float32)
    pos = labels.bool()
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / max(n_pos * n_neg, 1))


def _adagrad(p: torch.Tensor, s: torch.Tensor, gs: list[torch.Tensor], lr: float, table: bool) -> None:
    """Each of ``gs`` steps ``p`` with ``s`` as read plus its own squared gradient; ``s`` then
    takes them all. Row-wise for a table (FBGEMM's rule)."""
    sq = [g.square().mean(1) if table else g.square() for g in gs]
    for g, q in zip(gs, sq):
        std = (s + q).sqrt().add_(1e-10)
        p.sub_(lr * g / (std.unsqueeze(1) if table else std))
    for q in sq:
        s.add_(q)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 16])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--tables", type=int, default=1)
    ap.add_argument("--lookups", type=int, default=20)
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=200, help="replica steps of the warm-up variant")
    ap.add_argument("--out", type=Path, default=Path("bench_results/table_staleness.json"))
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="[table_staleness] %(message)s")
    torch.set_num_threads(1)
    res: dict[str, Any] = {"args": {k: str(v) for k, v in vars(a).items()}, "runs": {}}
    for w in a.workers:
        for v in a.variants:
            runs = [run(v, w, seed, a) for seed in range(a.seeds)]
            key = f"{v}_w{w}"
            res["runs"][key] = runs
            logger.info("%s: log-loss %s (median %.4f), AUC %s, collapsed %d of %d", key,
                        [round(r["logloss"], 4) for r in runs], statistics.median(r["logloss"] for r in runs),
                        [round(r["auc"], 3) for r in runs], sum(r["auc"] < 0.55 for r in runs), len(runs))
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
