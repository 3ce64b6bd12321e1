"""One replica's training state in shared memory: the data, the model whose parameters are
views into one flat buffer, and the shared optimizer state. Built by the leader before any
worker starts (design rules 1 and 3 in docs/design.md)."""

from __future__ import annotations

from dataclasses import dataclass
import logging
from typing import Optional

import torch
from torch import Tensor, nn

from hogwild.config.defaults import auto_keeps_hogwild
from hogwild.config.plan import Plan
from hogwild.config.schema import Config
from hogwild.config.targets import import_target
from hogwild.data.datasets import Dataset, load_dataset
from hogwild.data.streams import StreamRecords, StreamSplit
from hogwild.errors import ConfigError
from hogwild.replica.compiled import check_compiler
from hogwild.replica.lr_schedule import check_schedule
from hogwild.replica.models import build_model
from hogwild.replica import resources
from hogwild.replica.meeting import STEPS_KEY, Meeting
from hogwild.replica.optim import (check_in_place, new_shared_state, row_tables, state_names,
                                   state_numel, torch_state_probe)
from hogwild.replica.rows import RowMarks, check_row_sparse
from hogwild.replica.shared import Slot, alloc, layout, param_slots, share_model
from hogwild.replica.task import Task, build_task, preflight

logger = logging.getLogger(__name__)


@dataclass
class Replica:
    ds: Dataset
    model: nn.Module
    flat: Tensor
    """Every parameter of ``model``, in one shared tensor."""
    opt_state: Optional[dict[str, Tensor]]
    """Optimizer state in shared memory (the barrier's, or ``optim.state=shared``), else None (per worker)."""
    task: Task
    """The loss, the test metrics and the baseline (replica/task.py)."""
    plan: Plan
    """The choices the config made for this replica (config/plan.py), as the leader built them."""
    marks: Optional[RowMarks] = None
    """``sync.row_sparse``: the stamps of the embedding tables' rows the workers write."""
    meeting: Optional[Meeting] = None
    """``optim.update=barrier``: where the workers' gradients meet (replica/meeting.py)."""
    streams: Optional[StreamRecords] = None
    """A training stream: each worker's latest stream states, for checkpoints and respawns."""
    compile: str = "off"
    """The torch.compile mode the workers use: train.compile, resolved (auto: default, or off)."""
    private_state_bytes: int = 0
    """The optimizer state each worker keeps in its own host memory (none when it is shared)."""

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [s.shape for s in layout(self.model)]

    @property
    def param_numel(self) -> int:
        """The flat buffer's parameter prefix; float buffers follow it."""
        return sum(s.numel for s in param_slots(self.model))


def replica_device(device: str, local_rank: int) -> torch.device:
    """The device this replica's model lives on: ``cuda:LOCAL_RANK`` made current before the flat
    buffer is allocated. Made current any later (when the process group is joined), a second
    local rank would allocate on GPU 0 and join NCCL on GPU 1: two ranks on one GPU, which NCCL
    refuses ("Duplicate GPU detected")."""
    if device != "cuda":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("device: cuda requested but torch.cuda.is_available() is False")
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise ConfigError(f"device: cuda for LOCAL_RANK {local_rank}, but this machine shows {count} GPU(s); "
                          f"start at most {count} replica(s) per machine (--nproc-per-node)")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> Optional[bool]:
    """Whether this CPU computes bf16 in hardware (x86 ``avx512_bf16``/``amx_bf16``, Arm ``bf16``);
    None when it cannot tell (no /proc/cpuinfo)."""
    try:
        with open(cpuinfo) as f:
            text = f.read()
    except OSError:
        return None
    flags = {w for line in text.splitlines() if line.startswith(("flags", "Features")) for w in line.split()}
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def warn_slow_bf16(cfg: Config, device: torch.device, cpuinfo: str = "/proc/cpuinfo") -> None:
    """One line where bf16 autocast on this CPU is emulated: it then runs several times slower
    than float32 (8x seen on a 2-core host), which nothing else would say."""
    if cfg.train.precision == "bf16" and device.type == "cpu" and cpu_has_native_bf16(cpuinfo) is False:
        logger.warning("train.precision=bf16: this CPU has no native bf16 (no avx512_bf16, amx_bf16 or bf16 "
                       "flag in %s), so bf16 autocast is emulated and slower than fp32; fp32 is faster here",
                       cpuinfo)


