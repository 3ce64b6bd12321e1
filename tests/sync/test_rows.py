"""``sync.row_sparse``: rounds that send the dense values and the rows some replica wrote, on N
ranks played by threads. Workers are simulated: each "interval" writes some rows (and the dense
values) of every replica, then stamps them as a worker does after its update."""

from __future__ import annotations

from typing import Optional

import pytest
import torch

from hogwild.config.schema import SyncConfig
from hogwild.replica.board import Board
from hogwild.replica.rows import RowMarks, Table
from hogwild.sync.comm import Comm, LocalComm
from hogwild.sync.rounds import RoundFlags, sync_round
from hogwild.sync.rules import make_rule
from tests.fake_comm import run_ranks

pytestmark = pytest.mark.timeout(60)

DENSE, ROWS, DIM = 6, 40, 4
TABLE = Table(param=1, offset=DENSE, rows=ROWS, dim=DIM, first=0)
N = DENSE + ROWS * DIM
RULES = ["average", "slowmo", "diloco", "broadcast", "median", "trimmed_mean"]


def _start() -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(0))


def _touched(rank: int, k: int, every: bool) -> torch.Tensor:
    if every:
        return torch.arange(ROWS)
    g = torch.Generator().manual_seed(1000 * rank + k)
    return torch.randperm(ROWS // 2, generator=g)[:5]  # rows ROWS//2.. are never written


def _interval(flat: torch.Tensor, rank: int, k: int, rows: torch.Tensor, marks: Optional[RowMarks],
              board: Optional[Board]) -> None:
    """One interval of a worker's updates: every dense value, and ``rows`` of the table."""
    g = torch.Generator().manual_seed(7 * rank + 31 * k + 1)
    flat[:DENSE] += 0.1 * torch.randn(DENSE, generator=g)
    TABLE.view(flat).index_add_(0, rows, 0.1 * torch.randn(len(rows), DIM, generator=g))
    if marks is not None and board is not None:
        grad = torch.sparse_coo_tensor(rows.unsqueeze(0), torch.ones(len(rows), DIM), (ROWS, DIM),
                                       check_invariants=True)
        marks.mark([None, grad], int(board.control["row_epoch"]))


def _train(comm: Comm, cfg: SyncConfig, sparse: bool, every: bool, rounds: int = 4) -> tuple[torch.Tensor, dict]:
    marks = RowMarks([TABLE]) if sparse else None
    board = Board(1) if sparse else None
    rule = make_rule(cfg, comm, None, marks)
    flat = _start()
    rule.prime(flat)
    if board is not None:
        rule.attach(board)
    for k in range(rounds):
        _interval(flat, comm.rank, k, _touched(comm.rank, k, every), marks, board)
        sync_round(flat, rule, RoundFlags(final=k == rounds - 1))
    return flat, {"sent": rule.meter.sent, "rule": rule}


@pytest.mark.parametrize("mode", RULES)
def test_with_every_row_written_the_rounds_equal_dense_rounds(mode: str) -> None:
    cfg = SyncConfig(mode=mode, trim=1)
    for world in (2, 3):
        dense = run_ranks(world, lambda c: _train(c, cfg, sparse=False, every=True)[0])
        rows = run_ranks(world, lambda c: _train(c, cfg, sparse=True, every=True)[0])
        for d, r in zip(dense, rows):
            assert torch.equal(d, r), (mode, world, (d - r).abs().max())


@pytest.mark.parametrize("dtype", ["int8", "bf16"])
def test_compressed_wires_compose_with_row_sparse_rounds(dtype: str) -> None:
    # The table is the buffer's tail, so with every row written the compact vector is the
    # buffer itself, chunk for chunk: int8's scales and the residuals are the dense round's.
    cfg = SyncConfig(mode="slowmo", dtype=dtype)
    dense = run_ranks(2, lambda c: _train(c, cfg, sparse=False, every=True)[0])
    rows = run_ranks(2, lambda c: _train(c, cfg, sparse=True, every=True)[0])
    assert all(torch.equal(d, r) for d, r in zip(dense, rows))


@pytest.mark.parametrize("mode", RULES)
def test_with_one_replica_the_rounds_equal_dense_rounds_bit_for_bit(mode: str) -> None:
    cfg = SyncConfig(mode=mode)
    # diloco's momentum (0.9 even for one replica) keeps stepping rows that stopped changing in a
    # dense round; a row-sparse round leaves an unwritten row where it is (docs/sync.md), so for
    # diloco the two agree where every row is written. slowmo's default momentum is 0 for one.
    every = mode == "diloco"
    dense, _ = _train(LocalComm(), cfg, sparse=False, every=every)
    rows, _ = _train(LocalComm(), cfg, sparse=True, every=every)
    assert torch.equal(dense, rows)


@pytest.mark.parametrize("mode", RULES)
def test_a_row_no_replica_wrote_never_moves_and_replicas_end_identical(mode: str) -> None:
    cfg = SyncConfig(mode=mode, trim=1)
    out = run_ranks(3, lambda c: _train(c, cfg, sparse=True, every=False, rounds=5)[0])
    start = TABLE.view(_start())
    for flat in out:
        assert torch.equal(TABLE.view(flat)[ROWS // 2:], start[ROWS // 2:])
        assert torch.equal(flat, out[0])  # the final round lands every replica on one model


def test_a_round_sends_the_rows_that_moved_not_the_table() -> None:
    cfg = SyncConfig(mode="slowmo")
    dense = run_ranks(2, lambda c: _train(c, cfg, sparse=False, every=False, rounds=3)[1]["sent"])
    rows = run_ranks(2, lambda c: _train(c, cfg, sparse=True, every=False, rounds=3)[1]["sent"])
    # Two middle rounds of at most 10 of 40 rows (and the final one of every row ever written).
    assert rows[0] < 0.6 * dense[0], (rows, dense)


def test_an_idle_rows_momentum_decays_by_mu_per_round_it_sat_out() -> None:
    cfg = SyncConfig(mode="slowmo", outer_momentum=0.5)

    def rank_fn(comm: Comm) -> tuple[torch.Tensor, torch.Tensor]:
        marks, board = RowMarks([TABLE]), Board(1)
        rule = make_rule(cfg, comm, None, marks)
        flat = _start()
        rule.prime(flat)
        rule.attach(board)
        plan = [torch.tensor([0, 1]), torch.tensor([1]), torch.tensor([1]), torch.tensor([0, 1])]
        for k, rows in enumerate(plan):
            _interval(flat, comm.rank, k, rows, marks, board)
            if k == 1:
                kept = rule.state_dict()["momentum"][DENSE:DENSE + DIM].clone()  # row 0 after round 1
            sync_round(flat, rule)
        return kept, rule.state_dict()["momentum"]

    kept, momentum = run_ranks(2, rank_fn)[0]

    def written(rank: int) -> torch.Tensor:  # what round 4's interval added to row 0 on ``rank``
        g = torch.Generator().manual_seed(7 * rank + 31 * 3 + 1)
        torch.randn(DENSE, generator=g)
        return 0.1 * torch.randn(2, DIM, generator=g)[0]

    pseudo = -(written(0) + written(1)) / 2  # Δ = θ_g − mean of the replicas
    # Row 0 sat out rounds 2 and 3: its momentum decayed by μ² before round 4's b ← μ·b + Δ.
    assert torch.allclose(momentum[DENSE:DENSE + DIM], pseudo + 0.5 * 0.25 * kept, atol=1e-6)
    assert not torch.allclose(momentum[DENSE:DENSE + DIM], pseudo + 0.5 * kept, atol=1e-6)


def test_state_round_trips_through_a_checkpoint() -> None:
    cfg = SyncConfig(mode="diloco")

    def rank_fn(comm: Comm) -> tuple[torch.Tensor, torch.Tensor]:
        results = []
        for resume in (False, True):
            marks, board = RowMarks([TABLE]), Board(1)
            rule = make_rule(cfg, comm, None, marks)
            flat = _start()
            rule.prime(flat)
            rule.attach(board)
            for k in range(4):
                if resume and k == 2:  # a new leader resumes from the state saved after round 2
                    state, copy = rule.state_dict(), flat.clone()
                    marks, board = RowMarks([TABLE]), Board(1)
                    rule = make_rule(cfg, comm, None, marks)
                    rule.load_state_dict(state)
                    rule.prime(copy)
                    rule.attach(board)
                    flat = copy
                _interval(flat, comm.rank, k, _touched(comm.rank, k, False), marks, board)
                sync_round(flat, rule)
            results.append(flat)
        return results[0], results[1]

    for straight, resumed in run_ranks(2, rank_fn):
        assert torch.equal(straight, resumed)


def test_a_round_larger_than_a_chunk_makes_several_exchanges_with_the_same_result() -> None:
    cfg = SyncConfig(mode="slowmo", outer_momentum=0.5)

    def rank_fn(comm: Comm, chunk: int) -> torch.Tensor:
        marks, board = RowMarks([TABLE]), Board(1)
        rule = make_rule(cfg, comm, None, marks)
        rule.chunk = chunk  # type: ignore[attr-defined]
        flat = _start()
        rule.prime(flat)
        rule.attach(board)
        for k in range(4):
            _interval(flat, comm.rank, k, _touched(comm.rank, k, False), marks, board)
            sync_round(flat, rule, RoundFlags(final=k == 3))
        return flat

    whole = run_ranks(2, lambda c: rank_fn(c, 1 << 20))
    pieces = run_ranks(2, lambda c: rank_fn(c, 3 * DIM))  # the dense values alone, then 3 rows a piece
    for w, p in zip(whole, pieces):
        assert torch.equal(w, p)
