"""The benchmark scripts stand on a short surface: ``import hogwild`` (the public API) and
``hogwild.bench``, plus the command line they run as processes; and each one still imports and
parses its arguments, so a change inside a package cannot break a benchmark unnoticed (fast tier)."""

from __future__ import annotations

import ast
import runpy
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPTS = sorted((REPO / "scripts").glob("*.py"))
ALLOWED = {"hogwild", "hogwild.bench"}


def _is_module(name: str) -> bool:
    """``hogwild.x.y`` is a module or package of the source tree (not a name defined in one)."""
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _hogwild_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of every hogwild module ``source`` imports: ``import hogwild.x``, ``from
    hogwild.x import y``, ``from hogwild import x`` where x is a module, and ``import_module`` or
    ``__import__`` of a literal name, at any depth (in functions too)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "hogwild"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "hogwild":
                continue
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                      if _is_module(f"{node.module}.{a.name}")]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and node.args[0].value.split(".")[0] == "hogwild"
              and ast.unparse(node.func).split(".")[-1] in ("import_module", "__import__")):
            found.append((node.lineno, node.args[0].value))
    return found


def _outside(paths: list[Path]) -> list[str]:
    return [f"{p.relative_to(REPO)}:{line} imports {module}" for p in paths
            for line, module in _hogwild_imports(p.read_text()) if module not in ALLOWED]


def test_scripts_import_only_the_public_api_and_hogwild_bench() -> None:
    """A script that reaches inside a package breaks when the package changes, unnoticed until it
    runs: what it needs goes into hogwild/bench.py, with a docstring (docs/benchmarks.md)."""
    outside = _outside(SCRIPTS)
    assert not outside, "scripts may import hogwild and hogwild.bench only:\n" + "\n".join(outside)


def test_the_import_check_sees_every_way_to_reach_inside() -> None:
    code = ("import hogwild\nfrom hogwild import train, bench\nfrom hogwild.bench import sync_round\n"
            "import hogwild.sync.rounds\nfrom hogwild.replica.board import STATS\nfrom hogwild import replica\n"
            "def f():\n    from hogwild.cli import train\n"
            "importlib.import_module('hogwild.elastic.membership')\n__import__('hogwild.report')\n")
    assert sorted(m for _, m in _hogwild_imports(code) if m not in ALLOWED) == [
        "hogwild.cli", "hogwild.cli.train", "hogwild.elastic.membership", "hogwild.replica", "hogwild.replica.board",
        "hogwild.report", "hogwild.sync.rounds"]


def test_hogwild_bench_is_short_and_says_what_scripts_may_rely_on() -> None:
    import hogwild.bench as bench

    undocumented = [name for name in bench.__all__ if not (getattr(bench, name).__doc__ or "").strip()]
    assert not undocumented, f"hogwild.bench: no docstring for {undocumented}"
    # Every name is a promise kept through changes inside the packages: the list stays short.
    assert len(bench.__all__) <= 16, bench.__all__


@pytest.mark.parametrize("script", [p for p in SCRIPTS if "__main__" in p.read_text()], ids=lambda p: p.name)
def test_each_script_imports_and_parses_its_arguments(script: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.syspath_prepend(str(script.parent))
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(script), run_name="__main__")
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out
