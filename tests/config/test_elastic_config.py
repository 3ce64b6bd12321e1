"""The elastic.* group: the membership settings moved out of sync.*, the old sync.* spellings taken
with one warning each, and every check naming its elastic.<key>."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from hogwild.config import moved
from hogwild.errors import ConfigError
from tests.conftest import compose_cfg

ELASTIC = ["elastic.coordinator=node0:29400", "elastic.replicas=3", "elastic.slot=1"]
# (key, value as typed, value composed); each with the others of ELASTIC, so the checks pass.
MOVED = [("coordinator", "node1:29500", "node1:29500"), ("replicas", "4", 4), ("slot", "2", 2),
         ("peer_timeout_s", "3.5", 3.5), ("min_replicas", "2", 2)]


@pytest.mark.parametrize("key,text,value", MOVED, ids=[m[0] for m in MOVED])
def test_an_old_sync_key_is_taken_as_its_elastic_key_with_one_warning(tmp_cwd: Path, key: str, text: str,
                                                                       value: object,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    others = [o for o in ELASTIC if not o.startswith(f"elastic.{key}=")]
    moved._warned.clear()
    with caplog.at_level(logging.WARNING, logger="hogwild.config.moved"):
        cfg = compose_cfg([*others, f"sync.{key}={text}"])
        compose_cfg([*others, f"sync.{key}={text}"])  # a second compose in the same process: no second line
    assert getattr(cfg.elastic, key) == value
    assert not hasattr(cfg.sync, key)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"sync.{key} is deprecated: it moved to elastic.{key} "
                     "(the old key is taken until the next release)"]


def test_the_elastic_group_composes_and_the_sync_rules_keep_theirs(tmp_cwd: Path) -> None:
    cfg = compose_cfg([*ELASTIC, "elastic.peer_timeout_s=4", "elastic.min_replicas=2", "sync.timeout_s=60",
                       "sync.interval=20"])
    e = cfg.elastic
    assert (e.coordinator, e.replicas, e.slot, e.peer_timeout_s, e.min_replicas) == ("node0:29400", 3, 1, 4.0, 2)
    assert cfg.sync.timeout_s == 60.0 and cfg.sync.interval == 20
    plain = compose_cfg([])
    assert plain.elastic.coordinator is None and plain.elastic.replicas == 1 and plain.elastic.slot is None


BAD = [
    ("slot out of range", ["elastic.coordinator=node0:29400", "elastic.replicas=2", "elastic.slot=5"], "elastic.slot"),
    ("no slot", ["elastic.coordinator=node0:29400", "elastic.replicas=2"], "elastic.slot"),
    ("one slot", ["elastic.coordinator=node0:29400", "elastic.slot=0"], "elastic.replicas"),
    ("coordinator without port", ["elastic.coordinator=node0", "elastic.replicas=2", "elastic.slot=0"],
     "elastic.coordinator"),
    ("peer timeout of zero", [*ELASTIC, "elastic.peer_timeout_s=0"], "elastic.peer_timeout_s"),
    ("quorum above the slots", [*ELASTIC, "elastic.min_replicas=4"], "elastic.min_replicas"),
    ("quorum of zero", [*ELASTIC, "elastic.min_replicas=0"], "elastic.min_replicas"),
    # The old spelling's bad value names the key it is now.
    ("old key's slot out of range", ["sync.coordinator=node0:29400", "sync.replicas=2", "sync.slot=5"],
     "elastic.slot"),
]


@pytest.mark.parametrize("overrides,key", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_value_names_its_elastic_key(tmp_cwd: Path, overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: "):
        compose_cfg(overrides)


def test_without_a_coordinator_the_elastic_settings_are_not_checked(tmp_cwd: Path) -> None:
    """As before the move: a torchrun job ignores them, so a stray value is no error."""
    cfg = compose_cfg(["elastic.replicas=1", "elastic.slot=7"])
    assert cfg.elastic.coordinator is None and cfg.elastic.slot == 7


def test_a_checkpoint_written_before_the_move_still_reads(tmp_cwd: Path) -> None:
    """A checkpoint's config holds every key: one written before the move has sync.coordinator and the
    rest (and optim.min_wait and the rest of pace.*), which the schema no longer has; hogwild-evaluate
    and hogwild-export read them at their new places."""
    from omegaconf import OmegaConf

    from hogwild.checkpoint.portable import _merged_config
    from hogwild.config.compose import register_resolvers, to_config
    from hogwild.config.schema import Config

    register_resolvers()
    stored = OmegaConf.to_container(OmegaConf.structured(Config))
    assert isinstance(stored, dict)
    stored.pop("elastic")
    stored["sync"].update(coordinator=None, replicas=3, slot=1, peer_timeout_s=4.0, min_replicas=2)
    stored["optim"]["min_wait"] = 0.3
    stored["pace"].pop("min_wait")
    stored["run_dir"] = str(tmp_cwd / "run")
    cfg = to_config(_merged_config({"config": stored}, ["data.root=elsewhere"]))
    e = cfg.elastic
    assert (e.coordinator, e.replicas, e.slot, e.peer_timeout_s, e.min_replicas) == (None, 3, 1, 4.0, 2)
    assert cfg.pace.min_wait == 0.3 and cfg.data.root == "elsewhere"
