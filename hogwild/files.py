"""Files a run writes: atomic replacement under unique temp names, and the run-dir lock.

Two jobs on one ``run_dir`` used to share fixed ``.tmp`` names and overwrite each other's
checkpoints. Every write now goes to its own temp file (pid and a random part in the name),
fsynced, then renamed over the target; a failed write removes its temp file. The lock makes
the second job on a live ``run_dir`` fail at once instead (docs/design.md, rule 17).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import logging
import os
import socket
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Optional

from hogwild.errors import UserError

logger = logging.getLogger(__name__)

LOCK_NAME = ".hogwild.lock"


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """``write`` into a unique temp file next to ``path``, fsync, rename over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_link(target: Path, link: Path) -> None:
    """Point ``link`` at ``target`` (a hard link, swapped in atomically)."""
    tmp = link.with_name(f".{link.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        os.link(target, tmp)
        os.replace(tmp, link)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def open_nofollow(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that refuses a symlink in ``path``'s last component: a file a run opens for
    writing inside its run_dir is the run's own, never one that a link planted there points at."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as e:
        if os.path.islink(path):
            raise UserError(f"run_dir: {path} is a symbolic link; a run writes only its own files "
                            "(remove the link)") from None
        raise UserError(f"run_dir: cannot open {path}: {e.strerror}") from None


def writable_dir(path: str) -> bool:
    """Whether ``path`` can be created: its nearest existing ancestor is a writable folder."""
    p = os.path.abspath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    return os.path.isdir(p) and os.access(p, os.W_OK)


class RunDirLock:
    """An exclusive ``flock`` on ``run_dir/.hogwild.lock`` for the life of the job.

    The kernel drops the lock when its holder dies, however it dies, so a lock left by a
    dead job is simply taken over; the file only says who held it last.
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: Optional[int] = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read(fd) or "another job"
            os.close(fd)
            raise UserError(f"run_dir: {self.path.parent} is in use by {holder}; wait for it, stop it, "
                            "or choose another run_dir") from None
        previous = _read(fd)
        if previous:
            logger.info("run_dir lock: the previous holder (%s) is gone; taking it over", previous)
        os.ftruncate(fd, 0)
        now = datetime.datetime.now().isoformat(timespec="seconds")
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {now}".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock; the file stays as a record
            self._fd = None


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        return ""
