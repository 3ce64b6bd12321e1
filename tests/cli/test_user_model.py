"""A user's own model (``model._target_``) with BatchNorm and Dropout, imported from the
directory the command runs in, by the leader and by every spawned worker (slow tier)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from hogwild.checkpoint import store as checkpoint
from tests.conftest import REPO, assert_replicas_agree, clean_env, ranks, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NET = ["model._target_=mynets.Net", "+model.width=8"]


def _user_dir(tmp_path: Path) -> Path:
    shutil.copy(REPO / "examples" / "mynets.py", tmp_path / "mynets.py")
    return tmp_path


def _bn_stats(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    sys.path.insert(0, str(REPO / "examples"))
    try:
        from mynets import Net

        from hogwild.replica.shared import layout
    finally:
        sys.path.pop(0)
    slots = {s.name: s for s in layout(Net(10, 1, width=8))}
    return (slots["features.1.running_mean"].view(flat).clone(), slots["features.1.running_var"].view(flat).clone())


def test_batchnorm_statistics_train_checkpoint_resume_and_evaluate(tmp_path: Path) -> None:
    d = _user_dir(tmp_path)
    first = run_cli([*NET, "workers=2", "train.max_steps=200", f"run_dir={d / 'run'}"], cwd=d)
    assert first.returncode == 0, first.stderr[-3000:]
    ck = checkpoint.load(d / "run" / "checkpoints" / "last.pt")
    assert ck["model"] == "mynets.Net"
    mean, var = _bn_stats(ck["flat"])
    assert mean.abs().sum() > 0 and (var - 1).abs().sum() > 0, "running statistics never moved"
    m = json.loads((d / "run" / "metrics.json").read_text())
    assert m["test_accuracy"] > m["chance_accuracy"] + 0.3

    # Resuming at the same step count trains nothing: the final checkpoint must hold exactly
    # the restored values, buffers included.
    again = run_cli([*NET, "workers=2", "train.max_steps=200", "resume=true", f"run_dir={d / 'run'}"], cwd=d)
    assert again.returncode == 0, again.stderr[-3000:]
    assert torch.equal(checkpoint.load(d / "run" / "checkpoints" / "last.pt")["flat"], ck["flat"])

    # hogwild-eval rebuilds the user's model from the checkpoint's config, in eval() mode; the
    # user names the model's code on the command line (a stored _target_ alone is never called).
    ev = run_cli([f"checkpoint={d / 'run' / 'checkpoints' / 'last.pt'}", NET[0]], d, timeout=120,
                 module="hogwild.cli.evaluate")
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert json.loads(ev.stdout.strip().splitlines()[-1])["test_accuracy"] == pytest.approx(m["test_accuracy"])


def test_batchnorm_replicas_agree_bit_for_bit_after_the_final_sync(tmp_path: Path) -> None:
    d = _user_dir(tmp_path)
    # Two ranks as torchrun starts them, without the launcher (tests/conftest.py's ranks).
    proc = ranks(2, [*NET, "workers=2", "train.max_steps=200", "sync.interval=20", f"run_dir={d / 'run'}"],
                 cwd=d, env=clean_env(OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert_replicas_agree(json.loads((d / "run" / "metrics.json").read_text()), 2)
    mean, _ = _bn_stats(checkpoint.load(d / "run" / "checkpoints" / "last.pt")["flat"])
    assert mean.abs().sum() > 0


def test_a_user_dataset_from_the_working_directory_trains_in_spawned_workers(tmp_path: Path) -> None:
    d = _user_dir(tmp_path)
    shutil.copy(REPO / "examples" / "mydata.py", d / "mydata.py")
    proc = run_cli([*NET, "data._target_=mydata.digits", "+data.noise=0.05", "workers=2", "train.epochs=10",
                    f"run_dir={d / 'run'}"], cwd=d)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = json.loads((d / "run" / "metrics.json").read_text())
    assert m["test_accuracy"] >= 0.9 and m["worker_restarts"] == 0
    assert checkpoint.load(d / "run" / "checkpoints" / "last.pt")["config"]["data"]["kwargs"] == {"noise": 0.05}


def test_image_folder_of_digit_pictures(tmp_path: Path) -> None:
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    for i, (img, label) in enumerate(zip(digits.images[:600], digits.target[:600])):
        folder = tmp_path / "pics" / ("val" if i % 5 == 0 else "train") / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray((img * 16).clip(0, 255).astype("uint8")).convert("RGB").save(folder / f"{i}.png")
    # 20 epochs (320 steps): at 10, five runs beside a CPU hog ended at 0.475-0.77 accuracy, and one in
    # the suite at 0.467, on the bar; at 20 they ended at 0.86 and 0.89.
    proc = run_cli(["data=image_folder", f"data.root={tmp_path / 'pics'}", "data.image_size=16", "data.augment=true",
                    "model=convnet", "workers=2", "train.epochs=20", f"run_dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["test_accuracy"] > m["chance_accuracy"] + 0.3, m
