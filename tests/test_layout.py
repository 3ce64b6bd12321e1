"""The package's shape (fast tier): data flows one way through the subpackages, no import
cycle, nobody writes another object's private state, the wheel lists every subpackage, and
the launch scripts parse."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO

PKG = REPO / "hogwild"
# The flow, from what the user says to what the user runs. A package may import its own
# modules, the shared modules (errors, files, native) and the packages before it, never one after.
ORDER = ("config", "data", "replica", "sync", "checkpoint", "report", "elastic", "leader", "api", "bench", "cli",
         "jobs", "components")
SHARED = {"errors", "files", "logs", "native", "__init__"}  # __init__ re-exports api lazily
# Elastic mode is the conductor's business: elastic/ stands on sync/ alone, and only the
# conductor (and the CLI that picks it) may know it.
ELASTIC_MAY_IMPORT = {"config", "sync"}
ELASTIC_KNOWN_BY = {"elastic", "leader", "cli", "bench"}
# A sanity bound (docs/design.md): a module past it hides two ideas.
MAX_LINES = 600
# A module at the package's top (api, bench, errors, ...) is a surface or a shared helper that every
# subpackage may lean on: a part of it that grows has a subpackage to live in.
TOP_MAX_LINES = 300


def _module(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, known: set[str]) -> set[str]:
    """hogwild modules ``path`` imports (``sync.rounds``), function-level imports included."""
    deps: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "hogwild":
            base = node.module.partition(".")[2]
            for alias in node.names:
                sub = f"{base}.{alias.name}".strip(".")
                deps.add(sub if sub in known else base or "__init__")
        elif isinstance(node, ast.Import):
            deps |= {a.name.partition(".")[2] for a in node.names if a.name.startswith("hogwild.")}
    return deps


def _graph(root: Path = PKG) -> dict[str, set[str]]:
    files = {_module(p, root): p for p in root.rglob("*.py")}
    return {m: _imports(p, set(files)) - {m} for m, p in files.items()}


def _package(module: str) -> str:
    head = module.split(".")[0]
    return "shared" if head in SHARED else head


def _violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in graph.items():
        src = _package(mod)
        for dep in deps:
            dst = _package(dep)
            if dst in (src, "shared") or (src == "shared" and mod == "__init__"):
                continue
            if src == "shared":
                bad.append(f"{mod} -> {dep}: errors/files import no package")
            elif dst == "elastic" and src not in ELASTIC_KNOWN_BY:
                bad.append(f"{mod} -> {dep}: only the conductor knows elastic/")
            elif src == "elastic" and dst not in ELASTIC_MAY_IMPORT:
                bad.append(f"{mod} -> {dep}: elastic/ stands on config/ and sync/ only")
            elif src != "elastic" and dst != "elastic" and ORDER.index(dst) > ORDER.index(src):
                bad.append(f"{mod} -> {dep}: {src}/ comes before {dst}/ in the flow")
    return sorted(bad)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for dep in graph.get(todo.pop(), set()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_every_package_is_in_the_flow() -> None:
    packages = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in PKG.glob("*.py")}
    assert packages | (modules - SHARED) == set(ORDER), "a new package needs its place in ORDER"


def test_data_flows_one_way() -> None:
    assert _violations(_graph()) == []


def test_no_import_cycle() -> None:
    graph = _graph()
    cyclic = sorted(m for m in graph if m in _reachable(graph, m))
    assert not cyclic, f"modules on an import cycle: {cyclic}"


def test_workers_never_import_the_conductor() -> None:
    reach = {_package(m) for m in _reachable(_graph(), "replica.worker")}
    assert not reach & {"sync", "checkpoint", "report", "elastic", "leader", "cli"}, reach


def test_nobody_writes_another_objects_private_state() -> None:
    """``other._x = ...`` couples two classes through a name one of them may rename; a class
    sets its own private state, or offers a method."""
    writes = []
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            for t in targets:
                for sub in ast.walk(t):
                    if (isinstance(sub, ast.Attribute) and sub.attr.startswith("_") and not sub.attr.startswith("__")
                            and not (isinstance(sub.value, ast.Name) and sub.value.id in ("self", "cls"))):
                        writes.append(f"{path.relative_to(REPO)}:{node.lineno} {ast.unparse(t)}")
    assert writes == []


# The board's shared cells are the one message surface between the leader and its workers:
# whoever holds the board (self.board) writes them.
MESSAGE_SURFACE = ("self.board.control", "self.board.stats")


def _writes_through_others(tree: ast.AST) -> list[tuple[int, str]]:
    """Assignments into an object reached through another (``crew.saver.lineage = ...``,
    ``crew.board.stats["pos"] = ...``, ``self.memory.away_since = ...``): the object that owns
    the state offers a method instead, so one class never sets another's fields."""
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for t in targets:
            for sub in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]):
                owner = sub.value if isinstance(sub, ast.Subscript) else sub
                if (isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Attribute)
                        and ast.unparse(owner) not in MESSAGE_SURFACE):
                    found.append((node.lineno, ast.unparse(sub)))
    return found


