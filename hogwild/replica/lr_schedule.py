"""Learning-rate schedules (``sched.*``) as a function of the replica's step.

Every worker of a replica reads the replica's step (the sum of its workers' data positions,
which a resumed run restores) before each update and sets its learning rate from it, so all
workers of a replica use one learning rate at one step, however many there are, and a resumed
run continues its schedule where it stopped. The leader evaluates the same function for
TensorBoard's ``train/lr``.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from hogwild.config.registry import SCHEDULES
from hogwild.config.targets import call_target, import_target, schema_kwargs
from hogwild.config.train import SchedConfig
from hogwild.errors import ConfigError, first_line


class LRSchedule:
    def __init__(self, cfg: SchedConfig, base_lr: float, total_steps: int) -> None:
        self.cfg, self.base, self.total = cfg, base_lr, max(int(total_steps), 1)
        self._torch: Optional[Any] = None
        self._opt: Optional[torch.optim.Optimizer] = None
        self._at = 0
        if cfg._target_:
            self._build_target()

    def _build_target(self) -> None:
        """A torch scheduler drives a one-parameter optimizer that never steps; its learning rate
        at step s is read after s calls of ``step()`` (schedulers are defined by their steps)."""
        path = str(self.cfg._target_)
        fn = import_target(path, "sched._target_")
        self._opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=self.base)
        kwargs = {**schema_kwargs(self.cfg, fn, path, "sched", handled=("warmup_steps",)), **self.cfg.kwargs}
        sched = call_target(lambda **kw: fn(self._opt, **kw), path, "sched", kwargs, kwargs)
        if not hasattr(sched, "step"):
            raise ConfigError(f"sched._target_: {path} returned a {type(sched).__name__}, not an lr scheduler")
        self._torch = sched

    def _target_lr(self, step: int) -> float:
        assert self._opt is not None and self._torch is not None
        while self._at < step:
            self._opt.step()  # no gradient: a no-op that keeps torch's order-of-calls warning quiet
            self._torch.step()
            self._at += 1
        return float(self._opt.param_groups[0]["lr"])

    def lr_at(self, step: int, total: Optional[int] = None) -> float:
        """The learning rate of the update made at replica step ``step`` (0-based); ``total``: the
        run's length in steps when it is not the planned one (a time budget's estimate)."""
        c = self.cfg
        warm = c.warmup_steps
        if warm and step < warm:
            # Linear warm-up to the schedule's value where warm-up ends.
            return self.lr_after_warmup(warm, total) * (step + 1) / warm
        return self.lr_after_warmup(step, total)

    def lr_after_warmup(self, step: int, total: Optional[int] = None) -> float:
        c = self.cfg
        if self._torch is not None:
            return self._target_lr(step)  # a torch scheduler has its own length (T_max, total_steps)
        return SCHEDULES.get(c.name)(c, self.base, max(step - c.warmup_steps, 0),
                                     max((total or self.total) - c.warmup_steps, 1))


# The built-in schedules after warm-up: (config, peak rate, steps since warm-up, steps it has).
@SCHEDULES.register("constant")
def constant(c: SchedConfig, base: float, step: int, length: int) -> float:
    return base


@SCHEDULES.register("cosine")
def cosine(c: SchedConfig, base: float, step: int, length: int) -> float:
    return c.min_lr + (base - c.min_lr) * 0.5 * (1.0 + math.cos(math.pi * min(step / length, 1.0)))


@SCHEDULES.register("step")
def step_decay(c: SchedConfig, base: float, step: int, length: int) -> float:
    return base * c.gamma ** (step // c.step_size)


# Stepping a torch scheduler through the whole run to check it costs about a microsecond a step;
# past this many steps only the first ones are read.
CHECK_ALL_STEPS = 200_000


def check_schedule(cfg: SchedConfig, base_lr: float, total_steps: Optional[int] = None) -> None:
    """Build the schedule and read it where the run will, so a scheduler ``_target_`` that does
    not import, needs a metric (``ReduceLROnPlateau``), cannot run the planned steps
    (``OneCycleLR`` with a shorter ``total_steps``) or divides by zero (``T_max=0``) fails in the
    leader in one line, before any worker spawns, instead of in every worker. Without
    ``total_steps`` (not known yet) only the first steps are read."""
    sched = LRSchedule(cfg, base_lr, total_steps or 100)
    last = [total_steps - 1] if total_steps is not None and total_steps <= CHECK_ALL_STEPS else []
    for step in sorted({0, 1, 2, *last}):
        try:
            lr = sched.lr_at(step)
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's scheduler failed: say where, in one line
            planned = f" of the planned {total_steps}" if total_steps else ""
            raise ConfigError(f"sched._target_: {cfg._target_} cannot give the learning rate of step {step}{planned} "
                              f"({type(e).__name__}: {first_line(e)}); hogwild steps a scheduler once per replica "
                              "step, with no metric") from None
        # Not a finiteness check: optim.lr=inf is the user's to try, and the run's divergence
        # checks handle it (exit 4); a schedule that turns a fine rate into NaN or a negative is not.
        if math.isnan(lr) or lr < 0:
            raise ConfigError(f"sched: the learning rate at step {step} is {lr}")
