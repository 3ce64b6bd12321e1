"""``optim.update=barrier``: the workers' gradients meet in shared memory, and one optimizer state
per replica steps on their mean, as DDP's optimizer steps on its all-reduced mean.

Why: an adaptive optimizer's step on a stale gradient costs far more than SGD's (docs/design.md,
rule 20): one AdamW fed gradients one update old lost 0.78 in test loss on the GPT, and Hogwild
workers' gradients are about one update old. Here every gradient of a step is computed on the
weights that step moves, as DDP's are, and no worker waits long for a late one (Chen et al. 2016's
backup workers): when a step closes, and how each worker cuts its batch so that its gradient comes
with the others', is the pacer's to say (replica/pacing.py, ``pace.*``); a gradient later than the
step it was computed for joins the next. A step's mean weighs each gradient by its samples. No
allreduce and no copy of the model per worker: the gradients meet where they are.

What lives in shared memory, and who writes what (every cell has one writer at a time, as on
the board, so no lock is shared and a process killed at any moment holds nothing):

- ``rows``: one gradient buffer per worker, the dense parameters packed one after another. A
  worker's backward writes straight into its row (its ``.grad`` are views of it).
- ``cells``: one record per worker. The worker writes where it is: the step it arrived for,
  whether its gradient is finite, the step of the weights it read, what it took, and the last step
  whose shard it applied. The chair writes which step it is a member of; the chair also clears
  a dead worker's record.
- ``head``: the chair's: the open step and the last closed step's numbers; "applied" also by
  the member that finishes a step last (one value, whoever writes it).

The chair is a thread of the leader. It closes the open step (fixes its members) when every live
worker has arrived or the bound has passed (it runs from the median worker's fresh gradient); the
step is applied once every member has applied its
shard, which the member that finishes last marks (every member that sees it writes the same value,
and so may the chair). Each member then steps its share of the parameters (an equal slice of the dense values
under the flat rules; whole parameters under a torch optimizer, whose rules may span a parameter,
as Adafactor's factored moments do): the mean of the members' gradients, the optimizer's step,
in parallel. A worker reads the weights only when no step is being applied, so a step's
gradients are all computed on the weights it moves. A replica of one worker needs no chair: it
closes and applies its own steps.

The optimizer state lives in the replica's shared ``opt_state`` (checkpointed, restored, and
sent to a healed peer like any shared state), and with it ``barrier:steps``, the replica's
optimizer steps, which the learning-rate schedule and Adam's bias correction count.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from hogwild.replica.pacing import Pacer
from hogwild.replica.shared import Slot

logger = logging.getLogger(__name__)

STEPS_KEY = "barrier:steps"
"""The replica's optimizer steps, in ``opt_state`` (float64: exact far beyond any run)."""

HEAD = np.dtype([(name, np.float64) for name in (
    "open",     # the step that gradients arrive for (steps closed so far)
    "applied",  # steps whose every shard is applied; the weights are whole when applied == open
    "count",    # finite gradients in the last closed step
    "t",        # the replica's optimizer step number of the last closed step (from barrier:steps)
    "closed_late",  # gradients that joined a step after the one they were computed for
)])
CELLS = np.dtype([(name, np.float64) for name in (
    "arrived",    # worker: the step its gradient waits for (-1: none)
    "finite",     # worker: 1 if that gradient is finite (0: it arrived to say so and brings nothing)
    "read",       # worker: the step whose weights it computed that gradient on
    "compute_s",  # worker: seconds that gradient took
    "at",         # worker: time.monotonic() when it arrived
    "done",       # worker: the last step whose shard it applied
    "member_of",  # chair: the last step closed with this worker in it
    "live",       # worker: 1 once its loop runs, 0 when it finished; chair: 0 when it died
    "samples",    # worker: the samples that gradient was computed on (a step's mean weighs by them)
    "pace",       # worker: seconds a whole batch takes it (its recent median; 0: not measured yet)
    "began",      # worker: time.monotonic() when it read the weights for its gradient
    "tick",       # worker: time.monotonic() when it last finished a chunk (or began)
    "chunk_s",    # worker: seconds its recent chunks took while it ran (their least; 0: whole batches)
    "applies",    # chair: 1 if this member steps a shard of the step it is a member of (0: excused)
)])
# Between two looks at the stop flag and the leader, a waiting worker or an idle chair sleeps at most
# this long; a kick or a notice ends the sleep at once.
POLL_S = 0.05
# How long a waiting worker looks before it sleeps (wait_until).
SPIN_S = 0.0005
@dataclass(frozen=True)
class Piece:
    """A run of one dense parameter's values: its slot in the flat buffer, where the run starts in
    the slot and in a row, and how long it is."""

    slot: int
    """Index among the parameters."""
    start: int
    row_offset: int
    numel: int


