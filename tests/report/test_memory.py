"""This replica's peak memory (fast tier): the PSS of the leader's whole process tree, where a page
that several processes map counts once, as metrics.json's ``peak_memory_mb`` reports it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hogwild.report.memory import PeakMemory, process_tree, pss_bytes

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux /proc")]

MB = 2**20
# A child that holds 300 MB of its own memory (written, so resident), then waits to be measured.
HOLDER = ("b = bytearray(300 * 2**20)\nb[::4096] = b'x' * len(b[::4096])\nprint('ready', flush=True)\n"
          "import time; time.sleep(60)")
# A child that maps the same 200 MB shared file as its parent and reads every page.
MAPPER = ("import mmap, sys\nf = open(sys.argv[1], 'r+b')\nm = mmap.mmap(f.fileno(), 0)\n"
          "sum(m[i] for i in range(0, len(m), 4096))\nprint('ready', flush=True)\nimport time; time.sleep(60)")


def _start(code: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_the_peak_counts_every_process_below_the_leader() -> None:
    # A tree of its own (a parent that started a child holding 300 MB): other tests' processes
    # under this one come and go, and would move the baseline of a peak measured from here.
    parent = _start(f"import subprocess, sys\np = subprocess.Popen([sys.executable, '-c', {HOLDER!r}], "
                    "stdout=subprocess.PIPE, text=True)\nprint(p.stdout.readline().strip(), flush=True)\n"
                    "import time; time.sleep(60)")
    tree = process_tree(parent.pid)
    try:
        assert len(tree) == 2, tree
        own = pss_bytes(parent.pid)
        meter = PeakMemory(root=parent.pid)
        meter.sample()
    finally:
        for pid in tree[1:]:
            os.kill(pid, signal.SIGKILL)
        parent.kill()
        parent.wait()
    assert own is not None and meter.peak is not None
    assert meter.peak - own >= 290 * MB, (own, meter.peak)
    meter.sample()  # the tree is gone: nothing measured, the peak stays
    assert meter.peak - own >= 290 * MB


def test_shared_pages_count_once_however_many_processes_map_them(tmp_path: Path) -> None:
    path = Path("/dev/shm") / f"hogwild-test-{time.monotonic_ns()}"
    try:
        with path.open("wb") as f:
            f.truncate(200 * MB)
        with path.open("r+b") as f:
            import mmap

            shared = mmap.mmap(f.fileno(), 0)
            shared[::4096] = b"y" * len(shared[::4096])  # resident, mapped by this process
            meter = PeakMemory()
            meter.sample()
            alone = meter.peak
            children = [_start(MAPPER, str(path)) for _ in range(3)]
            try:
                meter.sample()
                rss_view = sum(pss_bytes(c.pid) or 0 for c in children)
            finally:
                for c in children:
                    c.kill()
                    c.wait()
            shared.close()
    finally:
        path.unlink(missing_ok=True)
    assert alone is not None and meter.peak is not None
    # Four processes map 200 MB: their PSS adds up to it once (plus three small interpreters), not 800 MB.
    assert meter.peak - alone < 200 * MB, (alone, meter.peak)
    assert rss_view >= 3 * 200 * MB / 4 * 0.9, "each child's PSS holds its quarter of the shared pages"


def test_a_process_that_is_gone_is_not_measured() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert pss_bytes(child.pid) is None


def test_a_peak_held_only_inside_a_blocking_call_is_seen() -> None:
    # The leader's loop is not sampling during the final round or a checkpoint's write: the
    # meter's own thread must see memory that comes and goes inside such a call.
    meter = PeakMemory(every_s=0.05)
    meter.sample()
    before = meter.peak
    meter.start()
    try:
        held = bytearray(300 * MB)
        held[::4096] = b"x" * len(held[::4096])
        time.sleep(1.0)  # a blocking call, as a collective or torch.save is to the leader
        del held
    finally:
        meter.stop()
    assert before is not None and meter.peak is not None
    assert meter.peak - before >= 250 * MB, (before, meter.peak)


def test_a_tree_whose_memory_stays_flat_is_not_walked_again_until_it_grows(monkeypatch: pytest.MonkeyPatch) -> None:
    # A full PSS sample walks every page table of the tree (23 ms of CPU for a leader and a worker
    # with torch loaded): at four a second it took 9 % of a one-core machine's worker. The meter
    # reads the cheap resident set instead and walks the tree again only when that grew.
    from hogwild.report import memory

    walks: list[int] = []
    real = memory.pss_bytes
    root = os.getpid()  # one call for it per full sample, whatever else this process has started
    monkeypatch.setattr(memory, "pss_bytes", lambda pid: (walks.append(pid) if pid == root else None) or real(pid))
    meter = PeakMemory(every_s=0.02)
    meter.start()
    try:
        time.sleep(0.6)  # about 30 ticks of the meter's thread
        flat = len(walks)
        held = bytearray(300 * MB)
        held[::4096] = b"x" * len(held[::4096])
        time.sleep(0.3)
        grown = len(walks)
        del held
    finally:
        meter.stop()
    assert flat <= 2, f"{flat} full samples of a tree whose memory did not move"
    assert grown > flat and meter.peak is not None and meter.peak >= 300 * MB, (flat, grown, meter.peak)
