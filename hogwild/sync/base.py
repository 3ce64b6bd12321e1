"""What every cross-replica sync rule shares: the round's control vector, the agreed
context, the :class:`SyncRule` base class and the registry that ``sync.mode`` picks from.

A rule only computes the *target* parameters of this replica from a snapshot, using
collectives among the leaders. The leader then moves the live buffer by
``target - snapshot`` in place, so updates that workers applied while the collective ran
survive (design rule 2 in docs/design.md). A rule never touches the live buffer itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
from torch import Tensor

from hogwild.config.registry import SYNC_RULES
from hogwild.config.schema import SyncConfig
from hogwild.replica.board import Board
from hogwild.sync.comm import SYNC_ROUND, Comm, LinkMeter, Metered
from hogwild.sync.wire import make_wire


@dataclass(frozen=True)
class RoundFlags:
    """What a replica brings to a round. Reduced (:meth:`RoundVector.agreed`), ``done`` means every
    replica is done and the others that some replica said so."""

    done: bool = False
    """Its workers finished."""
    stop: bool = False
    """It is stopping (a signal, a fault)."""
    checkpoint: bool = False
    """Its checkpoint is due."""
    reached: bool = False
    """Its target was met or its time budget spent: the whole job ends after this round."""
    reform: bool = False
    """Elastic mode: it saw a joiner or a newer epoch; all re-form after this round."""
    final: bool = False
    """Its workers stopped: it lands exactly on the consensus. Not sent: every leader is in the final round."""


class RoundVector:
    """Layout of the control vector every round all-reduces (SUM): the five sent flags of
    :class:`RoundFlags`, then per rank a "my snapshot is finite" slot, the drift it measured in
    the previous round, the weight of its contribution (0 when unhealthy), the intervals its
    previous round's time and its leader's CPU ask for (a paced schedule; 0: none), and its speed
    in steps a second of its workers' time since its last round (0: none measured)."""

    NUM_FLAGS = 5
    PER_RANK = 6

    @staticmethod
    def new(flags: RoundFlags, world: int, like: Tensor) -> Tensor:
        """The vector of a round on ``world`` ranks, holding ``flags``; every per-rank slot 0."""
        head = [flags.done, flags.stop, flags.checkpoint, flags.reached, flags.reform]
        return torch.tensor([*head, *[0.0] * RoundVector.PER_RANK * world], dtype=like.dtype, device=like.device)

    @staticmethod
    def agreed(ctl: Tensor) -> RoundFlags:
        """The flags of a reduced vector."""
        done, stop, checkpoint, reached, reform = ctl[:RoundVector.NUM_FLAGS].tolist()
        return RoundFlags(done >= RoundVector.world(ctl), stop > 0, checkpoint > 0, reached > 0, reform > 0)

    @staticmethod
    def healthy_slot(rank: int) -> int:
        return RoundVector.NUM_FLAGS + rank

    @staticmethod
    def drift_slot(world: int, rank: int) -> int:
        return RoundVector.NUM_FLAGS + world + rank

    @staticmethod
    def weight_slot(world: int, rank: int) -> int:
        return RoundVector.NUM_FLAGS + 2 * world + rank

    @staticmethod
    def pace_slot(world: int, rank: int) -> int:
        """The interval the round's time asks for; the CPU's ask follows the world's slots."""
        return RoundVector.NUM_FLAGS + 3 * world + rank

    @staticmethod
    def cpu_pace_slot(world: int, rank: int) -> int:
        return RoundVector.NUM_FLAGS + 4 * world + rank

    @staticmethod
    def speed_slot(world: int, rank: int) -> int:
        return RoundVector.NUM_FLAGS + 5 * world + rank

    @staticmethod
    def world(ctl: Tensor) -> int:
        return (ctl.numel() - RoundVector.NUM_FLAGS) // RoundVector.PER_RANK

    @staticmethod
    def ends_job(ctl: Tensor) -> bool:
        """The reduced flags end the job after this round: every replica done, a stop, or the
        target accuracy reached (the leaders' loop leaves on exactly these)."""
        agreed = RoundVector.agreed(ctl)
        return agreed.done or agreed.stop or agreed.reached


