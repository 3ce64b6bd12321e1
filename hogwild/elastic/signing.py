"""Signed coordinator values: what a process that reaches the coordinator's port may not forge.

``hogwild-coordinator`` is a plain ``TCPStore``: whoever reaches its port can list, read and
write every key. Without a token, the replicas trust every value they read, but check its
shape: a malformed one stops the replica in one line (exit 3), never with a traceback.

With ``HOGWILD_COORDINATOR_TOKEN`` set (the same secret on every replica; an environment
variable, so it is never written into a config, a checkpoint or a log), every value is stored
as ``<mac>.<payload>``, the mac an HMAC-SHA256 of the key and the payload under the token.
A value that does not verify is refused like a malformed one, so an outsider can neither forge
an epoch, a heartbeat or a join request, nor redirect the job's ``run_dir``. Counters, which the
store can only add to blindly, become signed values advanced by compare-and-set.

What a token does not give: secrecy (the store's traffic is plain TCP: anyone on the path reads
it) and availability (an outsider can still delete keys or flood the server). Keep the port on a
private network, or behind a tunnel (docs/machines.md, elastic mode).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from typing import Any, Callable, Optional, TypeVar

from hogwild.errors import Fault

TOKEN_ENV = "HOGWILD_COORDINATOR_TOKEN"
MAC_CHARS = 32
ABSENT = b"\x00hogwild:absent"  # what no replica ever stores: a read of a key that is not there
_SIGNED = re.compile(rb"^[0-9a-f]{%d}\." % MAC_CHARS)

T = TypeVar("T")


class Malformed(Fault):
    """A value in the coordinator's store that no replica of this job wrote."""


def token_from_env() -> Optional[bytes]:
    raw = os.environ.get(TOKEN_ENV, "")
    return raw.encode() if raw else None


class Signer:
    """Wraps and checks values for one token (or none: values pass as they are)."""

    def __init__(self, token: Optional[bytes]) -> None:
        self.token = token

    def _mac(self, key: str, payload: bytes) -> bytes:
        assert self.token is not None
        return hmac.new(self.token, key.encode() + b"\0" + payload, hashlib.sha256).hexdigest()[:MAC_CHARS].encode()

    def wrap(self, key: str, payload: bytes) -> bytes:
        if self.token is None or not payload:  # "" means "absent" to compare_set: never signed
            return payload
        return self._mac(key, payload) + b"." + payload

    def unwrap(self, key: str, raw: bytes) -> bytes:
        if self.token is None:
            if _SIGNED.match(raw):
                raise Malformed(f"elastic.coordinator: the value under {key!r} is signed: the running job uses a "
                                f"coordinator token; set {TOKEN_ENV} to the job's token")
            return raw
        if not raw:
            return raw
        mac, _, payload = raw.partition(b".")
        if not hmac.compare_digest(mac, self._mac(key, payload)):
            raise Malformed(f"elastic.coordinator: the value under {key!r} is not signed with this replica's "
                            f"{TOKEN_ENV} (a different token, or something else writes to the coordinator's port)")
        return payload


def parse(key: str, raw: bytes, fn: Callable[[bytes], T]) -> T:
    """``fn(raw)``, or one line naming the key if the value is not what a replica writes there."""
    try:
        return fn(raw)
    except (ValueError, TypeError, IndexError, UnicodeDecodeError, OverflowError):
        raise Malformed(f"elastic.coordinator: malformed value under {key!r}: {raw[:60]!r}; is something other "
                        f"than this job's replicas writing to the coordinator's port? (see {TOKEN_ENV})") from None


class SignedStore:
    """A raw ``TCPStore`` client seen through a :class:`Signer`: the operations a link runs."""

    def __init__(self, store: Any, signer: Signer) -> None:
        self.store, self.signer = store, signer

    def get(self, key: str) -> bytes:
        return self.signer.unwrap(key, self.store.get(key))

    def read(self, key: str) -> Optional[bytes]:
        """The value, or None if the key is absent, in one non-blocking call. A check then a
        get is a race: a key deleted between them (a join request) makes the get wait for it
        the store's whole timeout, and the link's calls with it."""
        raw = self.store.compare_set(key, ABSENT, ABSENT)  # never creates the key: expected is not b""
        return None if raw == ABSENT else self.signer.unwrap(key, raw)

    def set(self, key: str, value: bytes) -> None:
        self.store.set(key, self.signer.wrap(key, value))

    def check(self, key: str) -> bool:
        return bool(self.store.check([key]))

    def delete(self, key: str) -> None:
        self.store.delete_key(key)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """The value now under ``key``: ``desired`` if it was ``expected`` (or absent, for b"")."""
        raw = self.store.compare_set(key, self.signer.wrap(key, expected), self.signer.wrap(key, desired))
        return self.signer.unwrap(key, raw)

    def counter(self, key: str, n: int) -> int:
        """Add ``n`` (0: read, creating it at 0) to a counter kept as a signed value, by
        compare-and-set: the store's own ``add`` cannot check who wrote what it adds to."""
        while True:
            raw = self.store.compare_set(key, ABSENT, ABSENT)
            raw = b"" if raw == ABSENT else raw
            current = parse(key, self.signer.unwrap(key, raw), int) if raw else 0
            if n == 0 and raw:
                return current
            want = self.signer.wrap(key, str(current + n).encode())
            if self.store.compare_set(key, raw, want) == want:
                return current + n
