"""A replica that never meets another keeps no round state: no outer rule's θ_g and momentum in
its memory, its estimate or its checkpoints (fast tier)."""

from __future__ import annotations

from pathlib import Path

import torch

from hogwild.checkpoint import store as checkpoint
from hogwild.config.plan import Plan
from hogwild.config.schema import SyncConfig
from hogwild.replica.board import Board
from hogwild.replica.resources import memory_parts
from hogwild.sync.comm import LocalComm
from hogwild.sync.rounds import Rounds
from hogwild.sync.rules import make_rule
from hogwild.sync.schedule import SyncSchedule
from tests.conftest import compose_cfg, run_metrics


def _rounds(distributed: bool) -> Rounds:
    cfg = SyncConfig(mode="slowmo")
    flat = torch.randn(1000)
    return Rounds(flat, make_rule(cfg, LocalComm(), flat.numel()), LocalComm(), Board(1),
                  SyncSchedule.from_config(cfg, distributed))


def test_only_a_replica_that_will_meet_others_primes_its_outer_rule() -> None:
    assert _rounds(distributed=False).rule.state_dict() == {}
    assert set(_rounds(distributed=True).rule.state_dict()) == {"global_params", "momentum"}


def test_the_memory_estimate_of_a_lone_replica_counts_no_round_buffers() -> None:
    cfg = compose_cfg(["sync.mode=slowmo"])
    model = 100 * 2**20
    assert memory_parts(cfg, 1, model, 0, 0, syncs=True)["model"] >= 2 * model  # θ_g and momentum
    assert memory_parts(cfg, 1, model, 0, 0, syncs=False)["model"] == 0


def test_a_lone_replicas_checkpoint_carries_no_outer_state(tmp_cwd: Path) -> None:
    # It used to carry the initial model as θ_g, never moved by a round: a run resumed from it on
    # several replicas took that for its outer parameters.
    run_metrics(compose_cfg(["workers=1", "train.max_steps=50", "sync.mode=slowmo", f"run_dir={tmp_cwd / 'run'}"]),
                str(tmp_cwd / "run"))
    ckpt = checkpoint.load(tmp_cwd / "run" / "checkpoints" / "last.pt")
    assert "global_params" not in ckpt["sync_state"] and "momentum" not in ckpt["sync_state"], ckpt["sync_state"].keys()


def test_a_lone_replicas_workers_stamp_no_rows() -> None:
    # sync.row_sparse on one replica (+experiment=clicks run alone): the tables are still checked,
    # but there is no round to send rows in, so no stamps and no stamping on the workers' step.
    from hogwild.replica.build import build_replica

    cfg = compose_cfg(["+experiment=clicks", "data.kwargs.samples=2000", "data.kwargs.rows=1000"])
    assert build_replica(cfg, Plan.of(cfg, 1), torch.device("cpu"), syncs=False).marks is None
    marks = build_replica(cfg, Plan.of(cfg, 1), torch.device("cpu"), syncs=True).marks
    assert marks is not None and marks.rows == 4 * 1000
