"""The benchmark keeps working: two cheap sections at smoke size (no timing asserted)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, clean_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_bench_sections_train_every_method_and_measure_the_sync_round(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "races" / "bench.py"), "--tiny", "--only",
                           "final,sync", "--out", str(tmp_path)], capture_output=True, text=True, timeout=280,
                          env=clean_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    final = res["final_accuracy"]
    methods = {k: v for k, v in final.items() if k != "epochs"}
    assert methods.keys() == {"single", "ddp", "mnist_hogwild", "hogwild 1x2", "hogwild 2x1 average",
                              "hogwild 2x1 slowmo"}
    # Every method of the comparison really trains (chance on digits is 0.1).
    assert all(v["median"] > 0.5 for v in methods.values()), methods
    for rule in ("average", "slowmo"):  # the round of each rule against the same bare all_reduce
        sync = res["sync"][f"mlp_digits {rule}"]
        assert sync["bare_allreduce_s"] > 0 and math.isfinite(sync["ratio"]) and sync["ratio"] > 0
    table = (tmp_path / "table.md").read_text()
    assert "| ddp |" in table and "| mlp_digits | 9,610 | slowmo |" in table


def test_bench_rejects_an_unknown_section(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "races" / "bench.py"), "--only", "nope",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=60, env=clean_env())
    assert proc.returncode == 2 and "unknown section(s) nope" in proc.stderr


def test_gpu_bench_checks_its_sections_then_says_when_there_is_no_gpu(tmp_path: Path) -> None:
    script = [sys.executable, str(REPO / "scripts" / "device" / "gpu.py")]
    bad = subprocess.run([*script, "--only", "sync,nope", "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=60, env=clean_env())
    assert bad.returncode == 2 and "unknown section(s) nope" in bad.stderr
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the benchmark would run")
    none = subprocess.run([*script, "--only", "sync", "--out", str(tmp_path / "g")], capture_output=True, text=True,
                          timeout=60, env=clean_env())
    assert none.returncode == 1 and none.stderr.strip() == (
        "gpu.py: no CUDA GPU is visible (torch.cuda.is_available() is False)")
    assert not (tmp_path / "g").exists(), "nothing is written without a GPU"


def _script(name: str) -> object:
    """A script as a module, by its package path (``races.link``: scripts/races/link.py)."""
    import importlib

    return importlib.import_module(f"scripts.{name}")


def test_link_median_counts_a_missed_run_as_slower_than_every_run_that_reached_the_target() -> None:
    link = _script("races.link")

    def run(t: object) -> dict[str, object]:
        return {"time_to_target_s": t, "test_accuracy": 0.96, "bytes_per_step": 1.0, "tx_bytes_per_step": 1.0}

    # Dropping the miss would give 0.4 s; counted, it is the slowest of three: the median is 0.5 s.
    res = link.summary({}, {"a": [run(0.3), run(None), run(0.5)], "b": [run(float("nan")), run(None), run(0.2)]})
    assert res["methods"]["a"]["median_s"] == 0.5 and res["methods"]["a"]["missed"] == 1
    assert res["methods"]["b"]["median_s"] == math.inf and res["methods"]["b"]["missed"] == 2


def test_outer_rules_reports_each_seed_and_refuses_an_unknown_rule(tmp_path: Path) -> None:
    script = [sys.executable, str(REPO / "scripts" / "models" / "outer_rules.py")]
    bad = subprocess.run([*script, "--rules", "slowmo,nope"], capture_output=True, text=True, timeout=60,
                         env=clean_env())
    assert bad.returncode == 2 and "--rules: unknown nope" in bad.stderr
    out = tmp_path / "rules"
    proc = subprocess.run([*script, "--rules", "slowmo,diloco", "--seeds", "2", "--rounds", "3", "--target", "0.5",
                           "--out", str(out)], capture_output=True, text=True, timeout=120, env=clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(out.with_suffix(".json").read_text())["runs"]
    assert set(runs) == {"slowmo", "diloco"} and all(len(v) == 2 for v in runs.values())
    # The digits mlp passes 0.5 within a few rounds; a count is always a whole number of rounds.
    assert all(r["steps"] in (50, 100, 150) for v in runs.values() for r in v), runs
    assert "| slowmo |" in out.with_suffix(".md").read_text()


def test_hogwild_bench_reads_a_finished_run_as_it_reports_itself(tmp_path: Path) -> None:
    """What hogwild.bench reads of a run's own files (the board, the checkpoints) and its memory
    sampler agree with the run's metrics.json: a change of those layouts fails here, not in a
    benchmark the next time it runs."""
    from hogwild.bench import PeakPss, checkpoints, last_checkpoint, read_board

    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "hogwild.cli.train", "workers=1", "train.max_steps=40",
                             "checkpoint.every_s=0.05", "eval.every_s=60", f"run_dir={run_dir}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=clean_env(), cwd=tmp_path)
    with PeakPss(proc.pid, every_s=0.05) as peak:
        _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    steps = json.loads((run_dir / "metrics.json").read_text())["steps"]
    board = read_board(run_dir)
    assert board is not None and board.applied == steps and board.pos >= steps and board.base_steps == 0
    assert read_board(run_dir, rank=1) is None and read_board(tmp_path / "nothing") is None
    last, every = last_checkpoint(run_dir), checkpoints(run_dir)
    assert last is not None and last.path.name == "last.pt" and last.steps == steps and last.syncs == 0
    assert every and [c.written_at for c in every] == sorted(c.written_at for c in every)
    assert every[-1].sequence == last.sequence and [c.sequence for c in every] == sorted({c.sequence for c in every})
    assert last.positions is not None and float(last.positions.sum()) >= steps
    assert last_checkpoint(tmp_path / "nothing") is None and checkpoints(tmp_path / "nothing") == []
    if sys.platform.startswith("linux"):
        assert peak.peak_mib > 50  # an interpreter with torch, and its worker


def test_hogwild_bench_reads_the_coordinator_as_an_elastic_job_writes_it() -> None:
    import numpy as np
    import torch.distributed as dist

    from hogwild.bench import Coordinator
    from hogwild.elastic.membership import Epoch
    from hogwild.leader.elastic import slot_record
    from hogwild.replica.board import Counts
    from tests.conftest import free_port

    port = free_port()
    stop = Coordinator.serve(port)
    try:
        view = Coordinator(port)
        assert not view.whole(2) and view.position(1) is None  # no epoch formed, nothing published
        store = dist.TCPStore("127.0.0.1", port, is_master=False)
        for key, value in slot_record(1, np.array([5.0, 7.0]), Counts()).items():
            store.set(key, value)
        store.set("members/1", Epoch(1, (0, 1)).encode())
        store.set("epoch", "1")
        assert view.position(1) == 12.0 and view.whole(2)
        store.set("want/1", "1")  # slot 1 asks to join again
        assert not view.whole(2)
    finally:
        stop.set()
    assert not Coordinator(free_port(), timeout_s=0.5).whole(2)  # nobody there: not whole, no exception


def test_quality_by_replicas_splits_a_global_batch_over_the_replicas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    quality = _script("races.quality_by_replicas")
    given: list[tuple[int, int]] = []

    def one(arm: list[str], replicas: int, batches: int, target: float, work: Path, step_ms: int,
            batch: int = 32) -> dict[str, object]:
        given.append((replicas, batch))
        return {"samples_to_target": 1000.0 * replicas}

    monkeypatch.setattr(quality, "one", one)
    argv = ["quality_by_replicas.py", "--replicas", "2", "16", "--arms", "default", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", [*argv, "--global-batch", "64"])
    quality.main()
    assert given == [(2, 32), (16, 4)]  # 64 samples a round at either R
    assert "global batch 64" in (tmp_path / "quality_by_r.md").read_text()
    monkeypatch.setattr(sys, "argv", [*argv, "--global-batch", "24"])
    with pytest.raises(SystemExit) as refused:
        quality.main()
    assert refused.value.code == 2 and "--global-batch 24: not a multiple of every --replicas count" in \
        capsys.readouterr().err


def test_adam_staleness_replicas_split_a_global_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    model = _script("models.adam_staleness")
    given: list[tuple[int, int, int]] = []

    def replicas_run(mode: str, replicas: int, interval: int, gradients: int, lr: float, seed: int,
                     outer: object = None, batch: int = 32) -> dict[str, object]:
        given.append((replicas, gradients // replicas, batch))
        return {"test_loss": 1.5, "steps": gradients // replicas, "computed": gradients, "applied": gradients,
                "dropped": 0, "virtual_time": 0.0, "rounds": 1}

    monkeypatch.setattr(model, "replicas_run", replicas_run)
    argv = ["adam_staleness.py", "--meet", "replicas_average", "--workers", "2", "16", "--intervals", "2",
            "--gradients-per-worker", "600", "--out", str(tmp_path / "q.json")]
    monkeypatch.setattr(sys, "argv", [*argv, "--global-batch", "64"])
    model.main()
    assert given == [(2, 600, 32), (16, 600, 4)]  # the same 600 steps of 64 samples in all at either R
    assert json.loads((tmp_path / "q.json").read_text())["runs"][1]["global_batch"] == 64
    monkeypatch.setattr(sys, "argv", [*argv, "--global-batch", "24"])
    with pytest.raises(SystemExit) as refused:
        model.main()
    assert refused.value.code == 2 and "--global-batch 24: not a multiple of every --workers count" in \
        capsys.readouterr().err


def test_budget_rate_is_the_rate_a_worker_sets_under_a_time_budget() -> None:
    """A baseline annealed by ``budget_rate`` follows hogwild's run: warm-up by steps, then a cosine
    over the steps the budget allows at the pace so far (tests/leader/test_max_time.py: the worker's)."""
    from hogwild.bench import budget_rate
    from hogwild.config.train import SchedConfig
    from hogwild.replica.lr_schedule import LRSchedule

    rate, sched = budget_rate(1.0, 10, 10.0), LRSchedule(SchedConfig(name="cosine", warmup_steps=10), 1.0, 10**9)
    assert rate(4, 5.0) == pytest.approx(0.5)  # inside the warm-up the clock does not matter
    assert rate(20, 5.0) == pytest.approx(sched.lr_at(20, 40))  # 20 steps in half the budget: 40 in all
    assert rate(40, 10.0) == pytest.approx(0.0, abs=1e-9) and rate(40, 0.0) > 0.99  # spent: annealed
