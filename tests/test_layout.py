"""The package's shape: no import cycle, workers never reach the leader, small modules, launch scripts that parse (fast tier)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PKG = REPO / "hogwild"
MAX_LINES = 300


def _imports(path: Path) -> set[str]:
    """hogwild modules ``path`` imports, function-level (lazy) imports included."""
    deps: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "hogwild":
            parts = node.module.split(".")
            deps |= {a.name for a in node.names} if len(parts) == 1 else {parts[1]}
        elif isinstance(node, ast.Import):
            deps |= {a.name.split(".")[1] for a in node.names if a.name.startswith("hogwild.")}
    return deps - {path.stem}


def _graph() -> dict[str, set[str]]:
    return {p.stem: _imports(p) for p in PKG.glob("*.py") if p.stem != "__init__"}


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for dep in graph.get(todo.pop(), set()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_no_import_cycle() -> None:
    graph = _graph()
    cyclic = sorted(m for m in graph if m in _reachable(graph, m))
    assert not cyclic, f"modules on an import cycle: {cyclic}"


def test_workers_never_import_the_leader() -> None:
    reach = _reachable(_graph(), "worker")
    assert not reach & {"leader", "pool", "rounds", "telemetry", "train"}, reach


def test_modules_stay_small() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in PKG.glob("*.py")}
    assert not {n: s for n, s in sizes.items() if s > MAX_LINES}, sizes


def test_the_layout_detector_sees_a_cycle(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("from hogwild.b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from hogwild import a\n")
    graph = {p.stem: _imports(p) for p in tmp_path.glob("*.py")}
    assert graph == {"a": {"b"}, "b": {"a"}} and "a" in _reachable(graph, "a")


def test_launch_scripts_parse() -> None:
    import subprocess

    scripts = sorted((REPO / "launch").glob("*.s*"))
    assert {p.name for p in scripts} >= {"elastic.sh", "elastic.sbatch", "slurm.sbatch", "local.sh"}
    for script in scripts:
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{script.name}: {proc.stderr}"
