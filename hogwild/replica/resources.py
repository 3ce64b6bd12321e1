"""Cores, shared memory and RAM: what a run will take, checked before it takes it.

Unchecked, ``workers=1000`` or ``data.image_size=1000`` would eat all memory, and data
larger than ``/dev/shm`` would die half-way with a segment left behind. The estimates below run
before any tensor is allocated or process spawned (docs/design.md, rule 9); ``force=true`` skips
them for a user who knows better.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shutil
from dataclasses import dataclass
from typing import Any, Callable, Optional

from hogwild.config.plan import Plan
from hogwild.config.registry import DATASETS, SYNC_RULES
from hogwild.config.schema import Config, DataConfig, SyncConfig
from hogwild.config.sync import RUNGS
from hogwild.data.datasets import Builtin
from hogwild.errors import ConfigError
from hogwild.replica.rows import CHUNK_VALUES
from hogwild.replica.shared import SHM_PATH

logger = logging.getLogger(__name__)

# Resident memory of one spawned worker before its data: the interpreter, torch and its
# autograd buffers (measured ~250-350 MB on CPU with torch 2.x).
WORKER_RSS = 300 * 2**20
_GB = 2**30


def available_cores() -> int:
    """Cores this process may use: its affinity (taskset, cpusets), capped by its cgroup's CPU
    quota, at least 1.

    A container's CPU limit (Kubernetes ``limits.cpu``, ``docker --cpus``) is a CFS quota, not
    an affinity: the process still sees every core of the host. Sizing the thread budget by
    affinity alone then runs more threads than the quota feeds, and the group is throttled for
    the rest of each period: seen as 1 worker x 2 threads under a 2/3-core quota, 7x fewer steps
    per second than the same job at 1 thread. The quota is rounded down: a thread the quota
    cannot feed costs more in throttling than a fraction of a core left idle."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpu_limit()
    return max(1, min(cores, math.floor(quota))) if quota is not None else cores


