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
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench.py"), "--tiny", "--only", "final,sync",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=280,
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
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench.py"), "--only", "nope",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=60, env=clean_env())
    assert proc.returncode == 2 and "unknown section(s) nope" in proc.stderr


def test_gpu_bench_checks_its_sections_then_says_when_there_is_no_gpu(tmp_path: Path) -> None:
    script = [sys.executable, str(REPO / "scripts" / "gpu.py")]
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
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(REPO / "scripts"))


def test_link_median_counts_a_missed_run_as_slower_than_every_run_that_reached_the_target() -> None:
    link = _script("link")

    def run(t: object) -> dict[str, object]:
        return {"time_to_target_s": t, "test_accuracy": 0.96, "bytes_per_step": 1.0, "tx_bytes_per_step": 1.0}

    # Dropping the miss would give 0.4 s; counted, it is the slowest of three: the median is 0.5 s.
    res = link.summary({}, {"a": [run(0.3), run(None), run(0.5)], "b": [run(float("nan")), run(None), run(0.2)]})
    assert res["methods"]["a"]["median_s"] == 0.5 and res["methods"]["a"]["missed"] == 1
    assert res["methods"]["b"]["median_s"] == math.inf and res["methods"]["b"]["missed"] == 2


def test_outer_rules_reports_each_seed_and_refuses_an_unknown_rule(tmp_path: Path) -> None:
    script = [sys.executable, str(REPO / "scripts" / "outer_rules.py")]
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
