"""Which group a leader meets the others through: the one place that knows both concrete
groups, so the conductor (core.py) depends on the Group interface alone."""

from __future__ import annotations

from typing import Optional, Sequence

from hogwild.config.defaults import resolved
from hogwild.config.env import DistEnv
from hogwild.config.schema import Config
from hogwild.leader.api import Control
from hogwild.leader.core import Leader
from hogwild.leader.torchrun import TorchrunGroup
from hogwild.replica import faults
from hogwild.report.summary import RunResult


def leader_for(cfg: Config, run_dir: str, env: Optional[DistEnv] = None,
               overrides: Optional[Sequence[str]] = None) -> Leader:
    """The leader ``cfg`` asks for: elastic with ``elastic.coordinator``, else a torchrun group.
    ``overrides``: the command line's, recorded in ``.hydra/overrides.yaml``."""
    faults.install()  # a test's fault plan, read from this process's environment (replica/faults.py)
    ctl = Control()
    cfg = resolved(cfg)  # a Config handed in whole (hogwild.train(config=...)): its sync defaults decided
    if cfg.elastic.coordinator:
        from hogwild.leader.elastic import ElasticGroup

        return Leader(cfg, run_dir, ElasticGroup(cfg, ctl, env), ctl, overrides)
    return Leader(cfg, run_dir, TorchrunGroup(env, lambda: ctl.signalled), ctl, overrides)


def run(cfg: Config, run_dir: str, env: Optional[DistEnv] = None) -> RunResult:
    return leader_for(cfg, run_dir, env).run()
