"""How workers start: from a fork server that imported torch, and the config's target modules, once
(fast tier, and command-line and API runs)."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Optional

import pytest
import torch

from hogwild.replica.start import adopt_environment, environment, worker_context
from tests.conftest import REPO, child_pids, clean_env, run_cli

pytestmark = pytest.mark.timeout(120)

KEY = "HOGWILD_TEST_START_VALUE"


def _report(out: Connection, environ: Optional[dict[str, str]]) -> None:
    if environ is not None:
        adopt_environment(environ)
    out.send((os.environ.get(KEY), os.getppid(), torch.ones(3).sum().item()))


def _child(environ: Optional[dict[str, str]]) -> tuple[Optional[str], int, float]:
    ctx = worker_context()
    # A pipe, not ctx.SimpleQueue(): under the fork server's context a queue is two named semaphores
    # in /dev/shm, there while this process lives and after it if it is killed with its resource
    # tracker; and a child that dies before it answers is an EOFError here, not a wait forever.
    out, theirs = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_report, args=(theirs, environ))
    p.start()
    theirs.close()
    try:
        return out.recv()
    finally:
        p.join(60)
        assert p.exitcode == 0, p.exitcode


@pytest.mark.skipif("forkserver" not in mp.get_all_start_methods(),
                    reason="no fork server here: workers are spawned")
def test_a_worker_gets_the_leaders_environment_as_of_its_start_not_the_servers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The fork server runs from the first start on; its environment is frozen then.
    monkeypatch.delenv(KEY, raising=False)
    assert _child(environment())[0] is None
    # Set since (a script that calls the API twice, a test that sets a fault): the server does
    # not have it, and a worker that did not adopt the leader's environment would not either.
    monkeypatch.setenv(KEY, "set later")
    assert _child(None)[0] is None, "the fork server was not started before the variable was set"
    value, parent, total = _child(environment())
    assert value == "set later"
    assert total == 3.0  # torch works in a child of a server that imported it
    assert parent != os.getpid(), "the worker is a fork of this process, not of the fork server"


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the process tree from /proc")
def test_the_command_line_forks_its_fork_server_instead_of_importing_torch_again(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "hogwild.cli.train", "workers=2", "train.epochs=100000",
                             f"run_dir={tmp_path / 'run'}"], cwd=tmp_path, env=clean_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, server, workers = time.monotonic() + 120, 0, []
        while len(workers) < 2:  # the workers are the children of the leader's child that has two
            assert proc.poll() is None, proc.stderr.read()[-2000:] if proc.stderr else ""
            assert time.monotonic() < deadline, "the workers never started"
            for c in child_pids(proc.pid):
                if len(child_pids(c)) >= 2:
                    server, workers = c, child_pids(c)
            time.sleep(0.1)
        # A fork of the leader has its command line; multiprocessing's own server has its own.
        assert Path(f"/proc/{server}/cmdline").read_bytes() == Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        # A fresh interpreter would have spent ~2 CPU-s importing torch; a fork spends almost none.
        assert _cpu_s(server) < 1.0, _cpu_s(server)
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


def _imported_in(stderr: str) -> list[str]:
    """The processes that imported tests/loud_model.py, by name, as its lines say."""
    return [line.rpartition(" in ")[2] for line in stderr.splitlines() if line.startswith("loud_model imported in ")]


LOUD = ["model._target_=tests.loud_model.net", "workers=2", "train.max_steps=10", "eval.every_s=60"]


@pytest.mark.slow
def test_the_command_line_imports_the_model_module_once_and_no_worker_imports_it_again(tmp_path: Path) -> None:
    # Its print is seen once: the leader imported it before it forked the server, and every worker
    # is a fork of that server. A worker that imported it afresh paid for its imports again
    # (3-4 CPU-s each for a Hugging Face model) and printed its own line.
    out = run_cli([*LOUD, f"run_dir={tmp_path / 'run'}"], cwd=tmp_path, env=clean_env(PYTHONPATH=str(REPO)))
    assert out.returncode == 0, out.stderr[-3000:]
    assert _imported_in(out.stderr) == ["MainProcess"], out.stderr[-3000:]


@pytest.mark.slow
def test_a_script_calling_the_api_has_its_fork_server_import_the_model_module_for_every_worker(
        tmp_path: Path) -> None:
    # The script's server is a fresh interpreter (the script may run threads): it imports the
    # model module once, for all workers, instead of each worker importing it again.
    out = run_cli([*LOUD, f"run_dir={tmp_path / 'run'}"], cwd=tmp_path, module="tests.api_script",
                  env=clean_env(PYTHONPATH=str(REPO)))
    assert out.returncode == 0, out.stderr[-3000:]
    seen = _imported_in(out.stderr)
    assert seen and not [name for name in seen if name != "MainProcess"], out.stderr[-3000:]
