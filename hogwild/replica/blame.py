"""Whose fault a worker's death is, and how its leader learns it.

A worker runs the user's code (dataset items, collate, DataLoader processes, a stream, a forward,
a loss, an optimizer or scheduler step) between hogwild's own. An exception the user's code
raised is a user error: the same batch fails the same way in a respawn, so the worker sends its
one line to the leader through the wake pipe and exits with :data:`USER_EXIT`, and the leader
stops the run with exit 2 (replica/pool.py). Any other exception is a bug of hogwild's: the
worker prints one line, and the leader respawns it as for any death (exit 70's row in
docs/faults.md).
"""

from __future__ import annotations

import re
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Collection, Optional

import hogwild
from hogwild.errors import EXIT_USAGE, UserError, escaped, first_line

USER_EXIT = EXIT_USAGE
"""A worker's exit code when the user's code ended it (with a notice sent first)."""
NOTICE = b"!"
# One notice is one write of at most this many bytes: writes up to PIPE_BUF (4096 on Linux) are
# atomic, so two workers failing at once never interleave their lines in the shared pipe.
MAX_NOTICE = 3000

_OWN = Path(hogwild.__file__).resolve().parent
# torch re-raises a DataLoader process's exception in the worker as "Caught ValueError in
# DataLoader worker process 0." followed by the process's traceback as text.
_CAUGHT = re.compile(r"^Caught \S+ in DataLoader worker process \d+\.")


def raised_in_hogwild(e: BaseException) -> bool:
    """Whether the innermost frame of ``e``'s traceback is hogwild's own code (not the user's,
    nor a library the user's code called)."""
    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    try:
        return Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(_OWN)
    except (OSError, ValueError):  # "<string>", a frozen module: not a file of ours
        return False


def original(e: BaseException) -> tuple[str, str]:
    """``e``'s type name and first line; for an exception a DataLoader process raised, the
    original's, read off the traceback text torch wraps it in."""
    text = str(e).strip()
    if _CAUGHT.match(text):
        lines = text.splitlines()
        frames = [i for i, line in enumerate(lines) if line.startswith(" ")]
        if frames and frames[-1] + 1 < len(lines):  # the line after the last frame: "ValueError: ..."
            kind, _, message = lines[frames[-1] + 1].partition(": ")
            return kind.rsplit(".", 1)[-1], message.strip() or kind
    return type(e).__name__, first_line(e)


def user_failure(e: BaseException, phase: str, anywhere: Collection[str], outside: Collection[str]) -> Optional[str]:
    """The one line saying how the user's code failed in ``phase`` (the user call a worker was
    in), or None for a bug of hogwild's. In a phase of ``anywhere`` every exception is the user's;
    in one of ``outside`` only those raised outside hogwild's own code (in the user's code or in
    a library it called); in any other phase none but a :class:`UserError`, a ``SystemExit`` and
    a ``KeyboardInterrupt``."""
    left = escaped(e, phase)
    if left is not None:
        return str(left)
    kind, message = original(e)
    if isinstance(e, UserError):  # hogwild's own check of what the user's code gave: it names the key
        return message
    if phase in anywhere or (phase in outside and not raised_in_hogwild(e)):
        return f"{phase} raised {kind}: {message}"
    return None


def context(e: BaseException, worker: int, batch: int) -> str:
    """Where it happened: the notes hogwild added on the way out (the item's index), the worker
    and its batch."""
    notes = [str(n) for n in getattr(e, "__notes__", None) or [] if isinstance(n, str)]
    return f" ({'; '.join([*notes, f'worker {worker} at its batch {batch}'])})"


def tell_leader(wake: Connection, worker: int, line: str) -> None:
    """Send the leader the one line of worker ``worker`` (its local index), before it exits."""
    blob = (NOTICE + f"{worker}\t{' '.join(line.split())}".encode())[:MAX_NOTICE]
    try:
        wake.send_bytes(blob)
    except (OSError, ValueError):  # the leader is gone: nobody is left to tell
        pass


def read_notice(blob: bytes) -> Optional[tuple[int, str]]:
    """A worker's local index and line, if ``blob`` from the wake pipe is a notice (else a wake-up)."""
    if not blob.startswith(NOTICE):
        return None
    worker, _, line = blob[len(NOTICE):].decode(errors="replace").partition("\t")
    return (int(worker), line) if worker.isdigit() else None
