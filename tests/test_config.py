"""Config composition and validation, in process (fast tier)."""

from __future__ import annotations

import pytest

from hogwild.config import resolve_workers
from hogwild.errors import ConfigError
from tests.conftest import compose_cfg


def test_defaults_compose_to_digits_mlp_sgd(tmp_cwd) -> None:
    cfg = compose_cfg([])
    assert (cfg.model.name, cfg.data.name, cfg.optim.name, cfg.sync.mode) == ("mlp", "digits", "sgd", "average")
    assert cfg.workers == "auto" and cfg.optim.state == "worker"


def test_group_and_key_overrides(tmp_cwd) -> None:
    cfg = compose_cfg(["model=convnet", "optim=adam", "optim.state=shared", "workers=3",
                       "train.max_steps=10", "sync.interval=7", "run_dir=out"])
    assert cfg.model.name == "convnet" and cfg.optim.name == "adam" and cfg.optim.lr == 0.001
    assert cfg.workers == 3 and cfg.train.max_steps == 10 and cfg.sync.interval == 7


def test_sweep_preflight_checks_first_value(tmp_cwd) -> None:
    assert compose_cfg(["-m", "optim.lr=0.01,0.1"]).optim.lr == 0.01


def test_experiment_file(tmp_cwd) -> None:
    cfg = compose_cfg(["+experiment=sparse"])
    assert cfg.model.name == "sparse_linear" and cfg.data.name == "sparse_synthetic"


@pytest.mark.parametrize("override,key", [
    ("workers=0", "workers"), ("optim.lr=-1", "optim.lr"), ("model=foo", "model"),
    ("traim.epochs=2", "traim"), ("sync.interval=0", "sync.interval"),
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
