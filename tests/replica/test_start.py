"""How workers start: from a fork server that imported torch once (fast tier)."""

from __future__ import annotations

import multiprocessing as mp
import os
from multiprocessing.queues import SimpleQueue
from typing import Optional

import pytest
import torch

from hogwild.replica.start import adopt_environment, environment, worker_context

pytestmark = pytest.mark.timeout(120)

KEY = "HOGWILD_TEST_START_VALUE"


def _report(out: SimpleQueue, environ: Optional[dict[str, str]]) -> None:
    if environ is not None:
        adopt_environment(environ)
    out.put((os.environ.get(KEY), os.getppid(), torch.ones(3).sum().item()))


def _child(environ: Optional[dict[str, str]]) -> tuple[Optional[str], int, float]:
    ctx = worker_context()
    out = ctx.SimpleQueue()
    p = ctx.Process(target=_report, args=(out, environ))
    p.start()
    try:
        return out.get()
    finally:
        p.join(60)
        assert p.exitcode == 0, p.exitcode


@pytest.mark.skipif("forkserver" not in mp.get_all_start_methods(), reason="no fork server here: workers are spawned")
def test_a_worker_gets_the_leaders_environment_as_of_its_start_not_the_servers(monkeypatch: pytest.MonkeyPatch) -> None:
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
