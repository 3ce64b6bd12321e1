"""Elastic membership: which replica slots form the leaders' group now, kept in the
coordinator's ``TCPStore`` (``hogwild-coordinator``).

The group lives in numbered *epochs*. Every epoch has its own Gloo group, so a dead peer
never poisons the next one. Keys in the coordinator's store:

    job, run_dir     the first replica's fingerprint and output folder; later ones must match the
                     fingerprint, and adopt the folder if given none (elastic/outputs.py)
    hb/<slot>        "beat:ticks:round:step", set by a thread every ``peer_timeout_s / 5``: the
                     beat proves the process lives, the ticks that its main loop moves (0: the
                     process does not report them), round and step how far it got
    want/<slot>      the slot (re)started and asks to join; the formation that admits it to epoch e
                     marks it "admitted:e", and the slot deletes it once healed: a joiner whose
                     group or heal failed is still a joiner in the next epoch, never a member
                     with a stale model
    wants, wants/<i> how many writes to want/<slot> keys there were, and the slot of the i-th: a
                     member asks "does anyone want in?" before each round, and reads again only the
                     want keys written since it last asked (one call a round instead of one per slot)
    lost/<e>, lost/<e>/<i>
                     how many losses members of epoch e reported, and each ("slot:why"): a member
                     reads the heartbeats of the WATCH members after it in the epoch, and learns of
                     any other loss here (a few calls a check instead of one per member)
    epoch            the newest epoch (0: none formed yet)
    members/<e>      "0,1,2|2|1": epoch e's slots, those among them that must be healed, and the
                     heal source: the most advanced member by its heartbeat's round and step
    form/<e>         "slot:time": first writer forms epoch e+1 (compare_set); stale after peer_timeout_s
    pos/<slot>, done/<slot>
                     a slot's data position and totals (steps, samples, ...) at its last round
    heal/<e>/<slot>, stall/<e>/<slot>, finished
                     metrics, and the end of the job

The coordinator may die and come back: elastic/link.py puts the keys back, epoch number included.

Split brain is ruled out by the epoch counter living in one place and by quorum: a new epoch
needs a majority of the last one's slots alive (or ``elastic.min_replicas``). A minority waits
and never writes; a replica that finds a newer epoch without itself is dropped.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

from hogwild.elastic.coordinator import FINISHED
from hogwild.elastic.keys import JobKeys
from hogwild.elastic.link import Batch, CoordinatorAway, Link, Memory, call_deadline
from hogwild.elastic.liveness import POLL_S, Heartbeat, Liveness, Progress
from hogwild.elastic.signing import Signer, parse, token_from_env
from hogwild.errors import Fault, StopNow, UserError

T = TypeVar("T")
logger = logging.getLogger(__name__)

# A member watches the heartbeats of this many members after it in its epoch's order, not every
# member's: at R members, every member reading every heartbeat at each check is R x (R - 1) calls at
# the coordinator, 2 million a second at 1,000 members (docs/scale.md). The members watched by
# nobody alive are those after a run of dead ones, and the live member before that run watches its
# first: every loss is seen by a live member while one lives. At 3 members each watches all.
WATCH = 3
WANTS = "wants"
# A member waiting for an epoch asks the coordinator a few calls a poll. Every POLL_S (50 ms) at
# 1,000 members was 60,000 calls a second while the job started: the members' own calls starved
# their heartbeats, and the first epoch never formed (docs/scale.md). So the wait between polls
# grows with the job's slots past POLL_SLOTS, to at most a tenth of elastic.peer_timeout_s.
POLL_SLOTS = 16


class Dropped(Fault):
    """A newer epoch exists without this replica: it was silent too long. It must not write."""


class SlotTaken(Fault):
    """Another process holds this replica's slot now (it was silent, and a restart took over)."""


