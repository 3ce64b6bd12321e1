"""The task layer: which task the labels ask for, the loss, each task's test metrics against its
own baseline, the stopping target in either direction, and the verdict (fast tier)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from hogwild.config.plan import Plan
from hogwild.config.train import LossConfig, TargetConfig
from hogwild.data.splits import Dataset, Split
from hogwild.errors import ConfigError
from hogwild.replica.task import (
    DEFAULT_LOSS,
    Task,
    build_task,
    evaluate,
    infer_kind,
    make_loss,
    preflight,
    reached,
)
from tests.conftest import compose_cfg

pytestmark = pytest.mark.timeout(60)
CPU = torch.device("cpu")

LONE = Plan("hogwild", False, 1, 1)  # a replica of one Hogwild worker: what these tests build by hand


class Const(nn.Module):
    """Returns a fixed output per sample, whatever the input: a baseline made into a model."""

    def __init__(self, out: Tensor) -> None:
        super().__init__()
        self.out = out
        self.w = nn.Parameter(torch.zeros(()))

    def forward(self, x: Tensor) -> Tensor:
        return self.out.expand(len(x), *self.out.shape) + self.w


class Identity(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))

    def forward(self, x: Tensor) -> Tensor:
        return x[:, 0] * self.w


def _regression() -> Dataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 3, generator=g)
    y = x[:, 0].clone()
    return Dataset(Split((x[:150],), y[:150]), Split((x[150:],), y[150:]), 1, (3,))


def test_the_labels_pick_the_task() -> None:
    x = torch.zeros(4, 3)
    assert infer_kind(Split((x,), torch.tensor([0, 1, 2, 1]))) == "classification"
    assert infer_kind(Split((x,), torch.randn(4))) == "regression"
    assert infer_kind(Split((x.long(),), torch.zeros(4, 3, dtype=torch.long))) == "language_model"


def test_regression_metrics_and_r2_against_the_training_mean(tmp_cwd: object) -> None:
    ds = _regression()
    task = build_task(compose_cfg([]), ds)
    assert task.kind == "regression" and task.headline == "r2"
    perfect = evaluate(Identity(), ds.test, CPU, task)
    assert perfect["mse"] == pytest.approx(0.0, abs=1e-10) and perfect["r2"] == pytest.approx(1.0)
    mean = evaluate(Const(ds.train.targets.mean()), ds.test, CPU, task)
    assert mean["r2"] == pytest.approx(0.0, abs=1e-6)  # predicting the training mean is the baseline
    assert mean["rmse"] == pytest.approx(math.sqrt(mean["mse"]))
    assert task.baseline["mse"] == pytest.approx(mean["mse"], rel=1e-6)


def test_language_model_perplexity_of_a_uniform_model_is_the_vocabulary(tmp_cwd: object) -> None:
    V, T = 11, 5
    tokens = torch.randint(V, (40, T + 1), generator=torch.Generator().manual_seed(1))
    ds = Dataset(Split((tokens[:30, :-1],), tokens[:30, 1:]), Split((tokens[30:, :-1],), tokens[30:, 1:]), V, (T,))
    task = build_task(compose_cfg([]), ds)
    assert task.kind == "language_model"
    scores = evaluate(Const(torch.zeros(T, V)), ds.test, CPU, task)
    assert scores["perplexity"] == pytest.approx(V, rel=1e-5)
    assert scores["token_ce"] == pytest.approx(math.log(V), rel=1e-5)
    assert task.baseline["perplexity"] < V * 1.2  # the unigram model: about V for uniform tokens


def test_a_loss_target_is_a_class_built_once_or_a_function_given_its_keywords() -> None:
    out, y = torch.tensor([0.0, 3.0]), torch.tensor([0.0, 0.0])
    huber = make_loss(LossConfig("torch.nn.HuberLoss", {"delta": 1.0}), "regression")
    assert float(huber(out, y)) == pytest.approx((0.0 + (3.0 - 0.5)) / 2)
    l1 = make_loss(LossConfig("torch.nn.functional.l1_loss", {"reduction": "sum"}), "regression")
    assert float(l1(out, y)) == 3.0
    assert make_loss(LossConfig(), "classification") is DEFAULT_LOSS["classification"]


@pytest.mark.parametrize("metric,value,mode,scores,hit", [
    ("accuracy", 0.9, "auto", {"accuracy": 0.91}, True),
    ("accuracy", 0.9, "auto", {"accuracy": 0.89}, False),
    ("perplexity", 5.0, "auto", {"perplexity": 4.9}, True),   # lower is better
    ("perplexity", 5.0, "auto", {"perplexity": 5.1}, False),
    ("loss", 0.5, "auto", {"loss": float("nan")}, False),     # a NaN reaches nothing
    ("loss", 0.5, "max", {"loss": 0.6}, True),                # the direction, overridden
])
def test_the_target_stops_in_the_metric_s_direction(metric: str, value: float, mode: str,
                                                    scores: dict[str, float], hit: bool) -> None:
    task = Task("language_model", DEFAULT_LOSS["language_model"])
    assert reached(task, TargetConfig(metric, value, mode), {**{m: 1e9 for m in task.metrics}, **scores}) is hit


def test_target_accuracy_is_a_target_on_accuracy(tmp_cwd: object) -> None:
    cfg = compose_cfg(["train.target_accuracy=0.9"])
    assert (cfg.train.target.metric, cfg.train.target.value, cfg.train.target.mode) == ("accuracy", 0.9, "max")


def test_a_target_the_task_does_not_report_is_named(tmp_cwd: object) -> None:
    cfg = compose_cfg(["train.target.metric=perplexity", "train.target.value=3"])
    with pytest.raises(ConfigError, match=r"^train.target.metric: the regression task reports"):
        build_task(cfg, _regression())


def test_a_tuple_output_trains_on_its_first_element_and_an_unknown_output_is_named(tmp_cwd: object) -> None:
    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 1)

        def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
            return self.lin(x), x  # no scalar after the logits: no loss of its own

    class Text(Pair):
        def forward(self, x: Tensor) -> str:  # type: ignore[override]
            return "logits"

    ds = _regression()
    task = build_task(compose_cfg([]), ds)
    model = Pair()
    preflight(model, ds, task, 8, CPU)
    loss, out = task.step_for(model).run(model, *ds.train.batch(torch.arange(4)))
    assert out.loss is None and out.logits is not None and out.logits.shape == (4, 1)
    assert torch.allclose(loss, task.loss(out.logits, ds.train.batch(torch.arange(4))[1]))
    with pytest.raises(ConfigError, match=r"^model: forward returned a str; return a tensor, a tuple"):
        preflight(Text(), ds, build_task(compose_cfg([]), ds), 8, CPU)


def test_preflight_says_a_working_loss_s_warning_once_as_one_log_line(tmp_cwd: object,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    import dataclasses
    import logging
    import warnings

    def warns(out: Tensor, y: Tensor) -> Tensor:
        warnings.warn("a loss that warns\nover two lines", UserWarning, stacklevel=2)
        return ((out - y) ** 2).mean()

    ds = _regression()
    task = dataclasses.replace(build_task(compose_cfg([]), ds), loss=warns)
    with warnings.catch_warnings(record=True) as escaped, caplog.at_level(logging.WARNING, "hogwild.replica.task"):
        warnings.simplefilter("always")
        preflight(Identity(), ds, task, 8, CPU)
    assert not escaped, [str(w.message) for w in escaped]
    said = [r.getMessage() for r in caplog.records]
    assert said == ["loss: on output (8,) and labels (8,): a loss that warns"], said


def test_the_verdict_uses_the_task_s_own_baseline(tmp_cwd: object) -> None:
    from hogwild.replica.build import Replica
    from hogwild.report.verdict import judge

    ds = _regression()
    task = build_task(compose_cfg([]), ds)
    rep = Replica(ds, Identity(), torch.zeros(1), None, task, LONE)
    assert judge(rep, {"loss": 0.0, "r2": 0.95}, 100.0, 10, 0).summary.startswith("learned: r2 0.9500")
    flat = judge(rep, {"loss": 1.0, "r2": 0.001}, 100.0, 10, 0)
    assert flat.failure is None and flat.summary.startswith("no better than the baseline")


# --- task=binary: one click logit per sample, log-loss and AUC ---------------------------------

def test_auc_is_the_share_of_positive_negative_pairs_ranked_right_with_ties_half() -> None:
    from hogwild.replica.tasks import auc

    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 6, (300,), generator=g).float()  # many ties
    labels = torch.randint(0, 2, (300,), generator=g)
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairs = (pos[:, None] > neg[None, :]).double() + 0.5 * (pos[:, None] == neg[None, :]).double()
    assert auc(scores, labels) == pytest.approx(float(pairs.mean()), abs=1e-12)
    assert auc(torch.tensor([0.1, 0.9]), torch.tensor([0, 1])) == 1.0
    assert math.isnan(auc(torch.tensor([0.1, 0.9]), torch.tensor([1, 1])))


def _clicks(n: int, seed: int) -> Split:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return Split((x,), (torch.rand(n, generator=g) < torch.sigmoid(3 * x[:, 0])).long())


def test_binary_scores_log_loss_and_auc_against_the_click_rate() -> None:
    ds = Dataset(_clicks(400, 0), _clicks(300, 1), 2, (4,))
    task = build_task(compose_cfg(["task=binary"]), ds)
    assert task.headline == "auc" and task.baseline["auc"] == 0.5
    rate = float(ds.train.targets.double().mean())
    y = ds.test.targets.double()
    assert task.baseline["logloss"] == pytest.approx(float(-(y * math.log(rate) + (1 - y) * math.log(1 - rate)).mean()))
    model = nn.Linear(4, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[3.0, 0, 0, 0]]))
        model.bias.zero_()
    scores = evaluate(model, ds.test, CPU, task, batch_size=64)  # batches: the AUC sees every one
    assert scores["auc"] > 0.8 and scores["logloss"] < task.baseline["logloss"], scores
    assert scores["loss"] == pytest.approx(scores["logloss"], rel=1e-5)


def test_binary_refuses_labels_other_than_0_and_1_in_one_line() -> None:
    split = Split((torch.randn(10, 4),), torch.arange(10) % 3)
    with pytest.raises(ConfigError, match=r"^task: binary needs one 0/1 label per sample"):
        build_task(compose_cfg(["task=binary"]), Dataset(split, split, 3, (4,)))


def test_an_auc_target_outside_0_1_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^train\.target\.value: auc can never reach 1\.5"):
        TargetConfig(metric="auc", value=1.5)
