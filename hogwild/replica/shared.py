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

import copy
import ctypes
import logging
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Iterable, Optional

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
    check_shm(n * dtype.itemsize)
    # Made in shared memory, zero as a new file is: zeros() then share_memory_() wrote a private
    # copy first, a whole model of it for a moment (610 MiB of anonymous memory at 10M rows).
    return torch.empty(0, dtype=dtype).set_(torch.UntypedStorage._new_shared(n * dtype.itemsize))


def twin_on(model: nn.Module, flat: Tensor) -> nn.Module:
    """A deep copy of ``model`` whose parameters and float buffers are views of ``flat`` (laid out as
    :func:`layout` says), made without copying their values: ``copy.deepcopy`` takes each from its
    memo instead of cloning it (a clone of a model of embedding tables is the whole model)."""
    memo: dict[int, object] = {}
    tensors = [p for _, p in model.named_parameters()] + [b for _, b in _float_buffers(model)]
    for slot, t in zip(layout(model), tensors):
        view = slot.view(flat)
        memo[id(t)] = nn.Parameter(view, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else view
    return copy.deepcopy(model, memo)


def held_bytes(tensors: Iterable[Tensor]) -> int:
    """Host memory under ``tensors``: the bytes of their distinct storages (views of one buffer
    count once; a GPU's are not host memory)."""
    sizes = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t.device.type == "cpu"}
    return sum(sizes.values())


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
                sole = _sole_holder(p)  # before p.data, itself a holder while it lives
                copy_releasing(view, p.data, sole)
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


# A parameter at least this large is copied into the shared buffer a chunk at a time, each chunk's
# pages given back as soon as it is copied. glibc serves any allocation above 32 MiB with mmap, so
# its pages are the tensor's alone.
RELEASE_ABOVE = 64 * 2**20
RELEASE_CHUNK = 16 * 2**20  # bytes
MADV_DONTNEED = 4


def _sole_holder(p: Tensor) -> bool:
    """Nothing but ``p`` holds its storage (no view, alias or ``.data`` of it elsewhere): the
    temporary storage object here is the second holder."""
    return torch._C._storage_Use_Count(p.untyped_storage()._cdata) <= 2


def copy_releasing(dst: Tensor, src: Tensor, sole: bool) -> None:
    """``dst.copy_(src)``; where ``src`` is a large private CPU tensor that ``sole``ly holds its
    memory and is about to be dropped (a parameter's values as built, moving into the shared
    buffer), a chunk at a time, each chunk's pages returned to the kernel once copied. A model of
    embedding tables then never exists twice at once: the whole model twice was the leader's
    start-up peak (1.2 GB at 10M rows)."""
    nbytes = src.numel() * src.element_size()
    if not (sole and nbytes >= RELEASE_ABOVE and src.device.type == "cpu" and src.is_contiguous()
            and not src.is_shared()):
        dst.copy_(src)
        return
    s, d = src.reshape(-1), dst.reshape(-1)
    step = max(RELEASE_CHUNK // src.element_size(), 1)
    for start in range(0, s.numel(), step):
        d[start:start + step].copy_(s[start:start + step])
        release_pages(s[start:start + step])


def release_pages(t: Tensor) -> None:
    """Give the whole pages under ``t`` (contiguous, on the CPU, read no more by anyone, or backed by
    a file that holds them) back to the kernel: a private tensor's read zero afterwards, a mapped
    file's are read from the file again. Linux only; elsewhere nothing happens."""
    if not sys.platform.startswith("linux") or t.device.type != "cpu":
        return
    page = os.sysconf("SC_PAGE_SIZE")
    lo = -(-t.data_ptr() // page) * page  # whole pages inside the tensor only
    hi = (t.data_ptr() + t.numel() * t.element_size()) // page * page
    if hi > lo:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        madvise(lo, hi - lo, MADV_DONTNEED)


def share_model(model: nn.Module, device: str) -> Tensor:
    """Move ``model``'s parameters into a new flat shared buffer and return the buffer."""
    flat = alloc(numel(model), device)
    model.to(device)
    bind(model, flat, copy_values=True)
    logger.info("shared model: %d values (parameters and float buffers), %.2f MiB, on %s", flat.numel(),
                flat.numel() * 4 / 2**20, device)
    return flat