@dataclass(frozen=True)
class Epoch:
    number: int
    members: tuple[int, ...]
    """Slots, ascending; a slot's rank in the epoch's group is its index here."""
    joiners: tuple[int, ...] = ()
    """Members that (re)started and receive the live state from :attr:`source`."""
    src: Optional[int] = None
    """The heal source the former chose (None: the lowest member that is not joining). In an
    epoch of joiners only (a fresh job, or every replica restarted), the joiner whose restored
    state is furthest on: every other joiner takes its state, checkpoint positions included,
    so the group starts from one restore point however many checkpoints the slots can see."""

    @property
    def source(self) -> Optional[int]:
        """The member that sends the live state to the joiners."""
        return self.src if self.src is not None else next((s for s in self.members if s not in self.joiners), None)

    def encode(self) -> str:
        base = ",".join(map(str, self.members)) + "|" + ",".join(map(str, self.joiners))
        return base if self.src is None else f"{base}|{self.src}"

    @classmethod
    def decode(cls, number: int, raw: str, slots: Optional[int] = None) -> "Epoch":
        """Raises ValueError unless ``raw`` is what :meth:`encode` writes (slots below ``slots``)."""
        members, bar, rest = raw.partition("|")
        joiners, _, src = rest.partition("|")
        ints = lambda s: tuple(int(x) for x in s.split(",") if x)  # noqa: E731
        ep = cls(number, ints(members), ints(joiners), int(src) if src else None)
        if (not bar or list(ep.members) != sorted(set(ep.members)) or not set(ep.joiners) <= set(ep.members)
                or any(s < 0 or (slots is not None and s >= slots) for s in ep.members)
                or (ep.src is not None and (ep.src not in ep.members
                                            or (ep.src in ep.joiners and ep.joiners != ep.members)))):
            raise ValueError(raw)
        return ep


