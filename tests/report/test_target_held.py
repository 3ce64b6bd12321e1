"""The final model is judged against the target that stopped the run: a user who asked for 0.96
learns when the model the run hands back reads less."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from hogwild.config.train import TargetConfig
from hogwild.report.telemetry import Telemetry


def _tel(reached_at: float | None, final: float) -> SimpleNamespace:
    return SimpleNamespace(cfg=SimpleNamespace(train=SimpleNamespace(target=TargetConfig("accuracy", 0.96))),
                           task=SimpleNamespace(metrics={"accuracy": True, "loss": False}),
                           time_to_target=reached_at, scores={"accuracy": final, "loss": 0.2})


def test_a_final_model_below_the_target_that_stopped_the_run_is_said(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert Telemetry.target_held(_tel(1.5, 0.953)) is False  # type: ignore[arg-type]
    assert "train.target.value=0.96 stopped the run" in caplog.text and "accuracy 0.9530" in caplog.text


def test_a_final_model_that_keeps_the_target_or_a_run_it_did_not_stop_says_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert Telemetry.target_held(_tel(1.5, 0.961)) is True  # type: ignore[arg-type]
        assert Telemetry.target_held(_tel(None, 0.5)) is None  # type: ignore[arg-type]
    assert caplog.text == ""
