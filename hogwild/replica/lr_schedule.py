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
from hogwild.errors import PASSES, ConfigError, first_line, user_call


def projected_length(steps: int, spent: float, total: int) -> int:
    """The run's length in steps under a time budget: ``total`` (the planned steps), or, when the
    ``steps`` made so far in the ``spent`` fraction of the budget project fewer, that projection, so
    a schedule ends when the budget does. Before the first step or the first instant it is ``total``."""
    if steps < 1 or spent <= 0:
        return total
    return max(1, min(total, int(steps / min(spent, 1.0))))


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
            lr = self.lr_after_warmup(warm, total) * (step + 1) / warm
        else:
            lr = self.lr_after_warmup(step, total)
        # A schedule that turns optim.lr into NaN, a negative rate or, from a finite optim.lr, inf
        # (ExponentialLR with gamma=1e10) is refused at the step it does so, in the workers too:
        # check_schedule reads most runs whole before anything starts, this catches the rest (exit 2
        # rather than a model gone non-finite, exit 4). optim.lr=inf itself is the user's to try.
        if not lr >= 0 or (math.isinf(lr) and math.isfinite(self.base)):
            raise ConfigError(f"{self.key()}: the learning rate at step {step} of {total or self.total} is {lr} "
                              f"(optim.lr={self.base:g}); a schedule must keep it finite and not negative")
        return lr

    def lr_after_warmup(self, step: int, total: Optional[int] = None) -> float:
        c = self.cfg
        if self._torch is not None:
            return self._target_lr(step)  # a torch scheduler has its own length (T_max, total_steps)
        try:
            return SCHEDULES.get(c.name)(c, self.base, max(step - c.warmup_steps, 0),
                                         max((total or self.total) - c.warmup_steps, 1))
        except OverflowError:  # float ** int past any float (sched.gamma=1e10): a rate of inf
            return math.inf

    def unfinished_warmup(self, step: int, ends: str) -> Optional[str]:
        """What to warn of when ``ends`` (the key that stops the run) stops it at optimizer step
        ``step``, inside ``sched.warmup_steps``; None when the warm-up is over by then."""
        # A warm-up climbs to where the schedule after it begins, so a run shorter than its warm-up
        # ends at its highest rate, never decayed: what a short train.max_time does to a warm-up
        # copied from a longer recipe (as Hugging Face's cosine with warm-up does), silently.
        warm = self.cfg.warmup_steps
        if not warm or step >= warm:
            return None
        return (f"{ends} ends the run at optimizer step {step}, inside sched.warmup_steps={warm}, so the learning "
                f"rate climbs to {step / warm:.2f} of its peak and never decays; a warm-up of a fifth of the run "
                f"(sched.warmup_steps={max(1, step // 5)}) leaves the schedule room to anneal, and reaches "
                f"optim.lr={self.base:g} sooner (a rate tuned under the longer warm-up may be too high)")

    def key(self) -> str:
        """The keys that chose this schedule, as the user would write them."""
        c = self.cfg
        if c._target_:
            return f"sched._target_={c._target_}"
        shown = ", ".join(f"sched.{k}={getattr(c, k):g}" for k in BUILT_IN_KEYS.get(c.name, ()))
        return f"sched.name={c.name}" + (f" ({shown})" if shown else "")


# The built-in schedules after warm-up: (config, peak rate, steps since warm-up, steps it has).
# The keys each reads besides sched.name, named when it gives a rate that cannot be used.
BUILT_IN_KEYS = {"cosine": ("min_lr",), "step": ("gamma", "step_size")}


@SCHEDULES.register("constant")
def constant(c: SchedConfig, base: float, step: int, length: int) -> float:
    return base


@SCHEDULES.register("cosine")
def cosine(c: SchedConfig, base: float, step: int, length: int) -> float:
    return c.min_lr + (base - c.min_lr) * 0.5 * (1.0 + math.cos(math.pi * min(step / length, 1.0)))


@SCHEDULES.register("step")
def step_decay(c: SchedConfig, base: float, step: int, length: int) -> float:
    return base * c.gamma ** (step // c.step_size)


# A torch scheduler is read by stepping it (tens of microseconds a step on a loaded core): every
# step of a run up to this long is read before anything starts; a longer run's later steps are
# checked where a worker reaches them (LRSchedule.lr_at: exit 2 there).
CHECK_ALL_STEPS = 200_000
# A built-in schedule is a formula of the step, monotone or bounded between its ends: every step up
# to this many, then this many more spread evenly to the last, find where it leaves the floats.
CHECK_BUILT_IN = 10_000


def steps_to_check(cfg: SchedConfig, total_steps: Optional[int]) -> list[int]:
    """The steps :func:`check_schedule` reads, in increasing order (a torch scheduler only steps forward)."""
    if total_steps is None:
        return [0, 1, 2]
    if cfg._target_:
        return list(range(min(total_steps, CHECK_ALL_STEPS)))
    head = min(total_steps, CHECK_BUILT_IN)
    spread = {head + (total_steps - 1 - head) * i // CHECK_BUILT_IN for i in range(CHECK_BUILT_IN + 1)}
    return [*range(head), *sorted(s for s in spread if head <= s < total_steps)]


def check_schedule(cfg: SchedConfig, base_lr: float, total_steps: Optional[int] = None) -> None:
    """Build the schedule and read it where the run will, so a scheduler ``_target_`` that does
    not import, needs a metric (``ReduceLROnPlateau``), cannot run the planned steps
    (``OneCycleLR`` with a shorter ``total_steps``) or divides by zero (``T_max=0``), or a schedule
    whose rate becomes inf, NaN or negative at some step (``ExponentialLR`` with ``gamma=1e10``,
    ``sched.name=step`` with ``sched.gamma=1e10``), fails in the leader in one line naming the key,
    the step and the rate, before any worker spawns, instead of in every worker or as a model gone
    non-finite. Without ``total_steps`` (not known yet) only the first steps are read."""
    sched = LRSchedule(cfg, base_lr, total_steps or 100)
    for step in steps_to_check(cfg, total_steps):
        try:
            with user_call(f"{sched.key()}: the learning rate of step {step}", errors=False):
                sched.lr_at(step)  # a rate that cannot be used raises ConfigError there
        except PASSES:
            raise
        except BaseException as e:  # noqa: BLE001 - the user's scheduler failed: say where, in one line
            planned = f" of the planned {total_steps}" if total_steps else ""
            raise ConfigError(f"{sched.key()}: cannot give the learning rate of step {step}{planned} "
                              f"({type(e).__name__}: {first_line(e)}); hogwild steps a scheduler once per replica "
                              "step, with no metric") from None
