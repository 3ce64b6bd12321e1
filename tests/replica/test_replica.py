"""One replica end to end: real spawned workers on one shared model.

Full trainings are the slow tier; the two short in-process checks of the update rule and of
resuming stay in the fast tier."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hogwild.checkpoint import store as checkpoint
from hogwild.data.datasets import ShardSampler, load_dataset, shard
from hogwild.replica.models import build_model
from hogwild.replica.shared import layout
from tests.conftest import compose_cfg, metrics, run_cli
from tests.conftest import run_metrics as run

pytestmark = pytest.mark.timeout(240)
slow = pytest.mark.slow

REQUIRED_KEYS = {"test_accuracy", "test_loss", "train_loss", "steps", "samples_per_s", "wall_s", "workers"}


def _scalar_counts(tb_dir: Path) -> dict[str, int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: len(acc.Scalars(tag)) for tag in acc.Tags()["scalars"]}


@slow
def test_default_run_meets_accuracy_bar_and_writes_outputs(tmp_path: Path) -> None:
    proc = run_cli([f"run_dir={tmp_path / 'run'}", "train.log_every_s=0.2"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "run"
    m = metrics(out)
    assert REQUIRED_KEYS <= m.keys()
    assert m["test_accuracy"] >= 0.95
    assert m["workers"] >= 1 and m["steps"] > 0 and m["samples_per_s"] > 0
    assert "outputs in" in proc.stdout + proc.stderr
    # Nothing but the run's own lines: no warning from a worker's start (replica/start.py).
    assert "Warning" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    # Off a terminal the progress is a plain log line with percentage, rate and time left.
    assert re.search(r"\d+% \d+/\d+ steps \[\d\d:\d\d<\d\d:\d\d, [\d.]+step/s, loss [\d.]+ \| [\d,]+ samples/s",
                     proc.stdout + proc.stderr), proc.stderr[-2000:]
    ckpt = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["counters"]["steps"] == m["steps"] and ckpt["config"]["model"]["name"] == "mlp"
    counts = _scalar_counts(out / "tb")
    assert {"train/loss", "test/accuracy", "perf/samples_per_s", "perf/samples_per_s_worker0"} <= counts.keys()
    # A curve to look at even though the default run trains for about a second.
    assert counts["train/loss"] >= 50 and counts["test/accuracy"] >= 20, counts
    assert list((out / "tb" / "hparams").glob("events.*"))
    ev = run_cli([f"checkpoint={out / 'checkpoints' / 'last.pt'}"], cwd=tmp_path, module="hogwild.cli.evaluate")
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout.strip().splitlines()[-1])["test_accuracy"] == pytest.approx(m["test_accuracy"])


def test_one_worker_equals_plain_sgd(tmp_cwd: Path) -> None:
    """Same seed, same batches: the Hogwild update rule is exactly SGD."""
    cfg = compose_cfg(["workers=1", "train.max_steps=60", "train.batch_size=16", "optim.lr=0.05",
                       f"run_dir={tmp_cwd / 'run'}"])
    m = run(cfg, str(tmp_cwd / "run"))
    assert m["steps"] == 60
    hog = checkpoint.load(tmp_cwd / "run" / "checkpoints" / "last.pt")["flat"]

    ds = load_dataset(cfg.data)
    model = build_model(cfg.model, ds, cfg.train.seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sampler = ShardSampler(shard(len(ds.train), 1, 0, cfg.train.seed), 16, cfg.train.seed)
    for step in range(60):
        (x,), y = ds.train.batch(sampler.batch(step))
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    ref = torch.cat([p.detach().flatten() for p in model.parameters()])
    torch.testing.assert_close(hog, ref, rtol=1e-5, atol=1e-6)


@slow
def test_every_worker_writes_the_same_shared_model(tmp_cwd: Path) -> None:
    """Sparse rows used by exactly one worker's shard change in the one final model."""
    k = 3
    over = ["model=sparse_linear", "data=sparse_synthetic", "data.num_samples=600",
            "data.num_features=4096", "data.active_features=4", f"workers={k}", "train.epochs=1",
            "optim.lr=0.5", f"run_dir={tmp_cwd / 'run'}"]
    cfg = compose_cfg(over)
    m = run(cfg, str(tmp_cwd / "run"))
    assert m["workers"] == k
    flat = checkpoint.load(tmp_cwd / "run" / "checkpoints" / "last.pt")["flat"]
    ds = load_dataset(cfg.data)
    slot = next(s for s in layout(build_model(cfg.model, ds, 0)) if s.name == "weight.weight")
    weight = slot.view(flat)
    owners: dict[int, set[int]] = {}
    for w in range(k):
        rows = ds.train.inputs[0][shard(len(ds.train), k, w, cfg.train.seed)].unique().tolist()
        for r in rows:
            owners.setdefault(r, set()).add(w)
    for w in range(k):
        own = [r for r, ws in owners.items() if ws == {w}]
        assert own and (weight[own] != 0).any(1).float().mean() > 0.9, f"worker {w}'s updates missing"
    unused = sorted(set(range(4096)) - owners.keys())
    assert unused and bool((weight[unused] == 0).all()), "rows no sample uses must stay untouched"


