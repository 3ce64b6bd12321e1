"""The leader's decisions after a sync round, with the round itself stubbed (fast tier)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest

from hogwild.config.env import DistEnv
from hogwild.config.schema import Config
from hogwild.leader.api import Group
from hogwild.leader.core import Leader
from hogwild.sync.rounds import RoundOutcome


class _Group(Group):
    """A fixed group: the leader asks nothing of it after a round."""

    def __init__(self) -> None:
        self.env = DistEnv()

    @property
    def writer(self) -> bool:
        return False

    def connect(self, *a: Any) -> Any:
        raise AssertionError("not here")

    def restore(self, *a: Any) -> Optional[Any]:
        raise AssertionError("not here")

    def start(self, here: Any) -> None:
        pass

    def positions(self, here: Any) -> Any:
        raise AssertionError("not here")

    def close(self, degraded: bool) -> None:
        pass


class _Changing(_Group):
    """A group whose members change, which records what the leader asked of it."""

    def __init__(self) -> None:
        super().__init__()
        self.did: list[str] = []

    def reform(self) -> None:
        self.did.append("reform")


def _after_round(final: bool = False, **flags: bool) -> list[str]:
    """Leader._round on a leader whose round's agreed flags are ``flags`` (a re-formation
    asked for by someone); what the leader did next."""
    agreed = {"all_done": False, "any_stop": False, "checkpoint": False, "reached": False, "reform": True, **flags}
    changes = _Changing()
    leader = Leader(Config(), str(Path("unused")), changes)
    leader.ctl.next_ckpt = float("inf")
    crew = SimpleNamespace(
        rounds=SimpleNamespace(run=lambda **kw: RoundOutcome(healthy=True, drift=0.0, last_drifts=[], **agreed)),
        pool=SimpleNamespace(release=lambda: None),
        tel=SimpleNamespace(round=lambda stats: None), target=SimpleNamespace(met=False))
    leader._round(crew, done=final, stop=final, final=final)  # type: ignore[arg-type]
    return changes.did


@pytest.mark.parametrize("ending", [dict(all_done=True), dict(any_stop=True), dict(reached=True), dict(final=True)])
def test_a_round_that_ends_the_job_admits_no_joiner(ending: dict[str, bool]) -> None:
    """Elastic mode: a joiner admitted in the last round would be healed and start training while
    the members went on to their final collectives (seen under load: Gloo's "Received data size
    doesn't match expected size", a survivor aborted, the joiner waited 300 s for a quorum)."""
    assert _after_round(**ending) == []


def test_a_round_of_a_running_job_re_forms_when_asked() -> None:
    assert _after_round() == ["reform"]


@pytest.mark.parametrize("override", ["optim=adam", "sync.dtype=bf16", "data=sparse_synthetic", "train.seed=1",
                                      "sync.mode=diloco", "train.batch_size=64", "optim.state=shared",
                                      "sync.fragments=2", "sync.weighting=steps", "sync.row_sparse=true",
                                      "optim.update=hogwild", "sync.compress=off", "train.accumulate=2",
                                      "train.target_accuracy=0.9"])
def test_an_elastic_jobs_identity_covers_what_replicas_must_share(override: str) -> None:
    """A replica with another optimizer, wire type, data or seed is refused when it registers
    (issue 24, item 8); one that only logs differently is the same job."""
    from hogwild.config.plan import Plan
    from hogwild.leader.elastic import job_fingerprint
    from tests.conftest import compose_cfg

    base = {"optim.state=shared": ["optim=adam", "optim.update=hogwild"], "optim.update=hogwild": ["optim=adam"],
            "sync.compress=off": ["optim=adam"]}.get(override, [])

    def fingerprint(overrides: list[str]) -> str:
        cfg = compose_cfg(overrides)
        return job_fingerprint(cfg, Plan.of(cfg, 2), 9610)

    mine = fingerprint(base)
    assert fingerprint([*base, override]) != mine
    assert fingerprint([*base, "train.log_every_s=5"]) == mine


def test_no_test_hook_sits_on_the_production_path() -> None:
    """Faults are read from the environment by replica/faults.py alone, installed once as a process
    starts (the leader in leader/choose.py, a worker in worker_main), and act only at the seams that
    read the installed plan, two: a worker's step (replica/worker.py) and the leader's comm
    (leader/faults.py, wrapped in Leader._setup). No function or constructor takes a Faults."""
    import ast

    root = Path(__file__).resolve().parents[2] / "hogwild"
    installs, seams = [], []
    for path in root.rglob("*.py"):
        text = path.read_text()
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and node.annotation is not None:
                assert "Faults" not in ast.unparse(node.annotation), f"{path}: {node.arg} takes a Faults"
            if isinstance(node, ast.AnnAssign):
                assert "Faults" not in ast.unparse(node.annotation), f"{path}: a field holds a Faults"
            if isinstance(node, ast.Call):
                call = ast.unparse(node.func)
                if call.endswith("faults.install"):
                    installs.append(path.relative_to(root).as_posix())
                if call.endswith(("faults.planned", "faulty_comm")):
                    seams.append(path.relative_to(root).as_posix())
        if path.name != "faults.py":
            for var in ("HOGWILD_FAULT", "HOGWILD_LEADER_FAULT", "HOGWILD_SLOW_WHILE"):
                assert f'"{var}"' not in text, f"{path} reads {var} itself"
    assert sorted(installs) == ["leader/choose.py", "replica/worker.py"], installs
    assert sorted(seams) == ["leader/core.py", "replica/worker.py"], seams


def test_a_stop_that_lands_where_it_cannot_be_raised_prints_no_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM during start-up raises StopNow from the signal handler; landing in a weakref
    callback inside an import (seen under load), Python's unraisable hook printed "Exception
    ignored ... Traceback", though the run then stopped as it should, with exit 143 and its line."""
    import gc
    import sys

    from hogwild.errors import StopNow
    from hogwild.leader.stopping import Stopper

    reported: list[type] = []  # the hook there was (Python's prints the traceback)
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_type))

    class Dies:
        def __init__(self, error: BaseException) -> None:
            self.error = error

        def __del__(self) -> None:
            raise self.error

    stopper = Stopper()
    stopper.install()
    try:
        Dies(StopNow())
        Dies(ValueError("not ours"))
        gc.collect()
    finally:
        stopper.uninstall()
    assert reported == [ValueError]  # the stop dropped without a word, anything else reported as before
    Dies(StopNow())
    gc.collect()
    assert reported == [ValueError, StopNow]  # uninstalled: the hook there was is back
