"""The one place that reads torchrun's environment: where this leader sits in the job.

Reading happens in functions, never at import time, so tests can inject values.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Union

from hogwild.errors import ConfigError, UserError


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
    agent_store: bool = False
    """torchrun's agent already serves the store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE);
    otherwise rank 0 hosts it."""

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
        local_world = _int_env(env, "LOCAL_WORLD_SIZE", 1)
        if local_world < 1:
            raise UserError(f"environment variable LOCAL_WORLD_SIZE={local_world}: must be at least 1")
        port = _int_env(env, "MASTER_PORT", 29500)
        if not 1 <= port <= 65535:
            raise UserError(f"environment variable MASTER_PORT={port}: must be a TCP port, 1 to 65535")
        run_id = env.get("TORCHELASTIC_RUN_ID")
        return cls(
            rank=rank,
            world_size=world,
            local_rank=_int_env(env, "LOCAL_RANK", 0),
            local_world_size=local_world,
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=port,
            run_id=None if run_id in (None, "", "none") else run_id,
            restart_count=_int_env(env, "TORCHELASTIC_RESTART_COUNT", 0),
            agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
        )


def default_run_id(env: Optional[Mapping[str, str]] = None) -> str:
    """One output folder per job (design rule 8 in docs/design.md): torchrun's run id, else a timestamp.

    Under torchrun without ``--rdzv-id`` ranks could pick different seconds; the leaders
    then adopt rank 0's folder after rendezvous (see :func:`agree_on_path`).
    """
    run_id = DistEnv.from_env(env).run_id
    return run_id if run_id else time.strftime(RUN_TIME_FORMAT)


RUN_TIME_FORMAT = "%Y-%m-%d/%H-%M-%S"


def is_default_run_dir(path: Union[str, Path], env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether ``path`` has the form the schema's default gives (``outputs/<run id or time>``),
    so it was most likely not chosen by the user: an elastic slot started without ``run_dir``
    would otherwise write to a folder named after its own start time (hogwild/elastic/outputs.py)."""
    parts = Path(path).parts
    run_id = DistEnv.from_env(env).run_id
    if run_id and parts[-2:] == ("outputs", run_id):
        return True
    return (len(parts) >= 3 and parts[-3] == "outputs" and re.fullmatch(r"\d{4}-\d{2}-\d{2}", parts[-2]) is not None
            and re.fullmatch(r"\d{2}-\d{2}-\d{2}", parts[-1]) is not None)



def split_endpoint(endpoint: str, key: str = "elastic.coordinator") -> tuple[str, int]:
    """``host:port`` (the last colon splits, so an IPv6 host keeps its own); one line naming
    ``key`` when it is not one."""
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"{key}: expected host:port, got {endpoint!r}")
    return host, int(port)