def test_no_object_assigns_the_fields_of_an_object_it_reaches_through_another() -> None:
    writes = [f"{p.relative_to(REPO)}:{line} {t}" for p in PKG.rglob("*.py")
              for line, t in _writes_through_others(ast.parse(p.read_text()))]
    assert writes == []


def test_the_write_detector_sees_fields_set_through_another_object() -> None:
    code = ("crew.saver.lineage = 'x'\ncrew.board.stats['pos'] = 0\nself.memory.away_since = 1\n"
            "self.board.control['stop'] = 1\nself.x = 1\nrow['pos'] = 2\n")
    assert [t for _, t in _writes_through_others(ast.parse(code))] == [
        "crew.saver.lineage", "crew.board.stats['pos']", "self.memory.away_since"]


def test_the_conductor_knows_the_group_interface_only() -> None:
    deps = _graph()["leader.core"]
    assert not deps & {"leader.torchrun", "leader.elastic"}, deps


def test_modules_stay_readable() -> None:
    sizes = {str(p.relative_to(PKG)): len(p.read_text().splitlines()) for p in PKG.rglob("*.py")}
    assert not {n: s for n, s in sizes.items() if s > MAX_LINES}


def test_top_level_modules_stay_short() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in PKG.glob("*.py")}
    assert sizes and not {n: s for n, s in sizes.items() if s > TOP_MAX_LINES}, \
        f"over {TOP_MAX_LINES} lines: move a part into the subpackage it belongs to"


def test_the_wheel_lists_every_subpackage() -> None:
    """pyproject.toml names the packages one by one (conf/ is mapped onto hogwild.conf); a new
    subpackage left out of the list would be missing from every install but an editable one."""
    listed = set(re.findall(r'"(hogwild[\w.]*)"', (REPO / "pyproject.toml").read_text().split("packages = [")[1]
                            .split("]")[0]))
    on_disk = {"hogwild"} | {f"hogwild.{p.name}" for p in PKG.iterdir() if (p / "__init__.py").exists()}
    assert listed == on_disk | {"hogwild.conf"}


def test_the_layout_detector_sees_a_cycle_and_a_backward_import(tmp_path: Path) -> None:
    (tmp_path / "sync").mkdir()
    (tmp_path / "replica").mkdir()
    (tmp_path / "sync" / "a.py").write_text("from hogwild.replica.b import x\n")
    (tmp_path / "replica" / "b.py").write_text("def f():\n    from hogwild.sync import a\n")
    graph = _graph(tmp_path)
    assert graph == {"sync.a": {"replica.b"}, "replica.b": {"sync.a"}}
    assert "sync.a" in _reachable(graph, "sync.a")
    assert _violations(graph) == ["replica.b -> sync.a: replica/ comes before sync/ in the flow"]
    assert _violations({"sync.x": {"elastic.y"}, "elastic.y": {"replica.z"}}) == [
        "elastic.y -> replica.z: elastic/ stands on config/ and sync/ only",
        "sync.x -> elastic.y: only the conductor knows elastic/"]


def test_launch_scripts_parse() -> None:
    import subprocess

    scripts = sorted((REPO / "launch").glob("*.s*"))
    assert {p.name for p in scripts} >= {"elastic.sh", "elastic.sbatch", "slurm.sbatch", "local.sh"}
    for script in scripts:
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{script.name}: {proc.stderr}"


LINTED = ("hogwild", "scripts", "tests", "examples", "launch")


def _ruff() -> list[str]:
    """The command that runs ruff here, or [] where it is not installed."""
    import importlib.util
    import shutil
    import sys

    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    found = shutil.which("ruff")
    return [found] if found else []


def test_the_code_passes_ruff_at_120_characters() -> None:
    """pyproject.toml's [tool.ruff]: pyflakes and lines of at most 120 characters, over the
    package, the scripts, the tests, the examples and the launchers. ruff comes with the ``dev``
    extra (``pip install -e '.[dev]'``); without it this test skips, saying so."""
    import subprocess

    import pytest

    ruff = _ruff()
    if not ruff:
        pytest.skip("ruff is not installed (pip install -e '.[dev]' brings it): the lint did not run")
    proc = subprocess.run([*ruff, "check", "--no-cache", "--output-format", "concise", *LINTED], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    found = [line for line in proc.stdout.splitlines() if re.match(r"\S+:\d+:\d+: ", line)]
    assert proc.returncode == 0 and not found, "ruff (pyproject.toml's [tool.ruff]):\n" + (
        "\n".join(found) or proc.stdout + proc.stderr)


def test_elastic_comm_asks_membership_and_does_not_reach_into_its_parts() -> None:
    """ElasticComm (elastic/comm.py) reads what Membership answers (``self.m.rank()``,
    ``self.m.slot``), never an attribute of one of its attributes (``self.m.epoch.members``): the
    membership's parts can change without the comm."""
    import ast

    tree = ast.parse((PKG / "elastic" / "comm.py").read_text())
    reached = [ast.unparse(n) for n in ast.walk(tree)
               if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)
               and ast.unparse(n.value).startswith("self.m.")]
    assert reached == [], reached
