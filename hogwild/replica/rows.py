"""Row marks for row-sparse rounds (``sync.row_sparse``): which rows of the model's embedding
tables the workers wrote since the last round.

A table is a parameter whose gradient is sparse (``nn.Embedding``/``nn.EmbeddingBag`` with
``sparse=True``): its update writes the rows of the batch and no other. Every row of every table
has one int32 *stamp* in shared memory. After a worker writes its update into the shared model,
it writes the current epoch (``board.control["row_epoch"]``) into the stamps of the rows it wrote,
lock-free, as Hogwild writes everything else. A row whose stamp is newer than the epoch its last
round saw has moved since and travels in the next round (sync/rows.py).

Why stamps and not a flag the leader clears: a flag set between the leader's read and its clear
would be lost, and with it the row's update would never reach the other replicas. A stamp is only
ever raised, so a late one is seen by the next round (docs/sync.md, "Row-sparse rounds").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from hogwild.config.schema import Config
from hogwild.errors import ConfigError
from hogwild.replica.optim import decays, flat_rule, torch_optimizer
from hogwild.replica.shared import alloc, param_slots

logger = logging.getLogger(__name__)

CHUNK_VALUES = 1 << 24
"""Most values one exchange of a round carries (64 MB in fp32). A round whose rows are more
(the final one sends every row ever written) makes several exchanges, so its snapshot, reduce
buffer and cut state stay this size however large the tables are."""


@dataclass(frozen=True)
class Table:
    """One embedding table in the flat buffer."""

    param: int
    """Its index among the model's parameters (and their gradients)."""
    offset: int
    """Where its first value sits in the flat buffer."""
    rows: int
    dim: int
    """Values per row."""
    first: int
    """Its first row's index among all tables' rows (the stamps' numbering)."""

    def view(self, flat: Tensor) -> Tensor:
        """The table's rows as a (rows, dim) view of ``flat``."""
        return flat[self.offset:self.offset + self.rows * self.dim].view(self.rows, self.dim)


def find_tables(model: nn.Module, sparse: list[bool]) -> list[Table]:
    """The parameters whose gradient the preflight saw sparse, as tables."""
    tables, first = [], 0
    for i, (slot, is_sparse) in enumerate(zip(param_slots(model), sparse)):
        if is_sparse and len(slot.shape) >= 1:
            rows = slot.shape[0]
            tables.append(Table(i, slot.offset, rows, slot.numel // max(rows, 1), first))
            first += rows
    return tables


class RowMarks:
    """The stamps of one replica (shared memory, one int32 per table row) and its tables."""

    def __init__(self, tables: list[Table], device: str = "cpu") -> None:
        self.tables = tables
        self.stamps = alloc(sum(t.rows for t in tables), device, torch.int32)

    @property
    def rows(self) -> int:
        return int(self.stamps.numel())

    def mark(self, grads: list[Optional[Tensor]], epoch: int) -> None:
        """Called by a worker right after its update is written: the rows it wrote get ``epoch``."""
        for t in self.tables:
            g = grads[t.param]
            if g is None:
                continue
            if not g.is_sparse:  # a densified gradient wrote every row
                self.stamps[t.first:t.first + t.rows].fill_(epoch)
                continue
            self.stamps.index_fill_(0, g._indices()[0] + t.first, epoch)



def check_row_sparse(cfg: Config, model: nn.Module, sparse: list[bool]) -> list[Table]:
    """The model's tables when ``sync.row_sparse`` can sync them row by row; a one-line
    :class:`ConfigError` naming the key where it cannot."""
    tables = find_tables(model, sparse)
    if not tables:
        raise ConfigError("sync.row_sparse: the model has no parameter with a sparse gradient; row-sparse "
                          "rounds need embedding tables built with sparse=True (nn.EmbeddingBag, nn.Embedding)")
    if cfg.optim._target_:
        if not _steps_rows_alone(cfg, tables[0]):
            raise ConfigError(f"sync.row_sparse: optim._target_={cfg.optim._target_} moves rows of an embedding table "
                              "that its sparse gradient did not name, so every row would travel; use "
                              "torch.optim.SparseAdam, Adagrad, or SGD without momentum or weight decay")
    else:
        rule = flat_rule(cfg.optim.name)
        shapes = [s.shape for s in param_slots(model)]
        wd = decays(cfg.optim, shapes)
        for t in tables:
            # Weight decay and momentum move every row at every step: no row would stay put.
            if wd[t.param] or not rule.rows_only(cfg.optim):
                why = f"optim.weight_decay={wd[t.param]:g}" if wd[t.param] else f"optim.name={cfg.optim.name}"
                raise ConfigError(f"sync.row_sparse: {why} moves every row of an embedding table at every step, "
                                  "so every row would travel; use optim.name=adagrad, or sgd without momentum, "
                                  "and optim.weight_decay=0")
    return tables



def _steps_rows_alone(cfg: Config, table: Table) -> bool:
    """Whether ``optim._target_`` moves only the rows a sparse gradient names: two steps on a small
    stand-in of the table (its row length is all the optimizer sees of it), the first with a
    gradient on row 0, the second on row 1. A momentum kept per row moves row 0 again in the
    second; weight decay moves every row in both."""
    stand_in = torch.nn.Parameter(torch.ones(4, table.dim))
    opt = torch_optimizer(cfg.optim, [stand_in]).opt
    moved = torch.zeros(4, dtype=torch.bool)
    for row in (0, 1):
        before = stand_in.detach().clone()
        stand_in.grad = torch.sparse_coo_tensor(torch.tensor([[row]]), torch.ones(1, table.dim), (4, table.dim),
                                                check_invariants=True)
        try:
            opt.step()
        except Exception:  # noqa: BLE001 - one that refuses sparse gradients is refused where it is probed
            return True
        changed = (stand_in.detach() != before).any(1)
        changed[row] = False
        moved |= changed
    return not bool(moved.any())
