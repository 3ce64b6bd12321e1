"""hogwild from Python: ``train`` returns a typed result or raises, the caller's signal handlers
come back, and checkpoints load into the user's own module, with hogwild or without it
(``hogwild-export``). Fast tier (each run is a few seconds of one worker on the digits) but
for the export CLI's subprocesses."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hogwild
from tests.conftest import REPO, clean_env, run_cli

pytestmark = pytest.mark.timeout(240)

QUICK = ["workers=1", "train.max_steps=60", "eval.every_s=100"]
NET = ["model._target_=mynets.Net", "+model.width=8"]


@pytest.fixture
def user_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/mynets.py importable here and in the spawned workers (they inherit sys.path)."""
    monkeypatch.syspath_prepend(str(REPO / "examples"))


def _accuracy(model: torch.nn.Module, overrides: list[str]) -> float:
    """The model's test accuracy, computed without hogwild's evaluation code."""
    from hogwild.data.datasets import load_dataset

    ds = load_dataset(hogwild.compose(overrides).data)
    model.eval()
    with torch.no_grad():
        pred = model(*ds.test.inputs).argmax(dim=1)
    return float((pred == ds.test.targets).float().mean())


def test_train_returns_the_result_and_gives_the_signal_handlers_back(tmp_path: Path) -> None:
    def mine(signum: int, frame: object) -> None:
        pass

    before = signal.signal(signal.SIGINT, mine)
    try:
        result = hogwild.train([*QUICK, f"run_dir={tmp_path / 'run'}"])
        assert signal.getsignal(signal.SIGINT) is mine, "the run kept its SIGINT handler"
    finally:
        signal.signal(signal.SIGINT, before)
    assert result.ok and result.status == "ok" and result.error is None
    assert result.run_dir == tmp_path / "run"
    assert result.checkpoint == tmp_path / "run" / "checkpoints" / "last.pt"
    assert result.metrics is not None and result.metrics["steps"] == 60
    assert result.metrics["test_accuracy"] > result.metrics["chance_accuracy"] + 0.3


def test_a_bad_setting_raises_one_line_naming_the_key_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(hogwild.ConfigError) as info:
        hogwild.train(["optim.lr=-1", f"run_dir={tmp_path / 'run'}"])
    assert str(info.value).startswith("optim.lr") and "\n" not in str(info.value)
    assert not (tmp_path / "run").exists()
    with pytest.raises(hogwild.ConfigError, match="train.epoch"):
        hogwild.train({"train.epoch": 3})


def test_a_failed_run_raises_with_its_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOGWILD_FAULT", "nan:0:5")  # the worker's step 5 has a NaN gradient
    with pytest.raises(hogwild.RunFailed) as info:
        hogwild.train([*QUICK, "fault.max_nonfinite=0", f"run_dir={tmp_path / 'run'}"])
    result = info.value.result
    assert result.status == "training_failed" and result.exit_code == 4
    assert "non-finite" in str(info.value)


def test_a_checkpoint_loads_into_the_users_own_module(tmp_path: Path, user_code: None) -> None:
    from mynets import Net

    overrides = [*QUICK, *NET, f"run_dir={tmp_path / 'run'}"]
    # A dict works too, and a class is named by its import path for the spawned workers.
    result = hogwild.train({"model._target_": Net, "+model.width": 8, "workers": 1, "train.max_steps": 60,
                            "eval.every_s": 100, "run_dir": tmp_path / "run"})
    assert result.checkpoint is not None and result.metrics is not None
    # Plain torch, as serving code would: the checkpoint's state_dict has the module's own names,
    # BatchNorm's buffers (num_batches_tracked too) included, so a strict load works.
    state = torch.load(result.checkpoint, weights_only=True)["state_dict"]
    assert set(state) == set(Net(10, 1, width=8).state_dict())
    model = Net(10, 1, width=8)
    model.load_state_dict(state)
    assert _accuracy(model, overrides) == pytest.approx(result.metrics["test_accuracy"], abs=1e-6)
    loaded = hogwild.load_model(result.checkpoint, model=Net(10, 1, width=8))
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in state.items())
    with pytest.raises(hogwild.UserError, match="does not fit"):
        hogwild.load_model(result.checkpoint, model=Net(10, 1, width=4))


def test_load_model_builds_the_checkpoints_model_and_never_runs_a_stored_target_unasked(
        tmp_path: Path, user_code: None) -> None:
    plain = hogwild.train([*QUICK, f"run_dir={tmp_path / 'mlp'}"])
    assert plain.checkpoint is not None
    mlp = hogwild.load_model(plain.checkpoint)
    assert plain.metrics is not None
    assert _accuracy(mlp, QUICK) == pytest.approx(plain.metrics["test_accuracy"], abs=1e-6)

    user = hogwild.train([*QUICK, *NET, f"run_dir={tmp_path / 'net'}"])
    assert user.checkpoint is not None
    with pytest.raises(hogwild.UserError, match="model._target_"):
        hogwild.load_model(user.checkpoint)
    assert type(hogwild.load_model(user.checkpoint, trust_targets=True)).__name__ == "Net"


