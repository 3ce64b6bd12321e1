"""An elastic replica's account of the job: its own totals (this process's, plus what its
earlier processes did before a restart), every slot's data positions, and each absent slot's
totals and positions as it published them at its last round. Counts travel here as the flat
tensors a slot publishes (``Counts.to_tensor``), so this module needs nothing of the replica.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

import numpy as np
import torch
from torch import Tensor

Fetch = Callable[[int], Optional[np.ndarray]]
"""What the coordinator holds for a slot (None: nothing, or the coordinator is away)."""


class Ledger:
    def __init__(self, slots: int, workers: int) -> None:
        self.carried: Optional[Tensor] = None
        """This slot's earlier processes' totals, received when it healed after a restart."""
        self.slot_totals: dict[int, Tensor] = {}
        """Absent slots' totals as last published: the group merged their updates."""
        self.slot_positions = torch.zeros(slots, workers, dtype=torch.float64)
        self.restored_positions: Optional[Tensor] = None
        """Every slot's, in the checkpoint this slot restored."""

    def restored(self, positions: Optional[Tensor]) -> None:
        """The positions of every slot in the checkpoint this slot restored."""
        self.restored_positions = positions

    def carry(self, done: Optional[Tensor]) -> None:
        """Count on from an earlier process's totals (None: this slot starts its count afresh)."""
        self.carried = done

    def own(self, totals: Tensor) -> Tensor:
        """This slot's totals as the job sees them."""
        return totals if self.carried is None else totals + self.carried

    def job(self, members: Tensor, absent: Iterable[int], fetch_totals: Fetch) -> Tensor:
        """The members' totals plus, for each slot outside this epoch, its totals as it published
        them at its last round: a slot lost for good must not take its merged updates out of the
        job's count. (A slot that comes back carries the same totals into its own, so nothing
        counts twice.)"""
        total = members.clone()
        for s in absent:
            done = fetch_totals(s)
            if done is not None:  # the coordinator is away: the last totals this leader saw
                self.slot_totals[s] = torch.from_numpy(done)
            if s in self.slot_totals:
                total += self.slot_totals[s]
        return total

    def positions(self, members: dict[int, Tensor], absent: Iterable[int], fetch_positions: Fetch) -> Tensor:
        """Every slot's data positions: the members' as they are now, an absent slot's as it
        published them at its last round, as its totals are counted (:meth:`job`). The members'
        never come from the coordinator: while it is away it holds old positions, which beside
        fresh totals would make a resume read their shards again."""
        for s, pos in members.items():
            self.slot_positions[s] = pos
        for s in absent:
            pos = fetch_positions(s)
            if pos is not None:  # the coordinator is away: the last positions this leader saw
                self.slot_positions[s] = torch.from_numpy(pos)
        return self.slot_positions.clone()

    def report(self) -> list[float]:
        """Each slot's data position, summed over its workers (``metrics.json``'s slot_positions)."""
        return self.slot_positions.sum(dim=1).tolist()
