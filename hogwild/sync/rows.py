"""``sync.row_sparse=true``: rounds that send the dense parameters and, of the embedding tables,
only the rows some replica wrote since they last travelled.

Each round the leaders agree on the *union* of the rows any of them marked (replica/rows.py),
gather those rows and every dense value into one compact vector, and run the configured rule on
it as if it were the whole model. The rule's model-sized state (the outer rules' θ_g and
momentum, the compressed wires' residual and agreed base) is kept whole here and cut to the same
rows for the round, so a row's state is the one a dense round would have given it at its last
round. Why this is exact where it matters (docs/sync.md, "Row-sparse rounds"):

- A row no replica wrote since its last round is the same on every replica (that round landed
  each of them on one target), so every rule's target for it is that value: average, broadcast,
  median and trimmed mean would leave it where it is. Leaving it out changes nothing but bytes.
- The outer rules would still move it: their momentum keeps stepping a row after it stopped
  changing. Here a row nobody wrote never moves; its momentum decays by μ for each round it sat
  out and takes effect when the row travels again (lazy momentum, as sparse optimizers treat
  rows outside the batch). With every row written in every round, that is the dense rule.
- The job's final round sends every row any replica ever wrote, so the job still ends on one
  model, bit for bit, on every replica.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

import torch
from torch import Tensor

from hogwild.config.schema import SyncConfig
from hogwild.replica.board import Board
from hogwild.replica.rows import CHUNK_VALUES, RowMarks, Table
from hogwild.sync.base import SyncContext, SyncRule
from hogwild.sync.comm import SYNC_ROUND, Comm
from hogwild.sync.outer import OuterRule

logger = logging.getLogger(__name__)



class Gathered:
    """One round's stretch of the flat buffer: every dense value, then the union's rows of each
    table, in that order, as one compact vector."""

    def __init__(self, dense: list[slice], tables: list[Table], rows: list[Tensor]) -> None:
        self.tables, self.rows, self.dense = tables, rows, dense
        self.numel = sum(s.stop - s.start for s in dense) + sum(len(r) * t.dim for t, r in zip(tables, rows))

    @property
    def row_count(self) -> int:
        return sum(len(r) for r in self.rows)

    @staticmethod
    def plan(numel: int, tables: list[Table], union: Tensor, chunk: int = CHUNK_VALUES) -> list["Gathered"]:
        """The round's stretches: the dense values and the union's rows (sorted global row
        numbers), cut into pieces of at most about ``chunk`` values, dense values first."""
        dense: list[slice] = []
        at = 0
        for t in sorted(tables, key=lambda t: t.offset):
            if t.offset > at:
                dense.append(slice(at, t.offset))
            at = t.offset + t.rows * t.dim
        if at < numel:
            dense.append(slice(at, numel))
        empty = union[:0]
        pieces: list[Gathered] = []
        part, rows_of, room = dense, [empty for _ in tables], chunk - sum(s.stop - s.start for s in dense)
        for i, t in enumerate(tables):
            rows = union[(union >= t.first) & (union < t.first + t.rows)] - t.first
            while len(rows):
                take = room // t.dim
                if take <= 0:
                    if part or any(len(r) for r in rows_of):
                        pieces.append(Gathered(part, tables, rows_of))
                        part, rows_of, room = [], [empty for _ in tables], chunk
                        continue
                    take = 1  # a row longer than a chunk travels alone
                rows_of[i] = torch.cat([rows_of[i], rows[:take]])
                room -= len(rows[:take]) * t.dim
                rows = rows[take:]
        pieces.append(Gathered(part, tables, rows_of))
        return pieces

    def _parts(self, compact: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """``compact`` cut into its dense stretches and its tables' (rows, dim) blocks."""
        dense, blocks, at = [], [], 0
        for s in self.dense:
            n = s.stop - s.start
            dense.append(compact[at:at + n])
            at += n
        for t, r in zip(self.tables, self.rows):
            n = len(r) * t.dim
            blocks.append(compact[at:at + n].view(len(r), t.dim))
            at += n
        return dense, blocks

    def read(self, src: Tensor, out: Optional[Tensor] = None) -> Tensor:
        """``src``'s values at these positions (``src``: the flat buffer, or state of its size)."""
        out = torch.empty(self.numel, dtype=src.dtype, device=src.device) if out is None else out
        dense, blocks = self._parts(out)
        for s, part in zip(self.dense, dense):
            part.copy_(src[s])
        for t, r, block in zip(self.tables, self.rows, blocks):
            torch.index_select(t.view(src), 0, r, out=block)
        return out

    def add(self, dst: Tensor, delta: Tensor) -> None:
        """``dst[positions] += delta``: a worker's write in between survives (design rule 2)."""
        self._scatter(dst, delta, Tensor.add_, Tensor.index_add_)

    def write(self, dst: Tensor, values: Tensor) -> None:
        """``dst[positions] = values``."""
        self._scatter(dst, values, Tensor.copy_, Tensor.index_copy_)

    def _scatter(self, dst: Tensor, compact: Tensor, onto_dense: Callable[..., Tensor],
                 onto_rows: Callable[..., Tensor]) -> None:
        dense, blocks = self._parts(compact)
        for s, part in zip(self.dense, dense):
            onto_dense(dst[s], part)
        for t, r, block in zip(self.tables, self.rows, blocks):
            onto_rows(t.view(dst), 0, r, block)

    def scale_rows(self, compact: Tensor, factors: Tensor) -> None:
        """Multiply each table row of ``compact`` by its factor (``factors``: one per union row,
        in table order)."""
        _, blocks = self._parts(compact)
        at = 0
        for block in blocks:
            n = block.shape[0]
            block.mul_(factors[at:at + n].to(block.dtype).unsqueeze(1))
            at += n


