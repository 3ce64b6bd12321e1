"""User errors, faults and their exit codes: the one module both CLIs and the leader share.

A :class:`UserError` is something the user can fix (a key, a file, the environment, too little
shared memory, an unreachable rendezvous) and exits 2. A :class:`Fault` is a run that could
not go on (workers dying past the bound, a lost peer) and exits 3. Both reach the console as
one line, never a traceback (docs/design.md, "Exit codes").
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, Iterator, NoReturn, Optional, TypeVar

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_FAULT = 3
EXIT_FAILED = 4  # the run finished, but training failed: loss diverged or updates mostly skipped
EXIT_WRITE = 5  # a checkpoint or metrics.json could not be written (full disk, no permission)
EXIT_INTERNAL = 70  # an unexpected exception (BSD's EX_SOFTWARE): one line, the traceback saved to a file
EXIT_SIGINT = 130
EXIT_SIGTERM = 143


class UserError(ValueError):
    """A user mistake: reported in one line that names the key or file, exit code 2."""

    exit_code = EXIT_USAGE


class ConfigError(UserError):
    """A bad configuration value or input file."""


class Fault(RuntimeError):
    """The run cannot go on: reported in one line, exit code 3."""

    exit_code = EXIT_FAULT


class WriteFailed(Fault):
    """A file of the run could not be written (a full disk, no permission, a file where a folder
    must be): one line, exit code 5, wherever it happened."""

    exit_code = EXIT_WRITE

    @classmethod
    def of(cls, e: OSError) -> "WriteFailed":
        where = f" {e.filename}" if e.filename else ""
        return cls(f"run_dir: cannot write{where}: {e.strerror or first_line(e)}")


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (or its type name): one-line errors."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def say_error(msg: str) -> None:
    say(f"hogwild: error: {' '.join(msg.split())}")


def say(line: str) -> None:
    """One line on stderr. A stderr redirected to a full disk loses it, but never turns the exit
    code it goes with into a traceback and exit 1."""
    try:
        sys.stderr.write(f"{line}\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # ValueError: stderr closed
        pass


def note(e: BaseException, text: str) -> None:
    """Add ``text`` to ``e``'s notes (``add_note`` of Python 3.11, by hand before it): where in the
    user's code it was raised (an item's index), kept with the exception's own type and message."""
    try:
        notes = getattr(e, "__notes__", None)
        if not isinstance(notes, list):
            notes = []
            e.__notes__ = notes  # type: ignore[attr-defined]
        notes.append(text)
    except (AttributeError, TypeError):  # an exception type that takes no attributes
        pass


def report(e: UserError | Fault) -> NoReturn:
    """One line on stderr, no traceback, the error's exit code."""
    say_error(str(e))
    raise SystemExit(e.exit_code)


class StopNow(Exception):
    """SIGINT/SIGTERM before any worker exists (or while a group forms): unwinds the set-up.
    Here, not in the leader, because the elastic membership raises it too."""


class ForcedExit(SystemExit):
    """The second Ctrl-C: the leader leaves at once with :data:`EXIT_SIGINT`, from wherever it
    is. It may land inside a call into the user's code (the leader's evaluation runs the model's
    forward and loss), whose guard must pass it on, not take it for the user's code leaving: a
    guard that did ended a forced exit with exit 2 and "the forward pass ... called sys.exit(130)"."""


F = TypeVar("F", bound=Callable[..., object])


def save_traceback(e: BaseException, folder: Optional[Path] = None) -> Path:
    """Write ``e``'s full traceback to ``folder`` (the run directory, when one exists) or the
    temp folder; the file's path."""
    name = f"hogwild-crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    for where in (folder, Path(tempfile.gettempdir())):
        if where is None:
            continue
        path = where / name
        try:
            path.write_text("".join(traceback.format_exception(type(e), e, e.__traceback__)))
            return path
        except OSError:  # a full or read-only disk: no half-written file is left there, the next place is tried
            with contextlib.suppress(OSError):
                path.unlink()
            continue
    return Path("/dev/null")


def crash(e: BaseException, folder: Optional[Path] = None) -> NoReturn:
    """An exception nobody expected: one line naming it and the file that holds the traceback,
    exit :data:`EXIT_INTERNAL`. Never a raw traceback on the console."""
    path = save_traceback(e, folder)
    say_error(f"unexpected {type(e).__name__}: {first_line(e)} (the full traceback is in {path}; "
              "please report it)")
    raise SystemExit(EXIT_INTERNAL)


def escaped(e: BaseException, where: str) -> Optional[ConfigError]:
    """A ``SystemExit`` or ``KeyboardInterrupt`` raised by the user's code (a forward pass, a loss,
    a dataset item) as one line naming ``where``; None for any other exception. hogwild's own
    signals never arrive this way: the leader's SIGINT/SIGTERM handlers raise :class:`StopNow`
    or :class:`ForcedExit`, which every guard passes on, and workers ignore both, so such an
    exception is the user's code leaving, and a process that trained nothing must not exit 0 or
    die of a signal it never got."""
    if isinstance(e, SystemExit):
        return ConfigError(f"{where} called sys.exit({e.code!r}) instead of returning")
    if isinstance(e, KeyboardInterrupt):
        return ConfigError(f"{where} raised KeyboardInterrupt without a signal")
    return None


# What passes a guard around the user's code unchanged: hogwild's own check, a signal's stop or
# forced exit, a generator closing. SystemExit and KeyboardInterrupt are the user's code leaving (see escaped);
# anything else the user's code raises is its failure, even a subclass of BaseException.
PASSES = (UserError, StopNow, ForcedExit, GeneratorExit)


@contextlib.contextmanager
def user_call(where: str, errors: bool = True) -> Iterator[None]:
    """The one guard around a call into the user's code (a factory, a dataset item, collate, a
    forward, a loss, a step, a scheduler, an optimizer), ``where`` naming the key and the call:
    ``SystemExit`` or ``KeyboardInterrupt`` becomes one line (see :func:`escaped`) and, with
    ``errors``, any other exception too ("WHERE raised TypeError: ..."), exit 2. A
    :class:`UserError` raised inside (hogwild's own check) passes unchanged."""
    try:
        yield
    except PASSES:
        raise
    except (SystemExit, KeyboardInterrupt) as e:
        raise escaped(e, where) from None  # type: ignore[misc]
    # BaseException: the user's own subclass of it (not an Exception) went past every guard and
    # ended the process with a raw traceback and exit 1.
    except BaseException as e:  # noqa: BLE001 - the user's code failed: say where, in one line
        if not errors:
            raise
        raise ConfigError(f"{where} raised {type(e).__name__}: {first_line(e)}") from None


def guarded(fn: F) -> F:
    """A console script's entry point: user errors and faults are one line with their exit
    code; anything else goes through :func:`crash`. SystemExit and KeyboardInterrupt pass."""
    @functools.wraps(fn)
    def run(*args: object, **kwargs: object) -> object:
        try:
            return fn(*args, **kwargs)
        except (UserError, Fault) as e:
            report(e)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as e:  # noqa: BLE001 - the one place every escaping exception is caught
            crash(e)
    return run  # type: ignore[return-value]
