"""The documentation stays true: the configuration page matches the schema, the site builds
with no broken link and no page left out of the navigation, and the README stays a short entry
with working links (fast tier)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hogwild.config import docs
from tests.conftest import REPO

pytestmark = pytest.mark.timeout(180)


def test_the_configuration_page_is_the_schemas(tmp_cwd: Path) -> None:
    assert docs.page() == docs.PAGE.read_text(), "docs/configuration.md is stale: run python -m hogwild.config.docs"


def test_every_key_has_its_docstring_on_the_page() -> None:
    from hogwild.config.schema import Config

    keys = [key for key, _, _ in docs.rows(Config())]
    assert {"workers", "optim.lr", "sync.interval", "train.max_time", "eval.max_fraction", "step.logits"} <= set(keys)
    page = docs.PAGE.read_text()
    assert all(f"| `{k}` |" in page for k in keys)


def test_a_stale_page_is_caught(tmp_path: Path, tmp_cwd: Path) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text(docs.PAGE.read_text().replace("Per-worker mini-batch size.", "Batch size."))
    assert docs.main(["--check", "--out", str(stale)]) == 1
    assert docs.main(["--check"]) == 0


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "site" / "configuration" / "index.html").is_file()
    assert "load_model" in (tmp_path / "site" / "api" / "index.html").read_text()  # the API reference rendered


def test_the_readme_is_short_and_its_links_resolve() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 220
    links = [m for m in re.findall(r"\]\(([^)#\s]+)\)", text) if "://" not in m]
    assert "docs/configuration.md" in links
    missing = [m for m in links if not (REPO / m).exists()]
    assert not missing, missing
