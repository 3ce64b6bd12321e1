"""The benchmark keeps working: a tiny run writes its results and table (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, clean_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def test_bench_tiny_writes_results(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench.py"), "--tiny", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=380, env=clean_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    tta = res["time_to_accuracy"]["mlp_digits_tiny"]
    assert {"single", "ddp", "mnist_hogwild"} <= tta.keys() and any(k.startswith("hogwild 1x") for k in tta)
    assert all(v["runs"] for k, v in tta.items() if k != "target")
    assert res["scaling"]["mlp_digits"]["1"]["samples_per_s"] > 0
    assert res["memory"]["hogwild_peak_pss_mib"] > 0 and res["memory"]["ddp_peak_pss_mib"] > 0
    assert "| ddp |" in (tmp_path / "table.md").read_text()
