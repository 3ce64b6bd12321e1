"""The roles a scheduler runs (hogwild/jobs.py; TorchX's component in hogwild/components.py):
their commands run as a scheduler runs them, ``bash -c`` with its names for the first host and
the replica's index put in as TorchX puts them in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from string import Template

import pytest

from hogwild.errors import UserError
from hogwild.jobs import elastic_roles, torchrun_roles
from tests.conftest import REPO, clean_env, free_port


def _as_scheduled(command: str, replica: int) -> str:
    """What TorchX does to a role's arguments on each replica (torchx.specs.macros.Values)."""
    return Template(command).safe_substitute(replica_id=str(replica), rank0_env="HOGWILD_TEST_RANK0_HOST",
                                             app_id="test")


@pytest.mark.timeout(240)
def test_the_elastic_roles_train_a_job_and_the_coordinator_leaves_when_it_finished(tmp_path: Path) -> None:
    """A coordinator and two replicas, each a ``bash -c`` of its role's command: the replicas find
    the coordinator on the first host (here the variable is unset: this host), train to the end on
    one model, and the coordinator exits 0 once its grace after the job's end passed."""
    run_dir = tmp_path / "run"
    # A short heartbeat window (elastic.peer_timeout_s / 2) forms the epoch sooner: the test is the commands.
    roles = elastic_roles(["workers=1", "train.max_steps=20", "sync.interval=5", "eval.every_s=1000",
                           "elastic.peer_timeout_s=2"], 2, str(run_dir), "${rank0_env}", "${replica_id}",
                          port=free_port(), grace_s=0.5, python=sys.executable)
    assert [(r.name, r.replicas) for r in roles] == [("coordinator", 1), ("replica", 2)]
    env = clean_env(OMP_NUM_THREADS="1", LOCAL_WORLD_SIZE="2")
    procs = [subprocess.Popen(["bash", "-c", _as_scheduled(role.command, i)], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for role in roles for i in range(role.replicas)]
    try:
        errs = [p.communicate(timeout=200)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0, 0], [e[-1500:] for e in errs]
    m = json.loads((run_dir / "metrics.json").read_text())
    assert m["elastic"] and m["replicas"] == 2 and m["steps"] == 40, m
    assert len({s["model"] for s in m["replica_final_state"]}) == 1, m["replica_final_state"]
    assert "the job finished: the coordinator exits" in errs[0]


def test_the_torchrun_role_meets_at_the_first_host_and_passes_the_overrides() -> None:
    (role,) = torchrun_roles(["sync.interval=50", "+experiment=gpt"], 4, "/shared/exp 1", "${rank0_env}",
                             port=29511, max_restarts=2)
    assert role.name == "hogwild" and role.replicas == 4
    command = _as_scheduled(role.command, 3)
    assert "--rdzv-endpoint=${HOGWILD_TEST_RANK0_HOST:-localhost}:29511" in command
    assert "--nnodes=4" in command and "--max-restarts=2" in command
    assert command.endswith("-m hogwild.cli.train 'run_dir=/shared/exp 1' sync.interval=50 +experiment=gpt")


@pytest.mark.parametrize("call,says", [
    (lambda: torchrun_roles([], 0, "r", "X"), "replicas: must be at least 1, got 0"),
    (lambda: elastic_roles([], 2, "r", "X", "0", port=70000), "port: must be in 1..65535, got 70000"),
    (lambda: elastic_roles([], 2, "r", "X", "0", max_restarts=-2), "max_restarts: must be 0 or more, got -2"),
    (lambda: elastic_roles([], 2, "r", "X", "0", grace_s=-1), "grace_s: must be 0 or more, got -1"),
])
def test_a_bad_role_setting_is_one_line_naming_it(call: object, says: str) -> None:
    with pytest.raises(UserError, match=says):
        call()  # type: ignore[operator]


def test_the_torchx_component_hands_torchx_these_roles() -> None:
    """Where TorchX is installed (the ``torchx`` extra): its AppDef runs each role's command under
    bash, the coordinator first, so TorchX's rank0 host is the coordinator's."""
    pytest.importorskip("torchx.specs", reason="the torchx extra is not installed")
    from hogwild.components import train

    app = train("sync.interval=50", replicas=3, elastic=True, port=29401)
    expected = elastic_roles(["sync.interval=50"], 3, "outputs/torchx", "${rank0_env}", "${replica_id}", port=29401)
    assert [(r.name, r.num_replicas, r.entrypoint, r.args) for r in app.roles] == \
        [(c.name, c.replicas, "bash", ["-c", c.command]) for c in expected]
    (plain,) = train(replicas=2).roles
    assert plain.num_replicas == 2 and "hogwild.cli.launch" in plain.args[1]
    assert REPO.joinpath("hogwild", "components.py").is_file()  # the path torchx run takes from a checkout


def _torchx() -> str:
    """The ``torchx`` command of this interpreter's environment (the ``torchx`` extra), else skip."""
    pytest.importorskip("torchx.specs", reason="the torchx extra is not installed")
    cli = Path(sys.executable).with_name("torchx")
    if not cli.is_file():
        pytest.skip(f"no torchx command beside {sys.executable}")
    return str(cli)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("shape", [[], ["--elastic", "True", "--grace_s", "0"]], ids=["torchrun", "elastic"])
def test_torchx_local_scheduler_runs_four_replicas_to_one_model(tmp_path: Path, shape: list[str]) -> None:
    """``torchx run -s local_cwd`` with the component, as docs/machines.md shows it: 4 replicas on
    this host, torchrun-style or elastic (a coordinator role first), train to the end on one model
    and TorchX reports the job SUCCEEDED."""
    run_dir = tmp_path / "run"
    env = clean_env(OMP_NUM_THREADS="1", LOCAL_WORLD_SIZE="4", PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin")
    proc = subprocess.run([_torchx(), "run", "-s", "local_cwd", "--wait", "--log", "hogwild/components.py:train",
                           "--replicas", "4", "--run_dir", str(run_dir), "--port", str(free_port()), *shape, "--",
                           "workers=1", "train.max_steps=40", "sync.interval=5", "eval.every_s=1000"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=280)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Job finished: SUCCEEDED" in out, out[-3000:]
    m = json.loads((run_dir / "metrics.json").read_text())
    assert m["replicas"] == 4 and m["steps"] == 160, m
    assert len(m["replica_final_state"]) == 4 and len({s["model"] for s in m["replica_final_state"]}) == 1
