"""How worker processes start: from a fork server that has imported torch once, or by spawn.

``spawn`` starts each worker as a fresh interpreter that imports torch again: 2-3 s of CPU per
worker and per respawn, on every machine, every run. ``fork`` is not an option (design rule 5
in docs/design.md): a child forked from the leader inherits autograd's and CUDA's threads in a
broken state. A fork server is the safe middle: a fresh interpreter, started by the leader,
that imports the worker's modules (torch among them) and then only forks. It never builds a
model, runs autograd or touches CUDA, so its children are forks of a process that has done
nothing but imports, and a worker starts in a fraction of a second.

What a forked child does not get from the leader, it is handed explicitly: the objects to
share are pickled to it as with spawn (file descriptors pass through the server), ``sys.path``
and the working directory arrive with multiprocessing's preparation data, and the environment,
which the server froze when it started, travels with each worker (:func:`environment`).

multiprocessing starts its server as a fresh interpreter, which imports torch once more (about
2 s of CPU). The command line does better (:func:`fork_server_from_here`): at its very start,
when it has done nothing but imports, it forks itself into the server. Anywhere else (a script
or a notebook calling the API, which may already run threads or hold CUDA) the server is a fresh
interpreter as multiprocessing makes it.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import warnings
from multiprocessing import forkserver, util
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any, Callable, Optional

logger = logging.getLogger(__name__)

# Imported once by the fork server, before it forks: everything a worker needs.
PRELOAD = ["hogwild.replica.worker"]

# Under ``python -m hogwild.cli.train`` the server has imported the main module by its name, and
# each child runs it again as ``__mp_main__`` (multiprocessing's rule for ``-m``). runpy warns
# that the module is already imported, once per worker. The second run is into a fresh
# namespace and harmless; the filter is inherited by the children (this module is preloaded).
warnings.filterwarnings("ignore", message=r".* found in sys\.modules after import of package ",
                        category=RuntimeWarning, module="runpy")


def preload() -> list[str]:
    """:data:`PRELOAD`, and the leader's main module, which every child imports again as
    ``__mp_main__`` (as with spawn): ``hogwild.cli.train`` under ``python -m``, a console script
    or a user's script by path (``"__main__"``, which the server imports from its path). Loaded
    once in the server, it costs a child nothing; it is what pulls in Hydra."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    return [*PRELOAD, name if name and not name.endswith("__main__") else "__main__"]


def worker_context() -> BaseContext:
    """The fork server where the platform has one (Linux, macOS), else spawn (Windows)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    # Only read when the server starts: a process that already runs one keeps its preload.
    ctx.set_forkserver_preload(preload())
    return ctx


def environment() -> dict[str, str]:
    """The leader's environment now, for :func:`adopt_environment` in the worker."""
    return dict(os.environ)


def adopt_environment(env: dict[str, str]) -> None:
    """Take the leader's environment as it was at this worker's start. A forked child has the
    fork server's, frozen when the first worker started: a variable the leader (or a script
    calling the API twice) set since would otherwise be missing here."""
    if env != dict(os.environ):
        os.environ.clear()
        os.environ.update(env)


def leader_watch(life: Optional[Connection]) -> Callable[[], bool]:
    """Whether the worker's leader still lives. A forked worker's parent is the fork server, and
    the server lives on while any of its children do (each holds its "alive" pipe), so a parent
    pid that never changes says nothing. ``life`` is the read end of a pipe whose write end only
    the leader holds: it reads end-of-file once the leader is gone, however it ended (kill -9
    included). Without one (a loop run in-process, by tests), the parent pid."""
    if life is None:
        parent = os.getppid()
        return lambda: os.getppid() == parent
    return lambda: not life.poll()


def fork_server_from_here() -> bool:
    """Start the fork server as a fork of this process rather than as a fresh interpreter. Only
    for a process that has done nothing but imports (the command line, first thing): one thread,
    CUDA untouched, so the fork carries no thread or device state (design rule 5). The server's
    code is multiprocessing's own; only how its process is made changes. False, with nothing
    done, where that does not hold: the server then starts later as a fresh interpreter."""
    # Linux only: on macOS, system frameworks that torch loads are not safe to use after a fork.
    if not sys.platform.startswith("linux") or threading.active_count() != 1 or _cuda_touched():
        return False
    original = util.spawnv_passfds

    def fork_instead(path: str, args: list[str], passfds: Any) -> int:
        code = args[-1] if len(args) >= 2 and args[-2] == "-c" else ""
        if "multiprocessing.forkserver import main" not in code:
            return original(path, args, passfds)  # the resource tracker, or a layout we do not know
        pid = os.fork()
        if pid == 0:
            _serve(code, passfds)
        return pid

    util.spawnv_passfds = fork_instead
    try:
        worker_context()  # its preload list
        forkserver.ensure_running()
    except Exception:  # noqa: BLE001 - the fresh-interpreter server is always there to fall back on
        logger.debug("fork server from the leader failed; the workers' first start will make one",
                     exc_info=True)
        return False
    finally:
        util.spawnv_passfds = original
    return True


def _cuda_touched() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.cuda.is_initialized())


def _serve(code: str, passfds: Any) -> None:
    """In the forked child: become the server as the fresh interpreter would, and never return."""
    try:
        # As an exec with close_fds would: the server holds its passed pipes and stdio, nothing of
        # the leader's (a pipe it holds open could keep a reader waiting for an end).
        keep = {0, 1, 2, *map(int, passfds)}
        for fd in [int(n) for n in os.listdir("/proc/self/fd")]:
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        # The parent's record of its server is mid-start here, its lock held: a worker that starts
        # processes of its own (a DataLoader under the forkserver method) must find a clean one.
        forkserver._forkserver.__init__()  # type: ignore[misc]
        # A SIGTERM to the process group is the leader's to handle: a server killed by it could
        # start no worker, and it leaves anyway once its leader closes the pipe it reads.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        exec(code, {"__name__": "__mp_fork_server__"})  # noqa: S102 - multiprocessing's own command
    except BaseException:  # noqa: BLE001 - SystemExit is how the server ends (its leader is gone)
        pass
    os._exit(0)  # never the leader's atexit handlers, never back into the leader's code
