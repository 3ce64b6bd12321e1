"""Where an elastic slot writes its outputs: the ``run_dir`` it was given, or the job's.

The coordinator keeps the first replica's ``run_dir`` (elastic/keys.py). A slot started without
one adopts it: its own default is named after its start time (``outputs/<time>``), which no other
slot shares, and a restarted slot would find none of the job's checkpoints there. A slot given a
``run_dir`` of its own writes there: a machine without a shared filesystem passes a local path,
and writing to a path the user did not name (on another machine, or one that does not exist here)
would be a surprise. Either way one line says where the outputs go when the two differ.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Mapping, Optional

from hogwild.config.env import is_default_run_dir

logger = logging.getLogger(__name__)


def outputs_of(slot: int, mine: Path, job: str, env: Optional[Mapping[str, str]] = None) -> Path:
    """The folder slot ``slot`` writes to, given its own ``run_dir`` (``mine``) and the job's."""
    if _same(mine, job):
        return mine
    if is_default_run_dir(mine, env):
        logger.info("run_dir: none given; this slot's checkpoints, metrics.json and progress go to the job's "
                    "run_dir %s (its log stays in %s)", job, mine)
        return Path(job)
    # A warning, not an error: a local path per machine is legitimate, a typo on a shared one is not,
    # and only the user can tell them apart.
    logger.warning("run_dir: slot %d writes to %s, not to the job's run_dir %s: its log and progress, and the "
                   "checkpoints and metrics.json while it is the writer (the lowest live slot), go there, and a "
                   "resume reads from there (give every slot the same run_dir for one folder)", slot, mine, job)
    return mine


def _same(mine: Path, job: str) -> bool:
    # Both as absolute paths on this machine: the CLI hands an absolute one, the API may not.
    return os.path.abspath(mine) == os.path.abspath(job)
