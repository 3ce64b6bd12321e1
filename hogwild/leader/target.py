"""``train.target``: the conductor's decision to end the job once rank 0's evaluation meets
it, and the model the job then hands back. Telemetry (report/) only evaluates when its budget
allows and reports the scores here; whether they end the run is decided here.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
from torch import Tensor, nn

from hogwild.config.train import TargetConfig
from hogwild.replica.shared import twin_on
from hogwild.replica.task import Task, reached

logger = logging.getLogger(__name__)


class Target:
    def __init__(self, cfg: TargetConfig, task: Task, model: nn.Module, flat: Optional[Tensor] = None) -> None:
        self.cfg, self.task, self.model = cfg, task, model
        self.flat = flat
        """The shared buffer ``model`` views: what a still copy copies."""
        self.reached_s: Optional[float] = None
        """Seconds of training when an evaluation first met the target."""
        self.worker_steps: Optional[float] = None
        """Steps one worker of this replica had made (mean) when the target was first seen. R
        machines make their steps at the same time, so a cluster's time to the target follows it."""
        self.judged: Optional[Tensor] = None
        """The model (a copy of the flat buffer) whose evaluation first met the target: what the
        run hands back if its final model does not meet it (leader/core.py, hand_back_judged)."""
        self._snap: Optional[Tensor] = None
        self._snap_model: Optional[nn.Module] = None

    @property
    def is_set(self) -> bool:
        return bool(self.cfg.is_set)

    @property
    def met(self) -> bool:
        return self.reached_s is not None

    def subject(self) -> nn.Module:
        """The model an evaluation during training reads. With a target, a still copy of the live
        model, so the model that meets it is a model that existed and can be handed back, not one
        blurred by the workers' writes during the evaluation. One more model's memory on the
        evaluating leader, only then."""
        if not self.is_set or self.flat is None or self.met:  # met: the judged copy is kept; nothing to judge
            return self.model
        if self._snap_model is None:
            snap = torch.empty_like(self.flat)
            try:
                twin = twin_on(self.model, snap)  # never a copy of the values first: tables are large
            except Exception as e:  # noqa: BLE001 - a user's module may hold what cannot be copied
                logger.warning("train.target: the model cannot be copied (%s: %s), so evaluations read the live "
                               "model and a final model below the target cannot be replaced", type(e).__name__, e)
                self.flat = None  # asked once
                return self.model
            self._snap, self._snap_model = snap, twin
        assert self._snap is not None
        self._snap.copy_(self.flat)
        return self._snap_model

    def saw(self, scores: dict[str, float], worker_steps: float, elapsed_s: float) -> None:
        """An evaluation of :meth:`subject` during training: the first that meets the target ends
        the job (at the next round) and keeps the copy it read."""
        if self.met or not reached(self.task, self.cfg, scores):
            return
        self.reached_s, self.worker_steps = elapsed_s, worker_steps
        # The still copy itself becomes the judged one (no clone: one model less at the peak); later
        # evaluations read the live model.
        self.judged, self._snap, self._snap_model = self._snap, None, None
        logger.info("test %s %.4f reached train.target.value=%.4f after %.2fs", self.cfg.metric,
                    scores[str(self.cfg.metric)], self.cfg.value, elapsed_s)

    def final_misses(self, final_scores: dict[str, float]) -> bool:
        """True when a target stopped the run, a judged copy exists, and the final model (its
        ``final_scores``) does not meet the target. The final round lands on the replicas' mean,
        which near a plateau can read a little lower than the replica that met the target."""
        return self.judged is not None and not reached(self.task, self.cfg, final_scores)

    def restore(self, final_scores: dict[str, float]) -> None:
        """The live buffer (workers stopped) takes the copy that met the target back: the final
        model (``final_scores``) read below it."""
        assert self.judged is not None and self.flat is not None
        logger.warning("the final model reads test %s %.4f, below train.target.value=%g that stopped the run: "
                       "handing back the model that met it", self.cfg.metric, final_scores[str(self.cfg.metric)],
                       self.cfg.value)
        self.flat.copy_(self.judged)

    def held(self, final_scores: dict[str, float]) -> Optional[bool]:
        """After the final evaluation: whether the model the run ends with meets the target that
        stopped it (None: no target stopped it). It holds by construction wherever the judged copy
        exists; without one (no buffer to copy) the final model may miss it."""
        if not self.met:
            return None
        held = reached(self.task, self.cfg, final_scores)
        if not held:
            logger.warning("train.target.value=%g stopped the run, but the final model reads test %s %.4f",
                           self.cfg.value, self.cfg.metric, final_scores[str(self.cfg.metric)])
        return held