class Membership:
    """Forming the epochs: joining, claiming a slot, moving to the next epoch or forming it. It is
    composed of the job's other keys at the coordinator (:attr:`keys`, elastic/keys.py) and of
    liveness (:attr:`liveness`, elastic/liveness.py: this leader's heartbeat, the others' as seen
    from here), which its owner uses beside it."""

    def __init__(self, endpoint: str, slot: int, slots: int, peer_timeout_s: float,
                 min_replicas: Optional[int], timeout_s: float, stopped: Callable[[], bool] = lambda: False) -> None:
        self.endpoint, self.slot, self.slots, self.stopped = endpoint, slot, slots, stopped
        self.peer_timeout_s, self.min_replicas, self.timeout_s = peer_timeout_s, min_replicas, timeout_s
        self.memory = Memory()
        # HOGWILD_COORDINATOR_TOKEN: from the environment, so it is never recorded (elastic/signing.py).
        signer = Signer(token_from_env())
        progress = Progress()
        # A leader's round makes a dozen store calls, each bounded by call_deadline (about
        # elastic.peer_timeout_s): under load they add up, and each is its loop moving on.
        self.link = Link(endpoint, timeout_s, self.memory, call_deadline(peer_timeout_s), signer=signer,
                         on_call=lambda: self.liveness.moving())
        heartbeat = Heartbeat(endpoint, slot, peer_timeout_s / 5, timeout_s, self.memory, signer, progress)
        self.liveness = Liveness(self.link, slot, peer_timeout_s, heartbeat, progress)
        self.keys = JobKeys(endpoint, self.link, self.memory)
        self.epoch = Epoch(0, ())
        self._joining, self._asked_at = False, 0
        # This process's identity in its slot: a requeued job whose old node still runs must not
        # put a second process into a live slot (see claim).
        self.incarnation = f"{uuid.uuid4().hex[:12]} pid {os.getpid()} on {socket.gethostname()}"
        self._claimed = False
        self._wants: dict[int, Optional[bytes]] = {}  # every slot's want key as last read
        self._wants_read, self._wants_back_at = 0, float("nan")  # entries of the log read; back_at then
        self._reported: set[tuple[int, int]] = set()  # (epoch, slot) losses this member reported
        self._lost_read: tuple[int, int, dict[int, str]] = (-1, 0, {})  # epoch, reports read, what they said

    @property
    def poll_s(self) -> float:
        """The wait between a waiting member's polls (see POLL_SLOTS)."""
        return max(POLL_S, min(self.peer_timeout_s / 10, POLL_S * self.slots / POLL_SLOTS))

    def current(self) -> int:
        return self.link.add("epoch", 0)

    # ------------------------------------------- what the epoch's communicator asks (elastic/comm.py)
    def rank(self) -> int:
        """This slot's rank in the current epoch's group."""
        return self.epoch.members.index(self.slot)

    def group_size(self) -> int:
        """The current epoch's member count; before the first epoch forms (a sync rule's
        constructor asks), the job's planned size."""
        return len(self.epoch.members) or self.slots

    def store_address(self) -> tuple[str, int]:
        """The coordinator's host and port, for a connection of the caller's own."""
        return self.link.host, self.link.port

    def tick(self) -> None:
        """The owner's loop moved (waiting for a group or a collective is its progress)."""
        self.liveness.tick()

    def superseded(self) -> bool:
        """A newer epoch than this replica's exists. Raises CoordinatorAway."""
        return self.current() > self.epoch.number

    def watched(self) -> tuple[int, ...]:
        """The members whose heartbeats this one reads: the WATCH after it in the epoch, cyclically."""
        members = self.epoch.members
        if self.slot not in members:
            return tuple(s for s in members if s != self.slot)
        at = members.index(self.slot)
        return tuple(members[(at + i) % len(members)] for i in range(1, min(WATCH, len(members) - 1) + 1))

    def lost_peers(self) -> dict[int, str]:
        """The current epoch's other members judged lost, each with why ("silent", or "stuck at
        ..."): those this member watches, judged from here, and those others reported.
        Raises CoordinatorAway."""
        number = self.epoch.number
        dead = {s: self.liveness.why.get(s, "silent") for s in self.liveness.stale(self.watched())}
        log = f"lost/{number}"
        for s, why in dead.items():
            if (number, s) not in self._reported:
                self.link.append(log, f"{s}:{why}")
                self._reported.add((number, s))
        count = self.link.add(log, 0) if number > 0 else 0
        read_in, upto, known = self._lost_read
        if read_in != number:
            upto, known = 0, {}
        elif count < upto:  # a restarted coordinator counts from 0; the reports read stand
            upto = 0
        for i, raw in enumerate(self.link.entries(log, upto, count), start=upto + 1):
            slot, _, why = raw.decode(errors="replace").partition(":")
            known[parse(f"{log}/{i}", slot.encode(), int)] = why
            upto = i
        self._lost_read = (number, upto, known)
        return {**{s: why for s, why in known.items() if s in self.epoch.members and s != self.slot}, **dead}

    def read(self, number: int) -> Epoch:
        raw = self.link.get(f"members/{number}")
        ep = self._decode(number, raw)
        self.memory.keep(f"members/{number}", raw)
        self.memory.saw_epoch(number)
        return ep

    def _decode(self, number: int, raw: bytes) -> Epoch:
        return parse(f"members/{number}", raw, lambda r: Epoch.decode(number, r.decode(), self.slots))

    def wanting(self, epoch: Optional[int] = None) -> list[int]:
        """Slots that ask to join. One admitted to ``epoch`` (default: this replica's) or a
        later one is being healed there and asks no more; one admitted to an earlier epoch and
        still not healed asks again."""
        epoch = self.epoch.number if epoch is None else epoch
        count = self.link.add(WANTS, 0)
        if self._wants_back_at != self.memory.back_at or not 0 <= count - self._wants_read <= self.slots:
            # First look, the coordinator came back (its log starts again from 0 as the replicas
            # put their keys back), or more entries to read than slots (a job's start): every key.
            self._wants = {s: self.link.fetch(f"want/{s}") for s in range(self.slots)}
            self._wants_read, self._wants_back_at = count, self.memory.back_at
        for i, entry in enumerate(self.link.entries(WANTS, self._wants_read, count), start=self._wants_read + 1):
            s = parse(f"{WANTS}/{i}", entry, int)  # a slot whose key was written since the last look
            self._wants[s] = self.link.fetch(f"want/{s}")
            self._wants_read = i
        out = []
        for s, raw in sorted(self._wants.items()):
            if raw is None:
                continue
            admitted = parse(f"want/{s}", raw, _admitted)
            if admitted is None or admitted < epoch:
                out.append(s)
        return out

    def wanted(self, slot: int, value: Optional[str], keep: bool = False) -> None:
        """Set (None: delete) ``want/<slot>`` and count the change (see :meth:`wanting`); ``keep``:
        put it back after a coordinator restart (elastic/link.py)."""
        if value is None:
            self.link.delete(f"want/{slot}")
        elif keep:
            self.keys.put(f"want/{slot}", value)
        else:
            self.link.set(f"want/{slot}", value)
        try:  # after the write: a member that reads the entry reads the key as it is now
            self.link.append(WANTS, str(slot))
        except CoordinatorAway:
            pass  # when it comes back, every member reads the want keys again (back_at)

    def settled(self, ep: Epoch) -> None:
        """This slot is healed (or needed no heal) in ``ep``: its join request is done."""
        if self.slot in ep.joiners:
            self.memory.forget(f"want/{self.slot}")
            self.wanted(self.slot, None)

    def start(self, fn: Callable[[], T], what: str) -> Batch[T]:
        """``fn``'s calls to the coordinator on one thread of their own, started now (:meth:`Link.start`)."""
        return self.link.start(fn, what)

    def changed(self) -> bool:
        """A newer epoch exists, or some slot asks to join: the group should re-form. While the
        coordinator is away, no: the group goes on as it is."""
        try:
            return self.current() > self.epoch.number or bool(self.wanting())
        except CoordinatorAway:
            return False

    # ------------------------------------------------------------- formation
    def join(self) -> Epoch:
        """Ask to join (first start, restart, or back after being dropped) and wait until an
        epoch formed after the request lists this slot among its joiners."""
        self.claim()
        self._asked_at = self.current()
        self.wanted(self.slot, str(time.time()), keep=True)
        # The heartbeat starts only after the request: a restarted slot that beat first would be
        # taken for its old self, still a member, and the others would wait for it in a group it
        # does not know about.
        self.liveness.heartbeat.start()
        self._joining = True
        return self.advance()

    def claim(self) -> None:
        """Take this slot for this process, once. A slot held by another process whose heartbeat
        still moves is refused in one line; one whose holder is silent (killed, or a restart
        of this slot) is taken over, and the old holder, if it ever wakes, finds the slot gone
        at its next epoch and stops (:class:`SlotTaken`)."""
        if self._claimed:
            return
        key, mine = f"owner/{self.slot}", self.incarnation
        held = self.link.compare_set(key, "", mine)
        if held != mine:
            if self.liveness.alive([self.slot]):
                raise UserError(f"elastic.slot={self.slot}: the slot is held by a live replica ({held}); start "
                                "this one in a free slot, or stop that one first")
            if self.link.compare_set(key, held, mine) != mine:
                raise UserError(f"elastic.slot={self.slot}: another process took the slot at the same moment")
        self.memory.keep(key, mine)
        self._claimed = True

    def _check_owner(self) -> None:
        raw = self.link.fetch(f"owner/{self.slot}")
        holder = None if raw is None else raw.decode(errors="replace")
        if self._claimed and holder is not None and holder != self.incarnation:
            raise SlotTaken(f"sync: slot {self.slot} was taken over by another process ({holder[:80]}) while "
                            "this one was silent; stopping without writing")

    def advance(self) -> Epoch:
        """Move to the next epoch: learn it if another slot formed it, else form it. Raises
        :class:`Dropped` if it leaves this member out, :class:`Fault` if no quorum forms in time,
        :class:`StopNow` if a signal asks this replica to stop meanwhile."""
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self.stopped():  # SIGTERM/SIGINT: a replica waiting for a group never writes
                raise StopNow()
            if self.liveness.progress.ticks:
                self.liveness.tick()
            try:
                ep = self._step()
            except CoordinatorAway:  # a new epoch needs the coordinator: wait for it to come back
                ep = None
            if ep is not None:
                return ep
            time.sleep(self.poll_s)
        if self.memory.away_since is not None:
            raise Fault(f"elastic.coordinator {self.endpoint} unreachable for {self.memory.away_for():.0f}s "
                        "(sync.timeout_s) while the group had to change")
        raise Fault(f"sync: no group with a quorum formed within {self.timeout_s:.0f}s (sync.timeout_s); "
                    f"slots alive: {self.liveness.alive(list(range(self.slots)))}")

    def _step(self) -> Optional[Epoch]:
        if self.link.check(FINISHED):
            raise Fault(f"sync: the job at {self.endpoint} finished while replica {self.slot} was away; "
                        "nothing left for it to do (start a new coordinator for a new job)")
        newest = self.current()
        if newest <= self.epoch.number:
            self._try_form(newest)
        elif self._joining:
            if not self.link.check(f"want/{self.slot}"):  # taken for a dead joiner's: ask again
                self.wanted(self.slot, str(time.time()))
            ep = self.read(newest)
            if newest > self._asked_at and self.slot in ep.joiners:
                self._joining, self.epoch = False, ep  # its request stays until it is healed (settled)
                if ep.source is None:  # a group of joiners only: nobody to heal from, nothing to wait for
                    self.settled(ep)
                return ep
            if not self._group_alive(ep):  # nobody left to admit it: form the next epoch itself
                self._try_form(newest)
        else:
            self._check_owner()
            ep = self.read(newest)
            if self.slot not in ep.members:
                raise Dropped(f"sync: replica {self.slot} was dropped from the group (epoch {newest}) "
                              "while it was silent")
            self.epoch = ep
            return ep
        return None

    def _group_alive(self, ep: Epoch) -> bool:
        """Some member of ``ep`` still serves it. A member slot that asks to join is a restarted
        process whose old self is gone: its heartbeat (the same key) proves nothing about the
        group, or a whole group restarted against a live coordinator would wait forever for
        itself to admit itself."""
        serving = set(ep.members) - set(self.wanting(ep.number))
        return bool(serving - set(self.liveness.stale(tuple(sorted(serving)))))

    def _try_form(self, number: int) -> None:
        if time.monotonic() - self.memory.back_at < self.peer_timeout_s:
            return  # the coordinator just came back: the slower replicas restore their epochs first
        key, mine = f"form/{number}", f"{self.slot}:{time.time()}"
        held = self.link.compare_set(key, "", mine)
        if held != mine:
            if time.time() - parse(key, held.encode(), lambda r: float(r.split(b":")[1])) < 2 * self.peer_timeout_s:
                return  # another slot is forming it
            if self.link.compare_set(key, held, mine) != mine:
                return  # the former died mid-way; another slot took over first
        old = self.read(number) if number > 0 else Epoch(0, ())
        asked = self.wanting(number + 1)  # those admitted to the old epoch but never healed too
        alive = self.liveness.alive(sorted(set(old.members) | set(asked)))
        wanting = sorted(set(asked) | set(self.wanting(number + 1)))  # a slot restarted during the window joins
        # A request whose slot showed no heartbeat for the whole window is a joiner that died
        # before admission: drop it, or every round would see it and re-form the group, forever.
        # A live joiner puts its request back while it waits (see _step).
        for s in sorted(set(asked) - set(alive)):
            self.wanted(s, None)
        need = self.min_replicas or (len(old.members) // 2 + 1 if old.members else self.slots)
        kept = [s for s in alive if s in old.members] if old.members else alive
        if len(kept) < need:
            logger.warning("slot %d: %d of %s slots alive, %d needed: waiting (no writes)", self.slot, len(kept),
                           "the last group's" if old.members else "the job's", need)
            self.link.delete(key)
            time.sleep(self.peer_timeout_s / 5)
            return
        joiners = tuple(s for s in alive if s in wanting)
        ep = Epoch(number + 1, tuple(alive), joiners,
                   self._most_advanced([s for s in alive if s not in joiners] or list(alive)))
        # Compare-and-set, not set: members already written (by a replica that put this epoch
        # back after a coordinator restart, or by a former that died before publishing them)
        # stand, and are published as they are; their joiners remove their own requests.
        if self.link.compare_set(f"members/{ep.number}", "", ep.encode()) != ep.encode():
            self.link.compare_set("epoch", str(number), str(ep.number))
            return
        self.memory.keep(f"members/{ep.number}", ep.encode())
        for s in ep.joiners:
            self.wanted(s, f"admitted:{ep.number}")
        if self.link.compare_set("epoch", str(number), str(ep.number)) != str(ep.number):
            return  # last: whoever reads the epoch finds its members
        self.memory.saw_epoch(ep.number)
        logger.info("slot %d formed epoch %d: members %s, joining %s", self.slot, ep.number,
                    list(ep.members), list(ep.joiners))

    def _most_advanced(self, candidates: list[int]) -> Optional[int]:
        """The heal source: the member furthest on by its heartbeat (round, then step; the
        lowest slot on a tie). A member that was dropped while stopped, or never healed, is
        behind the others; the lowest slot is not always the one to copy."""
        if not candidates:
            return None

        def progress(s: int) -> tuple[int, int, int]:
            beat = self.liveness.beat_of(s)
            return (beat.round, beat.step, -s) if beat is not None else (-1, -1, -s)
        return max(candidates, key=progress)

    def history(self) -> list[Epoch]:
        """Every epoch whose members the coordinator (or, while it is away, this replica) knows."""
        try:
            newest = self.current()
            raws = {e: self.link.fetch(f"members/{e}") for e in range(1, newest + 1)}
        except CoordinatorAway:
            with self.memory.lock:
                raws = {int(k.split("/")[1]): v for k, v in self.memory.kept.items() if k.startswith("members/")}
        return [self._decode(e, raw) for e, raw in sorted(raws.items()) if raw is not None]

    def close(self) -> None:
        self.liveness.heartbeat.stop()


def _admitted(raw: bytes) -> Optional[int]:
    """The epoch a join request was admitted to (None: still waiting; a request is a time)."""
    text = raw.decode()
    if text.startswith("admitted:"):
        return int(text.split(":", 1)[1])
    float(text)
    return None
