"""Files a run writes: atomic replacement under unique temp names, and the run-dir lock.

Two jobs on one ``run_dir`` with fixed ``.tmp`` names would overwrite each other's
checkpoints, so every write goes to its own temp file (pid and a random part in the name),
fsynced, then renamed over the target; a failed write removes its temp file. The lock makes
the second job on a live ``run_dir`` fail at once instead (docs/design.md, rule 17).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import logging
import os
import socket
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Optional

from hogwild.errors import UserError
from hogwild.logs import QuietFileHandler

logger = logging.getLogger(__name__)

LOCK_NAME = ".hogwild.lock"


def _refusal(path: Path, e: OSError) -> Exception:
    """A link where the run needs its own folder or file is the user's to remove (exit 2); any
    other ``OSError`` (a file where a folder should be, a full disk, no permission) stays one,
    for the write paths to report as a write failure."""
    if e.errno == errno.ELOOP or os.path.islink(path):
        return UserError(f"run_dir: {path} is a symbolic link; a run writes only its own files (remove the link)")
    return OSError(e.errno, e.strerror, str(path))  # the whole path: the error was raised for a name


def open_dir(root: str | Path, rel: str | Path = "", create: bool = True) -> int:
    """A descriptor of the folder ``root/rel`` reached one component at a time without following
    a symbolic link below ``root`` (which the user named, and may be a link), made as needed.
    A run writes only into folders it reaches this way: a link planted as ``checkpoints`` or
    ``progress`` would otherwise send its files wherever the link points."""
    root, here = Path(root), Path(root)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in Path(rel).parts:
            here = here / part
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                raise _refusal(here, e) from None
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _parent_fd(path: Path, root: Optional[str | Path]) -> int:
    if root is None:
        return open_dir(path.parent, create=False)
    return open_dir(root, path.parent.relative_to(root), create=False)


def _temp_name(path: Path) -> str:
    """A unique name beside ``path``: two jobs on one run_dir never share a temp file."""
    return f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"


@contextlib.contextmanager
def _removed_on_failure(dfd: int, tmp: str) -> Iterator[None]:
    """A temp file that did not become its target is removed, whatever stopped it."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise


def atomic_write(path: Path, write: Callable[[BinaryIO], None], root: Optional[str | Path] = None) -> None:
    """``write`` into a unique temp file next to ``path``, fsync, rename over ``path``. Every
    name is resolved from the parent's descriptor and no link is followed: not ``path`` itself
    (a rename replaces a link, never its target), nor a folder between ``root`` and ``path``."""
    dfd = _parent_fd(Path(path), root)
    tmp = _temp_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
        with _removed_on_failure(dfd, tmp):
            with os.fdopen(fd, "wb") as f:
                try:
                    write(f)
                except RuntimeError as e:
                    # torch.save's zip writer reports a write that failed (a full disk) as a RuntimeError
                    # ("unexpected pos", "PytorchStreamWriter failed"): an output not written, not a bug.
                    raise OSError(errno.EIO, f"the write failed: {' '.join(str(e).split())[:200]}",
                                  str(path)) from None
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        os.close(dfd)


def atomic_link(target: Path, link: Path, root: Optional[str | Path] = None) -> None:
    """Point ``link`` at ``target`` (a hard link, swapped in atomically); both in one folder."""
    dfd = _parent_fd(Path(link), root)
    tmp = _temp_name(link)
    try:
        os.link(target.name, tmp, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
        with _removed_on_failure(dfd, tmp):
            os.replace(tmp, link.name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        os.close(dfd)


def open_nofollow(path: Path, flags: int, mode: int = 0o644, root: Optional[str | Path] = None) -> int:
    """``os.open`` that follows no symbolic link: not ``path``'s last component, nor a folder
    between ``root`` and it (created as needed). A file a run opens for writing inside its
    run_dir is the run's own, never one that a link planted there points at."""
    path = Path(path)
    rel = Path() if root is None else path.parent.relative_to(root)
    dfd = open_dir(path.parent if root is None else root, rel, create=bool(flags & os.O_CREAT))
    try:
        return os.open(path.name, flags | os.O_NOFOLLOW, mode, dir_fd=dfd)
    except OSError as e:
        err = _refusal(path, e)
        if isinstance(err, UserError):
            raise err from None
        raise UserError(f"run_dir: cannot open {path}: {e.strerror}") from None
    finally:
        os.close(dfd)


# The names a run writes directly in its run_dir. Checked before Hydra starts: Hydra opens the
# log file itself, and a link found only then could not be refused in one line.
RUN_FILES = ("train.log", "metrics.json", LOCK_NAME, ".hydra", "checkpoints", "progress", "tb")


def refuse_links(run_dir: str | Path) -> None:
    """One line, before anything runs, for a symbolic link where the run writes its own files."""
    for name in RUN_FILES:
        path = Path(run_dir) / name
        if path.is_symlink():
            raise UserError(f"run_dir: {path} is a symbolic link; a run writes only its own files (remove the link)")


class RunLogHandler(QuietFileHandler):
    """Hydra's log file (``run_dir/train.log``), opened without following a link: the run appends
    its log to its own file, never to whatever file a link planted there points at. A disk that
    refuses a line drops the file with one warning, never a traceback (logs.QuietFileHandler)."""

    def _open(self):  # type: ignore[no-untyped-def]
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        return os.fdopen(fd, "a", encoding=self.encoding, errors=self.errors)


def make_run_dir(path: str | os.PathLike[str]) -> None:
    """Create ``run_dir`` (and its parents) now, so a path that cannot exist (a symbolic-link loop,
    a folder under /proc) is one line naming it, exit 2, before Hydra or a leader tries."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UserError(f"run_dir: cannot create {str(path)!r} ({e.strerror or type(e).__name__})") from None


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
        now = datetime.datetime.now().isoformat(timespec="seconds")
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {now}".encode(), 0)
        except OSError as e:  # a full disk: the one line (exit 5) names this file
            os.close(fd)
            raise OSError(e.errno, e.strerror, str(self.path)) from None
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