class RowSparse(SyncRule):
    """Wraps the configured rule; see the module's docstring."""

    name = "row_sparse"  # a wrapper, not a sync.mode: never registered

    def __init__(self, cfg: SyncConfig, comm: Comm, params: Optional[int], inner: SyncRule,
                 marks: RowMarks) -> None:
        super().__init__(cfg, comm, params)
        self.inner, self.marks = inner, marks
        self.weighted, self.state_copies = inner.weighted, inner.state_copies
        inner.comm = self.comm  # one meter counts the union's indices and the values alike
        self.epoch = 1
        """The interval in progress; workers stamp the rows they write with it."""
        self.synced = torch.zeros(marks.rows, dtype=torch.int32, device=marks.stamps.device)
        """Per row: the epoch whose round last sent it (0: never)."""
        self.whole: dict[str, Tensor] = {}
        """The inner rule's model-sized state, whole (it holds cut copies during a round)."""
        self.pending: list[Gathered] = []
        """The stretches of the round being made, in the order exchange() meets them."""
        self._idle: Optional[Tensor] = None
        self._publish: Callable[[int], None] = lambda epoch: None
        self._idle_at = 0
        self.chunk = CHUNK_VALUES

    # ------------------------------------------------------------ wiring
    def attach(self, board: Board) -> None:
        def publish(epoch: int) -> None:
            board.control["row_epoch"] = float(epoch)
        self._publish = publish
        publish(self.epoch)

    def prime(self, flat: Tensor) -> None:
        self.inner.prime(flat)
        self.whole = self.inner.positional()
        if self.inner.compressed and "wire.residual" not in self.whole:
            self.whole["wire.residual"] = torch.zeros_like(flat)

    # ------------------------------------------------------------ the round
    def plan(self, numel: int, final: bool, timeout_s: Optional[float] = None) -> list[slice]:
        epoch = self.epoch
        # From here on a worker's write belongs to the next round; a stamp of this epoch written
        # after the scan below is still newer than ``synced`` and travels then (replica/rows.py).
        self._publish(epoch + 1)
        stamps = self.marks.stamps
        if final:  # every row any replica ever wrote: the job ends on one model
            mine = (stamps > 0) | (self.synced > 0)
        else:
            mine = stamps > self.synced
        union = self._union(mine.nonzero().view(-1), timeout_s)
        last = self.synced.index_select(0, union)
        self._idle = torch.where(last > 0, epoch - 1 - last, torch.zeros_like(last)).clamp_(min=0)
        self.synced.index_fill_(0, union, epoch)
        self.epoch = epoch + 1
        self.pending = Gathered.plan(numel, self.marks.tables, union, self.chunk)
        self._idle_at = 0
        return list(self.pending)  # type: ignore[arg-type]

    def _union(self, mine: Tensor, timeout_s: Optional[float] = None) -> Tensor:
        """The sorted union of every replica's marked rows (int64)."""
        world = self.comm.world_size
        if world == 1:
            return mine
        # The counts travel in a SUM all_reduce, which takes the round's bound on waiting (a
        # stopping leader's 10 s): the first collective of a round is where a dead peer shows.
        counts = torch.zeros(world, dtype=torch.float64)
        counts[self.comm.rank] = mine.numel()
        counts = self.comm.all_reduce(counts, timeout_s, SYNC_ROUND).long().tolist()
        longest = max(counts)
        padded = torch.full((longest,), -1, dtype=torch.int32, device=mine.device)
        padded[:mine.numel()] = mine.to(torch.int32)
        parts = self.comm.all_gather(padded)
        every = torch.cat([p[:int(c)] for p, c in zip(parts, counts)]).long()
        return torch.unique(every)  # sorted

    def exchange(self, snap: Tensor, ctl: Tensor, rank: int, timeout_s: float,
                 final: bool = False) -> tuple[Tensor, Tensor]:
        assert self.pending, "plan() makes the round's stretches first"
        g = self.pending.pop(0)
        cut = {name: g.read(t) for name, t in self.whole.items()}
        if isinstance(self.inner, OuterRule) and "momentum" in cut and self._idle is not None:
            idle = self._idle[self._idle_at:self._idle_at + g.row_count]
            self._idle_at += g.row_count
            if bool((idle > 0).any()):
                factors = torch.full(idle.shape, self.inner.mu, dtype=torch.float64).pow_(idle.double())
                g.scale_rows(cut["momentum"], factors)
        self.inner.set_positional(cut)
        try:
            target, red = self.inner.exchange(snap, ctl, rank, timeout_s, final)
            for name, t in self.inner.positional().items():
                g.write(self.whole[name], t)
        finally:
            self.inner.set_positional(self.whole)
        self.ending, self.spread = self.inner.ending, self.inner.spread
        return target, red

    def target(self, snap: Tensor, ctx: SyncContext) -> Tensor:
        raise NotImplementedError("RowSparse.exchange computes the target")  # pragma: no cover

    # ------------------------------------------------------------ state
    def settle(self, flat: Tensor) -> None:
        self.inner.settle(flat)

    def held(self) -> list[Tensor]:
        return [*super().held(), *self.inner.held(), *self.whole.values()]

    def state_dict(self) -> dict[str, Tensor]:
        state = self.inner.state_dict()
        state["row_synced"] = self.synced
        state["row_epoch"] = torch.tensor([self.epoch], dtype=torch.int64)
        return state

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        inner = {k: v for k, v in state.items() if not k.startswith("row_")}
        self.inner.load_state_dict(inner)
        if self.whole:  # primed already: the whole state now lives in the loaded tensors
            residual = self.whole.get("wire.residual")
            self.whole = self.inner.positional()
            if residual is not None:
                self.whole.setdefault("wire.residual", residual)
        if "row_synced" in state and state["row_synced"].numel() == self.synced.numel():
            self.synced = state["row_synced"].to(torch.int32).clone()
            self.epoch = int(state["row_epoch"][0])
            self._publish(self.epoch)
