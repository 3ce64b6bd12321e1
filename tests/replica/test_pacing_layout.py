"""The pacing code stays in one place (issue 68's house rules): its settings are read by two modules,
the worker's loop and the barrier's updater stay small, and a policy is one registered class."""

from __future__ import annotations

import ast
from pathlib import Path

HOGWILD = Path(__file__).resolve().parents[2] / "hogwild"
PACE_KEYS = ("min_wait", "max_wait", "straggler_wait", "balance", "chunks", "backup", "policy")


def _tree(module: str) -> ast.Module:
    return ast.parse((HOGWILD / module).read_text())


def test_the_pacing_settings_are_read_in_two_modules() -> None:
    """``cfg.pace.X``/``self.cfg.X`` (or the old ``cfg.optim.X``) reads of a pacing key: only
    config/pace.py (its checks) and replica/pacing.py (the rules) name them."""
    readers = set()
    for path in HOGWILD.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in PACE_KEYS:
                if ast.unparse(node.value).endswith(("pace", "cfg", "config", "optim")):
                    readers.add(str(path.relative_to(HOGWILD)))
    assert readers <= {"config/pace.py", "replica/pacing.py"}, readers


def test_run_loop_and_the_barrier_updater_stay_small() -> None:
    worker = next(n for n in _tree("replica/worker.py").body if isinstance(n, ast.FunctionDef) and n.name == "run_loop")
    assert worker.end_lineno is not None and worker.end_lineno - worker.lineno + 1 <= 60
    barrier = next(n for n in _tree("replica/update.py").body
                   if isinstance(n, ast.ClassDef) and n.name == "BarrierUpdate")
    methods = [n.name for n in barrier.body if isinstance(n, ast.FunctionDef)]
    assert len(methods) <= 10, methods


def test_every_pacing_policy_is_a_registered_pacer() -> None:
    from hogwild.config.registry import PACERS
    from hogwild.replica.pacing import Pacer

    assert {"deadline", "backup"} <= set(PACERS.names())
    assert all(issubclass(PACERS.get(name), Pacer) for name in PACERS.names())
