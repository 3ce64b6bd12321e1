"""``data=tokens``: pre-tokenised corpora in nanoGPT's ``train.bin`` layout (a flat array of token
ids, no header), read through memory maps.

A corpus can be larger than memory, and every worker of a machine reads it, so nothing here loads
a file: the leader only measures the files, and each process maps them (``np.memmap``, read-only)
and reads the few hundred tokens of a block when a batch asks for it. File-backed pages live in the
kernel's page cache, shared by every process that maps the file and reclaimable under pressure,
so K workers hold no copy of the corpus. The split objects travel to spawned workers by pickle;
they pickle as paths and offsets and reopen their maps in the process that reads them.

Layout of each file: its first ``1 - data.test_fraction`` of tokens is training data, the rest is
held out. A block never straddles that cut or the end of a file. A sample is ``block_size``
tokens ``x`` and the same block shifted by one token ``y`` (the next token at each position), so
``task=auto`` reads it as language modelling.
"""

from __future__ import annotations

import bisect
import glob
import logging
import os
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset as TorchDataset

from hogwild.config.registry import DATASETS
from hogwild.config.schema import DataConfig
from hogwild.data.mapped import check_pair
from hogwild.data.splits import Dataset
from hogwild.errors import ConfigError, first_line

__all__ = ["Region", "TokenBlocks", "load_tokens", "spread", "token_paths"]

logger = logging.getLogger(__name__)

KEY = "data.path"
# A bounded set of blocks (the held-out split, the label sample) is read as this many runs of
# consecutive blocks spread over the data: spread, so it stands for the whole corpus; in runs, so
# it touches a few places of the file, not thousands (each a disk read and its read-ahead when the
# file is not cached, and a whole page-cache folio mapped into the process when it is).
RUNS = 64
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


@dataclass(frozen=True)
class Region:
    """A run of tokens of one file that blocks are cut from: the train or the held-out part."""

    path: str
    start: int
    """Offset of the region's first token in the file (tokens, not bytes)."""
    tokens: int


def _splitmix64(x: int) -> int:
    """A 64-bit finaliser (SplitMix64): a random offset per index in about a microsecond,
    where building a numpy Generator per item costs tens of them on every read."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


def _hash(seed: int, index: int) -> int:
    """A uniform 64-bit value for ``(seed, index)``: the same in every process and run."""
    return _splitmix64((_splitmix64(seed & _MASK64) + (index + 1) * _GOLDEN) & _MASK64)


def spread(index: int, chosen: int, total: int) -> int:
    """The block of item ``index`` when ``chosen`` of ``total`` blocks are taken in :data:`RUNS`
    runs of consecutive blocks, the ``total - chosen`` left out shared evenly between the gaps,
    so the first run starts the split and the last ends it (with ``chosen == total``, every block
    in order). Increasing in ``index``, so no block is taken twice."""
    runs = min(RUNS, chosen)
    run = index * runs // chosen
    return index + (run * (total - chosen) // (runs - 1) if runs > 1 else 0)


def _cumulative(counts: Sequence[int]) -> list[int]:
    out, total = [0], 0
    for c in counts:
        total += c
        out.append(total)
    return out


class TokenBlocks(TorchDataset):
    """One split: ``(x, y)`` int64 blocks of ``block_size`` tokens cut from memory-mapped regions.

    ``sequential``: item ``i`` is a non-overlapping block of the regions in order, the ``i``-th
    when ``items == blocks`` (each block once), else one of ``items`` blocks taken in runs spread
    over the regions (:func:`spread`). ``random``: item ``i`` starts at a position drawn from
    ``(seed, i)``, uniform over every start that fits in a region, so a region is chosen in
    proportion to its size; the same index always reads the same block.
    """

    def __init__(self, regions: Sequence[Region], dtype: str, block_size: int, sampling: str = "sequential",
                 items: Optional[int] = None, seed: int = 0, sample: int = 4096) -> None:
        self.regions, self.dtype, self.block_size = tuple(regions), dtype, block_size
        self.sampling, self.seed, self.sample = sampling, seed, sample
        # A block reads block_size + 1 tokens (y is x shifted by one); consecutive blocks share
        # that one boundary token, as nanoGPT's do.
        self._block_ends = _cumulative([(r.tokens - 1) // block_size for r in self.regions])
        self._start_ends = _cumulative([r.tokens - block_size for r in self.regions])
        self.blocks = self._block_ends[-1]
        self.items = self.blocks if items is None else min(items, self.blocks)
        self._maps: dict[int, np.memmap] = {}
        self._targets: Optional[Tensor] = None

    def __len__(self) -> int:
        return self.items

    def __getstate__(self) -> dict[str, Any]:
        # np.memmap pickles as its whole array: a worker would receive a copy of the corpus.
        # The cached label sample is dropped too; it is rebuilt where it is asked for.
        return {k: v for k, v in self.__dict__.items() if k not in ("_maps", "_targets")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._maps, self._targets = {}, None

    def open(self) -> None:
        """Map every region's file now (the leader does, so an unreadable file fails at start)."""
        for r, region in enumerate(self.regions):
            try:
                self._map(r)
            except (OSError, ValueError) as e:
                raise ConfigError(f"{KEY}: cannot map {region.path} ({first_line(e)})") from None

    def _map(self, r: int) -> np.memmap:
        mm = self._maps.get(r)
        if mm is None:
            mm = self._maps[r] = np.memmap(self.regions[r].path, dtype=np.dtype(self.dtype), mode="r")
        return mm

    def locate(self, index: int) -> tuple[int, int]:
        """``(region, token offset in the file)`` of item ``index``'s first token."""
        if not -self.items <= index < self.items:
            raise IndexError(f"item {index} of {self.items}")
        index %= self.items
        if self.sampling == "random":
            pos = _hash(self.seed, index) % self._start_ends[-1]
            r = bisect.bisect_right(self._start_ends, pos) - 1
            return r, self.regions[r].start + pos - self._start_ends[r]
        return self._block_start(spread(index, self.items, self.blocks))

    def _block_start(self, block: int) -> tuple[int, int]:
        r = bisect.bisect_right(self._block_ends, block) - 1
        return r, self.regions[r].start + (block - self._block_ends[r]) * self.block_size

    def _read(self, r: int, start: int) -> tuple[Tensor, Tensor]:
        window = torch.from_numpy(np.array(self._map(r)[start:start + self.block_size + 1], dtype=np.int64))
        return window[:-1], window[1:]

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self._read(*self.locate(int(index)))

    @property
    def targets(self) -> Tensor:
        """The labels of at most ``sample`` non-overlapping blocks, in runs spread over the split
        (:func:`spread`), whatever the sampling: what the unigram baseline and the label checks
        read, so neither reads the whole corpus. For a sequential split of ``items <= sample``
        (the held-out one) these are exactly its items' labels."""
        if self._targets is None:
            n = min(self.items if self.sampling == "sequential" else self.blocks, self.sample)
            labels = [self._read(*self._block_start(spread(i, n, self.blocks)))[1] for i in range(n)]
            self._targets = torch.stack(labels) if labels else torch.zeros(0, dtype=torch.int64)
        return self._targets


