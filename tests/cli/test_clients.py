"""Models and data of the ecosystem's shapes, unchanged, trained through ``_target_`` keys with no
adapter (slow tier): a nanoGPT-style GPT built from its config object that returns
``(logits, loss)``, pytorch/examples' mnist_hogwild ``Net`` with ``nll_loss``, a two-input model
on dict items, and Hugging Face models built from configs on dict batches with their own loss
(skipped when transformers is not installed: ``pip install -e '.[hf]'``).

Each trained checkpoint is scored by hogwild-eval's own entry point in this process: the
command's process itself is covered by tests/cli/test_examples.py and tests/test_wheel.py, and a
fresh interpreter here cost a torch (and transformers) import per test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hogwild
from hogwild.cli.evaluate import main as eval_main
from tests.conftest import REPO, metrics, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

GPT = ["model._target_=examples.gpt.GPT", "+model.config._target_=examples.gpt.GPTConfig",
       "+model.config.n_layer=1", "+model.config.n_embd=64", "data._target_=examples.charlm.stdlib_text",
       "+data.chars=200000", "optim=adamw", "optim.lr=0.003", "train.max_steps=300", "train.batch_size=16",
       "workers=2", "eval.every_s=30"]


@pytest.fixture
def examples_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """``examples.*`` importable here and in the workers (they inherit sys.path), wherever pytest runs."""
    monkeypatch.syspath_prepend(str(REPO))


def _learned(run: Path, metric: str) -> dict:
    m = metrics(run)
    assert m["status"] == "ok" and m["verdict"].startswith(f"learned: {metric}"), m
    return m


def _evaluate(run: Path, capsys: pytest.CaptureFixture[str], *named: str) -> dict:
    capsys.readouterr()  # what the run printed before
    eval_main([f"checkpoint={run / 'checkpoints' / 'last.pt'}", *named])  # exits only on an error
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_a_nanogpt_style_gpt_built_from_its_config_trains_on_its_own_loss_through_the_python_api(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], examples_importable: None) -> None:
    # One job for both: the API composes the same overrides as the command line (which the other
    # tests here run), and returns what the run wrote to metrics.json.
    run = tmp_path / "run"
    result = hogwild.train([*GPT, f"run_dir={run}"])
    m = _learned(run, "perplexity")
    assert result.ok and result.checkpoint == run / "checkpoints" / "last.pt"
    assert result.metrics is not None and result.metrics["test_perplexity"] == m["test_perplexity"]
    assert m["test_perplexity"] < 0.85 * m["baseline_perplexity"], m
    # Its own loss is what evaluation reports: the logits at position 0, the loss at position 1.
    assert m["test_loss"] == pytest.approx(m["test_token_ce"], rel=1e-4)
    scores = _evaluate(run, capsys, "model._target_=examples.gpt.GPT",
                       "model.kwargs.config._target_=examples.gpt.GPTConfig",
                       "data._target_=examples.charlm.stdlib_text")
    assert scores["test_perplexity"] == pytest.approx(m["test_perplexity"], rel=1e-5)


def test_mnist_hogwild_net_with_nll_loss(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         examples_importable: None) -> None:
    run = tmp_path / "run"
    out = run_cli(["model._target_=examples.mnist_hogwild.Net", "loss._target_=torch.nn.functional.nll_loss",
                   "data.image_size=28", "optim.lr=0.05", "optim.momentum=0.5", "train.epochs=4", "workers=2",
                   f"run_dir={run}"], cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    m = _learned(run, "accuracy")
    assert m["test_accuracy"] > 0.6, m
    scores = _evaluate(run, capsys, "model._target_=examples.mnist_hogwild.Net",
                       "loss._target_=torch.nn.functional.nll_loss")
    assert scores["test_accuracy"] == pytest.approx(m["test_accuracy"])


def test_a_two_input_model_on_dict_items(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         examples_importable: None) -> None:
    run = tmp_path / "run"
    out = run_cli(["model._target_=examples.tabular.TwoInput", "data._target_=examples.tabular.clicks",
                   "train.epochs=8", "workers=2", f"run_dir={run}"], cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    m = _learned(run, "accuracy")
    assert m["test_accuracy"] > 0.8, m
    scores = _evaluate(run, capsys, "model._target_=examples.tabular.TwoInput", "data._target_=examples.tabular.clicks")
    assert scores["test_accuracy"] == pytest.approx(m["test_accuracy"])


@pytest.mark.parametrize("experiment,metric", [("hf_gpt2", "perplexity"), ("hf_bert", "accuracy")])
def test_hugging_face_models_built_from_configs_train_on_their_own_loss(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], examples_importable: None, experiment: str,
        metric: str) -> None:
    pytest.importorskip("transformers")
    run = tmp_path / "run"
    # 150 steps: under Hogwild the run once sat at the edge of the unigram plateau there, where a
    # busy machine's extra staleness alone decided whether perplexity had left it (18.4 of 19.2).
    # On the barrier (AdamW's path) 150 steps at a load of 9-12 on 2 cores ended at 9.7 and 10.1
    # (200 steps: 9.0), far under the 0.85 bar (16.3); 130 steps at 2.5x the rate ended at 13.8.
    # Windows of 32 characters, not the preset's 64, take half the compute a step: 150 steps ended at
    # 9.9-12.8 on one core when measured (10.2-10.9 beside a CPU hog, where 64 characters ended at 14.2).
    # BERT: 3 epochs are 150 steps. Beside a CPU hog on its one core it sat at chance (0.53) after
    # 50 steps, reached 0.78 at 60 and 1.0 from 70 on (100 steps: 1.0, loss 0.02-0.04) when measured.
    size = ["train.max_steps=150", "+data.context=32"] if experiment == "hf_gpt2" else ["train.epochs=3"]
    out = run_cli([f"+experiment={experiment}", *size, "workers=2", "eval.every_s=30", f"run_dir={run}"], cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    m = _learned(run, metric)
    model, config, data = {"hf_gpt2": ("transformers.GPT2LMHeadModel", "transformers.GPT2Config",
                                       "examples.hf.char_lm"),
                           "hf_bert": ("transformers.BertForSequenceClassification", "transformers.BertConfig",
                                       "examples.hf.has_seven")}[experiment]
    scores = _evaluate(run, capsys, f"model._target_={model}", f"model.kwargs.config._target_={config}",
                       f"data._target_={data}")
    assert scores[f"test_{metric}"] == pytest.approx(m[f"test_{metric}"], rel=1e-5)
    if metric == "perplexity":
        # The model shifts its labels itself; the metrics read its logits shifted to match.
        assert m["test_perplexity"] < 0.85 * m["baseline_perplexity"], m
        assert m["test_loss"] == pytest.approx(m["test_token_ce"], rel=1e-3)
    else:
        assert m["test_accuracy"] > 0.75, m
