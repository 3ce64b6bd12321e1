"""Config composition and validation, in process (fast tier)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hogwild.errors import ConfigError
from hogwild.replica.resources import resolve_workers
from tests.conftest import compose_cfg


def test_defaults_compose_to_digits_mlp_sgd(tmp_cwd) -> None:
    cfg = compose_cfg([])
    # sync.mode and sync.interval default to auto, which composing resolves (SGD: slowmo every 50).
    assert (cfg.model.name, cfg.data.name, cfg.optim.name, cfg.sync.mode) == ("mlp", "digits", "sgd", "slowmo")
    assert cfg.sync.interval == 50
    # optim.update=auto is decided when the config is composed, and the plan reads it.
    assert cfg.workers == "auto" and cfg.optim.state == "auto" and cfg.optim.update == "hogwild"
    # SGD keeps lock-free Hogwild; an adaptive optimizer's gradients meet at the barrier.
    from hogwild.config.plan import Plan
    from hogwild.config.schema import Config

    sgd = Plan.of(cfg, 2)
    assert (sgd.update, sgd.shared_state, sgd.batches_per_step) == ("hogwild", False, 1)
    # Under the barrier a step takes a batch of every worker: the schedule counts such steps.
    adamw = Plan.of(compose_cfg(["optim=adamw", "train.accumulate=2"]), 3)
    assert (adamw.update, adamw.shared_state, adamw.batches_per_step) == ("barrier", True, 6)
    assert adamw.schedule_steps(60) == 10 and adamw.schedule_steps(61) == 11 and sgd.schedule_steps(61) == 61
    assert Plan.of(compose_cfg(["optim.state=shared"]), 2).shared_state
    assert compose_cfg(["optim._target_=torch.optim.SGD"]).optim.update == "hogwild"
    assert compose_cfg(["optim._target_=torch.optim.RMSprop"]).optim.update == "barrier"
    assert compose_cfg(["optim=adamw", "optim.update=hogwild"]).optim.update == "hogwild"  # what the user set
    # A Config built in Python (the API) has its path decided by the plan as well.
    built = Config()
    built.optim.name = "adamw"
    assert built.optim.update == "auto" and Plan.of(built, 2).barrier


def test_each_groups_default_is_named_once(tmp_cwd) -> None:
    # conf/config.yaml picks each group's default file, and the schema has a default of its own for
    # the same choice (the API builds configs without Hydra): the two must name one option, and that
    # option's file must add nothing the schema does not already say.
    import yaml
    from omegaconf import OmegaConf

    from hogwild.config.compose import CONF_DIR
    from hogwild.config.schema import Config

    defaults = yaml.safe_load((Path(CONF_DIR) / "config.yaml").read_text())["defaults"]
    picks = {k: v for d in defaults if isinstance(d, dict) for k, v in d.items()}
    schema = OmegaConf.structured(Config)
    key = {"model": "name", "data": "name", "optim": "name", "sync": "mode"}
    assert set(picks) == set(key), picks
    for group, option in picks.items():
        assert schema[group][key[group]] == option, \
            f"{group}: config.yaml picks {option}, the schema {schema[group][key[group]]}"
        stated = yaml.safe_load((Path(CONF_DIR) / group / f"{option}.yaml").read_text())
        for k, v in stated.items():
            assert schema[group][k] == v, \
                f"conf/{group}/{option}.yaml sets {k}={v}, the schema's default is {schema[group][k]}"


def test_the_cross_machine_defaults_follow_the_optimizer_family(tmp_cwd) -> None:
    """sync.mode=auto and sync.interval=auto (the defaults) are decided once, by the optimizer:
    SGD keeps slowmo every 50 steps; an adaptive optimizer averages, paced by the link, a slower
    replica's interval following its speed and its change weighing its steps; what the user sets is
    kept."""
    from hogwild.config.defaults import resolved
    from hogwild.sync.schedule import SyncSchedule

    sgd = resolved(compose_cfg([])).sync
    assert (sgd.mode, sgd.interval, sgd.interval_by_speed, sgd.weighting) == ("slowmo", 50, "false", "equal")
    for optim in (["optim=adamw"], ["optim=adam"], ["optim._target_=torch.optim.RMSprop"]):
        adaptive = resolved(compose_cfg(optim)).sync
        assert (adaptive.mode, adaptive.interval) == ("average", "auto"), optim
        assert (adaptive.interval_by_speed, adaptive.weighting) == ("true", "steps"), optim
        assert SyncSchedule.from_config(adaptive).paced and SyncSchedule.from_config(adaptive).by_speed
    off = resolved(compose_cfg(["optim=adamw", "sync.interval_by_speed=false"])).sync
    assert (off.interval_by_speed, off.weighting) == ("false", "equal")
    equal = resolved(compose_cfg(["optim=adamw", "sync.weighting=equal"])).sync
    assert (equal.interval_by_speed, equal.weighting) == ("true", "equal")
    assert resolved(compose_cfg(["optim=adamw", "sync.mode=median"])).sync.weighting == "equal"  # unweighted rule
    assert resolved(compose_cfg(["optim=adamw", "optim.update=hogwild"])).sync.mode == "slowmo"
    kept = resolved(compose_cfg(["optim=adamw", "sync.mode=diloco", "sync.interval=30"])).sync
    assert (kept.mode, kept.interval) == ("diloco", 30)
    # sync.target_drift adapts a fixed interval to its own measure: it starts from SGD's 50.
    drift = resolved(compose_cfg(["optim=adamw", "sync.target_drift=0.01"])).sync
    assert (drift.mode, drift.interval) == ("average", 50)
    assert resolved(resolved(compose_cfg(["optim=adamw"]))).sync == resolved(compose_cfg(["optim=adamw"])).sync


@pytest.mark.parametrize("value,mode", [("true", "default"), ("false", "off"), ("True", "default"), ("auto", "auto")])
def test_train_compile_takes_the_boolean_a_trainer_user_types(tmp_cwd, value: str, mode: str) -> None:
    # Hugging Face's torch_compile is a boolean: train.compile=true was refused ("unknown value 'True'").
    assert compose_cfg([f"train.compile={value}"]).train.compile == mode


def test_group_and_key_overrides(tmp_cwd) -> None:
    cfg = compose_cfg(["model=convnet", "optim=adam", "optim.state=shared", "workers=3",
                       "train.max_steps=10", "sync.interval=7", "run_dir=out"])
    assert cfg.model.name == "convnet" and cfg.optim.name == "adam" and cfg.optim.lr == 0.001
    assert cfg.workers == 3 and cfg.train.max_steps == 10 and cfg.sync.interval == 7


def test_sweep_preflight_checks_every_job(tmp_cwd) -> None:
    assert compose_cfg(["-m", "optim.lr=0.01,0.1"]).optim.lr == 0.01
    with pytest.raises(ConfigError, match=r"^optim\.lr"):
        compose_cfg(["-m", "optim.lr=0.01,0.1,-3"])
    with pytest.raises(ConfigError, match=r"^train\.batch_size"):
        compose_cfg(["-m", "optim.lr=0.01,0.1", "train.batch_size=8,0"])  # a bad combination


def test_large_sweeps_check_each_value_once(tmp_cwd) -> None:
    from hogwild.config import compose

    lrs = ",".join(str(0.01 * i) for i in range(1, 11))
    bs = ",".join(str(i) for i in range(1, 10)) + ",-1"  # 100 jobs, the bad value in the last ones
    with pytest.raises(ConfigError, match=r"^train\.batch_size"):
        compose_cfg(["-m", f"optim.lr={lrs}", f"train.batch_size={bs}"])
    assert len(compose._jobs([f"optim.lr={lrs}", f"train.batch_size={bs}"], compose.CONF_DIR, True)) == 1 + 9 + 9


def test_print_flags_are_left_to_hydra(tmp_cwd) -> None:
    assert compose_cfg(["--cfg", "job", "workers=0"]) is None  # Hydra prints; nothing runs
    assert compose_cfg(["--help"]) is None


def test_a_sweep_without_multirun_is_an_error(tmp_cwd) -> None:
    with pytest.raises(ConfigError):
        compose_cfg(["optim.lr=0.01,0.1"])


def test_experiment_file(tmp_cwd) -> None:
    cfg = compose_cfg(["+experiment=sparse"])
    assert cfg.model.name == "sparse_linear" and cfg.data.name == "sparse_synthetic"


@pytest.mark.parametrize("override,key", [
    ("workers=0", "workers"), ("optim.lr=-1", "optim.lr"), ("model=foo", "model"),
    ("traim.epochs=2", "traim"), ("sync.interval=0", "sync.interval"), ("sync.interval=fast", "sync.interval"),
    ("sync.interval=2.5", "sync.interval"), ("sync.mode=autom", "sync.mode"), ("eval.batch_size=0", "eval.batch_size"),
    ("sync.compress=int8", "sync.compress"), ("sync.interval_by_speed=maybe", "sync.interval_by_speed"),
    ("sync.weighting=work", "sync.weighting"),
])
def test_bad_values_name_the_key(tmp_cwd, override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{key}\b"):
        compose_cfg([override])


def test_workers_auto_is_cores_shared_by_local_replicas() -> None:
    import os

    cores = len(os.sched_getaffinity(0))
    assert resolve_workers("auto") == cores
    assert resolve_workers("auto", local_replicas=cores * 2) == 1
    assert resolve_workers(3) == 3


def test_a_choice_is_checked_against_the_registry_its_implementations_fill() -> None:
    """One list per choice: the config check reads the registry the rules, models and datasets
    register into, so a new rule is valid with no second list to update."""
    import pytest

    from hogwild.config.registry import DATASETS, MODELS, SYNC_RULES
    from hogwild.errors import ConfigError
    from hogwild.sync.base import SyncRule, register
    from hogwild.sync.rules import make_rule

    assert set(SYNC_RULES.names()) == {"average", "broadcast", "diloco", "slowmo", "median", "trimmed_mean"}
    assert "image_folder" in DATASETS.names() and "mlp" in MODELS.names()
    with pytest.raises(ConfigError, match=r"sync.mode: unknown value 'toy'; choose one of .*slowmo"):
        compose_cfg(["sync.mode=toy"])

    @register
    class Toy(SyncRule):
        name = "toy"

        def target(self, snap, ctx):  # type: ignore[no-untyped-def]
            return snap

    try:
        cfg = compose_cfg(["sync.mode=toy"])
        assert type(make_rule(cfg.sync, None, 0)) is Toy  # type: ignore[arg-type]
    finally:
        SYNC_RULES._items.pop("toy")  # noqa: SLF001 - the test's own rule leaves the registry


def test_a_bare_tilde_says_how_to_write_a_home_path() -> None:
    """The README's own example, data.root=~/data, failed in Hydra's parser with only the
    parser's words; the line now says what to write instead."""
    with pytest.raises(ConfigError, match=r"^data.root: .*data.root=~/data .*write data.root=\$HOME/\.\.\., or quote"):
        compose_cfg(["data.root=~/data"])


@pytest.mark.parametrize("overrides,key,says", [
    (["sync.timeout_s=1e15"], "sync.timeout_s", "at most"),             # an OverflowError inside Gloo
    (["train.max_steps=99999999999999999999"], "train.max_steps", "64-bit"),  # accepted, then never ended
    (["train.target.metric=accuracy", "train.target.value=2"], "train.target.value", "can never reach"),
    (["train.target.metric=accuracy", "train.target.value=nan"], "train.target.value", "finite"),
    (["train.target.metric=perplexity", "train.target.value=0.5"], "train.target.value", "can never reach"),
    (["data.loader_workers=2000"], "data.loader_workers", "at most 64"),  # ~1,800 semaphores left behind
], ids=["timeout past a C++ duration", "steps past int64", "accuracy of 2", "NaN target", "perplexity below 1",
        "thousands of loader processes"])
def test_values_past_what_the_lower_layers_take_name_the_key(tmp_cwd, overrides: list[str], key: str,
                                                             says: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{key}: .*{says}"):
        compose_cfg(overrides)
