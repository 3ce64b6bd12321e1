"""The model a run hands back meets the target that stopped it: the copy that met it replaces a
final model that reads less, on every replica, and a run says so. The conductor decides
(leader/target.py); telemetry only evaluates and reports the scores."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import Tensor

from hogwild.config.plan import Plan
from hogwild.config.schema import SyncConfig
from hogwild.config.train import TargetConfig
from hogwild.leader.core import hand_back_judged
from hogwild.leader.target import Target
from hogwild.replica.tasks import LOSS, SHARE
from hogwild.report.telemetry import Hooks, Telemetry
from hogwild.sync.comm import Comm
from hogwild.sync.rules import make_rule
from tests.conftest import compose_cfg
from tests.fake_comm import run_ranks


def _target(reached_at: float | None) -> Target:
    task = SimpleNamespace(metrics={"accuracy": SHARE, "loss": LOSS})
    target = Target(TargetConfig("accuracy", 0.96), task, torch.nn.Linear(1, 1))  # type: ignore[arg-type]
    target.reached_s = reached_at
    return target


def test_a_final_model_below_the_target_that_stopped_the_run_is_said(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert _target(1.5).held({"accuracy": 0.953, "loss": 0.2}) is False
    assert "train.target.value=0.96 stopped the run" in caplog.text and "accuracy 0.9530" in caplog.text


def test_a_final_model_that_keeps_the_target_or_a_run_it_did_not_stop_says_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert _target(1.5).held({"accuracy": 0.961, "loss": 0.2}) is True
        assert _target(None).held({"accuracy": 0.5, "loss": 0.2}) is None
    assert caplog.text == ""


def _replica(tmp_path: Path, target: list[str]) -> tuple[Telemetry, Target, Tensor]:
    from hogwild.replica.build import build_replica

    cfg = compose_cfg(["workers=1", f"run_dir={tmp_path}", *target])
    rep = build_replica(cfg, Plan.of(cfg, 1), torch.device("cpu"))
    judge = Target(cfg.train.target, rep.task, rep.model, rep.flat)
    tel = Telemetry(cfg, tmp_path, False, rep, Hooks(subject=judge.subject, on_scores=judge.saw))
    return tel, judge, rep.flat


# The initial mlp's test loss is about 2.3, below the bar; parameters made NaN give a NaN loss,
# which meets no bar. So the judged copy meets it and a spoiled final model does not.
LOSS_BAR = ["train.target.metric=loss", "train.target.value=100"]


def test_with_a_target_evaluations_read_a_still_copy_and_the_one_that_met_it_is_kept(tmp_path: Path) -> None:
    tel, target, flat = _replica(tmp_path, LOSS_BAR)
    before = flat.clone()
    model = tel.subject()
    flat.add_(1.0)  # the workers write on while the copy is evaluated
    tel.evaluate(0, model)
    tel.on_scores(tel.scores, 0.0, 1.0)
    assert target.met and target.judged is not None
    assert torch.equal(target.judged, before), "the copy that met the target is the one evaluated, not the live model"
    flat.fill_(float("nan"))  # the final model misses the target
    assert target.final_misses(tel.score_final())
    target.restore(tel.scores)
    tel.rescore()
    assert torch.equal(flat, before)
    tel.evaluate_final(1)  # the model changed since it was checked: scored again
    assert tel.scores["loss"] < 100
    assert not target.final_misses(tel.score_final())


def test_without_a_target_evaluations_read_the_live_model_and_keep_no_copy(tmp_path: Path) -> None:
    tel, target, flat = _replica(tmp_path, [])
    assert tel.subject() is tel.model and target.judged is None
    flat.fill_(float("nan"))
    assert not target.final_misses(tel.score_final()), "no target stopped the run: nothing to hand back"


def _hand_back(world: int, judged_misses: bool) -> list[tuple[Tensor, Tensor]]:
    """Two replicas after a final round on the mean 0.5; rank 0 judged the model 2.0 earlier."""

    def body(comm: Comm) -> tuple[Tensor, Tensor]:
        flat = torch.full((6,), 0.5)
        rule = make_rule(SyncConfig(mode="slowmo"), comm)
        rule.prime(flat)
        judged = torch.full((6,), 2.0) if comm.rank == 0 else None
        tel = SimpleNamespace(scores={"accuracy": 0.95}, score_final=lambda: {"accuracy": 0.95}, rescore=lambda: None)
        target = SimpleNamespace(is_set=True, judged=judged, final_misses=lambda scores: judged_misses,
                                 restore=lambda scores: flat.copy_(judged))
        cfg = SimpleNamespace(sync=SimpleNamespace(timeout_s=10.0), train=SimpleNamespace(
            target=TargetConfig("accuracy", 0.96)))
        crew = SimpleNamespace(tel=tel, cfg=cfg, rep=SimpleNamespace(flat=flat), comm=comm, rule=rule, target=target)
        hand_back_judged(crew)  # type: ignore[arg-type]
        assert rule.global_params is not None
        return flat, rule.global_params

    return run_ranks(world, body)


def test_a_final_model_below_the_target_is_replaced_on_every_replica_by_the_copy_that_met_it() -> None:
    for flat, agreed in _hand_back(2, judged_misses=True):
        assert torch.equal(flat, torch.full((6,), 2.0))
        # A run resumed from the final checkpoint starts its rounds from the model it holds.
        assert torch.equal(agreed, flat)


def test_a_final_model_that_meets_the_target_is_the_one_handed_back() -> None:
    for flat, agreed in _hand_back(2, judged_misses=False):
        assert torch.equal(flat, torch.full((6,), 0.5)) and torch.equal(agreed, flat)


class _Uncopyable(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: Tensor) -> Tensor:
        return self.inner(x)

    def __deepcopy__(self, memo: dict[int, object]) -> "_Uncopyable":
        raise TypeError("holds a handle")


def test_a_model_that_cannot_be_copied_is_evaluated_live_with_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tel, target, _ = _replica(tmp_path, LOSS_BAR)
    target.model = tel.model = _Uncopyable(tel.model)
    with caplog.at_level(logging.WARNING):
        assert tel.subject() is tel.model and tel.subject() is tel.model
    assert caplog.text.count("the model cannot be copied (TypeError: holds a handle)") == 1
    tel.evaluate(0, tel.subject())
    tel.on_scores(tel.scores, 0.0, 1.0)
    assert target.met and target.judged is None  # met, but nothing to hand back


def test_the_final_model_is_evaluated_once_when_its_check_already_scored_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hogwild.report.telemetry as telemetry

    tel, target, _ = _replica(tmp_path, LOSS_BAR)
    tel.evaluate(0, tel.subject())
    tel.on_scores(tel.scores, 0.0, 1.0)
    calls = []
    real = telemetry.evaluate
    monkeypatch.setattr(telemetry, "evaluate", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert not target.final_misses(tel.score_final())
    tel.evaluate_final(1)
    assert len(calls) == 1 and tel.scores["loss"] < 100
