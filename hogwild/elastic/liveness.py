"""Whether the other slots' leaders live, as this replica sees them, and this leader's own
heartbeat: the liveness part of elastic membership (elastic/membership.py forms the epochs).

A thread sets ``hb/<slot>`` every ``peer_timeout_s / 5`` ("beat:ticks:round:step"): the beat
proves the process lives, the ticks that its main loop moves (0: the process does not report
them), round and step how far it got (the heal source is the member furthest on).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Optional

from hogwild.elastic.link import CoordinatorAway, Link, Memory, call_deadline
from hogwild.elastic.signing import Signer

logger = logging.getLogger(__name__)

POLL_S = 0.05


@dataclass
class Progress:
    """What a leader's main loop reports at each turn (:meth:`Liveness.tick`)."""

    ticks: int = 0
    round: int = 0
    step: int = 0

    def turn(self, round: Optional[int] = None, step: Optional[int] = None) -> None:
        self.ticks += 1
        if round is not None:
            self.round = round
        if step is not None:
            self.step = step


@dataclass(frozen=True)
class Beat:
    beat: int
    ticks: int
    round: int
    step: int

    @classmethod
    def decode(cls, raw: bytes) -> "Beat":
        beat, ticks, rnd, step = (int(x) for x in raw.split(b":"))
        return cls(beat, ticks, rnd, step)


@dataclass
class Seen:
    """A slot's heartbeat as this replica last saw it change (monotonic times)."""

    beat: Optional[Beat]
    beat_at: float
    ticks_at: float


class Heartbeat:
    """Sets ``hb/<slot>`` from its own thread and store connection, so a leader blocked in a
    collective still counts as alive, and a killed or stopped one does not. It carries the
    leader's :class:`Progress`, so a leader whose main loop is stuck (a write hung on a network
    filesystem, a deadlock) counts as lost too, though its process lives."""

    def __init__(self, endpoint: str, slot: int, period_s: float, timeout_s: float, memory: Memory,
                 signer: Signer, progress: Progress) -> None:
        self._link = Link(endpoint, timeout_s, memory, call_deadline(5 * period_s), retry_s=period_s, signer=signer)
        self._key, self._period, self._progress = f"hb/{slot}", period_s, progress
        self._beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hogwild-heartbeat", daemon=True)

    def _beat(self) -> None:
        self._beats += 1
        p = self._progress
        self._link.set(self._key, f"{self._beats}:{p.ticks}:{p.round}:{p.step}")

    def start(self) -> None:
        if self._thread.ident is None:  # once: a dropped replica rejoins with it running
            self._beat()
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            try:
                self._beat()  # after a coordinator restart: restores this replica's keys first
            except CoordinatorAway:
                pass  # the leader sees the outage and decides (Memory.away_for)
            except Exception:  # noqa: BLE001 - the thread must outlive any one failure
                logger.debug("heartbeat failed", exc_info=True)

    def stop(self) -> None:
        self._stop.set()


class Liveness:
    """This leader's heartbeat and progress, and the other slots' as seen from here."""

    def __init__(self, link: Link, slot: int, peer_timeout_s: float, heartbeat: Heartbeat, progress: Progress) -> None:
        self.link, self.slot, self.peer_timeout_s = link, slot, peer_timeout_s
        self.heartbeat, self.progress = heartbeat, progress
        self._seen: dict[int, Seen] = {}
        self.why: dict[int, str] = {}  # a slot :meth:`stale` found lost: "silent", or "stuck at ..."

    def tick(self, round: Optional[int] = None, step: Optional[int] = None) -> None:
        """The leader's main loop turned (called at least every ``peer_timeout_s / 2`` while it
        works; a member that never calls it is judged by its heartbeat alone)."""
        self.progress.turn(round, step)

    def _moving(self) -> None:
        if self.progress.ticks:  # only a process that reports its loop (a leader) counts turns
            self.progress.turn()

    def moving(self) -> None:
        """The leader's main thread is busy but moving (a batch of a long evaluation)."""
        self._moving()

    def beat_of(self, slot: int) -> Optional[Beat]:
        return self.link.fetch_as(f"hb/{slot}", Beat.decode)

    def stale(self, slots: tuple[int, ...]) -> list[int]:
        """The slots whose heartbeat has not moved for ``peer_timeout_s`` (a process killed or
        stopped), or whose main loop has reported no progress for as long (a process stuck), as
        seen from here."""
        now, out = time.monotonic(), []
        for s in slots:
            beat = self.beat_of(s)
            last = self._seen.get(s)
            if last is None:
                self._seen[s] = Seen(beat, now, now)
                continue
            if beat != last.beat:
                if beat is None or last.beat is None or beat.ticks != last.beat.ticks or beat.beat < last.beat.beat:
                    last.ticks_at = now  # a restarted process counts from 1 again: progress too
                last.beat, last.beat_at = beat, now
            reporting = beat is not None and beat.ticks > 0
            if now - last.beat_at > self.peer_timeout_s:
                out.append(s)
                self.why[s] = "silent"
            elif reporting and now - last.ticks_at > self.peer_timeout_s:
                out.append(s)
                self.why[s] = f"stuck at round {beat.round} step {beat.step}" if beat else "stuck"
        return out

    def alive(self, slots: list[int]) -> list[int]:
        """Slots whose heartbeat moves within a window of a few heartbeat periods. The window
        ends early once every slot not already known lost has moved (a stopped or stuck peer is
        known after the timeout; a killed one is not, so its absence takes the whole window).
        A slot known lost is not counted even if its heartbeat moves: a stuck leader's thread
        still beats, and a group that admitted it would wait for it at its first collective."""
        before = {s: self.beat_of(s) for s in slots}
        lost = set(self.stale(tuple(slots)))
        # A silent slot whose beat moves now is back (a restart that just began to beat); a
        # stuck one beats all along and stays out.
        stuck = {s for s in lost if self.why.get(s, "").startswith("stuck")}
        expect = set(slots) - lost
        moved: set[int] = set()
        deadline = time.monotonic() + self.peer_timeout_s / 2
        while time.monotonic() < deadline and not expect <= moved:
            time.sleep(POLL_S)
            moved |= {s for s in slots
                      if s not in moved and s not in stuck and _beat_moved(before[s], self.beat_of(s))}
        return sorted(moved)


def _beat_moved(before: Optional[Beat], now: Optional[Beat]) -> bool:
    return now is not None and (before is None or now.beat != before.beat)