def _export(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(args, cwd, timeout=120, module="hogwild.cli.export")


@pytest.mark.slow  # a subprocess of the CLI, and a second interpreter
def test_export_writes_a_state_dict_that_loads_without_hogwild(tmp_path: Path) -> None:
    result = hogwild.train([*QUICK, f"run_dir={tmp_path / 'run'}"])
    out = tmp_path / "weights.pt"
    proc = _export([f"checkpoint={result.checkpoint}", f"out={out}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # A fresh interpreter that never imports hogwild: a plain torch module of the same shape.
    check = subprocess.run([sys.executable, "-c", (
        "import sys, torch\n"
        "from torch import nn\n"
        "class MLP(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.fc1 = nn.Linear(64, 128); self.fc2 = nn.Linear(128, 10)\n"
        f"m = MLP(); m.load_state_dict(torch.load({str(out)!r}, weights_only=True))\n"
        "assert 'hogwild' not in sys.modules\n"
        "print(sorted(m.state_dict()))")], capture_output=True, text=True, timeout=120, env=clean_env())
    assert check.returncode == 0, check.stderr[-2000:]
    assert "fc1.weight" in check.stdout


@pytest.mark.slow  # a subprocess of the CLI each
@pytest.mark.parametrize("args, key", [
    (["checkpoint=ck.pt"], "out"),
    (["out=w.pt"], "checkpoint"),
    (["checkpoint=missing.pt", "out=w.pt"], "checkpoint"),
    (["checkpoint=CK", "out=no/such/dir/w.pt"], "out"),
])
def test_export_refuses_bad_input_in_one_line(tmp_path: Path, args: list[str], key: str) -> None:
    if "checkpoint=CK" in args:
        result = hogwild.train([*QUICK, "train.max_steps=10", f"run_dir={tmp_path / 'run'}"])
        args = [f"checkpoint={result.checkpoint}" if a == "checkpoint=CK" else a for a in args]
    proc = _export(args, tmp_path)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"hogwild: error: {key}"), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow  # a subprocess of the CLI each
@pytest.mark.parametrize("where", ["the checkpoint itself", "last.pt beside it", "a new file beside it"])
def test_export_never_writes_over_the_run_s_checkpoints(tmp_path: Path, where: str) -> None:
    import hashlib

    result = hogwild.train([*QUICK, "train.max_steps=10", f"run_dir={tmp_path / 'run'}"])
    assert result.checkpoint is not None
    folder = result.checkpoint.parent
    step_file = sorted(folder.glob("step_*.pt"))[-1]
    out = {"the checkpoint itself": step_file, "last.pt beside it": folder / "last.pt",
           "a new file beside it": folder / "model.pt"}[where]
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}
    proc = _export([f"checkpoint={step_file}", f"out={out}"], tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("hogwild: error: out:"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()} == before


@pytest.mark.slow  # a fresh interpreter
def test_a_script_without_a_main_guard_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text("import hogwild\nhogwild.train(['train.epochs=1', 'run_dir=run'])\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=clean_env())
    assert proc.returncode != 0
    assert "hogwild.errors.ConfigError" in proc.stderr and "if __name__ ==" in proc.stderr
    assert "unguarded.py: calls hogwild.train at its top level" in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing started, no worker re-ran the script


@pytest.mark.slow  # a fresh interpreter
def test_a_guarded_script_trains_through_the_api_with_its_own_module_in_the_workers(tmp_path: Path) -> None:
    """The user's script as the README shows it: the workers are spawned, and they import the
    script's own model class from its __main__ (the guard keeps them from training again)."""
    script = tmp_path / "train_mine.py"
    script.write_text(
        "import torch, hogwild\n"
        "class Mine(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(64, 10)\n"
        "    def forward(self, x):\n"
        "        return self.fc(x.flatten(1))\n"
        "if __name__ == '__main__':\n"
        "    r = hogwild.train(['model._target_=__main__.Mine', 'workers=2', 'train.max_steps=40', 'run_dir=run'])\n"
        "    print('RESULT', r.status.value, r.metrics['steps'], r.metrics['workers'])\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RESULT ok 40 2" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_a_run_dir_that_cannot_exist_is_a_user_error_not_an_os_error(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(hogwild.UserError, match=r"^run_dir: cannot create .*Too many levels of symbolic links"):
        hogwild.train([*QUICK, f"run_dir={loop / 'x'}"])
