"""Files a run opens for writing in its run_dir are its own: a symbolic link planted there (by
whoever redirected the run_dir, or left by a careless script) is refused, never followed."""

from __future__ import annotations

from pathlib import Path

import pytest

from hogwild.errors import UserError
from hogwild.files import LOCK_NAME, RunDirLock
from hogwild.replica.board import Board, previous_attempt


def _planted(tmp_path: Path, name: str) -> tuple[Path, Path]:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    run_dir = tmp_path / "run"
    (run_dir / "progress").mkdir(parents=True)
    (run_dir / name).symlink_to(victim)
    return run_dir, victim


def test_the_run_dir_lock_does_not_follow_a_link(tmp_path: Path) -> None:
    run_dir, victim = _planted(tmp_path, LOCK_NAME)
    with pytest.raises(UserError, match=rf"run_dir: .*{LOCK_NAME} is a symbolic link"):
        RunDirLock(run_dir).acquire()
    assert victim.read_text() == "precious"


def test_the_progress_board_does_not_follow_a_link(tmp_path: Path) -> None:
    run_dir, victim = _planted(tmp_path, "progress/rank0.board")
    assert previous_attempt(run_dir / "progress" / "rank0.board") is None
    with pytest.raises(UserError, match=r"run_dir: .*rank0.board is a symbolic link"):
        Board(2, run_dir / "progress" / "rank0.board")
    assert victim.read_text() == "precious"


def test_a_board_file_is_still_shared_between_processes_views(tmp_path: Path) -> None:
    path = tmp_path / "progress" / "rank0.board"
    board = Board(2, path)
    board.stats["applied"][:] = [3, 4]
    board.control["base_steps"] = 10
    assert previous_attempt(path) == (10.0, 7.0)
    again = Board.__new__(Board)
    again.__setstate__(board.__getstate__())  # a worker's view maps the same file
    assert list(again.stats["applied"]) == [3, 4]
