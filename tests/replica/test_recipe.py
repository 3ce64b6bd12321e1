"""A real training recipe: AdamW in the flat rules, any torch optimizer stepping the shared
parameters in place, no decay for biases and norms, clipping, bf16 autocast, and learning-rate
schedules driven by the replica's step (fast tier)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hogwild.config.schema import OptimConfig
from hogwild.config.train import SchedConfig
from hogwild.replica.lr_schedule import LRSchedule
from hogwild.replica.optim import FlatOptimizer, clip_grad_norm, make_optimizer
from hogwild.replica.shared import bind, layout, numel, param_slots, share_model
from hogwild.replica.worker import Channels, Recipe, run_loop
from tests.replica.test_worker import tiny_worker

pytestmark = pytest.mark.timeout(60)


def _pair() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(5, 7), nn.LayerNorm(7), nn.Tanh(), nn.Linear(7, 3))
    b = nn.Sequential(nn.Linear(5, 7), nn.LayerNorm(7), nn.Tanh(), nn.Linear(7, 3))
    b.load_state_dict(a.state_dict())
    return a, b


def _steps(ours: nn.Module, theirs: nn.Module, opt: object, topt: torch.optim.Optimizer, n: int = 5) -> None:
    for _ in range(n):
        x, y = torch.randn(8, 5), torch.randint(0, 3, (8,))
        for m in (ours, theirs):
            m.zero_grad()
            nn.functional.cross_entropy(m(x), y).backward()
        opt.step([p.grad for p in ours.parameters()])  # type: ignore[attr-defined]
        topt.step()


def _no_decay_groups(model: nn.Module, wd: float) -> list[dict]:
    ps = list(model.parameters())
    return [{"params": [p for p in ps if p.dim() > 1], "weight_decay": wd},
            {"params": [p for p in ps if p.dim() <= 1], "weight_decay": 0.0}]


@pytest.mark.parametrize("shared", [False, True])
def test_flat_adamw_matches_torch_adamw_with_biases_and_norms_exempt(shared: bool) -> None:
    ours, theirs = _pair()
    flat = torch.zeros(numel(ours))
    bind(ours, flat, copy_values=True)
    cfg = OptimConfig(name="adamw", lr=0.01, weight_decay=0.1, decay_norm_and_bias=False,
                      state="shared" if shared else "worker")
    opt = FlatOptimizer(cfg, flat, param_slots(ours), FlatOptimizer.new_state(cfg, flat.numel(), torch.zeros))
    _steps(ours, theirs, opt, torch.optim.AdamW(_no_decay_groups(theirs, 0.1), lr=0.01))
    for p, q in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_a_torch_optimizer_target_steps_the_shared_buffer_in_place() -> None:
    ours, theirs = _pair()
    flat = share_model(ours, "cpu")
    before = flat.clone()
    cfg = OptimConfig(_target_="torch.optim.RMSprop", kwargs={"alpha": 0.9}, lr=0.01, weight_decay=0.05,
                      decay_norm_and_bias=False)
    opt = make_optimizer(cfg, flat, param_slots(ours), list(ours.parameters()), {})
    _steps(ours, theirs, opt, torch.optim.RMSprop(_no_decay_groups(theirs, 0.05), lr=0.01, alpha=0.9))
    # The shared memory itself moved (what every other worker reads), and exactly as torch's
    # optimizer moves a private model.
    assert not torch.equal(flat, before)
    for slot, q in zip(layout(ours), theirs.parameters()):
        torch.testing.assert_close(slot.view(flat), q, rtol=1e-5, atol=1e-6)


def test_clipping_matches_torch_s() -> None:
    torch.manual_seed(0)
    ours = [torch.randn(4, 3) * 10, torch.randn(5)]
    theirs = [nn.Parameter(torch.zeros_like(g)) for g in ours]
    for p, g in zip(theirs, ours):
        p.grad = g.clone()
    norm = clip_grad_norm(ours, 1.0)
    ref = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert norm == pytest.approx(float(ref), rel=1e-5)
    for g, p in zip(ours, theirs):
        torch.testing.assert_close(g, p.grad)
    assert clip_grad_norm([torch.full((3,), 0.1)], 1.0) == pytest.approx(math.sqrt(0.03))  # under: untouched


def test_warmup_then_cosine_reaches_min_lr_at_the_end() -> None:
    s = LRSchedule(SchedConfig(name="cosine", warmup_steps=10, min_lr=0.001), 0.1, 110)
    assert s.lr_at(0) == pytest.approx(0.01)
    assert s.lr_at(4) == pytest.approx(0.05)
    assert s.lr_at(10) == pytest.approx(0.1)
    assert s.lr_at(60) == pytest.approx(0.001 + 0.099 * 0.5)
    assert s.lr_at(110) == pytest.approx(0.001)
    lrs = [s.lr_at(i) for i in range(10, 111)]
    assert all(x >= y for x, y in zip(lrs, lrs[1:])), "cosine never rises after warm-up"


def test_step_schedule_and_constant() -> None:
    s = LRSchedule(SchedConfig(name="step", step_size=100, gamma=0.5), 0.2, 1000)
    assert [s.lr_at(i) for i in (0, 99, 100, 250)] == pytest.approx([0.2, 0.2, 0.1, 0.05])
    assert LRSchedule(SchedConfig(), 0.3, 10).lr_at(7) == 0.3


def test_a_torch_scheduler_target_follows_torch_step_for_step() -> None:
    cfg = SchedConfig(_target_="torch.optim.lr_scheduler.OneCycleLR", kwargs={"max_lr": 0.5, "total_steps": 50})
    ours = LRSchedule(cfg, 0.1, 50)
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    ref = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=50)
    seen = []
    for _ in range(40):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        ref.step()
    assert [ours.lr_at(i) for i in range(40)] == pytest.approx(seen)
    # A fresh schedule (a resumed worker) asked for a late step lands on the same value.
    assert LRSchedule(cfg, 0.1, 50).lr_at(39) == pytest.approx(seen[39])


def test_the_learning_rate_follows_the_replica_s_step_not_the_worker_s() -> None:
    step_fn, opt, params, spec, board, flat, _, _ = tiny_worker(quota=5, rows=2, replica_quota=1000)
    board.stats["pos"][1] = 500  # the replica's other worker is this far along
    board.stats["done"][1] = 1.0
    sched = LRSchedule(SchedConfig(name="cosine"), 0.5, 1000)
    run_loop(step_fn, opt, params, spec, Channels(board), Recipe(sched=sched))
    # This worker's 5th update happened at replica step 504: half-way through the cosine.
    assert opt.opt.lr == pytest.approx(sched.lr_at(504))
    assert opt.opt.lr < 0.5 * 0.6


def test_bf16_autocast_trains_with_float32_weights_and_gradients() -> None:
    step_fn, opt, params, spec, board, flat, _, _ = tiny_worker(quota=60, bf16=True)
    loss = step_fn(0).loss
    assert loss.dtype == torch.float32 or loss.dtype == torch.bfloat16
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in params)
    run_loop(step_fn, opt, params, spec, Channels(board))
    assert flat.dtype == torch.float32 and torch.isfinite(flat).all()
    assert 0 < board.row(0)["loss"] < 0.5
