"""Real torchrun jobs: 2 simulated machines x 2 workers on loopback (slow tier)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import clean_env, metrics, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _job(tmp_path: Path, name: str, *args: str) -> tuple[dict, list[torch.Tensor]]:
    out, dump = tmp_path / name, tmp_path / f"{name}_final"
    dump.mkdir()
    env = clean_env(OMP_NUM_THREADS="1", HOGWILD_DUMP_FINAL=str(dump))
    proc = torchrun(2, ["workers=2", f"run_dir={out}", *args], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    finals = [torch.load(dump / f"rank{r}.pt", weights_only=True) for r in range(2)]
    return metrics(out), finals


def test_two_replicas_average_reach_bar_and_agree_bit_for_bit(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    m, finals = _job(tmp_path, "avg", "sync.interval=20")
    assert m["replicas"] == 2 and m["workers"] == 2
    assert m["test_accuracy"] >= 0.95
    assert m["syncs"] > 0 and m["max_drift"] > 0
    assert torch.equal(finals[0], finals[1]), "replicas differ after the final sync"
    acc = EventAccumulator(str(tmp_path / "avg" / "tb"))
    acc.Reload()
    assert {"sync/drift_mean", "sync/drift_max"} <= set(acc.Tags()["scalars"])
    assert len(list((tmp_path / "avg" / "checkpoints").glob("step_*.pt"))) >= 1
    assert not (tmp_path / "avg" / "checkpoints" / "rank1").exists()


def test_broadcast_mode(tmp_path: Path) -> None:
    m, finals = _job(tmp_path, "bc", "sync.mode=broadcast", "sync.interval=20")
    assert m["sync_mode"] == "broadcast" and m["syncs"] > 0 and m["test_accuracy"] >= 0.9
    assert torch.equal(finals[0], finals[1])


def test_interval_bounds_drift(tmp_path: Path) -> None:
    small, _ = _job(tmp_path, "small", "sync.interval=5", "train.epochs=30")
    large, _ = _job(tmp_path, "large", "sync.interval=100000", "train.epochs=30")
    assert large["syncs"] < small["syncs"]
    assert large["mean_drift"] > 2 * small["mean_drift"], (small, large)
