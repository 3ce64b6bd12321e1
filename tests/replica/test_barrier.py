"""optim.update=barrier end to end: real spawned workers meeting at one optimizer state per replica."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from hogwild.checkpoint import store as checkpoint
from hogwild.replica.meeting import STEPS_KEY
from tests.conftest import clean_env, compose_cfg, metrics, run_cli, wait_training
from tests.conftest import run_metrics as run

pytestmark = pytest.mark.timeout(240)
QUIET = ["eval.every_s=1000", "checkpoint.every_s=1000"]


def test_two_adamw_workers_train_on_one_shared_state(tmp_cwd: Path) -> None:
    out = tmp_cwd / "run"
    m = run(compose_cfg(["optim=adamw", "optim.lr=0.005", "workers=2", "train.epochs=10", f"run_dir={out}"]), str(out))
    assert m["update"] == "barrier" and m["test_accuracy"] > 0.9
    # Each optimizer step took the gradients of one round of arrivals: two most of the time.
    assert m["steps"] / 2 <= m["optimizer_steps"] < m["steps"]
    assert 0.1 <= m["wait_bound"] <= 2.0  # within pace.straggler_wait and pace.max_wait
    state = checkpoint.load(out / "checkpoints" / "last.pt")["opt_state"]
    assert set(state) == {"exp_avg", "exp_avg_sq", STEPS_KEY}  # one state for the replica, in the checkpoint
    assert int(state[STEPS_KEY][0]) == m["optimizer_steps"] and state["exp_avg_sq"].abs().sum() > 0


@pytest.mark.parametrize("optim", [["optim=adamw"], ["optim._target_=torch.optim.AdamW", "optim.lr=0.001"]],
                         ids=["flat adamw", "torch AdamW"])
def test_a_resumed_run_takes_the_same_steps_as_an_uninterrupted_one(tmp_cwd: Path, optim: list[str]) -> None:
    """The replica's one optimizer state, its step count and the data positions are all in the
    checkpoint: stopping after 40 steps and resuming to 70 lands on the very weights and moments
    of a run that never stopped (per-worker state, under hogwild, would restart its moments)."""
    base = [*optim, "workers=1", *QUIET]
    straight, split = tmp_cwd / "straight", tmp_cwd / "split"
    run(compose_cfg([*base, "train.max_steps=70", f"run_dir={straight}"]), str(straight))
    run(compose_cfg([*base, "train.max_steps=40", f"run_dir={split}"]), str(split))
    again = run(compose_cfg([*base, "train.max_steps=70", f"run_dir={split}", "resume=true"]), str(split))
    assert Path(again["resumed_from"]).name.startswith("step_000000040-") and again["optimizer_steps"] == 70
    a, b = (checkpoint.load(d / "checkpoints" / "last.pt") for d in (straight, split))
    assert torch.equal(a["flat"], b["flat"])
    assert a["opt_state"].keys() == b["opt_state"].keys()
    for key, value in a["opt_state"].items():
        assert torch.equal(value, b["opt_state"][key]), key


def test_a_poisoned_gradient_never_reaches_the_shared_state(tmp_cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOGWILD_FAULT", "nan:0:3,nan:1:3,nan:1:9")
    out = tmp_cwd / "run"
    m = run(compose_cfg(["optim=adamw", "workers=2", "train.max_steps=60", *QUIET, f"run_dir={out}"]), str(out))
    assert m["skipped_nonfinite"] == 3 and m["steps"] == 57
    ck = checkpoint.load(out / "checkpoints" / "last.pt")
    assert torch.isfinite(ck["flat"]).all() and all(torch.isfinite(v).all() for v in ck["opt_state"].values())


@pytest.mark.parametrize("update", ["barrier", "hogwild"])
def test_a_frozen_parameter_is_never_stepped(tmp_cwd: Path, update: str) -> None:
    out = tmp_cwd / "run"
    m = run(compose_cfg(["model._target_=tests.user_models.PartlyFrozen", "optim=adamw", "optim.weight_decay=0.1",
                         f"optim.update={update}", "workers=2", "train.max_steps=40", *QUIET, f"run_dir={out}"]),
              str(out))
    assert m["update"] == update
    sd = checkpoint.load(out / "checkpoints" / "last.pt")["state_dict"]
    assert bool((sd["features.weight"] == 0.01).all())  # no gradient and no weight decay reached it
    assert m["steps"] == 40 and m["skipped_nonfinite"] == 0


def test_accumulated_batches_make_one_step(tmp_cwd: Path) -> None:
    out = tmp_cwd / "run"
    m = run(compose_cfg(["optim=adamw", "workers=2", "train.max_steps=80", "train.accumulate=4", *QUIET,
                         f"run_dir={out}"]), str(out))
    # 80 batches, 4 to a worker's update and a step of two workers' updates: 10 steps when every
    # step took both (a late update makes a step of its own).
    assert m["steps"] == 20 and 10 <= m["optimizer_steps"] <= 20


@pytest.mark.slow
def test_a_slow_worker_holds_no_step_past_the_bound(tmp_path: Path) -> None:
    """Worker 1 takes 400 ms a step, worker 0 a few: worker 0's steps wait for it at most
    pace.max_wait times worker 0's own gradient's time, so worker 0 makes its steps alone instead
    of one per 400 ms, and the workers' waits stay far below the 20 x 400 ms that waiting would take.
    pace.balance=false pace.chunks=1: the bound alone, whole batches."""
    out = tmp_path / "run"
    proc = run_cli(["optim=adamw", "workers=2", "train.max_steps=40", "pace.balance=false", "pace.chunks=1", *QUIET,
                    f"run_dir={out}"], cwd=tmp_path, env=clean_env(HOGWILD_FAULT="slow:1:400"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = metrics(out)
    assert m["steps"] == 40 and m["optimizer_steps"] >= 30  # paired, they would have made 20
    assert m["barrier_wait_s"] < 1.5, m["barrier_wait_s"]


@pytest.mark.slow
def test_a_slow_worker_computes_on_part_of_each_batch(tmp_path: Path) -> None:
    """pace.balance (pace.chunks=1): worker 0 takes 40 ms a step and worker 1 120 ms, so worker 1
    computes its batches in parts (thirds, each a third as slow) while both run; every
    sample is trained on once, as by workers of equal speed with pace.balance=false (that job runs
    at full speed: which samples a worker reads does not depend on its pace), and metrics.json counts
    the parts."""
    def job(balance: bool, fault: str) -> dict[str, Any]:
        out = tmp_path / str(balance)
        proc = run_cli(["optim=adamw", "workers=2", "train.max_steps=80", "train.batch_size=32", *QUIET,
                        f"pace.balance={str(balance).lower()}", "pace.chunks=1", f"run_dir={out}"], cwd=tmp_path,
                       env=clean_env(HOGWILD_FAULT=fault))
        assert proc.returncode == 0, proc.stderr[-3000:]
        return metrics(out)

    on, off = job(True, "slow:0:40,slow:1:120"), job(False, "")
    assert on["steps"] == off["steps"] == 80 and on["samples"] == off["samples"] and off["batch_parts"] == 0
    assert on["batch_parts"] >= 5, on["batch_parts"]  # a dozen of worker 1's gradients while worker 0 runs


@pytest.mark.slow
def test_a_slow_worker_in_chunks_hands_in_what_it_has_when_the_other_is_in(tmp_path: Path) -> None:
    """pace.chunks=4: worker 0 takes 40 ms a batch and worker 1 120 ms (30 ms a chunk). Once worker
    0's gradient is in and worker 1's rest would come after the bound, worker 1 hands in the chunks
    it has; the rest of its batch is its next part. Every sample is trained on once, as by workers of
    equal speed in whole batches."""
    def job(chunks: int, fault: str, *extra: str) -> dict[str, Any]:
        out = tmp_path / str(chunks)
        proc = run_cli(["optim=adamw", "workers=2", "train.max_steps=60", "train.batch_size=32", *QUIET,
                        f"pace.chunks={chunks}", *extra, f"run_dir={out}"], cwd=tmp_path,
                       env=clean_env(HOGWILD_FAULT=fault))
        assert proc.returncode == 0, proc.stderr[-3000:]
        return metrics(out)

    # The reference computes whole batches whatever the host does: with pace.balance on, a worker slowed
    # for a moment by a busy neighbour had one batch cut (1 run in 20 beside a CPU hog).
    on, off = job(4, "slow:0:40,slow:1:120"), job(1, "", "pace.balance=false")
    assert on["steps"] == off["steps"] == 60 and on["samples"] == off["samples"] and off["batch_parts"] == 0
    assert on["batch_parts"] >= 5, on["batch_parts"]  # about one of worker 1's batches in two goes in parts


@pytest.mark.slow
def test_a_dead_worker_holds_no_step_while_it_is_respawned(tmp_path: Path) -> None:
    """A worker killed with SIGKILL mid-run is respawned, which takes over 10 s here (a respawn's
    warm-up is slowed, the first start's is not): its peer's steps go on without it meanwhile, and
    the run ends with every step."""
    from tests.leader.test_faults import _start, _wait_training

    out = tmp_path / "run"
    env = clean_env(HOGWILD_FAULT="slow:0:30,slow:1:30,rewarm:0:10000,rewarm:1:10000")
    proc = _start(tmp_path, "optim=adamw", "workers=2", "train.max_steps=400", *QUIET, f"run_dir={out}", env=env)
    victim = _wait_training(proc, 2)[1]
    wait_training(out, proc)
    time.sleep(0.5)
    os.kill(victim, signal.SIGKILL)
    log, _ = proc.communicate(timeout=200)
    assert proc.returncode == 0, log[-3000:]
    m = metrics(out)
    assert m["worker_restarts"] == 1 and m["steps"] == 400
    # Waiting for the respawn would take 10 s and more. The steps' ordinary waits add up too: 3.9 s
    # over the run's 400 batches beside two busy processes and two other tests on 2 cores.
    assert m["barrier_wait_s"] < 6.0, m["barrier_wait_s"]


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_barrier_trains_on_a_gpu(tmp_cwd: Path) -> None:
    """On CUDA the rows and the state live on the GPU (CUDA IPC, as the model does); a worker
    synchronizes its stream before it says its row or its shard is written."""
    out = tmp_cwd / "run"
    m = run(compose_cfg(["device=cuda", "optim=adamw", "optim.lr=0.005", "workers=2", "train.epochs=10",
                         f"run_dir={out}"]), str(out))
    assert m["update"] == "barrier" and m["test_accuracy"] > 0.9 and m["optimizer_steps"] >= m["steps"] / 2
