"""Job processes forked from one interpreter that has imported hogwild, instead of started afresh.

Most of a short job's start is its ``import torch`` (about 2 CPU-seconds; a test process has one
core on CI), and the suite starts a few hundred jobs. So each test process keeps one "zygote": an
interpreter that imported hogwild (torch, Hydra) and then does nothing but fork. A child becomes
``python -m MODULE ARGS``: the module run afresh as ``__main__`` in its own working directory,
environment, argv and log files, its exit code and signals as a fresh process's. hogwild-train makes
its own workers' fork server the same way (hogwild/replica/start.py).

What a fork does not redo: anything read when torch was imported (the OpenMP runtime's
``OMP_NUM_THREADS``, which a job sets for itself anyway: replica/resources.py). A test about a fresh
interpreter's start (the wheel, a restart while the others train on) starts one with subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

ZYGOTE = r"""
import json, os, runpy, select, sys
import hogwild.cli.coordinator, hogwild.cli.train, hogwild.leader.choose  # noqa: E401,F401
exits, buf, req = sys.argv[1], b"", None
os.write(1, b"ready\n")
while req is None:
    while True:  # reap the children, their exit codes to files Forked reads
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        with open(os.path.join(exits, f".{pid}"), "w") as f:
            f.write(str(os.waitstatus_to_exitcode(status)))
        os.replace(os.path.join(exits, f".{pid}"), os.path.join(exits, str(pid)))
    if b"\n" not in buf:
        if select.select([0], [], [], 0.05)[0]:
            chunk = os.read(0, 1 << 16)
            if not chunk:  # the test process is done with it
                sys.exit(0)
            buf += chunk
        continue
    line, buf = buf.split(b"\n", 1)
    spec = json.loads(line)
    pid = os.fork()
    if pid == 0:
        req = spec
    else:
        if os.path.exists(os.path.join(exits, str(pid))):  # an earlier child's, whose pid this one reuses
            os.unlink(os.path.join(exits, str(pid)))
        os.write(1, f"{pid}\n".encode())
if req.get("session"):  # as Popen(start_new_session=True): a group of its own, for os.killpg
    os.setsid()
os.chdir(req["cwd"])
os.environ.clear()
os.environ.update(req["env"])
for fd, path, flags in ((0, None, os.O_RDONLY), (1, req["out"], os.O_WRONLY | os.O_APPEND),
                        (2, req["log"], os.O_WRONLY | os.O_APPEND)):
    opened = os.open(path or os.devnull, flags)
    os.dup2(opened, fd)
    os.close(opened)
# sys.path as python -m sets it: the working directory first, then PYTHONPATH's entries.
extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
sys.path[:1] = [os.getcwd(), *[p for p in extra if p not in sys.path]]
sys.argv = ["-m", *req["argv"]]
sys.modules.pop(req["module"], None)  # run afresh as __main__, as python -m runs it
runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
"""


class Forked:
    """A child of the :class:`Zygote`, with the part of ``subprocess.Popen`` the tests use."""

    def __init__(self, pid: int, exit_file: Path, args: list[str], out: Optional[Path] = None,
                 err: Optional[Path] = None) -> None:
        self.pid, self.exit_file, self.args = pid, exit_file, args
        self.out, self.err = out, err
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None and self.exit_file.exists():
            self.returncode = int(self.exit_file.read_text())
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode

    def output(self) -> tuple[str, str]:
        """Its stdout and stderr so far (stderr empty where both go to one file, as with
        ``stderr=STDOUT``)."""
        out = self.out.read_text() if self.out else ""
        return out, (self.err.read_text() if self.err and self.err != self.out else "")

    def communicate(self, timeout: Optional[float] = None) -> tuple[str, str]:
        """As ``Popen.communicate`` with output to pipes: :meth:`output` once it has exited."""
        self.wait(timeout)
        return self.output()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The interpreter jobs fork from (see the module's docstring)."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.exits = tmp / "exits"
        self.exits.mkdir()
        self.lock = threading.Lock()
        self.proc = subprocess.Popen([sys.executable, "-c", ZYGOTE, str(self.exits)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=(tmp / "zygote.log").open("w"), cwd=tmp, env=env)
        assert self.proc.stdout is not None and self.proc.stdout.readline() == b"ready\n", \
            (tmp / "zygote.log").read_text()[-3000:]

    def start(self, module: str, args: list[str], cwd: Path, env: dict[str, str], log: Path,
              append: bool = False, stdout: Optional[Path] = None, session: bool = False) -> Forked:
        """``python -m module *args`` in ``cwd`` with ``env``, stderr to ``log``, stdout to ``stdout``
        (default: ``log`` too); ``session``: in a session and process group of its own, as
        ``Popen(start_new_session=True)`` starts one."""
        for path in {log, stdout or log}:  # there once this returns, as a Popen's output file is
            path.open("a" if append else "w").close()
        request = {"module": module, "argv": args, "cwd": str(cwd), "env": env, "log": str(log),
                   "out": str(stdout or log), "session": session}
        with self.lock:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            reply = self.proc.stdout.readline()
        assert reply, f"the zygote is gone: {(self.exits.parent / 'zygote.log').read_text()[-3000:]}"
        return Forked(int(reply), self.exits / reply.decode().strip(), [module, *args], stdout or log, log)

    def run_many(self, module: str, jobs: list[tuple[list[str], dict[str, str]]], cwd: Path,
                 timeout: float) -> list[subprocess.CompletedProcess[str]]:
        """``python -m module`` once per job (its args and env), all started at once, each as
        ``subprocess.run(..., capture_output=True, text=True)``, within one ``timeout`` for all:
        ``subprocess.TimeoutExpired`` if any is still running then, and none outlives the call."""
        out = Path(tempfile.mkdtemp(dir=self.exits.parent))
        procs = [self.start(module, args, cwd, env, out / f"{i}.err", stdout=out / f"{i}.out")
                 for i, (args, env) in enumerate(jobs)]
        try:
            deadline = time.monotonic() + timeout
            for proc in procs:
                proc.wait(max(0.0, deadline - time.monotonic()))
        finally:
            for proc in procs:
                proc.kill()
        return [subprocess.CompletedProcess([sys.executable, "-m", module, *args], proc.returncode,
                                            (out / f"{i}.out").read_text(), (out / f"{i}.err").read_text())
                for i, (proc, (args, _)) in enumerate(zip(procs, jobs))]

    def run(self, module: str, args: list[str], cwd: Path, env: dict[str, str],
            timeout: float) -> subprocess.CompletedProcess[str]:
        """As ``subprocess.run(..., capture_output=True, text=True, timeout=timeout)``."""
        return self.run_many(module, [(args, env)], cwd, timeout)[0]

    def close(self) -> None:
        """Stop it and remove its directory (its children's exit codes, ``run``'s captured output)."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)
        shutil.rmtree(self.exits.parent, ignore_errors=True)
