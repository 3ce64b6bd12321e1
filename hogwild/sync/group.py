"""The torchrun group: the leaders' process group, set up from the environment (config/env.py).

Only leaders (one per replica) ever join the group; workers never see these variables'
meaning. Reading happens in functions, never at import time, so tests can inject values.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.distributed as dist

from hogwild.config.env import DistEnv
from hogwild.config.schema import SyncConfig
from hogwild.errors import ConfigError, UserError, first_line
from hogwild.native import until_stopped
from hogwild.sync.comm import Comm, DistComm, LocalComm

logger = logging.getLogger(__name__)


def pick_backend(requested: str, device: str) -> str:
    if requested == "auto":
        return "nccl" if device == "cuda" else "gloo"
    if requested == "nccl" and not torch.cuda.is_available():
        raise ConfigError("sync.backend: nccl requested but CUDA is not available on this machine")
    return requested


def init_group(env: DistEnv, backend: str, timeout_s: float, device: str,
               stopped: Callable[[], bool] = lambda: False) -> None:
    """Join the leaders' group, failing within ``timeout_s`` with the endpoint in the message,
    or at once with :class:`StopNow` when ``stopped()`` (a SIGTERM while peers never come)."""
    if not env.distributed or dist.is_initialized():
        return
    if device == "cuda":
        torch.cuda.set_device(env.local_rank)
    timeout = timedelta(seconds=timeout_s)
    logger.info("rank %d/%d joining %s group at %s (timeout %.0fs)",
                env.rank, env.world_size, backend, env.endpoint, timeout_s)
    # Keys are prefixed by the restart count: after `--max-restarts` a new attempt must never
    # read the dead attempt's gloo addresses ("Connection refused" right after a restart).
    def rendezvous() -> None:
        store = dist.TCPStore(env.master_addr, env.master_port, env.world_size,
                              is_master=env.rank == 0 and not env.agent_store, timeout=timeout,
                              wait_for_workers=False)
        prefixed = dist.PrefixStore(f"hogwild/attempt_{env.restart_count}", store)
        dist.init_process_group(backend, store=prefixed, rank=env.rank, world_size=env.world_size,
                                timeout=timeout)
    try:
        # In its own thread: blocked in C++, the main thread would never run a signal handler.
        until_stopped(rendezvous, stopped, "hogwild-rendezvous")
    except (RuntimeError, TimeoutError, dist.DistError) as e:
        raise UserError(
            f"sync: could not join the process group at {env.endpoint} within {timeout_s:.0f}s "
            f"(sync.timeout_s): {first_line(e)}") from None


def join_torchrun_group(env: DistEnv, sync: SyncConfig, device: str, run_dir: Path, workers: int,
                        wire: torch.device, stopped: Callable[[], bool] = lambda: False) -> tuple[Comm, Path]:
    """The leaders' collectives (``sync.backend``, ``sync.timeout_s``) and the job's agreed run_dir;
    a lone replica gets the identity."""
    if not env.distributed:
        return LocalComm(), run_dir
    init_group(env, pick_backend(sync.backend, device), sync.timeout_s, device, stopped)
    run_dir = Path(agree_on_path(str(run_dir)))
    agree_on_workers(workers)
    return DistComm(wire), run_dir


def destroy_group() -> None:
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - teardown after a failure must not mask it
            logger.debug("destroy_process_group failed", exc_info=True)


def agree_on_path(path: str) -> str:
    """All leaders adopt rank 0's value (run dirs picked by wall clock may differ)."""
    if not dist.is_initialized():
        return path
    box: list[Optional[str]] = [path]
    dist.broadcast_object_list(box, src=0)
    return str(box[0])


def agree_on_workers(k: int) -> None:
    """Every leader must run the same number of workers: shards are numbered replica-major."""
    if not dist.is_initialized():
        return
    ks: list[int] = [0] * dist.get_world_size()
    dist.all_gather_object(ks, k)
    if len(set(ks)) != 1:
        raise ConfigError(f"workers: replicas resolved different worker counts {ks}; set workers=K explicitly")
