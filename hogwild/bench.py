"""What the benchmark scripts (``scripts/``) may use of hogwild besides the public API
(``import hogwild``: ``train``, ``compose``, ``load_model``) and the command line, which they run
as processes (``python -m hogwild.cli.train ...``).

A script imports ``hogwild`` and ``hogwild.bench`` and no other module of the package
(``tests/test_scripts.py`` fails naming the file and the import otherwise). Each name below says
what a script may rely on; what stands behind it (the modules, the board's and the coordinator's
layouts, the checkpoint's keys) may change, and the name is kept working with it, so a change
inside hogwild breaks a test here instead of a benchmark the next time someone runs it. Nothing
here is for users' code; the names change with the benchmarks. Importing this module is cheap:
each name imports what it stands on when it is used.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

# The memory sampler lives with the leader's own (report/memory.py); importing it here stays cheap:
# that module needs the standard library only.
from hogwild.report.memory import PeakPss
# A swarm of elastic members without training (scripts/measures/coordinator_swarm.py); cheap likewise.
from hogwild.elastic.swarm import swarm_member, watch_members

if TYPE_CHECKING:
    from torch import Tensor, nn

    from hogwild.data.datasets import Dataset, ShardSampler

__all__ = ["Coordinator", "PeakPss", "available_cores", "build_model", "checkpoints", "digits", "evaluate",
           "budget_rate", "last_checkpoint", "read_board", "round_rules", "shard_sampler",
           "swarm_member", "sync_round", "sync_rule", "watch_members"]


# ------------------------------------------------------------------ data, models, evaluation
def available_cores() -> int:
    """The cores this process may use (its affinity, capped by a cgroup CPU quota, at least 1):
    the count hogwild sizes its workers' threads by."""
    from hogwild.replica.resources import available_cores as cores

    return cores()


def digits(image_size: int = 0, channels: int = 1, split_seed: int = 0) -> Dataset:
    """The digits data set as a job loads it for ``data.name=digits data.image_size=...
    data.channels=... data.split_seed=...``. Scripts may rely on ``.train`` and ``.test``, each
    with ``len()``, ``.batch(indices) -> ((inputs,), labels)``, ``.inputs[0]`` and ``.targets``."""
    from hogwild.config.schema import DataConfig
    from hogwild.data.datasets import load_dataset

    return load_dataset(DataConfig(name="digits", image_size=image_size, channels=channels, split_seed=split_seed))


def build_model(ds: Dataset, seed: int, *, name: str = "mlp", hidden: int = 128, target: Optional[str] = None,
                num_classes: int = 10) -> nn.Module:
    """The model a job builds on ``ds`` for ``model.name=NAME model.hidden=HIDDEN``, or for
    ``model._target_=TARGET +model.num_classes=N``, with the initial weights of ``train.seed=SEED``:
    a baseline built so starts where every replica of that job starts."""
    from hogwild.config.schema import ModelConfig
    from hogwild.replica.models import build_model as build

    cfg = ModelConfig(name=name, hidden=hidden, _target_=target, kwargs={"num_classes": num_classes} if target else {})
    return build(cfg, ds, seed)


def shard_sampler(n: int, batch_size: int, seed: int, shards: int = 0, index: int = 0) -> ShardSampler:
    """The batches worker ``index`` of a job of ``shards`` workers in all reads with ``train.seed=SEED``
    from a training split of ``n`` samples: its shard of them, reshuffled every epoch. ``shards=0``:
    every sample, in one shard (one process). Scripts may rely on ``.batch(step) -> indices`` (the
    step-th batch, epochs one after another) and ``.batches_per_epoch``."""
    import torch

    from hogwild.data.datasets import ShardSampler, shard

    if not shards:
        return ShardSampler(torch.arange(n), batch_size, seed)
    return ShardSampler(shard(n, shards, index, seed), batch_size, seed + index)


def evaluate(model: nn.Module, split: Any, task: str = "classification") -> dict[str, float]:
    """The metrics a job's evaluation reports of ``model`` on ``split`` (a data set's ``.train`` or
    ``.test``, or a pair ``(inputs, targets)`` of tensors), on the CPU, in ``eval()`` mode (the
    model is put back as it was), with the task's default loss: ``loss``, and ``accuracy`` for
    ``"classification"``, ``perplexity`` for ``"language_model"``."""
    import torch

    from hogwild.data.splits import Split
    from hogwild.replica.task import DEFAULT_LOSS, Task
    from hogwild.replica.task import evaluate as run

    if isinstance(split, tuple):
        split = Split((split[0],), split[1])
    return run(model, split, torch.device("cpu"), Task(task, DEFAULT_LOSS[task]))


