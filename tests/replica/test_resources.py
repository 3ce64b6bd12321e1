"""The memory estimate counts the model, its optimizer state, the round buffers and loader
processes, and refuses a run that will not fit before the model is shared or a worker spawns
(fast tier)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hogwild.config.plan import Plan
from hogwild.config.schema import Config
from hogwild.errors import ConfigError
from hogwild.replica import build, resources
from hogwild.replica.resources import Footprint
from hogwild.replica.optim import torch_state_probe
from tests.conftest import compose_cfg

GB = 2**30


def planned(cfg: Config, workers: int) -> tuple[Config, Plan]:
    return cfg, Plan.of(cfg, workers)


def _memory(monkeypatch: pytest.MonkeyPatch, avail: int) -> None:
    monkeypatch.setattr(resources, "mem_available", lambda: avail)
    monkeypatch.setattr(resources, "shm_free", lambda: 1000 * GB)


def test_a_model_whose_workers_copies_do_not_fit_is_refused_naming_workers(
        tmp_cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _memory(monkeypatch, 8 * GB)
    cfg = compose_cfg(["optim=adamw", "optim.update=hogwild", "workers=8"])
    # Eight workers, each with the gradients and two Adam moments of a 1 GB model (about 26 GB), and
    # the leader's snapshot, reduce buffer and slowmo's θ_g and momentum (4 GB).
    with pytest.raises(ConfigError, match=r"^workers: 8 workers x 1 replica\(s\) need about 30\.\d GB .*model 4\.0 GB"):
        resources.check(cfg, Plan.of(cfg, 8), 1, Footprint(model_bytes=GB, state_copies=2))
    # The data alone fits: the first check passes.
    resources.check(cfg, Plan.of(cfg, 8), 1, Footprint(model_bytes=0, state_copies=2))
    # One worker, plain SGD: it fits.
    resources.check(*planned(compose_cfg(["optim=sgd", "workers=1"]), 1), 1, Footprint(model_bytes=GB))
    # Under the barrier the moments are held once and the gradients meet in shared memory: it fits.
    resources.check(*planned(compose_cfg(["optim=adamw", "workers=8"]), 8), 1,
                    Footprint(model_bytes=GB, state_copies=2, row_bytes=8 * GB))


def test_loader_processes_count_and_are_named(tmp_cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _memory(monkeypatch, 8 * GB)
    cfg = compose_cfg(["workers=2", "data.loader_workers=32"])
    with pytest.raises(ConfigError, match=r"^data\.loader_workers: .*need about 19\.\d GB"):
        resources.check(cfg, Plan.of(cfg, 2), 1)


def test_shared_optimizer_state_counts_in_shared_memory(tmp_cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resources, "mem_available", lambda: 1000 * GB)
    monkeypatch.setattr(resources, "shm_free", lambda: 2 * GB)
    hogwild = ["optim=adamw", "optim.update=hogwild"]
    # Moments per worker: RAM.
    resources.check(*planned(compose_cfg(hogwild), 1), 1, Footprint(model_bytes=GB, state_copies=2))
    with pytest.raises(ConfigError, match=r"^model: the model and its shared optimizer state needs 3\.0 GB of shared"):
        resources.check(*planned(compose_cfg([*hogwild, "optim.state=shared"]), 1), 1,
                        Footprint(model_bytes=GB, state_copies=2))
    # The barrier's one state, and its workers' gradient rows, are shared memory too.
    with pytest.raises(ConfigError, match=r"^model: the model and its shared optimizer state needs 5\.0 GB of shared"):
        resources.check(*planned(compose_cfg(["optim=adamw"]), 2), 1,
                        Footprint(model_bytes=GB, state_copies=2, row_bytes=2 * GB))


def test_a_torch_optimizers_model_sized_state_is_read_off_its_probe(tmp_cwd: Path) -> None:
    params = [torch.nn.Parameter(torch.zeros(10, 3)), torch.nn.Parameter(torch.zeros(3))]
    adamw = compose_cfg(["optim._target_=torch.optim.AdamW"]).optim
    sgd = compose_cfg(["optim._target_=torch.optim.SGD"]).optim
    assert build.model_sized_state(torch_state_probe(adamw, params), params) == 2
    assert build.model_sized_state(torch_state_probe(sgd, params), params) == 0


def test_the_replica_is_refused_before_its_model_is_shared(tmp_cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _memory(monkeypatch, int(1.5 * GB))
    shared: list[int] = []
    monkeypatch.setattr(build, "share_model", lambda *a: shared.append(1))
    # slowmo keeps two more models in the leader (θ_g and its momentum): past 1.5 GB with four workers.
    cfg = compose_cfg(["optim=adamw", "workers=4", "model.hidden=500000", "sync.mode=slowmo"])
    with pytest.raises(ConfigError, match=r"^workers: 4 workers"):
        build.build_replica(cfg, Plan.of(cfg, 4), torch.device("cpu"), 1)
    assert not shared


def test_the_round_buffers_count_the_rules_kept_state_and_a_row_sparse_rounds_chunks() -> None:
    from hogwild.config.schema import SyncConfig
    from hogwild.replica.rows import CHUNK_VALUES

    model = 10 * GB
    # The snapshot and the reduce buffer, plus what the rule keeps: slowmo's θ_g and momentum.
    assert resources.round_bytes(SyncConfig(mode="slowmo"), model) == 4 * model
    assert resources.round_bytes(SyncConfig(mode="average", compress="off"), model) == 2 * model
    # sync.compress=auto on a paced average: what its largest rung needs (int8, whole: residual, base).
    assert resources.round_bytes(SyncConfig(mode="average", interval="auto"), model) == 4 * model
    assert resources.round_bytes(SyncConfig(mode="average", dtype="int8"), model) == 4 * model  # residual, base
    assert resources.round_bytes(SyncConfig(mode="slowmo", fragments=4), model) == 2.5 * model
    # Row-sparse exchanges carry at most a chunk: the kept state stays whole, the buffers do not.
    chunk = 4 * CHUNK_VALUES
    assert resources.round_bytes(SyncConfig(mode="average", row_sparse=True), model) == 2 * chunk
    assert resources.round_bytes(SyncConfig(mode="slowmo", row_sparse=True), model) == 4 * chunk + 2 * model
