"""User code for the stream tests: streams that number their samples, and a step that logs which
samples each worker trained on (one file per process, a line per batch, in order)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from torch import Tensor, nn
from torch.utils.data import IterableDataset, TensorDataset


class Numbered(IterableDataset):
    """``n`` samples ``(x, id, label)``: x a fixed function of the id, so the stream is the same on
    every read; ``set_epoch`` reverses odd epochs."""

    def __init__(self, n: int) -> None:
        self.n, self.epoch, self._pos, self._start = n, 0, 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _order(self) -> list[int]:
        ids = list(range(self.n))
        return ids[::-1] if self.epoch % 2 else ids

    def __iter__(self) -> Iterator[tuple[Tensor, int, int]]:
        order, start = self._order(), self._start
        self._start = 0
        for k in range(start, self.n):
            self._pos = k + 1
            i = order[k]
            g = torch.Generator().manual_seed(i)
            x = torch.randn(4, generator=g)
            yield x, torch.tensor(i), int(x[0] > 0)


class StatefulNumbered(Numbered):
    """With ``state_dict``/``load_state_dict`` (the position of the iteration under way), as
    torchdata's stateful datasets keep them."""

    def state_dict(self) -> dict[str, int]:
        return {"pos": self._pos, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._start, self.epoch = int(state["pos"]), int(state["epoch"])


def numbered(n: int = 256, stateful: bool = False, test: int = 64) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(10**6)
    x = torch.randn(test, 4, generator=g)
    return (StatefulNumbered if stateful else Numbered)(n), TensorDataset(x, torch.arange(test), (x[:, 0] > 0).long())


class Net(nn.Module):
    """A linear classifier that takes (x, id) and ignores the id."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: Tensor, ids: Optional[Tensor] = None) -> Tensor:
        return self.fc(x)


def _log(log_dir: str, ids: Tensor) -> None:
    with open(Path(log_dir) / f"{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps([int(i) for i in ids.reshape(-1)]) + "\n")


def counting_step(model: nn.Module, batch: Any, log_dir: str) -> Tensor:
    """The model's own step, and the batch's sample ids logged (training steps only: the warm-up
    pass runs in eval mode, and its batch is the first step's)."""
    if isinstance(batch, dict):
        if model.training:
            _log(log_dir, batch["id"])
        _, loss = model(batch["idx"], batch["targets"])
        return loss  # type: ignore[no-any-return]
    x, ids, y = batch
    if model.training:
        _log(log_dir, ids)
    return nn.functional.cross_entropy(model(x), y)


def batches(log_dir: Path) -> list[list[list[int]]]:
    """Every process's batches of ids, in the order it trained on them."""
    return [[json.loads(line) for line in p.read_text().splitlines()] for p in sorted(log_dir.glob("*.jsonl"))]


def first_batches(worker: list[list[int]], n: int, batch_size: int) -> list[int]:
    """The ids of a worker's first ``n`` batches. A line of the log is one step's samples, and a
    slower worker computes its batch in parts, a part a step (pace.balance), so a batch may span
    several lines: a position counts whole batches, and the samples are what matches it."""
    return [i for b in worker for i in b][:n * batch_size]


class DatasetDictLike(dict):  # type: ignore[type-arg]
    """Stands in for ``datasets.DatasetDict`` (a dict of splits by name) where the package is absent."""


DatasetDictLike.__name__ = "DatasetDict"


def dataset_dict() -> Any:
    train, test = numbered(64)
    return DatasetDictLike(train=train, test=test)


def same_twice() -> tuple[Any, Any]:
    _, test = numbered(64)
    return test, test


def by_path(path: str) -> tuple[Any, Any]:
    """A factory that takes data.path (the schema field reaches it)."""
    n = int(Path(path).read_text())
    return numbered(n)


def numbered_blocks(n: int = 128, block: int = 16) -> tuple[Any, Any]:
    """A map-style ``datasets.Dataset`` of ``n`` numbered character blocks for the GPT, and 16 held out."""
    import datasets

    def table(ids: list[int]) -> Any:
        codes = [[32 + (i * 7 + k) % 90 for k in range(block + 1)] for i in ids]
        return datasets.Dataset.from_dict({"idx": [c[:-1] for c in codes], "targets": [c[1:] for c in codes],
                                           "id": ids}).with_format("torch")

    return table(list(range(n))), table(list(range(10**4, 10**4 + 16)))


class SelfSplitting(Numbered):
    """Splits itself as a dataset written for DataLoader workers does: by get_worker_info()."""

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor, int]]:
        info = torch.utils.data.get_worker_info()
        for k, item in enumerate(super().__iter__()):
            if info is None or k % info.num_workers == info.id:
                yield item
