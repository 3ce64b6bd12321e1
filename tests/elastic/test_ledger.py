"""An elastic replica's account of the job: its own totals with what its earlier processes
carried, absent slots' totals and positions as last published, kept while the coordinator is
away (fast tier)."""

from __future__ import annotations

import numpy as np
import torch

from hogwild.elastic.ledger import Ledger


def test_a_restarted_slot_counts_on_from_its_earlier_processes() -> None:
    books = Ledger(slots=3, workers=2)
    assert torch.equal(books.own(torch.tensor([5.0, 1.0])), torch.tensor([5.0, 1.0]))
    books.carry(torch.tensor([100.0, 2.0]))
    assert torch.equal(books.own(torch.tensor([5.0, 1.0])), torch.tensor([105.0, 3.0]))
    books.carry(None)
    assert torch.equal(books.own(torch.tensor([5.0, 1.0])), torch.tensor([5.0, 1.0]))


def test_an_absent_slots_totals_stay_in_the_job_while_the_coordinator_is_away() -> None:
    books = Ledger(slots=3, workers=2)
    published = {2: np.array([40.0, 0.0])}
    job = books.job(torch.tensor([60.0, 1.0]), [2], published.get)
    assert torch.equal(job, torch.tensor([100.0, 1.0]))
    away = books.job(torch.tensor([70.0, 1.0]), [2], lambda s: None)  # the last totals seen still count
    assert torch.equal(away, torch.tensor([110.0, 1.0]))


def test_positions_are_the_members_now_and_the_absent_slots_last_published() -> None:
    books = Ledger(slots=3, workers=2)
    pos = books.positions({0: torch.tensor([3.0, 4.0], dtype=torch.float64)}, [1, 2],
                          {1: np.array([7.0, 8.0])}.get)
    assert pos.tolist() == [[3.0, 4.0], [7.0, 8.0], [0.0, 0.0]]
    again = books.positions({0: torch.tensor([5.0, 6.0], dtype=torch.float64)}, [1, 2], lambda s: None)
    assert again.tolist() == [[5.0, 6.0], [7.0, 8.0], [0.0, 0.0]]
    assert books.report() == [11.0, 15.0, 0.0]
