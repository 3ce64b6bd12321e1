"""The job's keys at the coordinator that are not the epochs: the job's identity and run_dir,
what a slot publishes for the others (its positions and totals, metrics), and how long the
coordinator has been away. Part of elastic membership (elastic/membership.py forms the epochs)."""

from __future__ import annotations

from typing import Callable, Optional, TypeVar, Union

from hogwild.elastic.link import CoordinatorAway, Link, Memory
from hogwild.elastic.signing import Malformed
from hogwild.errors import UserError

T = TypeVar("T")


class JobKeys:
    def __init__(self, endpoint: str, link: Link, memory: Memory) -> None:
        self.endpoint, self.link, self.memory = endpoint, link, memory

    def agree_job(self, fingerprint: str, run_dir: str) -> str:
        """Refuse a replica of another job; return the job's run_dir (the first replica's)."""
        try:  # the first keys a replica reads: a bad signature here is a token that differs, or none
            theirs = self.link.compare_set("job", "", fingerprint)
            if theirs != fingerprint:
                raise UserError(f"elastic.coordinator {self.endpoint}: this replica's {fingerprint} differs from "
                                f"the running job's {theirs}; start it with the job's settings")
            agreed = self.link.compare_set("run_dir", "", run_dir)
        except Malformed as e:
            raise UserError(str(e)) from None
        self.memory.keep("job", fingerprint)
        self.memory.keep("run_dir", agreed)
        return agreed

    def put(self, key: str, value: Union[str, bytes]) -> None:
        """Set a key that must outlive a coordinator restart (put back then if it is away now)."""
        self.memory.keep(key, value)
        try:
            self.link.set(key, value)
        except CoordinatorAway:
            pass

    def away_for(self) -> float:
        """How long the coordinator has been unreachable (0: it is not)."""
        return self.memory.away_for()

    def fetch_as(self, key: str, fn: Callable[[bytes], T]) -> Optional[T]:
        """A value at the coordinator, parsed (None: absent or the coordinator away)."""
        return self.link.fetch_as(key, fn)

    def set(self, key: str, value: Union[str, bytes]) -> None:
        """Set at the coordinator, not kept (see :meth:`put`)."""
        self.link.set(key, value)
