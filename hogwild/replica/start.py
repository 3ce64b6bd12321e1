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
2 s of CPU). The command line does better (:func:`fork_server_from_here`): once it has composed
its config, and done nothing else but imports, it imports the modules of the config's
``_target_`` callables (a user's model module, ``transformers``: 3-4 s of CPU for a Hugging Face
model) and forks itself into the server. The leader needs those modules anyway, and no worker
imports them again. Anywhere else (a script or a notebook calling the API, which may already run
threads or hold CUDA) the server is a fresh interpreter as multiprocessing makes it, which imports
those modules once itself (:func:`preload`).
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import types
import warnings
from multiprocessing import forkserver, util
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import TYPE_CHECKING, Any, Callable, Optional

from hogwild.config.targets import import_target, stored_targets
from hogwild.errors import ConfigError

if TYPE_CHECKING:
    from hogwild.config.schema import Config

logger = logging.getLogger(__name__)

# Imported once by the fork server, before it forks: everything a worker needs.
PRELOAD = ["hogwild.replica.worker"]

# Under ``python -m hogwild.cli.train`` the server has imported the main module by its name, and
# each child runs it again as ``__mp_main__`` (multiprocessing's rule for ``-m``). runpy warns
# that the module is already imported, once per worker. The second run is into a fresh
# namespace and harmless; the filter is inherited by the children (this module is preloaded).
warnings.filterwarnings("ignore", message=r".* found in sys\.modules after import of package ",
                        category=RuntimeWarning, module="runpy")


def preload(cfg: Optional[Config] = None) -> list[str]:
    """:data:`PRELOAD`, the leader's main module, which every child imports again as
    ``__mp_main__`` (as with spawn): ``hogwild.cli.train`` under ``python -m``, a console script
    or a user's script by path (``"__main__"``, which the server imports from its path), and the
    modules of ``cfg``'s targets (:func:`target_modules`). Loaded once in the server, they cost a
    child nothing; the main module is what pulls in Hydra, the targets a user's model library.

    Not the targets of a CUDA run: a module that touched CUDA as it was imported would leave the
    server, and every worker forked from it, with a CUDA it cannot use (design rule 5). Its
    workers import them as before."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    targets = target_modules(cfg) if cfg is not None and cfg.device == "cpu" else []
    return [*PRELOAD, name if name and not name.endswith("__main__") else "__main__", *targets]


def target_modules(cfg: Config) -> list[str]:
    """The modules that define ``cfg``'s ``_target_`` callables (the model and the objects built
    for its arguments, data, loss, step, optim, sched), imported here if they are not yet: what
    each worker would otherwise import again as it unpickles its data and builds its model, step
    and optimizer. The defining module, not the path's: ``transformers.GPT2LMHeadModel`` is
    ``transformers.models.gpt2.modeling_gpt2``, which the lazy ``transformers`` package alone
    does not import. A target that fails to import is left out: building the replica names it."""
    names: list[str] = []
    for key, path in stored_targets(dataclasses.asdict(cfg)).items():
        try:
            obj = import_target(path, key)
        except ConfigError:
            continue
        name = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)
        # Only what imported here without fault: the server's preload stops at anything but an
        # ImportError. A script's own classes are in __main__, which the server loads anyway.
        if isinstance(name, str) and name in sys.modules and name not in ("__main__", "__mp_main__", *names):
            names.append(name)
    return names


def worker_context(cfg: Optional[Config] = None) -> BaseContext:
    """The fork server where the platform has one (Linux, macOS), else spawn (Windows); its
    server preloads ``cfg``'s target modules (:func:`preload`)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    # Only read when the server starts: a process that already runs one keeps its preload.
    ctx.set_forkserver_preload(preload(cfg))
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


def fork_server_from_here(cfg: Optional[Config] = None) -> bool:
    """Start the fork server as a fork of this process rather than as a fresh interpreter, with
    the modules of ``cfg``'s targets imported here first (:func:`target_modules`), so that
    neither the server nor any worker imports them again. Only for a process that has done
    nothing but imports and compose its config (the command line, before it runs a job): one
    thread, CUDA untouched, so the fork carries no thread or device state (design rule 5). The
    server's code is multiprocessing's own; only how its process is made changes. False where
    that does not hold: the server then starts later as a fresh interpreter."""
    # Linux only: on macOS, system frameworks that torch loads are not safe to use after a fork.
    if not sys.platform.startswith("linux") or threading.active_count() != 1 or _cuda_touched():
        return False
    if cfg is not None:
        target_modules(cfg)  # the leader imports them anyway, to build its replica
        if threading.active_count() != 1 or _cuda_touched():
            logger.debug("importing the targets started a thread or touched CUDA: no fork server from here")
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
        worker_context(cfg)  # its preload list
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
        # multiprocessing's server hands its children the SIGINT disposition it found here: left as
        # Python's default, a Ctrl-C in the moment between a worker's fork and its own SIG_IGN
        # (replica/worker.py) printed a KeyboardInterrupt traceback from _bootstrap (seen in a
        # suite run: test_signal_shm's warm-up case). Ctrl-C is the leader's.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        exec(code, {"__name__": "__mp_fork_server__"})  # noqa: S102 - multiprocessing's own command
    except BaseException:  # noqa: BLE001 - SystemExit is how the server ends (its leader is gone)
        pass
    os._exit(0)  # never the leader's atexit handlers, never back into the leader's code