def test_resume_continues_from_checkpoint(tmp_cwd: Path) -> None:
    out = tmp_cwd / "run"
    first = run(compose_cfg(["workers=2", "train.max_steps=40", f"run_dir={out}"]), str(out))
    assert first["steps"] == 40
    again = run(compose_cfg(["workers=2", "train.max_steps=100", f"run_dir={out}", "resume=true"]), str(out))
    assert Path(again["resumed_from"]).name.startswith("step_000000040-")
    assert again["steps"] == 100  # 40 restored + 60 more: the data position carried over
    assert again["steps_lost_on_resume"] == 0  # the first run ended with a final checkpoint


def test_a_run_to_a_target_reports_the_time_and_steps_per_worker_it_took(tmp_cwd: Path) -> None:
    out = tmp_cwd / "run"
    m = run(compose_cfg(["workers=2", "train.target_accuracy=0.9", "eval.every_s=0.05", f"run_dir={out}"]), str(out))
    # The model handed back meets the target that stopped the run, though the workers trained on
    # after the evaluation that met it.
    assert m["time_to_target_s"] > 0 and m["test_accuracy"] >= 0.9 and m["target_held"] is True
    quota = 40 * len(load_dataset(compose_cfg([]).data).train) // (2 * 32)  # 40 epochs of a half shard
    # Stopped at the target, long before the epochs ran out, and counted per worker: two workers
    # made about the job's steps at that moment, half each.
    assert 0 < m["worker_steps_to_target"] <= m["steps"] / 2 < quota


def test_steps_lost_on_resume_is_exact(tmp_cwd: Path) -> None:
    """The newest checkpoint is gone (as if the crash came before it was written): the resumed
    run counts exactly the steps the previous attempt made beyond the one it resumes."""
    out = tmp_cwd / "run"
    run(compose_cfg(["workers=2", "train.max_steps=40", f"run_dir={out}"]), str(out))
    run(compose_cfg(["workers=2", "train.max_steps=100", f"run_dir={out}", "resume=true"]), str(out))
    newest = checkpoint.load(out / "checkpoints" / "last.pt")
    assert newest["counters"]["steps"] == 100
    for p in (out / "checkpoints").glob("*.pt"):
        if checkpoint.load(p)["counters"]["steps"] == 100:
            p.unlink()  # last.pt and its step file: never written
    again = run(compose_cfg(["workers=2", "train.max_steps=120", f"run_dir={out}", "resume=true"]), str(out))
    assert Path(again["resumed_from"]).name.startswith("step_000000040-")
    assert again["steps_lost_on_resume"] == 100 - 40


