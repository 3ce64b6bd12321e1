"""The three examples of the README, through the real CLI from the repository root (slow tier):
a character-level language model at 2 x 2 (the README's 1 x 2 and 2 x 1 in one job), a regression
with MSE, and torchvision's ResNet-18 with BatchNorm at 2 replicas under the default rule. Each runs
shorter than its README command (the suite's time budget), so the bars here are lower than the README's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from hogwild.checkpoint import store as checkpoint
from tests.conftest import REPO, clean_env, metrics, ranks, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

# A narrower model on less text, in windows of 16 characters instead of 64, and a shorter test
# split (10k characters, 624 windows: every evaluation reads all of it): the README's command
# trains the full one longer. The short windows take under half the compute a step and learn as
# fast in steps: the ratio to the unigram baseline was 0.70 at 90 steps, 0.55 at 120 and 0.41-0.43
# at 160 (2 x 2; with 64 characters 0.44 at 160, 0.37 at 200 at 1 x 2) when measured, so at 160
# steps the 0.6 bar keeps a margin and still fails a model that stalls at the unigram.
SHORT_LM = ["+experiment=charlm", "train.max_steps=160", "+data.chars=300000", "+data.test_chars=10000",
            "+data.context=16", "+model.context=16", "+model.width=64", "sched.warmup_steps=20", "eval.every_s=30"]


def _check_lm(run: Path) -> dict:
    m = metrics(run)
    assert m["status"] == "ok" and m["task"] == "language_model", m
    assert m["verdict"].startswith("learned: perplexity"), m["verdict"]
    # The unigram model of the training characters is the baseline: ~25-30 for Python source.
    assert m["test_perplexity"] < 0.6 * m["baseline_perplexity"], m
    return m


def test_char_language_model_two_replicas_of_two_workers(tmp_path: Path) -> None:
    # One job for the README's two shapes (1 x 2: Hogwild workers on one model; 2 x 1: replicas
    # meeting in sync rounds, whose health check reads every synced value of the model): 2 x 2
    # runs both paths, for about the cost of the 2 x 1 job alone. Started as torchrun starts
    # ranks, without the launcher (tests/leader/test_faults.py's restart test runs torchrun itself,
    # and test_group_sigterm.py launch/local.sh): one torch import less.
    out = ranks(2, [*SHORT_LM, "workers=2", f"run_dir={tmp_path / 'run'}"], cwd=REPO,
                env=clean_env(OMP_NUM_THREADS="1"), timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    m = _check_lm(tmp_path / "run")
    assert m["replicas"] == 2 and m["workers"] == 2 and m["syncs"] >= 1, m
    assert math.isclose(m["test_perplexity"], math.exp(m["test_token_ce"]), rel_tol=1e-6)
    # AdamW across machines, on the defaults: the replicas average, paced by what their rounds
    # cost, never below two optimizer steps of two workers, and on loopback far more often than
    # SGD's 50 (docs/sync.md, "Adaptive optimizers across machines").
    assert m["sync_mode"] == "average" and m["final_interval"] >= 4 and m["steps_per_sync"] < 50, m
    assert m["sync_cpu_s"] > 0, m
    # sync.compress=auto: the wire the rounds ended on is the last one climbed to (on loopback
    # usually none: whole fp32 rounds), and a climb lands on a rung of the ladder.
    climbs = m["sync_wire_climbs"]
    assert m["sync_wire"] == (climbs[-1]["wire"] if climbs else "fp32"), m
    assert all(c["wire"] in ("int8", "int8/4") and c["round"] >= 2 for c in climbs), m


def test_regression_with_mse(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    out = run_cli(["+experiment=regression", "workers=2", f"run_dir={tmp_path / 'run'}"], cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    m = metrics(tmp_path / "run")
    assert m["task"] == "regression" and m["verdict"].startswith("learned: r2"), m
    assert m["test_r2"] > 0.4 and m["test_rmse"] == pytest.approx(math.sqrt(m["test_mse"]))
    assert m["baseline_r2"] == 0.0 and m["test_mse"] < 0.6 * m["baseline_mse"]
    # hogwild-eval scores the checkpoint by the task's own metrics, once the user names the code. In
    # this process: its console script is run as a process by tests/test_wheel.py and test_user_model.py.
    from hogwild.cli.evaluate import main as eval_main

    monkeypatch.syspath_prepend(str(REPO))  # examples.* as from the repository root
    capsys.readouterr()
    try:
        eval_main([f"checkpoint={tmp_path / 'run' / 'checkpoints' / 'last.pt'}",
                   "model._target_=examples.regression.Regressor", "data._target_=examples.regression.diabetes"])
    except SystemExit as e:  # @guarded exits only on an error
        pytest.fail(f"hogwild-eval exited {e.code}: {capsys.readouterr().err[-2000:]}")
    scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scores["task"] == "regression" and scores["test_r2"] == pytest.approx(m["test_r2"], abs=1e-6)


def test_resnet18_with_batchnorm_on_two_replicas_under_the_default_rule(tmp_path: Path) -> None:
    run = tmp_path / "run"
    # 2 epochs instead of 3, with a round every 10 steps instead of 50: more rounds of the default
    # rule over the BatchNorm statistics (6 against 3 when measured; a momentum step there once
    # drove a running variance negative and evaluation to NaN) in two thirds of the steps. (1 epoch
    # with a round every 5 steps ended at 0.23 accuracy when measured: under the bar.) No evaluation
    # before the final one: the preset's every 10 s cost ResNet-18 passes over the test split that
    # nothing here reads; the final evaluation is the one that reads the synced statistics. Nor a
    # periodic checkpoint: only the final one is read. Ranks as torchrun starts them (see above).
    out = ranks(2, ["+experiment=resnet18_digits", "workers=1", "train.epochs=2", "sync.interval=10",
                    "eval.every_s=3600", "checkpoint.every_s=3600", f"run_dir={run}"], cwd=REPO,
                env=clean_env(OMP_NUM_THREADS="1"), timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    m = metrics(run)
    assert m["sync_mode"] == "slowmo" and m["replicas"] == 2 and m["syncs"] >= 3, m
    assert math.isfinite(m["test_loss"]) and m["test_accuracy"] > m["chance_accuracy"] + 0.3, m
    import torchvision

    from hogwild.replica.shared import layout

    slots = layout(torchvision.models.resnet18(num_classes=10))
    flat = checkpoint.load(run / "checkpoints" / "last.pt")["flat"]
    variances = torch.cat([s.view(flat).flatten() for s in slots if s.name.endswith("running_var")])
    assert variances.numel() > 0 and bool((variances >= 0).all()), "a running variance went negative"


def test_clicks_dlrm_on_sparse_tables_learns_most_of_the_true_models_auc(tmp_path: Path) -> None:
    # The recommendation example: sparse EmbeddingBag tables updated Hogwild-style by 2 workers,
    # one pass over a click log drawn from a known model, stopped by an AUC target.
    import sys

    sys.path.insert(0, str(REPO))
    from examples.clicks import click_log
    from hogwild.replica.tasks import auc

    small = ["data.kwargs.samples=40000", "data.kwargs.rows=2000"]
    # The pass takes a second or two, and an evaluation a tenth of a second or more on a loaded host.
    # Under any budget below the whole pass, an early evaluation (before the model crosses 0.62) can
    # spend the budget until the pass ends: CI saw AUC 0.687 at the end and no target seen, at
    # eval.max_fraction=0.1 and again at 0.4. At 1.0 an evaluation waits only as long as the last
    # took, at each of the 30 points of the step grid, while the workers train on (evaluations read a
    # still copy): the crossing is seen on a loaded host too.
    out = run_cli(["+experiment=clicks", *small, "workers=2", "train.target.metric=auc", "train.target.value=0.62",
                   "eval.max_fraction=1.0",
                   f"run_dir={tmp_path / 'run'}"], cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    m = metrics(tmp_path / "run")
    _, test = click_log(samples=40000, rows=2000)
    oracle = auc(test.oracle, test.clicks)
    assert m["task"] == "binary" and m["verdict"].startswith("learned: auc"), m
    assert m["test_auc"] >= 0.62 and m["time_to_target_s"] is not None and m["target_held"], m
    assert m["test_logloss"] < m["baseline_logloss"], m
    assert m["test_auc"] <= oracle + 0.02, (m["test_auc"], oracle)  # no model beats the one that drew the labels
