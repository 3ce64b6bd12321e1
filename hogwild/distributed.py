"""The one place that reads torchrun's environment and sets up the leaders' process group.

Only leaders (one per replica) ever join the group; workers never see these variables'
meaning. Reading happens in functions, never at import time, so tests can inject values.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from datetime import timedelta
from typing import Mapping, Optional

import torch
import torch.distributed as dist

from hogwild.comm import Comm, DistComm, LocalComm
from hogwild.errors import ConfigError, UserError, first_line

logger = logging.getLogger(__name__)


def _int_env(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise UserError(f"environment variable {key}: expected an integer, got {raw!r}") from None


@dataclass(frozen=True)
class DistEnv:
    """Where this leader sits in the job; a plain ``hogwild-train`` is rank 0 of 1."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    run_id: Optional[str] = None
    restart_count: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def endpoint(self) -> str:
        return f"{self.master_addr}:{self.master_port}"

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> "DistEnv":
        env = os.environ if env is None else env
        world = _int_env(env, "WORLD_SIZE", 1)
        rank = _int_env(env, "RANK", 0)
        if not 0 <= rank < max(world, 1):
            raise UserError(f"environment variable RANK={rank} is outside WORLD_SIZE={world}")
        run_id = env.get("TORCHELASTIC_RUN_ID")
        return cls(
            rank=rank,
            world_size=world,
            local_rank=_int_env(env, "LOCAL_RANK", 0),
            local_world_size=_int_env(env, "LOCAL_WORLD_SIZE", 1),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_int_env(env, "MASTER_PORT", 29500),
            run_id=None if run_id in (None, "", "none") else run_id,
            restart_count=_int_env(env, "TORCHELASTIC_RESTART_COUNT", 0),
        )


def default_run_id(env: Optional[Mapping[str, str]] = None) -> str:
    """One output folder per job (design rule 8 in docs/design.md): torchrun's run id, else a timestamp.

    Under torchrun without ``--rdzv-id`` ranks could pick different seconds; the leaders
    then adopt rank 0's folder after rendezvous (see :func:`agree_on_path`).
    """
    run_id = DistEnv.from_env(env).run_id
    return run_id if run_id else time.strftime("%Y-%m-%d/%H-%M-%S")


def hydra_output_subdir(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    return ".hydra" if DistEnv.from_env(env).rank == 0 else None


def pick_backend(requested: str, device: str) -> str:
    if requested == "auto":
        return "nccl" if device == "cuda" else "gloo"
    if requested == "nccl" and not torch.cuda.is_available():
        raise ConfigError("sync.backend: nccl requested but CUDA is not available on this machine")
    return requested


def init_group(env: DistEnv, backend: str, timeout_s: float, device: str) -> None:
    """Join the leaders' group, failing within ``timeout_s`` with the endpoint in the message."""
    if not env.distributed or dist.is_initialized():
        return
    if device == "cuda":
        torch.cuda.set_device(env.local_rank)
    timeout = timedelta(seconds=timeout_s)
    logger.info("rank %d/%d joining %s group at %s (timeout %.0fs)",
                env.rank, env.world_size, backend, env.endpoint, timeout_s)
    # Under torchrun the agent already serves a store on MASTER_PORT; otherwise rank 0 hosts it.
    # Keys are prefixed by the restart count: after `--max-restarts` a new attempt must never
    # read the dead attempt's gloo addresses (seen: "Connection refused" right after a restart).
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    try:
        store = dist.TCPStore(env.master_addr, env.master_port, env.world_size,
                              is_master=env.rank == 0 and not agent_store, timeout=timeout,
                              wait_for_workers=False)
        prefixed = dist.PrefixStore(f"hogwild/attempt_{env.restart_count}", store)
        dist.init_process_group(backend, store=prefixed, rank=env.rank, world_size=env.world_size,
                                timeout=timeout)
    except (RuntimeError, TimeoutError, dist.DistError) as e:
        raise UserError(
            f"sync: could not join the process group at {env.endpoint} within {timeout_s:.0f}s "
            f"(sync.timeout_s): {first_line(e)}") from None


def join_torchrun_group(env: DistEnv, backend: str, timeout_s: float, device: str, run_dir: Path, workers: int,
                        wire: torch.device) -> tuple[Comm, Path]:
    """The leaders' collectives and the job's agreed run_dir; a lone replica gets the identity."""
    if not env.distributed:
        return LocalComm(), run_dir
    init_group(env, pick_backend(backend, device), timeout_s, device)
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
