"""BatchNorm's running statistics under every sync rule, on R ranks played by threads (fast tier).

Each rank trains its own copy of a user's BatchNorm MLP on raw (unstandardised) digits
features between rounds, as a replica's workers would, and the rule syncs the flat buffer
(parameters, then float buffers). The failure this guards against: an outer rule that
extrapolated the running variance with its momentum drove it below zero, and evaluation in
``eval()`` mode returned NaN although training looked fine.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import Tensor, nn

from hogwild.config.schema import SyncConfig
from hogwild.replica.shared import bind, layout, numel, param_slots
from hogwild.sync.comm import Comm
from hogwild.sync.rounds import RoundFlags, sync_round
from hogwild.sync.rules import make_rule
from tests.fake_comm import run_ranks

pytestmark = pytest.mark.timeout(120)

MODES = ["average", "broadcast", "median", "trimmed_mean", "diloco", "slowmo"]
ROUNDS, INTERVAL, LR, BATCH = 30, 25, 0.02, 32


def _data() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    d = load_digits()
    x, y = torch.tensor(d.data, dtype=torch.float32), torch.tensor(d.target)  # raw pixels, 0..16
    test = torch.arange(len(y)) % 5 == 0
    return x[~test], y[~test], x[test], y[test]


def _net() -> nn.Module:
    torch.manual_seed(0)
    # BatchNorm on the raw input, as tabular models do: digits' border pixels are almost always 0,
    # so their running variance shrinks from 1 toward 0, which a momentum step overshoots.
    return nn.Sequential(nn.BatchNorm1d(64), nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.1),
                         nn.Linear(64, 10))


def _train(mode: str, replicas: int) -> list[tuple[float, float, float]]:
    xtr, ytr, xte, yte = _data()

    def rank_fn(comm: Comm) -> tuple[float, float, float]:
        model = _net()
        flat = torch.zeros(numel(model))
        bind(model, flat, copy_values=True)
        rule = make_rule(SyncConfig(mode=mode), comm, params=sum(s.numel for s in param_slots(model)))
        rule.prime(flat)
        gen = torch.Generator().manual_seed(comm.rank)
        model.train()
        for r in range(ROUNDS):
            for _ in range(INTERVAL):
                idx = torch.randint(len(ytr), (BATCH,), generator=gen)
                model.zero_grad()
                F.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(p.grad, alpha=-LR)  # in place: the views stay views of flat
            sync_round(flat, rule, RoundFlags(final=r == ROUNDS - 1))
        var = min(float(s.view(flat).min()) for s in layout(model) if s.name.endswith("running_var"))
        model.eval()
        with torch.no_grad():
            logits = model(xte)
        return float(F.cross_entropy(logits, yte)), float((logits.argmax(1) == yte).float().mean()), var

    return run_ranks(replicas, rank_fn, timeout_s=60)


@pytest.mark.parametrize("replicas", [2, 3])
def test_every_rule_keeps_batchnorm_statistics_sane_and_matches_average(replicas: int) -> None:
    results = {mode: _train(mode, replicas) for mode in MODES}
    for mode, per_rank in results.items():
        assert all(r == per_rank[0] for r in per_rank), f"{mode}: replicas disagree after the final round"
    bar = results["average"][0][1]
    assert bar > 0.9, f"average itself did not learn ({bar:.3f})"
    for mode, per_rank in results.items():
        loss, acc, min_var = per_rank[0]
        assert math.isfinite(loss), f"{mode}: evaluation loss is {loss}"
        assert min_var >= 0.0, f"{mode}: a running variance went negative ({min_var})"
        assert acc >= bar - 0.02, f"{mode}: accuracy {acc:.3f} against average's {bar:.3f}"
