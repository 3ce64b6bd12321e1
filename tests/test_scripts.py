"""The benchmark scripts stand on a short surface: ``import hogwild`` (the public API) and
``hogwild.bench``, plus the command line they run as processes; and each one still imports and
parses its arguments, so a change inside a package cannot break a benchmark unnoticed. Among
themselves they import by package path (``scripts.harness.common``), the harness imports no other
script, and no script imports one that imports it back (fast tier)."""

from __future__ import annotations

import ast
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_layout import _reachable

SCRIPTS = sorted((REPO / "scripts").rglob("*.py"))
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


@pytest.mark.parametrize("script", [p for p in SCRIPTS if "__main__" in p.read_text()],
                         ids=lambda p: str(p.relative_to(REPO / "scripts")))
def test_each_script_imports_and_parses_its_arguments(script: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.syspath_prepend(str(script.parent))
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(script), run_name="__main__")
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out


def _script_module(path: Path, root: Path) -> str:
    """``scripts.races.link`` for scripts/races/link.py (``root`` holds ``scripts/``)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _script_graph(root: Path = REPO) -> dict[str, set[str]]:
    """Which script modules each script module imports (at any depth, ``import_module`` aside):
    ``from scripts.harness import links`` is an import of scripts.harness.links."""
    files = {_script_module(p, root): p for p in sorted((root / "scripts").rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in files}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                subs = {f"{node.module}.{a.name}" for a in node.names} & files.keys()
                deps |= subs or ({node.module} & files.keys())
        graph[mod] = deps - {mod}
    return graph


def _on_a_cycle(graph: dict[str, set[str]]) -> list[str]:
    return sorted(m for m in graph if m in _reachable(graph, m))


def test_no_script_imports_one_that_imports_it_back() -> None:
    cyclic = _on_a_cycle(_script_graph())
    assert not cyclic, f"scripts on an import cycle: {cyclic}"


def test_the_harness_imports_no_script_outside_it() -> None:
    """races/, models/, measures/, chaos/ and device/ stand on scripts/harness, never the other way."""
    graph = _script_graph()
    up = {m: sorted(d for d in deps if not d.startswith("scripts.harness")) for m, deps in graph.items()
          if m.startswith("scripts.harness")}
    assert not any(up.values()), {m: d for m, d in up.items() if d}


def test_scripts_import_each_other_by_package_path() -> None:
    """``import link`` would find scripts/races/link.py only when its folder is on sys.path, and a
    second copy of it when it is also imported as scripts.races.link: scripts say ``scripts.…``."""
    stems = {p.stem for p in SCRIPTS if p.stem != "__init__"}
    bare = []
    for path in SCRIPTS:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            bare += [f"{path.relative_to(REPO)}:{node.lineno} imports {n}" for n in names if n in stems]
    assert not bare, "import scripts by their package path (scripts.harness.common):\n" + "\n".join(bare)


def test_the_cycle_check_sees_a_cycle(tmp_path: Path) -> None:
    (tmp_path / "scripts" / "races").mkdir(parents=True)
    (tmp_path / "scripts" / "harness").mkdir()
    (tmp_path / "scripts" / "races" / "link.py").write_text("from scripts.races import lm_race\n")
    (tmp_path / "scripts" / "races" / "lm_race.py").write_text("def f():\n    import scripts.races.link\n")
    (tmp_path / "scripts" / "harness" / "common.py").write_text("import os\n")
    (tmp_path / "scripts" / "races" / "rows.py").write_text("from scripts.harness.common import REPO\n")
    graph = _script_graph(tmp_path)
    assert graph["scripts.races.link"] == {"scripts.races.lm_race"}
    assert graph["scripts.races.rows"] == {"scripts.harness.common"}
    assert _on_a_cycle(graph) == ["scripts.races.link", "scripts.races.lm_race"]


def test_every_script_is_listed_by_its_question_in_docs_benchmarks() -> None:
    """docs/benchmarks.md names every script of scripts/ (the harness's modules included), so a
    reader finds the one that answers a question without reading them all."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md").read_text()
    scripts = Path(__file__).resolve().parents[1] / "scripts"
    missing = [str(p.relative_to(scripts)) for p in scripts.rglob("*.py")
               if p.name != "__init__.py" and f"`{p.name}`" not in page]
    assert not missing, missing


def test_replica_scaling_refuses_a_congestion_control_without_shaped_machines() -> None:
    """``--congestion`` sets the namespaces' TCP congestion control: asked of a run on loopback it
    would change nothing, so it is refused in one line naming the option."""
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "measures" / "replica_scaling.py"), "--launch",
                           "torchrun", "--congestion", "cubic"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("--congestion: shaped machines only (--launch shaped)")
    assert "Traceback" not in proc.stderr


def test_a_congestion_control_the_host_does_not_allow_in_namespaces_is_named_with_its_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A namespace may pick only from the host's allowed list: ``--congestion cubic`` on a host that
    offers cubic but allows "reno bbr" used to fail inside the first namespace with a traceback."""
    from scripts.harness import links

    allowed = tmp_path / "tcp_allowed_congestion_control"
    allowed.write_text("reno bbr\n")
    monkeypatch.setattr(links, "ALLOWED_CONGESTION", allowed)
    monkeypatch.setattr(links, "congestion_choices", lambda: ["reno", "bbr", "cubic"])
    problem = links.congestion_problem("cubic")
    assert problem is not None and "sysctl -w net.ipv4.tcp_allowed_congestion_control='reno bbr cubic'" in problem
    assert "offers reno bbr cubic" in (links.congestion_problem("vegas") or "")
    allowed.write_text("reno bbr cubic\n")
    assert links.congestion_problem("cubic") is None