def token_paths(spec: Optional[str]) -> list[str]:
    """The files ``data.path`` names: comma-separated paths, each a file or a glob (sorted)."""
    if not spec or not str(spec).strip():
        raise ConfigError(f"{KEY}: required for data=tokens (nanoGPT's train.bin; several files as "
                          "'a.bin,b.bin' or a glob)")
    found: list[str] = []
    for piece in (p.strip() for p in str(spec).split(",")):
        if not piece:
            continue
        path = os.path.expanduser(piece)
        matches = sorted(glob.glob(path)) if glob.has_magic(path) else [path] if os.path.exists(path) else []
        if not matches:
            raise ConfigError(f"{KEY}: no file matches {piece!r}" if glob.has_magic(path)
                              else f"{KEY}: no such file {piece!r}")
        found.extend(os.path.abspath(m) for m in matches if os.path.abspath(m) not in found)
    return found


def count_tokens(path: str, dtype: str, block_size: int) -> int:
    """A file's length in tokens, after checking it can hold one block."""
    if not os.path.isfile(path):
        raise ConfigError(f"{KEY}: {path} is not a file")
    try:
        size = os.path.getsize(path)
        with open(path, "rb"):  # readable by this user, not only listed
            pass
    except OSError as e:
        raise ConfigError(f"{KEY}: {path} cannot be read ({e.strerror or first_line(e)})") from None
    itemsize = np.dtype(dtype).itemsize
    if size == 0:
        raise ConfigError(f"{KEY}: {path} is empty (0 bytes)")
    if size % itemsize:
        raise ConfigError(f"{KEY}: {path}: {size} bytes is not a multiple of {dtype}'s {itemsize} bytes")
    tokens = size // itemsize
    if tokens < block_size + 1:
        raise ConfigError(f"{KEY}: {path}: {tokens} tokens, fewer than data.block_size + 1 = "
                          f"{block_size + 1}")
    return tokens


def split_file(path: str, tokens: int, cfg: DataConfig) -> tuple[Region, Region]:
    """A file's train region and held-out region (its last ``data.test_fraction`` of tokens),
    each long enough for one block."""
    held = round(tokens * cfg.test_fraction)
    train, test = Region(path, 0, tokens - held), Region(path, tokens - held, held)
    need = cfg.block_size + 1
    for name, region in (("training", train), ("held-out", test)):
        if region.tokens < need:
            raise ConfigError(f"{KEY}: {path}: its {name} part ({region.tokens} of its {tokens} tokens at "
                              f"data.test_fraction={cfg.test_fraction}) is shorter than data.block_size + 1 "
                              f"= {need} tokens; lower data.block_size or use a longer file")
    return train, test


@DATASETS.register("tokens")
def load_tokens(cfg: DataConfig) -> Dataset:
    """Measure the files and build the two splits; no token is read but the checks' few blocks
    and the bounded label samples (see :attr:`TokenBlocks.targets`)."""
    paths = token_paths(cfg.path)
    lengths = [count_tokens(p, cfg.dtype, cfg.block_size) for p in paths]
    regions = [split_file(p, n, cfg) for p, n in zip(paths, lengths)]
    train = TokenBlocks([r[0] for r in regions], cfg.dtype, cfg.block_size, cfg.sampling,
                        seed=cfg.split_seed, sample=cfg.test_samples)
    # The held-out blocks are fixed (sequential, spread over every file), so every evaluation and
    # every replica scores the same ones.
    test = TokenBlocks([r[1] for r in regions], cfg.dtype, cfg.block_size, "sequential",
                       items=cfg.test_samples, sample=cfg.test_samples)
    train.open()
    test.open()
    logger.info("tokens: %d file(s), %d tokens (%s, memory-mapped); %d train blocks (%s), %d of %d held-out "
                "blocks", len(paths), sum(lengths), cfg.dtype, len(train), cfg.sampling, len(test),
                test.blocks)
    # The vocabulary is the model's (GPTConfig.vocab_size); num_classes is only the label sample's
    # largest id + 1, so memory stays flat and start-up never scans the corpus.
    return check_pair(train, test, KEY)
