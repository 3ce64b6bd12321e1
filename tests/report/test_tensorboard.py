"""A failed TensorBoard write (a full disk) ends the run in one line, without the writer
thread's own traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = r"""
import errno, sys, time
from hogwild.errors import WriteFailed
from hogwild.report.metrics import Metrics

m = Metrics(sys.argv[1], True)
writer = m._tb.file_writer.event_writer._async_writer._worker._record_writer

def full(data):
    raise OSError(errno.ENOSPC, "No space left on device")

writer.write = full
deadline = time.monotonic() + 60  # the thread fails first, as on a real disk; a busy host delays it
try:
    i = 0
    while time.monotonic() < deadline:
        m.scalar("loss", 1.0, i)
        m._tb.flush()
        time.sleep(0.02)
        i += 1
    m.close()
except OSError as e:
    print("raised:", WriteFailed.of(e))
"""


def test_a_full_disk_under_tensorboard_is_one_error_in_the_leader_and_no_thread_traceback(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "raised: run_dir: cannot write" in out.stdout and "No space left on device" in out.stdout
    assert "Traceback" not in out.stderr, out.stderr