def balanced(sizes: list[int], parts: int) -> list[list[int]]:
    """``sizes``' indices in ``parts`` groups of near-equal totals (largest first into the lightest
    group, ties by index: the same in every process), each group in index order."""
    groups: list[list[int]] = [[] for _ in range(parts)]
    load = [0] * parts
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        g = min(range(parts), key=lambda g: (load[g], g))
        groups[g].append(i)
        load[g] += sizes[i]
    return [sorted(g) for g in groups]


class Meeting:
    """The shared half: rows, cells and head, and how the dense parameters are cut into shards.
    Built by the leader before any worker starts; workers receive it pickled (its tensors shared)."""

    def __init__(self, workers: int, slots: list[Slot], sparse: list[bool], device: str,
                 alloc: Callable[[int, str], Tensor], trainable: Optional[list[bool]] = None) -> None:
        """``sparse``: each parameter's gradient is sparse; ``trainable``: it has one at all (a
        frozen parameter is never stepped, as DDP never steps one)."""
        self.workers = workers
        self.slots = slots
        trainable = trainable or [True] * len(sparse)
        self.dense = [i for i, (s, t) in enumerate(zip(sparse, trainable)) if t and not s]
        """The parameters whose gradients meet here."""
        self.tables = [i for i, (s, t) in enumerate(zip(sparse, trainable)) if t and s]
        """The sparse tables: each worker writes their rows directly, as under Hogwild."""
        offsets, at = {}, 0
        for i in self.dense:
            offsets[i] = at
            at += slots[i].numel
        self.offsets = offsets
        self.numel = at
        self.rows = alloc(workers * max(at, 1), device).view(workers, max(at, 1))
        self.block = torch.zeros(len(HEAD) + workers * len(CELLS), dtype=torch.float64).share_memory_()
        cells = self.cells
        cells["arrived"], cells["read"], cells["done"], cells["member_of"] = -1, -1, -1, -1

    @property
    def head(self) -> np.void:
        return self.block[:len(HEAD)].numpy().view(HEAD)[0]

    @property
    def cells(self) -> np.ndarray:
        return self.block[len(HEAD):].numpy().view(CELLS).reshape(-1)

    def row_views(self, worker: int) -> dict[int, Tensor]:
        """Worker ``worker``'s row as its dense parameters' shapes, by parameter index."""
        row = self.rows[worker]
        return {i: row[o:o + self.slots[i].numel].view(self.slots[i].shape) for i, o in self.offsets.items()}

    def value_shard(self, rank: int, parts: int) -> list[Piece]:
        """An equal slice of the dense values (flat rules: every element steps on its own)."""
        lo, hi = self.numel * rank // parts, self.numel * (rank + 1) // parts
        pieces = []
        for i, o in self.offsets.items():
            n = self.slots[i].numel
            a, b = max(lo, o), min(hi, o + n)
            if a < b:
                pieces.append(Piece(i, a - o, a, b - a))
        return pieces

    def param_shard(self, rank: int, parts: int) -> list[Piece]:
        """Whole dense parameters of near-equal total size (torch optimizers step whole parameters)."""
        group = balanced([self.slots[i].numel for i in self.dense], parts)[rank]
        return [Piece(self.dense[g], 0, self.offsets[self.dense[g]], self.slots[self.dense[g]].numel) for g in group]

    def members(self, step: int) -> list[int]:
        return [int(j) for j in np.flatnonzero(self.cells["member_of"] == step)]

    def appliers(self, step: int) -> list[int]:
        """The members of ``step`` that step a shard of it (the chair excuses a slow one: pacing.py)."""
        cells = self.cells
        return [int(j) for j in np.flatnonzero((cells["member_of"] == step) & (cells["applies"] > 0))]

    def all_done(self, step: int) -> bool:
        """Whether every member of ``step`` that steps a shard has applied it (a dead one is excused: forget)."""
        cells = self.cells
        return bool((cells["done"][(cells["member_of"] == step) & (cells["applies"] > 0)] >= step).all())

    def mark_applied(self, step: int) -> bool:
        """If every member of ``step`` has applied its shard, say so in the head (the weights are
        whole again); whoever sees it, the chair or the last member, writes the same value."""
        if not self.all_done(step):
            return False
        head = self.head
        head["applied"] = max(head["applied"], step + 1)
        return True

    def finish(self, worker: int, step: int) -> None:
        """``worker`` has applied its shard of ``step``; the last member to do so marks the step
        applied, so the weights are whole again without waiting for the chair's next look."""
        self.cells[worker]["done"] = step
        self.mark_applied(step)

    def forget(self, worker: int) -> None:
        """A dead worker's record: not live, arrived nowhere, no pace, and a step it was in no longer waits
        for its shard (that shard skips the step). Only the chair calls it (or the pool, alone)."""
        c = self.cells[worker]
        c["live"], c["arrived"], c["pace"] = 0.0, -1.0, 0.0  # its successor's pace is its own
        c["done"] = max(c["done"], c["member_of"])

    def forget_alone(self) -> None:
        """The one worker of a replica died, perhaps inside a step it closed itself: that step is over."""
        self.forget(0)
        head = self.head
        head["applied"] = head["open"]