@slow
def test_multirun_sweeps_learning_rates(tmp_path: Path) -> None:
    proc = run_cli(["-m", "optim.lr=0.05,0.2", "train.max_steps=30", "workers=1",
                    f"run_dir={tmp_path / 'sweep'}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = sorted(d for d in (tmp_path / "sweep").iterdir() if d.is_dir())
    lrs = sorted(checkpoint.load(d / "checkpoints" / "last.pt")["config"]["optim"]["lr"] for d in jobs)
    assert lrs == [0.05, 0.2]
    for d in ("0", "1"):
        assert metrics(tmp_path / "sweep" / d)["steps"] == 30


@slow
def test_shared_adam_state_trains(tmp_cwd: Path) -> None:
    out = tmp_cwd / "run"
    m = run(compose_cfg(["optim=adam", "optim.lr=0.005", "optim.update=hogwild", "optim.state=shared", "workers=2",
                         "train.epochs=10", f"run_dir={out}"]), str(out))
    assert m["test_accuracy"] > 0.9
    ck = checkpoint.load(out / "checkpoints" / "last.pt")
    assert set(ck["opt_state"]) == {"exp_avg", "exp_avg_sq"} and ck["opt_state"]["exp_avg_sq"].abs().sum() > 0


@slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_shared_model_trains(tmp_cwd: Path) -> None:
    out = tmp_cwd / "run"
    m = run(compose_cfg(["device=cuda", "workers=2", f"run_dir={out}"]), str(out))
    assert m["test_accuracy"] >= 0.95


@slow
def test_seed_makes_runs_reproducible_and_distinct(tmp_cwd: Path) -> None:
    def final(seed: int, name: str) -> torch.Tensor:
        out = tmp_cwd / name
        run(compose_cfg(["workers=1", "train.max_steps=30", f"train.seed={seed}", f"run_dir={out}"]), str(out))
        return checkpoint.load(out / "checkpoints" / "last.pt")["flat"]

    a, b, c = final(0, "a"), final(0, "b"), final(1, "c")
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@slow
def test_workers_do_not_oversubscribe_cores_and_leader_sleeps(tmp_cwd: Path) -> None:
    import os
    import time

    out = tmp_cwd / "run"
    cpu0, wall0 = time.process_time(), time.monotonic()
    m = run(compose_cfg(["workers=2", "train.epochs=60", f"run_dir={out}"]), str(out))
    leader_cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    assert m["workers"] * m["threads_per_worker"] <= max(len(os.sched_getaffinity(0)), m["workers"])
    # Setup (data, model, final eval) costs ~1 s of CPU; training itself must cost the leader ~nothing.
    assert leader_cpu - 1.5 < 0.1 * m["train_s"], (leader_cpu, m["train_s"], wall)


@slow
def test_sparse_logistic_regression_learns(tmp_cwd: Path) -> None:
    out = tmp_cwd / "run"
    m = run(compose_cfg(["+experiment=sparse", "workers=2", f"run_dir={out}"]), str(out))
    assert m["test_accuracy"] > 0.9  # balanced classes: chance is 0.5


def test_bf16_on_a_cpu_without_native_bf16_says_so_in_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                                ) -> None:
    import logging

    from hogwild.replica.build import cpu_has_native_bf16, warn_slow_bf16
    from tests.conftest import compose_cfg

    old, new = tmp_path / "old", tmp_path / "new"
    old.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\n")
    new.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n")
    assert cpu_has_native_bf16(str(old)) is False and cpu_has_native_bf16(str(new)) is True
    assert cpu_has_native_bf16(str(tmp_path / "none")) is None
    cfg = compose_cfg(["train.precision=bf16", f"run_dir={tmp_path}"])
    with caplog.at_level(logging.WARNING, "hogwild.replica.build"):
        warn_slow_bf16(cfg, torch.device("cpu"), str(new))
        warn_slow_bf16(compose_cfg([f"run_dir={tmp_path}"]), torch.device("cpu"), str(old))  # fp32: nothing
        assert caplog.records == []
        warn_slow_bf16(cfg, torch.device("cpu"), str(old))
    assert len(caplog.records) == 1 and "no native bf16" in caplog.records[0].getMessage()
