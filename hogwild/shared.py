"""One flat shared-memory buffer for all parameters; module parameters are views into it.

One buffer means one file descriptor (not one per tensor), one collective per sync and
one ``clone()`` per snapshot (design rule 3 in docs/design.md). The buffer is allocated and the leader's
parameters are re-pointed *before* any worker starts (design rule 1).
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass

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


def layout(model: nn.Module) -> list[Slot]:
    slots, off = [], 0
    for name, p in model.named_parameters():
        slots.append(Slot(name, off, tuple(p.shape)))
        off += p.numel()
    return slots


def numel(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


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


def bind(model: nn.Module, flat: Tensor, copy_values: bool = False) -> None:
    """Point every parameter of ``model`` at its slice of ``flat``.

    Only ever called on a model before it trains (leader: before spawning; worker: right
    after it starts). Rebinding later would silently break sharing (design rule 1).
    """
    slots = layout(model)
    if slots and slots[-1].offset + slots[-1].numel != flat.numel():
        raise ValueError(f"flat buffer holds {flat.numel()} values, model needs {numel(model)}")
    with torch.no_grad():
        for slot, p in zip(slots, model.parameters()):
            view = slot.view(flat)
            if copy_values:
                view.copy_(p.data)
            p.data = view


def share_model(model: nn.Module, device: str) -> Tensor:
    """Move ``model``'s parameters into a new flat shared buffer and return the buffer."""
    flat = alloc(numel(model), device)
    model.to(device)
    bind(model, flat, copy_values=True)
    logger.info("shared model: %d parameters, %.2f MiB, on %s", flat.numel(),
                flat.numel() * 4 / 2**20, device)
    return flat