class Chair:
    """The leader's thread that closes steps and marks them applied (the module's text)."""

    def __init__(self, meeting: Meeting, pacer: Pacer, steps: Tensor, kick: Callable[[], None],
                 notices: Connection, tell: Connection) -> None:
        """``pacer``: when a step stops waiting for its last workers (replica/pacing.py);
        ``notices``: where workers say they arrived or finished a shard; ``tell``: its other end,
        for the leader's own notices (a worker died)."""
        self.m, self.pacer, self.steps, self.kick = meeting, pacer, steps, kick
        self._notices, self._tell = notices, tell
        self._gone: "queue.Queue[tuple[int, threading.Event]]" = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hogwild-chair", daemon=True)
        self._applied = int(meeting.head["applied"])
        self.cpu_s = 0.0
        """The chair thread's CPU seconds so far (metrics.json's time_s.leader.chair_cpu)."""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def gone(self, worker: int) -> None:
        """Worker ``worker`` died (the pool respawns it next): returns once the chair has cleared
        its record, so its successor never finds a step waiting for it."""
        if not self._thread.is_alive():
            self.m.forget(worker)
            return
        done = threading.Event()
        self._gone.put((worker, done))
        try:
            self._tell.send_bytes(b"g")
        except OSError:
            pass
        done.wait(2.0)

    def _run(self) -> None:
        wait = POLL_S
        while not self._stop.is_set():
            try:
                if self._notices.poll(wait):
                    while self._notices.poll():
                        self._notices.recv_bytes()
            except (EOFError, OSError):
                return
            while not self._gone.empty():
                worker, done = self._gone.get()
                self.m.forget(worker)
                self.pacer.forget(worker)
                done.set()
            wait = self.tick(time.monotonic())
            self.cpu_s = time.thread_time()  # this thread's own: the chair's cost to its leader's core

    def tick(self, now: float) -> float:
        """Close or finish what can be; the seconds until the bound of the open step (or a poll)."""
        m, head, cells = self.m, self.m.head, self.m.cells
        k = int(head["open"])
        if head["applied"] < k and not m.mark_applied(k - 1):
            return POLL_S
        if head["applied"] > self._applied:  # set here, or by the member that finished last
            self._applied = int(head["applied"])
            self.kick()
        arrived = np.flatnonzero(cells["arrived"] == k)
        if len(arrived) == 0:
            return POLL_S
        live = np.flatnonzero(cells["live"] > 0)
        if set(live.tolist()) <= set(arrived.tolist()):
            self._close(k, arrived, live)
            return POLL_S
        at = self.pacer.close_at(k, arrived.tolist(), live.tolist(), cells)
        if at is None:
            return POLL_S
        if now >= at:
            self._close(k, arrived, live)
            return POLL_S
        return max(0.0, min(POLL_S, at - now))

    def _close(self, k: int, members: np.ndarray, live: np.ndarray) -> None:
        head, cells = self.m.head, self.m.cells
        self.pacer.closed(k, members.tolist(), live.tolist(), cells)
        count = int((cells["finite"][members] > 0).sum())
        head["count"] = count
        head["t"] = float(self.steps[0])
        head["closed_late"] += int((cells["read"][members] < k).sum())
        if count:
            self.steps += 1
        appliers = set(self.pacer.appliers(members.tolist(), cells))
        for j in members:
            cells[j]["applies"] = float(int(j) in appliers)
            cells[j]["member_of"] = k
        head["open"] = k + 1  # last: a worker that sees the step closed finds its members written
        self.kick()


