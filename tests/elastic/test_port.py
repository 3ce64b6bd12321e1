"""What a process that reaches the coordinator's port can do to the job (fast tier).

Without a token: malformed values stop a replica in one line (exit 3), never with a traceback.
With ``HOGWILD_COORDINATOR_TOKEN``: forged values are refused, and a replica with another
token (or none) is refused in one line.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Iterator

import pytest
import torch.distributed as dist

from hogwild.elastic.membership import Membership
from hogwild.elastic.signing import TOKEN_ENV, Malformed
from hogwild.errors import Fault, UserError
from tests.conftest import free_port
from tests.elastic.helpers import coordinator_thread

pytestmark = pytest.mark.timeout(120, method="thread")

PEER_S, TIMEOUT_S = 1.0, 20.0


@pytest.fixture
def coordinator() -> Iterator[str]:
    with coordinator_thread() as port:
        yield f"127.0.0.1:{port}"


def _intruder(endpoint: str) -> dist.TCPStore:
    host, port = endpoint.split(":")
    return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10))


def _one(endpoint: str) -> Membership:
    m = Membership(endpoint, 0, 1, PEER_S, None, TIMEOUT_S)
    m.keys.agree_job("fp", "runs/a")
    m.join()
    return m


@pytest.mark.parametrize("key,value", [
    ("members/1", "0,x|"),       # not slots
    ("members/1", "0,7|"),       # a slot the job does not have
    ("epoch", "three"),          # a counter that is not one (the store's own add closed the connection)
    ("hb/0", "\xff"),
], ids=["members not ints", "members out of range", "epoch not a number", "heartbeat garbage"])
def test_a_malformed_value_is_one_line_not_a_traceback(coordinator: str, key: str, value: str) -> None:
    m = _one(coordinator)
    try:
        _intruder(coordinator).set(key, value)
        with pytest.raises(Malformed, match=rf"elastic.coordinator: malformed value under '{key}'") as e:
            m.read(1) if key.startswith("members") else m.liveness.stale((0,)) if key.startswith("hb") else m.current()
        assert isinstance(e.value, Fault) and "\n" not in str(e.value)
    finally:
        m.close()


def test_with_a_token_a_forged_epoch_is_refused(coordinator: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "s3cret")
    m = _one(coordinator)
    try:
        assert m.read(1).members == (0,)
        # The intruder knows the protocol and lists the keys, but not the token.
        keys = _intruder(coordinator).list_keys()
        assert "members/1" in keys
        _intruder(coordinator).set("members/1", "0|")
        with pytest.raises(Malformed, match=f"not signed with this replica's {TOKEN_ENV}"):
            m.read(1)
        _intruder(coordinator).set("run_dir", "/etc")
        with pytest.raises(UserError, match=f"not signed with this replica's {TOKEN_ENV}"):
            Membership(coordinator, 0, 1, PEER_S, None, TIMEOUT_S).keys.agree_job("fp", "runs/a")
    finally:
        m.close()


def test_a_replica_without_the_jobs_token_is_refused_in_one_line(coordinator: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "s3cret")
    first = Membership(coordinator, 0, 2, PEER_S, None, TIMEOUT_S)
    first.keys.agree_job("fp", "runs/a")
    try:
        monkeypatch.delenv(TOKEN_ENV)
        with pytest.raises(UserError, match=f"uses a coordinator token; set {TOKEN_ENV}"):
            Membership(coordinator, 1, 2, PEER_S, None, TIMEOUT_S).keys.agree_job("fp", "runs/a")
        monkeypatch.setenv(TOKEN_ENV, "guess")
        with pytest.raises(UserError, match=f"not signed with this replica's {TOKEN_ENV}"):
            Membership(coordinator, 1, 2, PEER_S, None, TIMEOUT_S).keys.agree_job("fp", "runs/a")
    finally:
        first.close()


def test_signed_counters_count_and_survive_a_coordinator_restart_shape(coordinator: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "s3cret")
    m = _one(coordinator)
    try:
        assert m.current() == 1
        raw = _intruder(coordinator).get("epoch")
        assert raw.endswith(b".1") and raw != b"1", raw  # signed, not a bare number the store could add to
        beat = m.liveness.beat_of(0)  # the heartbeat: a signed value its own thread sets
        assert beat is not None and beat.beat >= 1 and _intruder(coordinator).get("hb/0") != b"%d:0:0:0" % beat.beat
    finally:
        m.close()


def _listeners(port: int) -> list[str]:
    """The local addresses of every listening TCP socket on ``port``, read from /proc/net."""
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            rows = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            addr, _, hexport = local.partition(":")
            if state == "0A" and int(hexport, 16) == port and len(addr) == width:
                found.append(addr)
    return found


def test_the_coordinator_listens_only_on_the_host_it_was_given(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys
    import time

    from tests.conftest import clean_env

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "hogwild.cli.coordinator", "--host", "127.0.0.1", "--port",
                             str(port)], cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not _listeners(port) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # a second listener, if the store opened one, is up by now too
        # 127.0.0.1 in /proc/net/tcp's little-endian hex; no 0.0.0.0 and no IPv6 wildcard.
        assert _listeners(port) == ["0100007F"], _listeners(port)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        store.set("k", "v")
        assert store.get("k") == b"v"
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    assert f"listening on 127.0.0.1:{port}" in out, out


def test_a_port_in_use_is_one_line_naming_the_port(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import socket
    import subprocess
    import sys

    from tests.conftest import clean_env

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "hogwild.cli.coordinator", "--host", "127.0.0.1", "--port",
                               str(port)], cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and f"--port {port}" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("args,says", [
    (["--port", "70000"], "--port: must be in 0..65535, got 70000"),
    (["--port", "x"], "--port: must be a whole number, got 'x'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--exit-after-finish", "soon"], "--exit-after-finish: must be a number of seconds, got 'soon'"),
    (["--exit-after-finish", "-1"], "--exit-after-finish: must be 0 or more seconds, got '-1'"),
])
def test_coordinator_argument_errors_are_one_line(args: list[str], says: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # In this process: the parser's error path is the same code either way, and a real process of
    # this CLI leaving with its one line and exit 2 is test_a_port_in_use_is_one_line_naming_the_port
    # (each case as a process cost an interpreter and an import of torch: 12-21 s in the suite).
    from hogwild.cli.coordinator import main

    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.strip() == f"hogwild: error: {says}", err
    assert "Traceback" not in err


def test_a_coordinator_told_to_exit_leaves_once_the_job_finished_and_its_grace_passed() -> None:
    """--exit-after-finish: the coordinator as a role of the job (the TorchX component) ends when
    the job does, after the grace in which a late replica still reads that it finished."""
    import threading
    import time

    from hogwild.elastic.coordinator import FINISHED, serve

    port, ready = free_port(), threading.Event()
    thread = threading.Thread(target=serve, args=("127.0.0.1", port, ready), kwargs={"exit_after_finish": 1.0},
                              daemon=True)
    thread.start()
    assert ready.wait(10)
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    time.sleep(1.5)
    assert thread.is_alive()  # no job finished yet: it serves on
    client.set(FINISHED, "3")
    t0 = time.monotonic()
    thread.join(15)
    assert not thread.is_alive() and time.monotonic() - t0 >= 1.0
