"""Elastic members without training, for measuring the coordinator under many of them
(``scripts/measures/coordinator_swarm.py``, through ``hogwild.bench``). Importing this module is
cheap: each function imports what it stands on when it is called."""

from __future__ import annotations

from typing import Any, Callable


def swarm_member(endpoint: str, slot: int, slots: int, peer_timeout_s: float, timeout_s: float,
                 stopped: Callable[[], bool]) -> Any:
    """A leader's client of the coordinator (elastic/membership.py), with no training behind it.
    Scripts may rely on ``join``, ``changed``, ``advance``, ``superseded``, ``lost_peers``,
    ``settled``, ``tick``, ``keys.put``, ``start`` (a round's calls on one thread) and ``close``;
    its waits raise (a stop, a drop, a timeout) as a leader's do."""
    from hogwild.elastic.membership import Membership

    return Membership(endpoint, slot, slots, peer_timeout_s, None, timeout_s, stopped)


def watch_members(on_call: Callable[[str, str, float], None]) -> None:
    """From now on, each store call of a member in this process to ``on_call(operation, key,
    seconds)``; a heartbeat is a ``set`` of ``hb/<slot>`` from the member's heartbeat thread."""
    from hogwild.elastic.link import observe_calls

    observe_calls(on_call)