def cgroup_cpu_limit(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> Optional[float]:
    """Cores the CFS quota of this process's cgroup and its ancestors allows (the smallest),
    or None when there is no limit or it cannot be read. cgroup v2 (``cpu.max``) and v1
    (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` under the ``cpu`` controller)."""
    try:
        with open(proc_cgroup) as f:
            lines = [ln.rstrip("\n").split(":", 2) for ln in f if ln.count(":") >= 2]
    except OSError:
        return None
    limits: list[float] = []
    for _, controllers, path in lines:
        if controllers == "":  # v2's unified hierarchy
            limits += _walk(root, path, _v2_limit)
        elif "cpu" in controllers.split(","):
            mount = os.path.join(root, controllers)
            limits += _walk(mount if os.path.isdir(mount) else os.path.join(root, "cpu"), path, _v1_limit)
    return min(limits) if limits else None


def _walk(mount: str, path: str, read: Callable[[str], Optional[float]]) -> list[float]:
    """The limits ``read`` finds in ``path``'s cgroup directory and every one above it."""
    found, parts = [], [q for q in path.split("/") if q]
    for depth in range(len(parts), -1, -1):
        limit = read(os.path.join(mount, *parts[:depth]))
        if limit is not None:
            found.append(limit)
    return found


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _v2_limit(d: str) -> Optional[float]:
    raw = _read(os.path.join(d, "cpu.max"))  # "max 100000" or "quota period"
    if raw is None or raw.startswith("max"):
        return None
    try:
        quota, period = (int(x) for x in raw.split()[:2])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_limit(d: str) -> Optional[float]:
    quota, period = _read(os.path.join(d, "cpu.cfs_quota_us")), _read(os.path.join(d, "cpu.cfs_period_us"))
    try:
        q, p = int(quota or "-1"), int(period or "0")
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None  # -1: no quota


def resolve_workers(workers: Any, local_replicas: int = 1) -> int:
    """``auto`` = the cores this process may use, shared among this host's replicas."""
    if workers != "auto":
        return int(workers)
    return max(1, available_cores() // max(1, local_replicas))


def data_bytes(cfg: DataConfig) -> Optional[int]:
    """float32 bytes the dataset will hold once loaded, or None when it cannot be known cheaply."""
    entry = DATASETS.get(cfg.name)
    return entry.nbytes(cfg) if isinstance(entry, Builtin) else None


def mem_available() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def shm_free() -> Optional[int]:
    try:
        return shutil.disk_usage(SHM_PATH).free
    except OSError:
        return None


def size(nbytes: float) -> str:
    """Bytes for a person: GB from one GB up, MiB below (a 64 MB /dev/shm is not "0.0 GB")."""
    return f"{nbytes / _GB:.1f} GB" if nbytes >= _GB else f"{nbytes / 2**20:.1f} MiB"


@dataclass(frozen=True)
class Footprint:
    """What a built model adds to a replica's memory (nothing before it is built)."""

    model_bytes: int = 0
    state_copies: float = 0
    """Model-sized buffers its optimizer keeps: Adam's two moments; row-wise Adagrad's a fraction of one."""
    stamp_bytes: int = 0
    """``sync.row_sparse``: its tables' row stamps (shared, and as much again in the leader for the
    rows' last rounds)."""
    row_bytes: int = 0
    """``optim.update=barrier``: the workers' gradient rows, which live in shared memory instead of in
    each worker."""
    syncs: bool = True
    """The replica will meet others in rounds (a lone replica keeps no round buffers)."""


def check(cfg: Config, plan: Plan, replicas_here: int = 1, built: Footprint = Footprint()) -> None:
    """Refuse, with the numbers, a run whose data and model will not fit in shared memory or whose
    processes will not fit in RAM. ``replicas_here``: replicas on this machine. Called twice: before
    the data is loaded, and once the model is ``built`` but before it is shared or any worker spawns."""
    if cfg.force:
        return
    data = data_bytes(cfg.data) or 0
    workers = plan.workers
    shared = built.state_copies if plan.shared_state else 0
    shm_parts = {"data": data * replicas_here,
                 "model": (int(built.model_bytes * (1 + shared)) + built.stamp_bytes + built.row_bytes) * replicas_here}
    shm = shm_free()
    if shm is not None and sum(shm_parts.values()) > shm:
        key = max(shm_parts, key=lambda k: shm_parts[k])
        what = cfg.data.name if key == "data" else "the model" + (" and its shared optimizer state" if shared else "")
        raise ConfigError(f"{key}: {what} needs {size(sum(shm_parts.values()))} of shared memory, "
                          f"{SHM_PATH} has {size(shm)} free; shrink the {key}, enlarge /dev/shm, or pass force=true")
    parts = memory_parts(cfg, workers, built.model_bytes, built.state_copies - shared, data, built.syncs,
                         private_grads=not built.row_bytes)
    parts["model"] += built.stamp_bytes
    need = replicas_here * sum(parts.values())
    avail = mem_available()
    if avail is not None and need > avail:
        key = max(parts, key=lambda k: parts[k])
        detail = ", ".join(f"{k} {size(replicas_here * v)}" for k, v in parts.items() if v)
        raise ConfigError(f"{key}: {workers} workers x {replicas_here} replica(s) need about {size(need)} of "
                          f"memory ({detail}), {size(avail)} is available; lower {key}, or pass force=true")


def memory_parts(cfg: Config, workers: int, model_bytes: int, private_state: float, data: int,
                 syncs: bool = True, private_grads: bool = True) -> dict[str, int]:
    """One replica's RAM by the key that sizes it: its worker processes (each with the model's
    gradients, unless they live in shared memory, and its private optimizer state), their
    DataLoader processes, the leader's round buffers (a fragment's snapshot and reduce buffer, the
    outer rule's state) and the data (built once, then shared)."""
    per_worker = WORKER_RSS + int(model_bytes * (int(private_grads) + private_state))
    return {"workers": workers * per_worker, "data.loader_workers": workers * cfg.data.loader_workers * WORKER_RSS,
            "model": int(round_bytes(cfg.sync, model_bytes)) if syncs else 0, "data": 2 * data}


def round_bytes(sync: SyncConfig, model_bytes: int) -> float:
    """The leader's round buffers: the snapshot and the reduce buffer of what one exchange carries
    (a fragment of the model, or under ``sync.row_sparse`` at most a chunk of rows), and the rule's
    model-sized state, which it keeps whole. A wire that climbs (``sync.compress=auto``) needs
    what its largest rung needs."""
    if sync.climbs():
        return max(round_bytes(dataclasses.replace(sync, dtype=d, fragments=f, compress="off"), model_bytes)
                   for d, f in RUNGS)
    kept = SYNC_RULES.get(sync.mode).state_copies  # type: ignore[attr-defined]
    if sync.dtype != "fp32":
        kept += 2 if sync.mode == "average" else 1  # the residual, and average's agreed base
    exchange = model_bytes / sync.fragments
    if sync.row_sparse:
        # Each exchange also cuts the kept state to its rows: as many chunk-sized copies again.
        return min(model_bytes, 4 * CHUNK_VALUES) * (2 + kept) + model_bytes * kept
    return 2 * exchange + model_bytes * kept

