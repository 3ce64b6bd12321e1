"""train.compile: a worker's model compiled in place still trains the one shared model (fast
tier), and the CLI compiles, refuses a broken compiler in one line or, under auto, trains eager
(slow tier)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import pytest
import torch
from torch import nn

from hogwild.config.schema import OptimConfig
from hogwild.replica.compiled import check_compiler, compile_model, warm_up_in_training_mode
from hogwild.replica.optim import FlatOptimizer
from hogwild.replica.shared import bind, param_slots, share_model
from tests.conftest import REPO, clean_env, metrics, run_cli

# torch reads CXX for inductor's C++ compiler (torch/_inductor/config.py, cpp.cxx): pointed at
# nothing, every CPU compile fails, as on a machine without a compiler.
NO_CXX = {"CXX": "/nonexistent/hogwild-test-no-cxx"}
# torch's own log of each compile (its glog format: level+date, time, pid, file, then the message).
TRACING = re.compile(r"^I\d+ \S+ (\d+) .*torchdynamo start tracing (\S+)", re.MULTILINE)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


@pytest.fixture
def shared_pair() -> Iterator[tuple[nn.Module, nn.Module, torch.Tensor]]:
    """The leader's model moved into a shared flat buffer, and a worker's, built afresh and bound
    to it, then compiled, the way replica/worker.py does."""
    torch.manual_seed(0)
    leader = _Net()
    flat = share_model(leader, "cpu")
    worker = _Net()
    bind(worker, flat)
    compile_model(worker, "default")
    yield leader, worker, flat
    torch._dynamo.reset()


def _views(model: nn.Module, flat: torch.Tensor) -> list[torch.Tensor]:
    return [s.view(flat) for s in param_slots(model)]


def test_a_compiled_worker_sees_another_workers_writes(shared_pair: tuple[nn.Module, nn.Module, torch.Tensor]) -> None:
    leader, worker, flat = shared_pair
    x = torch.randn(5, 6)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    before = worker(x).detach()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs, "the forward was not compiled"
    # Another worker's update: written straight into the shared buffer, in place.
    flat.mul_(0.5).add_(0.1)
    after = worker(x).detach()
    eager = _Net()
    bind(eager, flat.clone())
    assert not torch.allclose(after, before), "the compiled forward kept the old weights"
    torch.testing.assert_close(after, eager(x).detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(after, leader(x).detach(), rtol=1e-5, atol=1e-6)


def test_a_compiled_backward_and_update_land_in_the_shared_buffer(
        shared_pair: tuple[nn.Module, nn.Module, torch.Tensor]) -> None:
    leader, worker, flat = shared_pair
    x, y = torch.randn(7, 6), torch.randint(0, 3, (7,))
    torch.nn.functional.cross_entropy(worker(x), y).backward()
    params = list(worker.parameters())
    # The very tensors the step reads: views of the shared buffer, holding the gradients.
    assert [p.data_ptr() for p in params] == [v.data_ptr() for v in _views(worker, flat)]
    assert all(p.grad is not None for p in params)
    eager = _Net()
    bind(eager, flat.clone())
    torch.nn.functional.cross_entropy(eager(x), y).backward()
    for p, q in zip(params, eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    start = flat.clone()
    FlatOptimizer(OptimConfig(name="sgd", lr=0.1), flat, param_slots(worker), {}).step([p.grad for p in params])
    for view, old, p in zip(_views(worker, flat), _views(worker, start), params):
        torch.testing.assert_close(view, old - 0.1 * p.grad)
    # What the leader evaluates (its own eager model on the same buffer) is the updated model.
    torch.testing.assert_close(leader(x).detach(), worker(x).detach(), rtol=1e-5, atol=1e-6)


def test_off_compiles_nothing_and_auto_means_default_where_compiling_works() -> None:
    model = _Net()
    compile_model(model, "off")
    assert model._compiled_call_impl is None
    assert check_compiler("off", torch.device("cpu")) == "off"
    assert check_compiler("auto", torch.device("cpu")) == "default"


@pytest.mark.parametrize("mode", ["auto", "default"])
def test_a_signal_during_the_compiler_probe_stops_the_run(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """Ctrl-C while the leader's probe compiled ended in "train.compile: torch.compile does not work
    here (InductorError: StopNow: )", exit 2 (auto: a warning, and the run trained on eager)."""
    from torch._inductor.exc import InductorError

    from hogwild.errors import StopNow
    from hogwild.replica import compiled

    def interrupted(mode: str, device: torch.device) -> None:
        raise InductorError(StopNow(), None)

    monkeypatch.setattr(compiled, "_probe", interrupted)
    with pytest.raises(StopNow):
        check_compiler(mode, torch.device("cpu"))


