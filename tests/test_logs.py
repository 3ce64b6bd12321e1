"""Every log line carries its process's place in the job (fast tier)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from hogwild import logs


@pytest.fixture(autouse=True)
def _clean_context() -> None:
    yield
    logs.stamp(**{k: None for k in logs.ORDER})


def _line(msg: str) -> str:
    record = logging.LogRecord("hogwild.leader.elastic", logging.INFO, __file__, 1, msg, (), None)
    logs.Context().filter(record)
    return logging.Formatter(logs.FORMAT).format(record)


def test_lines_carry_the_stamped_fields_in_a_fixed_order() -> None:
    assert _line("members [0, 1]").endswith("] - members [0, 1]")
    logs.stamp(epoch=3, slot=1)
    assert _line("healed from slot 0").endswith(" - [slot 1 epoch 3] healed from slot 0")
    logs.stamp(epoch=None)
    assert _line("x").endswith(" - [slot 1] x")
    with pytest.raises(ValueError, match="rank"):
        logs.stamp(rank=2)


def test_a_worker_and_a_command_log_in_the_one_format() -> None:
    code = ("import logging; from hogwild import logs; logs.setup(worker=3); "
            "logging.getLogger('hogwild.replica.worker').warning('respawned')")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stderr
    assert "[hogwild.replica.worker][WARNING] - [worker 3] respawned" in err, err


def test_a_log_file_on_a_full_disk_says_so_once_and_is_dropped_without_a_traceback(
        capsys: pytest.CaptureFixture[str]) -> None:
    from hogwild.files import RunLogHandler

    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    # /dev/full takes the open and refuses every write (ENOSPC), as a full run_dir does.
    handler = RunLogHandler("/dev/full")
    log = logging.getLogger("hogwild.test.full_disk")
    log.addHandler(handler)
    log.propagate = False
    try:
        for i in range(3):
            log.warning("line %d", i)
        handler.close()  # at exit: the flush of what is left must not raise either
    finally:
        log.removeHandler(handler)
    err = capsys.readouterr().err
    assert "Logging error" not in err and "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hogwild: warning: cannot write the log file /dev/full"), err
    assert "No space left on device" in lines[0] and handler.dropped
