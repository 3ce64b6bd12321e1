"""The benchmark scripts stand on a small surface (the public API, the CLI and hogwild.bench),
and each one still imports and parses its arguments, so a change inside a package cannot break
a benchmark unnoticed (fast tier)."""

from __future__ import annotations

import ast
import runpy
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPTS = sorted((REPO / "scripts").glob("*.py"))
ALLOWED = ("hogwild", "hogwild.bench", "hogwild.cli")


def _hogwild_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "hogwild":
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "hogwild"}
    return found


def test_scripts_import_only_the_benchmark_surface() -> None:
    inside = {f"{p.name}: {m}" for p in SCRIPTS for m in _hogwild_imports(p)
              if not (m in ALLOWED or m.startswith("hogwild.cli."))}
    assert not inside, sorted(inside)


@pytest.mark.parametrize("script", [p for p in SCRIPTS if "__main__" in p.read_text()], ids=lambda p: p.name)
def test_each_script_imports_and_parses_its_arguments(script: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.syspath_prepend(str(script.parent))
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(script), run_name="__main__")
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out