def budget_rate(lr: float, warmup_steps: int, budget_s: float, name: str = "cosine") -> Callable[[int, float], float]:
    """hogwild's rate under ``train.max_time=BUDGET_S sched.name=NAME sched.warmup_steps=WARMUP_STEPS``,
    peak ``lr``, by optimizer step and seconds spent: the warm-up climbs over its steps, then the schedule
    runs over the steps the budget allows at the pace so far. A baseline on it anneals as hogwild does."""
    from hogwild.config.train import SchedConfig
    from hogwild.replica.lr_schedule import LRSchedule, projected_length

    endless = 2**62
    sched = LRSchedule(SchedConfig(name=name, warmup_steps=warmup_steps), lr, endless)
    return lambda step, spent: sched.lr_at(step, projected_length(step, spent / budget_s, endless))


# ---------------------------------------------------------------------------- sync rounds
def sync_rule(flat: Tensor, mode: str = "average", *, dtype: str = "fp32", lockstep: int = 0,
              outer_lr: Optional[float] = None, outer_momentum: Optional[float] = None) -> Any:
    """hogwild's rule for ``sync.mode=MODE sync.dtype=DTYPE`` (and ``sync.outer_lr``,
    ``sync.outer_momentum``), primed with ``flat`` as a leader primes it before training. Scripts
    may rely on passing it to :func:`sync_round`, and on nothing else of it.

    ``lockstep=0``: over ``torch.distributed``'s default group (the caller initialises it), one
    rank a replica, on ``flat``'s device. ``lockstep=R``: R replicas that one process trains in
    lockstep and feeds to each round as their mean: the rule runs on a one-rank group, and an
    outer momentum left unset takes the rule's default for R replicas, as an R-replica job's does.
    """
    import dataclasses

    from hogwild.config.schema import SyncConfig
    from hogwild.sync.comm import DistComm, LocalComm
    from hogwild.sync.outer import OuterRule
    from hogwild.sync.rules import make_rule

    cfg = SyncConfig(mode=mode, dtype=dtype, outer_lr=outer_lr, outer_momentum=outer_momentum)
    comm = LocalComm() if lockstep else DistComm(flat.device)
    rule = make_rule(cfg, comm)
    if lockstep and outer_momentum is None and isinstance(rule, OuterRule):
        rule = make_rule(dataclasses.replace(cfg, outer_momentum=rule.default_momentum(lockstep)), comm)
    rule.prime(flat)
    return rule


def sync_round(flat: Tensor, rule: Any, *, final: bool = False) -> None:
    """One round of ``rule`` (:func:`sync_rule`) on ``flat``, in place, as a leader makes it:
    ``flat`` then holds the rule's target (with ``lockstep``, the synced model made from the
    replicas' mean it held). ``final``: the job's last round, which lands on the replicas' mean
    (an outer rule does not step past it)."""
    from hogwild.sync.base import RoundFlags
    from hogwild.sync.rounds import sync_round as round_

    round_(flat, rule, RoundFlags(final=final))


def round_rules() -> dict[str, Any]:
    """What a script may know of rounds, as the code has it: ``ring_bytes(nbytes, world)`` (what a
    ring all_reduce sends per rank, which hogwild's own byte counts, ``sync_bytes_per_step``, follow,
    so a baseline's count compares with them); the paced interval's ``wall`` and ``cpu`` shares,
    ``floor`` and ``uneven`` fleet bound; the wire ladder's ``rungs`` ((dtype, fragments) by index)
    and ``fitting(rung, ask, floor, replicas)`` (scripts/models/scale_sim.py models them)."""
    from hogwild.config.sync import RUNGS
    from hogwild.sync import schedule
    from hogwild.sync.comm import ring_all_reduce_bytes
    from hogwild.sync.ladder import fitting

    return {"ring_bytes": ring_all_reduce_bytes, "wall": schedule.PACE_WALL, "cpu": schedule.PACE_CPU,
            "floor": schedule.PACE_FLOOR, "uneven": schedule.UNEVEN, "rungs": RUNGS, "fitting": fitting}


# ------------------------------------------------------------------- a run's own records
@dataclass(frozen=True)
class BoardReading:
    """A replica's progress as its board holds it (one value may be a step behind the workers)."""

    pos: float
    """The replica's data position: batches its workers have read through their shards, summed."""
    applied: float
    """Updates its workers have applied in this attempt, summed."""
    base_steps: float
    """The job's steps this attempt started from (restored from a checkpoint, or a peer's)."""