@dataclass(frozen=True)
class SyncContext:
    """What every leader agreed on in this round's control exchange."""

    rank: int
    world_size: int
    healthy: list[bool]
    """Per rank: its snapshot is finite. Unhealthy replicas contribute nothing."""
    given: Optional[list[float]] = None
    """Per rank: the weight of its contribution (``sync.weighting``); None: 1 for each."""

    @property
    def n_healthy(self) -> int:
        return sum(self.healthy)

    @property
    def first_healthy(self) -> int:
        return self.healthy.index(True)

    @property
    def weights(self) -> list[float]:
        """Per rank, 0 where unhealthy: every rule divides by their sum, never by a count."""
        given = self.given or [1.0] * self.world_size
        return [w if ok else 0.0 for w, ok in zip(given, self.healthy)]


class SyncRule(ABC):
    name: ClassVar[str]
    weighted: ClassVar[bool] = False
    """Takes ``sync.weighting=steps``: its consensus is a weighted mean of the replicas."""
    state_copies: ClassVar[int] = 0
    """Model-sized buffers the rule keeps between rounds (the outer rules: θ_g and the momentum),
    counted by the memory estimate; a compressed wire adds its residual, and average its base."""
    POSITIONAL: ClassVar[tuple[str, ...]] = ()
    """The attributes holding model-sized state, one value per synced position (row-sparse
    rounds cut them to the round's rows: sync/rows.py)."""

    def __init__(self, cfg: SyncConfig, comm: Comm, params: Optional[int] = None) -> None:
        self.cfg = cfg
        # Every collective a rule makes is counted: what the link carried is a run's figure.
        self.comm: Metered = comm if isinstance(comm, Metered) else Metered(comm)
        self.params = params
        """How many leading values of the flat buffer are parameters; the rest are float buffers
        (BatchNorm's running statistics), which rules that step past the replicas' mean must
        not extrapolate. None: all of it is parameters."""
        self.wire = make_wire(cfg.dtype)
        self.compressed = cfg.dtype != "fp32"
        self._scratch: dict[str, Tensor] = {}
        self.ending = False
        """The job ends with the round being made (its flags say so, or it is the final one):
        its target is the model the job ends with."""
        self.spread: Optional[float] = None
        """Set by rules whose target is not the replicas' consensus (the outer-momentum rules
        step past their mean): this replica's ``||snap - mean||`` in the round just made. Drift
        measures how far replicas moved apart, not how far the outer step went."""

    @property
    def meter(self) -> LinkMeter:
        return self.comm.meter

    def scratch(self, name: str, numel: int, like: Tensor) -> Tensor:
        """A buffer kept across rounds: fresh multi-MB allocations page-fault on every sync."""
        buf = self._scratch.get(name)
        if buf is None or buf.numel() != numel or buf.dtype != like.dtype or buf.device != like.device:
            buf = torch.empty(numel, dtype=like.dtype, device=like.device)
            self._scratch[name] = buf
        return buf

    def prime(self, flat: Tensor) -> None:
        """Called once with the replica's parameters before training starts."""
        del flat

    def attach(self, board: Board) -> None:
        """The replica's board, once, before its workers start (row-sparse rounds publish their
        epoch there)."""
        del board

    def positional(self) -> dict[str, Tensor]:
        """The model-sized state as it stands, by name (the wire's error-feedback residual too)."""
        state = {name: getattr(self, name) for name in self.POSITIONAL if getattr(self, name) is not None}
        residual = getattr(self.wire, "residual", None)
        if residual is not None:
            state["wire.residual"] = residual
        return state

    def set_positional(self, state: dict[str, Tensor]) -> None:
        """Point the model-sized state at ``state``'s tensors (the names :meth:`positional` gives)."""
        for name, t in state.items():
            if name == "wire.residual":
                setattr(self.wire, "residual", t)
            else:
                setattr(self, name, t)

    def plan(self, numel: int, final: bool, timeout_s: Optional[float] = None) -> list[slice]:
        """The stretches of the flat buffer this round syncs, one :meth:`exchange` each, in
        order: all of it, unless the rule syncs a fragment per round. ``timeout_s``: the round's bound
        on waiting for a peer, for a rule that must agree on its plan first."""
        del final, timeout_s
        return [slice(0, numel)]

    @abstractmethod
    def target(self, snap: Tensor, ctx: SyncContext) -> Tensor:
        """The parameters this replica should hold. ``snap`` must be left as it is."""

    def exchange(self, snap: Tensor, ctl: Tensor, rank: int, timeout_s: float,
                 final: bool = False) -> tuple[Tensor, Tensor]:
        """Reduce the control vector, then compute the target: (target, reduced control).

        Rules whose data collective is itself a SUM all_reduce fuse both into one call. The
        target may be the rule's own state: the round only reads it. ``final``: the job's last
        round (workers stopped, every leader in it); its target is the model the job ends with.
        """
        ctl = self.comm.all_reduce(ctl, timeout_s, SYNC_ROUND)
        self.ending = final or RoundVector.ends_job(ctl)
        return self.target(snap, context(ctl, rank)), ctl

    def _fused_sum(self, snap: Tensor, ctl: Tensor, rank: int, timeout_s: float,
                   final: bool = False) -> tuple[Tensor, Tensor, float]:
        """One collective for the whole round: the control flags travel in front of the
        parameters, and an unhealthy replica sends zeros. Returns (weighted sum of the healthy
        snapshots, in a scratch buffer; reduced control; their total weight)."""
        c = ctl.numel()
        buf = self.scratch("fused", c + snap.numel(), snap)
        buf[:c].copy_(ctl)
        weight = float(ctl[RoundVector.weight_slot(RoundVector.world(ctl), rank)])
        if ctl[RoundVector.healthy_slot(rank)] <= 0:
            buf[c:].zero_()  # not a product with weight 0: NaN * 0 is NaN
        elif weight == 1.0:
            buf[c:].copy_(snap)
        else:
            torch.mul(snap, weight, out=buf[c:])
        self.comm.all_reduce(buf, timeout_s, SYNC_ROUND)
        ctl = buf[:c].clone()
        self.ending = final or RoundVector.ends_job(ctl)
        return buf[c:], ctl, sum(context(ctl, rank).weights)

    def settle(self, flat: Tensor) -> None:
        """The job ends on ``flat``, the same on every replica, though it is not the final round's
        target (a run that met its target hands back the model that met it): whatever the rule
        keeps as the agreed model becomes ``flat``, so a run resumed from the final checkpoint
        starts its rounds from the model it holds."""
        del flat

    def state_dict(self) -> dict[str, Tensor]:
        """Every tensor in it has one value per element of the stretch the rule syncs, so a
        fragmented rule can cut and join its fragments' states (sync/fragments.py). The rule's own
        tensors, not copies: a model-sized state copied for every checkpoint was two more models
        at the peak. Its callers (a checkpoint's write, a joiner's heal) use it before the next
        round, which is the only thing that changes it."""
        return {}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        del state

    def held(self) -> list[Tensor]:
        """Every tensor the rule keeps between rounds (its state and its round buffers), for
        ``metrics.json``'s account of memory (replica/shared.py: held_bytes)."""
        return [*self.state_dict().values(), *self.positional().values(), *self._scratch.values()]

    def _masked(self, snap: Tensor, ctx: SyncContext) -> Tensor:
        return snap if ctx.healthy[ctx.rank] else torch.zeros_like(snap)

    def _mean(self, x: Tensor, ctx: SyncContext) -> Tensor:
        """Weighted mean over healthy replicas of ``x``, on the configured wire (sync/wire.py)."""
        weights = ctx.weights
        return self.wire.mean(self._masked(x, ctx), weights[ctx.rank], weights, self.comm)


def register(cls: type[SyncRule]) -> type[SyncRule]:
    """A rule is chosen by its ``name`` (``sync.mode``); the config check reads the same registry."""
    SYNC_RULES.register(cls.name)(cls)
    return cls


def context(ctl: Tensor, rank: int) -> SyncContext:
    R = RoundVector
    world = R.world(ctl)
    first, w0 = R.healthy_slot(0), R.weight_slot(world, 0)
    healthy = [bool(x > 0.5) for x in ctl[first:first + world].tolist()]
    return SyncContext(rank, world, healthy, [float(x) for x in ctl[w0:w0 + world].tolist()])