def model_sized_state(probe: list[dict[str, object]], params: list[Tensor]) -> int:
    """How many model-sized buffers a torch optimizer keeps (Adam: two), read off its state."""
    n = sum(p.numel() for p in params) or 1
    held = sum(v.numel() for state in probe for v in state.values() if isinstance(v, Tensor) and v.dim() > 0)
    return -(-held // n)


def build_replica(cfg: Config, plan: Plan, device: torch.device, replicas_here: int = 1,
                  syncs: bool = True) -> Replica:
    """``device`` comes from :func:`replica_device`, which has made it current; the ``plan``'s
    workers, ``replicas_here`` and ``syncs`` (the replica meets others in rounds) size the memory
    check."""
    warn_slow_bf16(cfg, device)
    compile_mode = check_compiler(cfg.train.compile, device)  # before any worker: a broken compiler fails here
    ds = load_dataset(cfg.data).share_memory_()
    if isinstance(ds.train, StreamSplit):
        check_stream_config(cfg)
    model = build_model(cfg.model, ds, cfg.train.seed)
    task = build_task(cfg, ds)
    # Before the model moves into shared memory and any worker spawns: a model, data or loss that
    # does not fit fails here in one line.
    sparse = preflight(model, ds, task, cfg.train.batch_size, torch.device("cpu"))
    check_schedule(cfg.sched, cfg.optim.lr)
    tables = check_row_sparse(cfg, model, sparse) if cfg.sync.row_sparse else None
    # A replica that never meets another has no round to send rows in: its workers stamp none.
    stamped = tables if syncs else None
    barrier = plan.barrier
    numel = sum(t.numel() for t in [*model.parameters(), *model.buffers()] if t.is_floating_point())
    state_n = state_numel(cfg.optim, numel, check_rowwise(cfg, model))
    copies: float = len(state_names(cfg.optim)) * state_n / max(numel, 1)
    if cfg.optim._target_:  # built and stepped once on copies: a bad one fails here in one line
        # An optimizer auto leaves on Hogwild is at the barrier only because optim.update said so.
        chosen = barrier and auto_keeps_hogwild(import_target(str(cfg.optim._target_), "optim._target_"))
        key = "optim.update" if chosen else "optim._target_"
        probe = torch_state_probe(cfg.optim, list(model.parameters()), key=key, sparse=sparse)
        copies = model_sized_state(probe, list(model.parameters()))
        if barrier:
            check_in_place(cfg.optim, list(model.parameters()), sparse)
    dense = sum(p.numel() for p, s in zip(model.parameters(), sparse) if p.requires_grad and not s)
    resources.check(cfg, plan, replicas_here, resources.Footprint(
        model_bytes=4 * numel, state_copies=copies, stamp_bytes=4 * sum(t.rows for t in stamped or []),
        row_bytes=4 * dense * plan.workers if barrier else 0, syncs=syncs))
    flat = share_model(model, device.type)
    opt_state, meeting = None, None
    if plan.shared_state:
        params = list(model.parameters())
        opt_state = new_shared_state(cfg.optim, params, param_slots(model), state_n, alloc, device.type)
    if barrier:
        assert opt_state is not None
        opt_state[STEPS_KEY] = torch.zeros(1, dtype=torch.float64).share_memory_()
        meeting = Meeting(plan.workers, param_slots(model), sparse, device.type, alloc,
                          trainable=[p.requires_grad for p in model.parameters()])
    marks = RowMarks(stamped, device.type) if stamped else None
    # A record per batch of a step, and the one before it: the state at the position the board
    # shows stays held while the worker reads its next step's batches.
    streams = StreamRecords(plan.workers, cfg.train.accumulate + 1) if isinstance(ds.train, StreamSplit) else None
    private = 0 if plan.shared_state or device.type != "cpu" else int(copies * 4 * numel)
    return Replica(ds, model, flat, opt_state, task, plan, marks, meeting, streams, compile_mode, private)


def check_rowwise(cfg: Config, model: nn.Module) -> list[Slot]:
    """The model's embedding tables under ``optim.rowwise`` (none without it); a model without any
    is refused in one line."""
    if not cfg.optim.rowwise:
        return []
    tables = row_tables(model)
    if not tables:
        raise ConfigError("optim.rowwise: the model has no nn.Embedding or nn.EmbeddingBag table to keep row-wise "
                          "state for; set optim.rowwise=false")
    return tables


def check_stream_config(cfg: Config) -> None:
    """What a stream cannot do, said before anything starts."""
    if cfg.train.max_steps is None and cfg.train.max_time is None:
        raise ConfigError("train.max_steps: the training data is a stream, which has no length (so no epochs); "
                          "set train.max_steps or train.max_time")
    if cfg.data.loader_workers:
        raise ConfigError("data.loader_workers: not with a training stream (each worker reads its own part of "
                          "the stream in order); set data.loader_workers=0")
