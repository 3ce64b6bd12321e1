"""One flat shared-memory buffer for all parameters and float buffers; the module's
parameters and buffers are views into it.

Layout: every parameter (``named_parameters``: tied ones once), then every float buffer
(BatchNorm's running mean and variance). Workers' forward passes update those buffers in
place, Hogwild-style, and sync rounds average them with the parameters. Integer buffers
(``num_batches_tracked``) cannot live in a float32 buffer and stay private to each process;
they only matter to BatchNorm with ``momentum=None`` (design rule 13 in docs/design.md).

One buffer means one file descriptor (not one per tensor), one collective per sync and
one ``clone()`` per snapshot (design rule 3 in docs/design.md). The buffer is allocated and the leader's
parameters are re-pointed *before* any worker starts (design rule 1).
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from hogwild.errors import UserError

logger = logging.getLogger(__name__)

SHM_PATH = "/dev/shm"


@dataclass(frozen=True)
class Slot:
    name: str
    offset: int
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def view(self, flat: Tensor) -> Tensor:
        return flat[self.offset:self.offset + self.numel].view(self.shape)


def _float_buffers(model: nn.Module) -> list[tuple[str, Tensor]]:
    return [(n, b) for n, b in model.named_buffers() if b.is_floating_point()]


def layout(model: nn.Module) -> list[Slot]:
    """Parameters first (the optimizer's slots are this list's prefix), then float buffers."""
    slots, off = [], 0
    for name, t in [*model.named_parameters(), *_float_buffers(model)]:
        slots.append(Slot(name, off, tuple(t.shape)))
        off += t.numel()
    return slots


def param_slots(model: nn.Module) -> list[Slot]:
    return layout(model)[:len(list(model.parameters()))]


def numel(model: nn.Module) -> int:
    return sum(s.numel for s in layout(model))


def check_dtypes(model: nn.Module) -> Optional[str]:
    """Why ``model`` cannot live in one float32 buffer, or None."""
    for name, t in [*model.named_parameters(), *_float_buffers(model)]:
        if t.dtype != torch.float32:
            return f"{name} is {t.dtype}; hogwild shares float32 parameters and buffers only"
    return None


def check_shm(nbytes: int, path: str = SHM_PATH) -> None:
    """Fail clearly, before allocating, when /dev/shm (64 MB in many containers) is too small."""
    if not os.path.isdir(path):
        return
    free = shutil.disk_usage(path).free
    # 10% headroom: torch and the data tensors share the same tmpfs.
    if free < nbytes * 1.1:
        raise UserError(
            f"shared memory: the model needs {nbytes / 2**20:.1f} MiB in {path} but only "
            f"{free / 2**20:.1f} MiB is free; raise it (docker run --shm-size=1g, or "
            f"mount -o remount,size=1G {path}) or use a smaller model")


def alloc(n: int, device: str, dtype: torch.dtype = torch.float32) -> Tensor:
    """A zeroed flat tensor every spawned worker can write: shm on CPU, CUDA IPC on GPU."""
    if device == "cuda":
        return torch.zeros(n, dtype=dtype, device="cuda")
    check_shm(n * torch.tensor([], dtype=dtype).element_size())
    return torch.zeros(n, dtype=dtype).share_memory_()


def state_dict_of(model: nn.Module, flat: Tensor) -> dict[str, Tensor]:
    """``model.state_dict()``'s names and shapes with the values of ``flat`` (a copy of the shared
    buffer): the portable half of a checkpoint, which loads into the user's own module with
    ``load_state_dict``. Shared slots are views of ``flat``, so ``torch.save`` stores their
    values once; what the buffer does not hold (``num_batches_tracked``) comes from ``model``."""
    slots = {s.name: s for s in layout(model)}
    return {name: slots[name].view(flat) if name in slots else t.detach().to("cpu", copy=True)
            for name, t in model.state_dict(keep_vars=False).items()}


def bind(model: nn.Module, flat: Tensor, copy_values: bool = False) -> None:
    """Point every parameter of ``model`` at its slice of ``flat``.

    Only ever called on a model before it trains (leader: before spawning; worker: right
    after it starts). Rebinding later would silently break sharing (design rule 1).
    """
    slots = layout(model)
    if slots and slots[-1].offset + slots[-1].numel != flat.numel():
        raise ValueError(f"flat buffer holds {flat.numel()} values, model needs {numel(model)}")
    with torch.no_grad():
        params = list(model.parameters())
        for slot, p in zip(slots, params):
            view = slot.view(flat)
            if copy_values:
                view.copy_(p.data)
            p.data = view
        for slot in slots[len(params):]:
            owner, _, leaf = slot.name.rpartition(".")
            mod = model.get_submodule(owner)
            view = slot.view(flat)
            if copy_values:
                view.copy_(mod.get_buffer(leaf))
            # The module now reads and updates the shared slice; re-registering keeps the
            # buffer's persistence (a non-persistent buffer stays out of state_dict).
            mod.register_buffer(leaf, view, persistent=leaf not in mod._non_persistent_buffers_set)


def share_model(model: nn.Module, device: str) -> Tensor:
    """Move ``model``'s parameters into a new flat shared buffer and return the buffer."""
    flat = alloc(numel(model), device)
    model.to(device)
    bind(model, flat, copy_values=True)
    logger.info("shared model: %d values (parameters and float buffers), %.2f MiB, on %s", flat.numel(),
                flat.numel() * 4 / 2**20, device)
    return flat
