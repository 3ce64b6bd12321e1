"""The pacing part of the schema (``pace.*``): how long a barrier step waits for its last workers,
and how each worker cuts its batch so that its gradient comes with the others'.

Its own group, apart from ``optim``: the optimizer's keys are its keyword arguments (a torch
optimizer named by ``optim._target_`` is given them), and pacing is none of an optimizer's business.
Read by replica/pacing.py alone; each check raises :class:`ConfigError` naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hogwild.config.registry import PACERS
from hogwild.config.validate import require

# A step's wait for its late workers is bounded by this many times a gradient's compute time: more
# would let one stuck worker hold every step of its replica for longer than it takes to compute.
MAX_WAIT_BOUND = 10.0
# Beyond this a chunk of a typical batch is a few samples, and each chunk's kernels run below speed.
MAX_CHUNKS = 16


@dataclass
class PaceConfig:
    """Applies under ``optim.update=barrier`` with two workers or more (Hogwild workers wait for nobody)."""

    policy: str = "deadline"
    """deadline: once half of the live workers have brought fresh gradients, a step waits for the
    others a bound (pace.min_wait to pace.max_wait) times the compute time of the last of that half,
    the pivot; a later gradient joins the next step. backup: Chen et al. 2016's backup workers: a
    step closes as soon as all but the pace.backup slowest live workers have arrived, and waits for
    nobody past that (their gradients join the next step)."""
    min_wait: float = 0.5
    """deadline: the least a step waits for its last workers once half of them have brought fresh
    gradients, in the compute times of the last of that half (the pivot; with 2 workers, the first);
    a later gradient joins the next step. The step waits longer, up to pace.max_wait, when the
    recent gradients habitually came later: the median plus three median deviations of the last 16
    gradients' lags behind their step's pivot (two workers sharing a core with a busy process take
    turns at a third of a step behind and more), while a worker stopped now and then is an outlier
    among its lags and is not waited for past pace.min_wait. Chunks (pace.chunks) hand in once
    their rest would come later than this."""
    max_wait: float = 2.0
    """deadline: the most a step waits for its last workers, in the pivot's compute times (0: never
    wait; pace.min_wait=X pace.max_wait=X: always X)."""
    straggler_wait: float = 0.1
    """deadline: how long a step waits for a worker missing from the step before too (at most
    pace.max_wait): it still computes on older weights, so its gradient is stale whenever it comes."""
    balance: bool = True
    """Where a batch is not computed in chunks (pace.chunks=1), and under pace.chunks=auto once the
    median worker's batch takes 0.3 s: true: a worker whose whole batch takes
    more than 1.15 times the median worker's computes each batch in equal parts (at most four), one
    part a step, sized to its speed, so its gradients arrive with the others' and not one update
    late; a step's mean weighs each gradient by its samples (LB-BSP). Every sample is still trained
    on once (metrics.json: batch_parts). A worker's pace is the median of its last 5 gradients, so
    one that stalls now and then (stopped 1 s every 3 s) is not read as slow after each stall."""
    chunks: Any = "auto"
    """Compute each batch in this many equal chunks and hand in what is done once the step's pivot
    has arrived and the batch's rest would come after pace.min_wait: a worker slowed for a while (a
    core shared with a busy process, a quota) brings the samples it computed with the others'
    instead of a late gradient, and the rest of its batch is its next part, so every sample is still
    trained on once. No pace is estimated, so a slowness that moves between workers is followed at
    once. auto: 4 chunks of at least 8 samples once a whole batch takes over 20 ms; once the median
    worker's batch takes 0.3 s, a worker steadily slower than it (pace.balance's band) computes
    pace.balance's planned share instead (a quota's 100 ms periods then look like a steady rate, which
    a plan matches); whole batches for a model with batch-norm layers (their statistics are a
    batch's) or sparse tables. A number cuts every batch into that many chunks; 1: whole batches
    (pace.balance then cuts a slow worker's)."""
    backup: int = 1
    """backup: how many of the slowest live workers a step never waits for (at least one worker is
    always waited for)."""

    def __post_init__(self) -> None:
        PACERS.check(self.policy)
        for key, wait in (("min_wait", self.min_wait), ("max_wait", self.max_wait),
                          ("straggler_wait", self.straggler_wait)):
            require(0.0 <= wait <= MAX_WAIT_BOUND, f"pace.{key}",
                    f"must be in [0, {MAX_WAIT_BOUND:g}] (times a gradient's compute time), got {wait}")
        require(self.min_wait <= self.max_wait, "pace.min_wait",
                f"must not exceed pace.max_wait ({self.max_wait:g}), got {self.min_wait:g}")
        require(self.chunks == "auto" or (isinstance(self.chunks, int) and not isinstance(self.chunks, bool)
                                          and 1 <= self.chunks <= MAX_CHUNKS),
                "pace.chunks", f"must be 'auto' or a whole number from 1 to {MAX_CHUNKS}, got {self.chunks!r}")
        require(isinstance(self.backup, int) and not isinstance(self.backup, bool) and self.backup >= 1,
                "pace.backup", f"must be a whole number of at least 1, got {self.backup!r}")