def test_the_warm_up_compiles_the_graph_training_runs() -> None:
    # Dropout reads module.training, on which the compiled graph depends: the worker's warm-up must
    # compile the training graph, or the first training step compiles it on the training clock.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.1), nn.Linear(8, 3))
    bind(model, share_model(nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.1), nn.Linear(8, 3)), "cpu"))
    compile_model(model, "default")
    stats = torch._dynamo.utils.counters["stats"]
    try:
        model.train(warm_up_in_training_mode(model, "default"))
        model(torch.randn(4, 6)).sum().backward()  # the warm-up step
        graphs = stats["unique_graphs"]
        model.train()
        model(torch.randn(4, 6)).sum().backward()  # the first training step
        assert stats["unique_graphs"] == graphs, "the first training step compiled again"
    finally:
        torch._dynamo.reset()
    # BatchNorm's running statistics are shared: they keep the eval-mode warm-up; eager never compiles.
    assert not warm_up_in_training_mode(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)), "default")
    assert not warm_up_in_training_mode(model, "off")


def _digits(run: Path, *extra: str) -> list[str]:
    return ["workers=2", "eval.every_s=30", f"run_dir={run}", *extra]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_cli_trains_the_digits_mlp_compiled(tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = run_cli(_digits(run, "train.max_steps=300", "train.compile=default"), cwd=REPO, timeout=230,
                  env=clean_env(TORCH_LOGS="dynamo"), fresh=True)
    assert out.returncode == 0, out.stderr[-3000:]
    m = metrics(run)
    assert m["status"] == "ok" and m["test_accuracy"] > 0.7, m
    assert "train.compile=default: each worker compiles the model's forward" in out.stdout  # the leader's log
    assert metrics(run)["compile"] == "default"
    traced = TRACING.findall(out.stderr)
    probe = {pid for pid, what in traced if what == "<lambda>"}
    forwards = {pid for pid, what in traced if what == "forward"}
    # Each of the two workers compiled the model; the leader compiled only its probe, and evaluates eager.
    assert len(forwards) == 2 and len(probe) == 1 and not probe & forwards, traced


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_explicit_mode_on_a_broken_compiler_is_one_line_and_exit_2(tmp_path: Path) -> None:
    out = run_cli(_digits(tmp_path / "run", "train.max_steps=50", "train.compile=default"), cwd=REPO, timeout=110,
                  env=clean_env(**NO_CXX), fresh=True)
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("hogwild: error:")]
    assert out.returncode == 2 and len(errors) == 1, out.stderr[-3000:]
    assert errors[0].startswith("hogwild: error: train.compile: torch.compile does not work here (")
    assert "set train.compile=off, or auto" in errors[0] and "Traceback" not in out.stderr
    assert not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_auto_on_a_broken_compiler_warns_once_and_trains_eager(tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = run_cli(_digits(run, "train.max_steps=200", "train.compile=auto"), cwd=REPO, timeout=110,
                  env=clean_env(**NO_CXX), fresh=True)
    assert out.returncode == 0, out.stderr[-3000:]
    warned = [ln for ln in (out.stdout + out.stderr).splitlines() if "[WARNING]" in ln]
    assert len(warned) == 1 and "train.compile=auto: torch.compile does not work here" in warned[0], out.stdout
    assert "training uncompiled" in warned[0]
    # The workers trained eager (a compile there would have failed them) and the run learned.
    m = metrics(run)
    assert m["status"] == "ok" and m["test_accuracy"] > 0.5 and m["worker_restarts"] == 0, m
    assert m["compile"] == "off"
