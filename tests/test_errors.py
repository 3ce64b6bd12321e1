"""Every exception that escapes an entry point is one line and a saved traceback (fast tier)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hogwild.errors import EXIT_INTERNAL, ConfigError, Fault, guarded


def test_an_unexpected_exception_is_one_line_naming_the_file_with_its_traceback(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR

    @guarded
    def main() -> None:
        {}["missing"]

    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == EXIT_INTERNAL
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("hogwild: error: unexpected KeyError: 'missing'"), err
    saved = Path(re.search(r"traceback is in (\S+);", lines[0]).group(1))  # type: ignore[union-attr]
    assert saved.parent == tmp_path and "Traceback" in saved.read_text() and 'main\n' in saved.read_text()


@pytest.mark.parametrize("error, code", [(ConfigError("optim.lr: must be > 0"), 2), (Fault("sync: lost"), 3)])
def test_user_errors_and_faults_keep_their_own_line_and_code(capsys: pytest.CaptureFixture[str],
                                                             error: Exception, code: int) -> None:
    @guarded
    def main() -> None:
        raise error

    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == code
    assert capsys.readouterr().err == f"hogwild: error: {error}\n"


class _Boom(BaseException):
    """A user's own exception that is not an Exception: it went past every guard, and a process
    ended with Python's traceback and exit 1 (a factory, an item, a scheduler) or respawned a
    worker until the run ended with exit 0."""


def _boom() -> None:
    raise _Boom("not an Exception")


def test_user_code_raising_a_subclass_of_baseexception_is_still_one_line_naming_where() -> None:
    from hogwild.config.targets import call_target
    from hogwild.errors import StopNow, user_call

    with pytest.raises(ConfigError, match=r"^data: reading item 3 raised _Boom: not an Exception$"):
        with user_call("data: reading item 3"):
            _boom()
    with pytest.raises(ConfigError, match=r"^model\._target_: mine\.net\(\.\.\.\) raised _Boom: not an Exception$"):
        call_target(lambda: _boom(), "mine.net", "model", {}, {})
    with pytest.raises(StopNow):  # a signal's stop during the user's call is no failure of theirs
        with user_call("data: reading item 3"):
            raise StopNow()


def test_the_entry_point_never_prints_a_traceback_for_a_subclass_of_baseexception(
        capsys: pytest.CaptureFixture[str]) -> None:
    @guarded
    def main() -> None:
        _boom()

    with pytest.raises(SystemExit) as info:
        main()
    err = capsys.readouterr().err
    assert info.value.code == EXIT_INTERNAL and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_second_ctrl_c_during_the_users_forward_is_the_forced_exit_not_the_users_sys_exit() -> None:
    """The second SIGINT raises exit 130 from wherever the leader is; it landed once inside the
    leader's evaluation (the user's forward and loss), whose guard took it for the model calling
    sys.exit: exit 2 and "the forward pass and loss on the test set called sys.exit(130)"."""
    import signal
    import sys

    from hogwild.errors import EXIT_SIGINT, ForcedExit, user_call
    from hogwild.leader.stopping import Stopper

    stopper, killed = Stopper(), []
    stopper.workers_started(lambda: killed.append(True))
    stopper._handle(signal.SIGINT, None)  # the first: stop and write a checkpoint, no exception
    with pytest.raises(ForcedExit) as info:
        with user_call("model, loss: the forward pass and loss on the test set"):
            stopper._handle(signal.SIGINT, None)  # the second, as if it landed in the forward
    assert info.value.code == EXIT_SIGINT and killed == [True]
    # The user's own sys.exit in the same place is still named as theirs.
    with pytest.raises(ConfigError, match=r"the forward pass and loss on the test set called sys.exit\(130\)"):
        with user_call("model, loss: the forward pass and loss on the test set"):
            sys.exit(130)
