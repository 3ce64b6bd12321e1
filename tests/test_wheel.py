"""The wheel installs anywhere: built from this checkout, installed into a fresh virtual
environment, and run from an unrelated folder, it trains, evaluates and exports with the
configs it carries (slow tier: a build, a venv and three short commands).

The fresh environment gets the already-installed dependencies (torch alone is gigabytes) by a
``.pth`` line to this interpreter's site-packages; hogwild itself comes only from the wheel,
which the test checks, so a module or config left out of the wheel fails it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# Every package hogwild imports at its top level, by its distribution name.
IMPORTED = {"torch", "torchvision", "hydra-core", "omegaconf", "tensorboard", "numpy", "scikit-learn", "tqdm"}


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "HOGWILD_", "VIRTUAL_ENV"))}
    # From a clean copy of the sources: setuptools' build/ folder keeps files a rename left
    # behind, and they would land in the wheel.
    src = root / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info",
                                                             "__pycache__", "outputs", "bench_results",
                                                             ".pytest_cache"))
    build = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                  "-w", str(root / "dist"), str(src)], root, env)
    assert build.returncode == 0, build.stderr[-3000:]
    wheel = next((root / "dist").glob("hogwild-*.whl"))
    venv = root / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)], root, env)
    assert made.returncode == 0, made.stderr[-2000:]
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "_hogwild_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    inst = _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                root, env)
    assert inst.returncode == 0, inst.stderr[-3000:]
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    return wheel, elsewhere, env


def test_the_wheel_declares_its_dependencies_and_trains_evaluates_and_exports_from_anywhere(
        installed: tuple[Path, Path, dict[str, str]]) -> None:
    # One test, not two: under pytest-xdist two tests of one module fixture can run in two test
    # processes, and each then built the wheel and its venv again.
    wheel, here, env = installed
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith("METADATA"))).decode()
        names = z.namelist()
    required = {}
    for line in meta.splitlines():
        m = re.match(r"Requires-Dist: ([A-Za-z0-9_.-]+)\s*(\S[^;]*)?(;.*)?$", line)
        if m and not m.group(3):
            required[m.group(1).lower()] = m.group(2) or ""
    assert IMPORTED <= set(required), f"undeclared: {IMPORTED - set(required)}"
    assert all("<" in spec for name, spec in required.items() if name in IMPORTED), required
    assert "hogwild/conf/config.yaml" in names and "hogwild/conf/sync/slowmo.yaml" in names

    # The installed wheel trains, evaluates and exports from a directory outside the sources.
    where = _run(["python", "-c", "import hogwild.config.compose as c, hogwild; print(hogwild.__file__, c.CONF_DIR)"],
                 here, env)
    assert where.returncode == 0, where.stderr[-2000:]
    module, conf = where.stdout.split()
    assert "/venv/" in module and str(REPO) not in module, "hogwild came from the checkout, not the wheel"
    assert conf.endswith("hogwild/conf") and "/venv/" in conf

    train = _run(["hogwild-train", "workers=1", "train.max_steps=40", "sync=average", "run_dir=run"], here, env)
    assert train.returncode == 0, train.stderr[-3000:]
    metrics = json.loads((here / "run" / "metrics.json").read_text())
    assert metrics["steps"] == 40 and metrics["status"] == "ok"

    ev = _run(["hogwild-eval", "checkpoint=run/checkpoints/last.pt"], here, env)
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert json.loads(ev.stdout.strip().splitlines()[-1])["test_accuracy"] == pytest.approx(
        metrics["test_accuracy"], abs=1e-6)

    ex = _run(["hogwild-export", "checkpoint=run/checkpoints/last.pt", "out=weights.pt"], here, env)
    assert ex.returncode == 0, ex.stderr[-3000:]
    assert (here / "weights.pt").is_file()

    bad = _run(["hogwild-train", "sync=nope"], here, env)
    assert bad.returncode == 2 and "sync: unknown option 'nope'" in bad.stderr, bad.stderr[-2000:]
