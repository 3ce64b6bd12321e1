"""What the benchmark scripts (``scripts/``) may use of hogwild besides the public API
(``hogwild.train``, the CLI): one surface, so a change inside a package that breaks a benchmark
shows up here and in ``tests/test_scripts.py`` instead of the next time someone runs it.
Nothing here is for users' code; the names may change with the benchmarks.
"""

from __future__ import annotations

from hogwild.checkpoint import store as checkpoint_store
from hogwild.config.schema import DataConfig, ModelConfig, SyncConfig
from hogwild.data.datasets import Dataset, ShardSampler, load_dataset, shard
from hogwild.data.splits import Split
from hogwild.elastic.coordinator import serve as serve_coordinator
from hogwild.elastic.membership import Epoch
from hogwild.replica.board import CONTROL, STATS, previous_attempt
from hogwild.replica.models import build_model
from hogwild.replica.resources import available_cores
from hogwild.replica.task import DEFAULT_LOSS, Task, evaluate
from hogwild.report.memory import process_tree, pss_bytes
from hogwild.sync.base import SyncRule
from hogwild.sync.comm import DistComm, LocalComm, ring_all_reduce_bytes
from hogwild.sync.outer import OuterRule
from hogwild.sync.rounds import sync_round
from hogwild.sync.rules import make_rule

__all__ = ["CONTROL", "DEFAULT_LOSS", "STATS", "DataConfig", "Dataset", "DistComm", "Epoch", "LocalComm", "ModelConfig",
           "OuterRule", "ShardSampler", "Split", "SyncConfig", "SyncRule", "Task", "available_cores",
           "build_model", "checkpoint_store", "evaluate", "load_dataset", "make_rule", "previous_attempt",
           "process_tree", "pss_bytes",
           "ring_all_reduce_bytes", "serve_coordinator", "shard", "sync_round"]
