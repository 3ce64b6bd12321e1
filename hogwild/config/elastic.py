"""``elastic.*``: the elastic membership, each replica launched on its own and meeting the others at
a coordinator, so that the group survives a lost machine (``elastic.coordinator=HOST:PORT``; unset,
the replicas are one torchrun job and a lost peer stops it).

Its own group, apart from ``sync``: how the replicas meet once a group exists (the rule, interval,
wire and ``sync.timeout_s``) is ``sync.*``; who is in the group is this. Read by leader/elastic.py
and leader/choose.py; each check raises :class:`ConfigError` naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hogwild.config.env import split_endpoint
from hogwild.config.validate import require, timeout


@dataclass
class ElasticConfig:
    coordinator: Optional[str] = None
    """host:port of a hogwild-coordinator: elastic mode, each replica launched on its own; a lost
    replica is dropped and the others go on (null: one torchrun job, a lost peer stops it)."""
    replicas: int = 1
    """Elastic mode: the job's replica slots (the data is split into this many shards)."""
    slot: Optional[int] = None
    """Elastic mode: this replica's slot, 0..elastic.replicas-1; a restarted replica keeps its slot."""
    peer_timeout_s: float = 10.0
    """Elastic mode: a replica whose heartbeat stops this long is dropped from the group."""
    min_replicas: Optional[int] = None
    """Elastic mode: live slots a new group needs (null: a majority of the last group)."""

    def __post_init__(self) -> None:
        if self.coordinator is None:
            return
        split_endpoint(self.coordinator, "elastic.coordinator")
        require(self.replicas >= 2, "elastic.replicas", f"elastic mode needs at least 2 slots, got {self.replicas}")
        require(self.slot is not None and 0 <= self.slot < self.replicas, "elastic.slot",
                f"must be set to 0..{self.replicas - 1} with elastic.coordinator, got {self.slot}")
        timeout(self.peer_timeout_s, "elastic.peer_timeout_s")
        m = self.min_replicas
        require(m is None or 1 <= m <= self.replicas, "elastic.min_replicas", f"must be in 1..{self.replicas}, got {m}")
