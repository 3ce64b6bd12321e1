"""The in-place flat update rules equal torch.optim step for step (fast tier)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hogwild.config.schema import OptimConfig
from hogwild.replica.optim import FlatOptimizer, grads_finite
from hogwild.replica.shared import bind, layout, numel


def _pair() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    b = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize("cfg,ref", [
    (OptimConfig(name="sgd", lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    (OptimConfig(name="sgd", lr=0.1, momentum=0.9, weight_decay=0.01),
     lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01)),
    (OptimConfig(name="adam", lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    (OptimConfig(name="adagrad", lr=0.1, eps=1e-10), lambda p: torch.optim.Adagrad(p, lr=0.1, eps=1e-10)),
])
def test_matches_torch_optim(cfg: OptimConfig, ref) -> None:
    ours, theirs = _pair()
    flat = torch.zeros(numel(ours))
    bind(ours, flat, copy_values=True)
    opt = FlatOptimizer(cfg, flat, layout(ours), FlatOptimizer.new_state(cfg, flat.numel(), torch.zeros))
    topt = ref(theirs.parameters())
    for step in range(5):
        x, y = torch.randn(8, 5), torch.randint(0, 3, (8,))
        for m in (ours, theirs):
            m.zero_grad()
            nn.functional.cross_entropy(m(x), y).backward()
        opt.step([p.grad for p in ours.parameters()])
        topt.step()
    for p, q in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_sparse_sgd_touches_only_used_rows() -> None:
    emb = nn.EmbeddingBag(100, 2, mode="sum", sparse=True)
    flat = torch.zeros(numel(emb))
    bind(emb, flat, copy_values=True)
    before = flat.clone()
    out = emb(torch.tensor([[3, 7]]), per_sample_weights=torch.ones(1, 2))
    out.sum().backward()
    FlatOptimizer(OptimConfig(lr=0.5), flat, layout(emb), {}).step([emb.weight.grad])
    changed = (flat != before).view(100, 2).any(1).nonzero().flatten().tolist()
    assert changed == [3, 7]


def test_nonfinite_gradients_are_detected() -> None:
    assert grads_finite([torch.ones(3), None])
    assert not grads_finite([torch.tensor([1.0, float("nan")])])
    assert not grads_finite([torch.tensor([float("inf")])])


def _shared_models(cfg: OptimConfig, workers: int = 2):  # type: ignore[no-untyped-def]
    """``workers`` modules viewing one flat buffer, each with its own torch optimizer bound to one
    shared state, as spawned workers are."""
    from hogwild.replica.optim import make_optimizer, new_shared_state
    from hogwild.replica.shared import alloc, param_slots

    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    flat = torch.zeros(numel(base))
    bind(base, flat)
    flat.normal_(0.0, 0.5)  # weights, and buffers that a training-mode forward does not read
    state = new_shared_state(cfg, list(base.parameters()), param_slots(base), flat.numel(), alloc, "cpu")
    views = []
    for _ in range(workers):
        m = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
        bind(m, flat)
        views.append((m, make_optimizer(cfg, flat, param_slots(m), list(m.parameters()), state)))
    return flat, state, views


def _step(model: nn.Module, opt, x: torch.Tensor) -> None:  # type: ignore[no-untyped-def]
    for p in model.parameters():
        p.grad = None
    model(x).pow(2).mean().backward()
    opt.step([p.grad for p in model.parameters()])


@pytest.mark.parametrize("target", ["torch.optim.AdamW", "torch.optim.Adam", "torch.optim.SGD", "torch.optim.Adagrad",
                                    "torch.optim.RMSprop"])
def test_a_torch_optimizer_s_shared_state_is_one_state_for_every_worker(target: str) -> None:
    kw = {"momentum": 0.9} if target == "torch.optim.SGD" else {}
    cfg = OptimConfig(_target_=target, lr=0.01, state="shared", kwargs=kw)
    flat, state, [(a, opt_a), (b, opt_b)] = _shared_models(cfg)
    assert state and all(k.startswith("torch:") for k in state)
    x = torch.randn(16, 4)
    _step(a, opt_a, x)
    moved = {k: v.clone() for k, v in state.items()}
    assert any(v.abs().sum() > 0 for v in moved.values())
    # Worker b's optimizer holds the very tensors worker a's update wrote: the same memory.
    for pa, pb in zip(a.parameters(), b.parameters()):
        for key, value in opt_b.opt.state[pb].items():
            if isinstance(value, torch.Tensor) and value.shape == pb.shape:
                assert value.data_ptr() == opt_a.opt.state[pa][key].data_ptr()
    _step(b, opt_b, x)
    assert any(not torch.equal(moved[k], state[k]) for k in state)


def test_one_worker_with_shared_state_steps_as_with_its_own() -> None:
    cfg_shared = OptimConfig(_target_="torch.optim.AdamW", lr=0.01, state="shared", weight_decay=0.1)
    cfg_own = OptimConfig(_target_="torch.optim.AdamW", lr=0.01, weight_decay=0.1)
    flat_s, _, [(ms, opt_s)] = _shared_models(cfg_shared, workers=1)
    flat_o, _, [(mo, opt_o)] = _shared_models(cfg_own, workers=1)
    assert torch.equal(flat_s, flat_o)
    torch.manual_seed(1)
    for _ in range(5):
        x = torch.randn(16, 4)
        _step(ms, opt_s, x)
        _step(mo, opt_o, x)
    assert torch.equal(flat_s, flat_o)


def test_shared_state_for_an_optimizer_that_needs_a_closure_is_one_line() -> None:
    from hogwild.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^optim.state: shared state needs an optimizer that steps on its own"):
        _shared_models(OptimConfig(_target_="torch.optim.LBFGS", lr=0.1, state="shared"))


def test_hogwild_s_own_optim_keys_never_reach_a_torch_optimizer() -> None:
    """optim.update and optim.state are hogwild's to read: a torch optimizer named by optim._target_
    is built without them, whatever they are set to (the pace.* keys are another group's)."""
    from hogwild.replica.optim import torch_optimizer

    cfg = OptimConfig(_target_="torch.optim.AdamW", update="barrier", state="shared", lr=0.01)
    opt = torch_optimizer(cfg, [torch.nn.Parameter(torch.zeros(3))]).opt
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["lr"] == 0.01
