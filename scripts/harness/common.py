"""What the benchmark scripts share: a free port, a clean environment for the processes they start,
the training command line, its results, the files a script writes, and its plots."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
logger = logging.getLogger(__name__)
LAUNCHERS = ("RANK", "WORLD_", "LOCAL_", "MASTER_", "TORCHELASTIC", "HOGWILD_")
"""Variables a launcher (torchrun, a hogwild job) sets, which a process started afresh must not inherit."""


def names(ap: argparse.ArgumentParser, option: str, value: str, known: Iterable[str], what: str = "") -> list[str]:
    """The comma-separated names of ``value``, in order; ``ap.error`` (exit 2) names any not ``known``."""
    known = list(known)
    chosen = [n for n in value.split(",") if n]
    bad = [n for n in chosen if n not in known]
    if bad:
        ap.error(f"{option}: unknown {what}{', '.join(bad)}; choose from {', '.join(known)}")
    return chosen


def sh(*cmd: str) -> subprocess.CompletedProcess[str]:
    """Run a setup command (``ip``, ``tc``, ``sysctl``), its output captured; raise where it fails."""
    return subprocess.run(cmd, check=True, capture_output=True, text=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    """A live process's user + system CPU seconds, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def connects(port: int) -> bool:
    """Something on 127.0.0.1 accepts connections on ``port`` now (a coordinator that listens)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def start_coordinator(port: int, env: Optional[dict[str, str]] = None, out: Any = subprocess.DEVNULL,
                      timeout_s: float = 60.0) -> subprocess.Popen[bytes]:
    """``hogwild-coordinator`` on 127.0.0.1:``port`` in a process of its own (``out``: where its lines
    go), returned once it accepts connections: its own import of torch takes a second or two, which a
    measurement of its load must not count and a member's first call need not wait out."""
    proc = subprocess.Popen([sys.executable, "-m", "hogwild.cli.coordinator", "--host", "127.0.0.1", "--port",
                             str(port)], stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout_s
    while not connects(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the coordinator on port {port} never listened (exit {proc.wait()})")
        time.sleep(0.05)
    return proc


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without :data:`LAUNCHERS`' variables, unbuffered, with ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHERS)}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def train_cmd(args: list[str], replicas: int = 1, *flags: str, launcher: str = "torch.distributed.run") -> list[str]:
    """``python -m hogwild.cli.train ARGS``; with ``replicas`` > 1, that many on this host under
    ``launcher`` (a c10d rendezvous on a free port, and ``flags``)."""
    cmd = [sys.executable, "-m", "hogwild.cli.train", *args]
    if replicas <= 1:
        return cmd
    return [sys.executable, "-m", launcher, "--nnodes=1", f"--nproc-per-node={replicas}", *flags,
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", *cmd[1:]]


def metrics(run_dir: Path) -> dict[str, Any]:
    """The run's ``metrics.json``."""
    return dict(json.loads((run_dir / "metrics.json").read_text()))


def train(args: list[str], run_dir: Path, timeout: float = 900) -> dict[str, Any]:
    """One fresh run of ``args`` (from the repository root) to its end: its ``metrics.json``."""
    proc = subprocess.run(train_cmd([*args, f"run_dir={run_dir}", "resume=false"]), cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return metrics(run_dir)


def put_result(result: dict[str, Any]) -> None:
    """The one line a rank started by another script prints for it (:func:`result_line`)."""
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


def result_line(log: str) -> dict[str, Any]:
    """What :func:`put_result` printed in ``log``; StopIteration where it did not."""
    line = next(ln for ln in log.splitlines() if ln.startswith("RESULT "))
    return dict(json.loads(line[len("RESULT "):]))


@contextlib.contextmanager
def busy_core(core: Optional[int]) -> Iterator[None]:
    """A process spinning on ``core`` while the block runs (None: none), so that core is shared
    with whatever else lands on it (a straggler for DDP, which waits for its slowest rank)."""
    proc = None if core is None else subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"])
    try:
        yield
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


def table_head(*columns: str) -> list[str]:
    """A markdown table's header and rule."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def write_results(out: Path, name: str, data: Any, text: str, indent: int = 2) -> None:
    """``<out>/<name>.json`` (``data``) and ``<out>/<name>.md`` (``text``, also printed)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=indent, default=str) + "\n")
    (out / f"{name}.md").write_text(text)
    sys.stdout.write(text)


def reached(value: Any) -> bool:
    """A time to the target exists: metrics.json has null when it was missed, the baselines NaN."""
    return value is not None and value == value


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or None (with a warning) where it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib not installed (pip install -e '.[bench]'): no PNG")
        return None
    return plt


def arm_summary(rs: list[dict[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
    """One arm's runs of a race: the median of each of ``keys`` and of the curve's last loss over the runs
    that did not fail, how many did, and the runs themselves (only those two where every run failed)."""
    ok = [r for r in rs if "error" not in r]
    if not ok:
        return {"failed": len(rs), "runs": rs}
    out: dict[str, Any] = {k: statistics.median(r[k] for r in ok) for k in keys}
    out.update(curve_end=statistics.median(r["curve"][-1]["loss"] for r in ok), failed=len(rs) - len(ok), runs=rs)
    return out