def read_board(run_dir: Union[str, Path], rank: int = 0) -> Optional[BoardReading]:
    """Replica ``rank``'s progress in the run at ``run_dir``, read from the board its leader and
    workers share (a file that outlives a ``kill -9``, so after one it tells the last attempt's);
    None where there is no board yet, or the file is not one. Safe while the run writes it."""
    import numpy as np

    from hogwild.replica.board import CONTROL, STATS

    path = Path(run_dir) / "progress" / f"rank{rank}.board"
    try:
        if path.is_symlink() or path.parent.is_symlink():  # not a board the run wrote
            return None
        data = np.fromfile(path, dtype=np.float64)
    except OSError:
        return None
    s, c = len(STATS.names), len(CONTROL.names)
    workers, rest = divmod(data.size - c, s)
    if rest or workers < 1:
        return None
    stats, control = data[:workers * s].view(STATS), data[workers * s:].view(CONTROL)[0]
    return BoardReading(float(stats["pos"].sum()), float(stats["applied"].sum()), float(control["base_steps"]))


@dataclass(frozen=True)
class CheckpointReading:
    """One checkpoint file of a run, as its counters describe it."""

    path: Path
    sequence: int
    """Its place in the order the run's checkpoints were written (it only grows)."""
    written_at: float
    """``time.time()`` when it was written."""
    steps: int
    """The job's steps (updates applied) it holds."""
    syncs: int
    """The rounds made before it."""
    positions: Optional[Tensor]
    """Data positions (batches read), replicas x workers: where a resume from it starts reading."""


def _reading(path: Path) -> CheckpointReading:
    from hogwild.checkpoint import store

    c = store.load(path)
    pos = c.get("positions")
    return CheckpointReading(path, int(c.get("seq", -1)), float(c["written_at"]), int(c["counters"]["steps"]),
                             int(c["counters"]["syncs"]), pos.clone() if pos is not None else None)


def checkpoints(run_dir: Union[str, Path]) -> list[CheckpointReading]:
    """Every step checkpoint the run at ``run_dir`` has on disk, read, the earliest written first
    (``last.pt``, which names one of them, is not listed twice)."""
    from hogwild.checkpoint import store

    return sorted((_reading(p) for p in store.candidates(run_dir)), key=lambda c: c.written_at)


def last_checkpoint(run_dir: Union[str, Path]) -> Optional[CheckpointReading]:
    """``last.pt`` of the run at ``run_dir`` (what ``hogwild-eval checkpoint=...`` and a resume
    take), read; None where the run has written none. Its ``path`` is ``last.pt`` itself."""
    from hogwild.checkpoint import store

    last = store.ckpt_dir(run_dir) / "last.pt"
    return _reading(last) if last.is_file() else None


# ------------------------------------------------------------------------ elastic jobs
class Coordinator:
    """What an elastic job (``elastic.coordinator=HOST:PORT``) keeps at its coordinator, read by a
    client of the script's own: it connects when first asked, and again after the coordinator
    went away (killed, restarted). Scripts may rely on :meth:`serve`, :meth:`whole` and
    :meth:`position`."""

    @staticmethod
    def serve(port: int, host: str = "127.0.0.1") -> threading.Event:
        """A coordinator for elastic jobs (what ``hogwild-coordinator`` serves) on a daemon thread of
        this process, listening when this returns; set the returned event to stop it."""
        from hogwild.elastic.coordinator import serve

        ready, stop = threading.Event(), threading.Event()
        threading.Thread(target=serve, args=(host, port, ready, stop), daemon=True).start()
        ready.wait(30)
        return stop

    def __init__(self, port: int, host: str = "127.0.0.1", timeout_s: float = 3.0) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self._store: Any = None

    def _client(self) -> Any:
        import torch.distributed as dist

        if self._store is None:
            self._store = dist.TCPStore(self.host, self.port, is_master=False,
                                        timeout=timedelta(seconds=self.timeout_s))
        return self._store

    def whole(self, slots: int) -> bool:
        """Every slot of ``range(slots)`` a member of the newest epoch, and none asking to join;
        False too where the coordinator cannot be reached now."""
        import torch.distributed as dist

        from hogwild.elastic.membership import Epoch

        try:
            store = self._client()
            number = int(store.add("epoch", 0))
            if number < 1 or not store.check([f"members/{number}"]):
                return False
            ep = Epoch.decode(number, store.get(f"members/{number}").decode(), slots)
            return ep.members == tuple(range(slots)) and not any(store.check([f"want/{s}"]) for s in range(slots))
        except (RuntimeError, ValueError, dist.DistError):
            self._store = None  # restarted, or away: connect again next time
            return False

    def position(self, slot: int) -> Optional[float]:
        """``slot``'s data position (batches its workers read, summed) at its last round, as the
        coordinator holds it; None where it has published none. Raises where it cannot be reached."""
        import numpy as np

        store = self._client()
        key = f"pos/{slot}"
        return float(np.frombuffer(store.get(key), dtype=np.float64).sum()) if store.check([key]) else None
