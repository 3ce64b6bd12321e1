"""Evaluation costs what the README says: at most ``eval.max_fraction`` of the leader's time,
whatever asks for it (the step grid or the clock), and ``eval.max_batches`` scores a fixed subset
during training while the final evaluation scores the whole test split (fast tier)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from hogwild.config.plan import Plan
from hogwild.replica.board import Board
from hogwild.report import telemetry as telemetry_mod
from hogwild.report.telemetry import Telemetry
from tests.conftest import compose_cfg

pytestmark = pytest.mark.timeout(120)

EVAL_S = 0.05


def _telemetry(tmp_path: Path, overrides: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[Telemetry, list]:
    from hogwild.replica.build import build_replica

    cfg = compose_cfg(["workers=1", f"run_dir={tmp_path}", *overrides])
    rep = build_replica(cfg, Plan.of(cfg, 1), torch.device("cpu"))
    calls: list = []

    def slow(model, split, device, task, batch_size=2048, on_batch=lambda: None,  # type: ignore[no-untyped-def]
             max_batches=None):
        t0 = time.monotonic()
        time.sleep(EVAL_S)
        calls.append((max_batches, time.monotonic() - t0, batch_size))
        return {m: 0.5 for m in task.metrics}

    monkeypatch.setattr(telemetry_mod, "evaluate", slow)
    return Telemetry(cfg, tmp_path, True, rep), calls


@pytest.mark.parametrize("fraction", [0.1, 0.3])
def test_evaluations_take_at_most_their_share_of_the_leader_s_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   fraction: float) -> None:
    # eval.every_s asks for an evaluation at every tick: only the budget holds them back.
    tel, calls = _telemetry(tmp_path, ["eval.every_s=0.001", f"eval.max_fraction={fraction}"], monkeypatch)
    board = Board(1)
    tel.start(board, total_steps=10_000, plan=Plan("hogwild", False, 1, 1))
    t0 = time.monotonic()
    while time.monotonic() - t0 < 1.5:
        board.stats["pos"][0] += 1
        tel.tick(board, 0, 0)
        time.sleep(0.002)
    elapsed = time.monotonic() - t0
    # By construction: each evaluation of d seconds starts d / fraction after the previous one
    # began, so their total stays within the share of the time, plus the last one.
    longest = max(took for _, took, _ in calls)
    assert tel.eval_s <= fraction * elapsed + longest + 0.01, (tel.eval_s, elapsed, calls)
    assert len(calls) >= 2  # the budget spaces evaluations out; it does not stop them
    assert tel.eval_s / elapsed < 0.5  # unbounded, back-to-back evaluations would take nearly all of it


def test_max_batches_scores_a_subset_during_training_and_the_whole_split_at_the_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tel, calls = _telemetry(tmp_path, ["eval.every_s=0.001", "eval.max_batches=1", "eval.batch_size=64"], monkeypatch)
    board = Board(1)
    tel.start(board, total_steps=100, plan=Plan("hogwild", False, 1, 1))
    board.stats["pos"][0] = 50
    tel.tick(board, 0, 0)
    tel.evaluate_final(100)
    # The subset is one batch of eval.batch_size samples; the final evaluation scores every batch.
    assert [(limit, size) for limit, _, size in calls] == [(1, 64), (None, 64)]


def test_a_subset_is_the_first_batches_and_the_whole_split_by_default(tmp_path: Path) -> None:
    from hogwild.replica.build import build_replica
    from hogwild.replica.task import evaluate

    cfg = compose_cfg(["workers=1", f"run_dir={tmp_path}"])
    rep = build_replica(cfg, Plan.of(cfg, 1), torch.device("cpu"))
    full = evaluate(rep.model, rep.ds.test, torch.device("cpu"), rep.task, batch_size=100)
    part = evaluate(rep.model, rep.ds.test, torch.device("cpu"), rep.task, batch_size=100, max_batches=1)
    first = evaluate(rep.model, rep.ds.test, torch.device("cpu"), rep.task, batch_size=100, max_batches=100)
    assert first == full and part != full
