"""The leader's decisions after a sync round, with the round itself stubbed (fast tier)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hogwild.config.schema import Config
from hogwild.leader.core import Leader
from hogwild.sync.rounds import RoundOutcome


def _after_round(final: bool = False, **flags: bool) -> list[str]:
    """Leader._round on a leader whose round's agreed flags are ``flags`` (a re-formation
    asked for by someone); what the leader did next."""
    agreed = {"all_done": False, "any_stop": False, "checkpoint": False, "reached": False, "reform": True, **flags}
    did: list[str] = []
    leader = Leader.__new__(Leader)
    leader.cfg, leader.is_rank0, leader.next_ckpt = Config(), False, float("inf")
    leader.rounds = SimpleNamespace(run=lambda **kw: RoundOutcome(healthy=True, drift=0.0, last_drifts=[], **agreed))
    leader.pool = SimpleNamespace(release=lambda: None)
    leader.tel = SimpleNamespace(time_to_target=None, round=lambda stats: None)
    leader._reform = lambda: did.append("reform")  # type: ignore[method-assign]
    leader._round(done=final, stop=final, final=final)
    return did


@pytest.mark.parametrize("ending", [dict(all_done=True), dict(any_stop=True), dict(reached=True), dict(final=True)])
def test_a_round_that_ends_the_job_admits_no_joiner(ending: dict[str, bool]) -> None:
    """Elastic mode: a joiner admitted in the last round would be healed and start training while
    the members went on to their final collectives (seen under load: Gloo's "Received data size
    doesn't match expected size", a survivor aborted, the joiner waited 300 s for a quorum)."""
    assert _after_round(**ending) == []


def test_a_round_of_a_running_job_re_forms_when_asked() -> None:
    assert _after_round() == ["reform"]
