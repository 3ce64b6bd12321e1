"""How one replica trains, decided once from its config and its worker count.

The leader builds the :class:`Plan` as soon as it knows how many workers it runs
(``Leader._setup``), and hands it to everything that acts on these choices: the memory check,
the replica's shared state, the elastic job's identity, the workers (in their spec), the
telemetry. None of them decides them again, so a leader and its workers, or the learning-rate
schedule the workers step and the one the leader logs, cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hogwild.config.defaults import BARRIER, resolved

if TYPE_CHECKING:
    from hogwild.config.schema import Config

# Evaluations during training land on a grid of this many points over the run (and no sooner
# than eval.every_s apart, within eval.max_fraction of the time: report/telemetry.py).
EVAL_POINTS = 30


@dataclass(frozen=True)
class Plan:
    update: str
    """``optim.update`` resolved: ``hogwild`` (each worker steps the shared weights) or ``barrier``
    (the workers' gradients meet and one state steps on their mean)."""
    shared_state: bool
    """The optimizer state lives once per replica in shared memory: always on the barrier, and
    under hogwild with ``optim.state=shared``; else each worker keeps its own."""
    batches_per_step: int
    """Batches one optimizer step of the replica takes: a worker's ``train.accumulate``, and under
    the barrier every worker's."""
    workers: int

    @classmethod
    def of(cls, cfg: Config, workers: int) -> Plan:
        update = resolved(cfg).optim.update  # a no-op on a composed config: the path was decided there
        barrier = update == BARRIER
        return cls(update=update, shared_state=barrier or cfg.optim.state == "shared",
                   batches_per_step=cfg.train.accumulate * (workers if barrier else 1), workers=workers)

    @property
    def barrier(self) -> bool:
        return self.update == BARRIER

    def schedule_steps(self, batches: int) -> int:
        """The learning-rate schedule's length: the optimizer steps in the ``batches`` all of a
        replica's workers read (a last partial step counts)."""
        return -(-int(batches) // self.batches_per_step)

    def eval_every(self, batches: float) -> float:
        """Batches between evaluations during training, over a run of ``batches`` still to read."""
        return max(1.0, batches / EVAL_POINTS)