def wait_until(cond: Callable[[], bool], stopping: Callable[[], bool], kick: Optional[Connection],
               spin_s: float = SPIN_S) -> bool:
    """Until ``cond()``; False if ``stopping()`` turned true first. It looks for ``spin_s`` first
    (the other members of a step finish within a few hundred microseconds of each other, and a
    sleeping process takes as long again to be woken), then blocks: a kick only says "look again";
    between kicks a look every :data:`POLL_S`."""
    spin_until = time.perf_counter() + spin_s
    while not cond() and time.perf_counter() < spin_until:
        pass
    while not cond():
        if stopping():
            return False
        if kick is None:
            time.sleep(POLL_S / 50)
            continue
        try:
            if kick.poll(POLL_S):
                while kick.poll():
                    kick.recv_bytes()
        except EOFError:
            return cond()  # its writer, the leader, is gone
    return True


def mean_into(rows: Tensor, mine: int, contributors: list[int], pieces: list[Piece],
              samples: Optional[Sequence[float]] = None) -> bool:
    """Row ``mine`` over ``pieces`` := the mean of the ``contributors``' rows there (only this worker
    reads or writes those values of its own row now), each row weighed by its ``samples`` where
    they differ: every row is a mean over its own batch, so the step's is the mean over all their
    samples, as one batch. Whether the mean is finite."""
    weights = None
    if samples is not None and len(set(samples)) > 1 and min(samples) > 0:
        total = float(sum(samples))
        weights = {j: n / total for j, n in zip(contributors, samples)}
    scale = 1.0 / len(contributors)
    finite = []
    for piece in pieces:
        a, b = piece.row_offset, piece.row_offset + piece.numel
        out = rows[mine, a:b]
        others = [j for j in contributors if j != mine]
        if mine not in contributors:
            out.copy_(rows[others[0], a:b])
            first, others = others[0], others[1:]
        else:
            first = mine
        if weights is not None:
            out.mul_(weights[first])
            for j in others:
                out.add_(rows[j, a:b], alpha=weights[j])
        else:
            for j in others:
                out.add_(rows[j, a:b])
            if len(contributors) > 1:
                out.mul_(scale)
        finite.append(torch.isfinite(out).all())
    # One read of the verdicts: on a GPU each would wait for the stream.
    return bool(torch.stack(finite).all()) if finite else True
