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


@pytest.mark.parametrize("folder", ["progress", "checkpoints", ".hydra", "tb"])
def test_no_file_is_written_through_a_folder_planted_as_a_link(tmp_path: Path, folder: str) -> None:
    from hogwild.checkpoint import store
    from hogwild.report.metrics import Metrics
    from hogwild.report.rundir import record_config

    elsewhere, run_dir = tmp_path / "elsewhere", tmp_path / "run"
    elsewhere.mkdir()
    run_dir.mkdir()
    (run_dir / folder).symlink_to(elsewhere)
    write = {
        "progress": lambda: Board(2, run_dir / "progress" / "rank0.board"),
        "checkpoints": lambda: store.save(run_dir, {"lineage": "abc", "counters": {"steps": 1}}, keep=2),
        ".hydra": lambda: record_config(run_dir, {"a": 1}, ["a=1"]),
        "tb": lambda: Metrics(run_dir, enabled=True),
    }[folder]
    with pytest.raises(UserError, match=rf"^run_dir: .*{folder} is a symbolic link"):
        write()
    assert list(elsewhere.iterdir()) == []


def test_an_atomic_write_replaces_a_planted_link_never_its_target(tmp_path: Path) -> None:
    from hogwild.files import atomic_write

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "metrics.json").symlink_to(victim)
    atomic_write(tmp_path / "metrics.json", lambda f: f.write(b"{}"))
    assert victim.read_text() == "precious"
    assert not (tmp_path / "metrics.json").is_symlink() and (tmp_path / "metrics.json").read_text() == "{}"


def test_the_log_handler_refuses_a_link(tmp_path: Path) -> None:
    from hogwild.files import RunLogHandler

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "train.log").symlink_to(victim)
    with pytest.raises(OSError):
        RunLogHandler(str(tmp_path / "train.log"))
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("planted", ["train.log", "progress", "checkpoints"])
def test_a_run_with_a_link_in_its_run_dir_stops_in_one_line_and_leaves_the_target_alone(
        tmp_path: Path, planted: str) -> None:
    from tests.conftest import compose_cfg, run_cli

    victim, run_dir = tmp_path / "victim", tmp_path / "run"
    run_dir.mkdir()
    if planted == "train.log":
        victim.write_text("precious")
    else:
        victim.mkdir()
    (run_dir / planted).symlink_to(victim)
    says = f"run_dir: {run_dir / planted} is a symbolic link; a run writes only its own files (remove the link)"
    if planted == "train.log":  # Hydra's own log file: the whole command line, exit 2 and its one line
        proc = run_cli([f"run_dir={run_dir}", "train.epochs=1"], cwd=tmp_path, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().splitlines() == [f"hogwild: error: {says}"], proc.stderr
    else:
        # The command line's preflight, in this process: the same check refuses every name the run
        # writes (files.RUN_FILES), and a process per name only imported torch again.
        with pytest.raises(UserError) as e:
            compose_cfg([f"run_dir={run_dir}", "train.epochs=1"])
        assert str(e.value) == says
    assert (victim.read_text() == "precious") if planted == "train.log" else list(victim.iterdir()) == []


def test_a_torch_save_that_fails_midway_is_an_output_not_written_and_leaves_no_temp_file(tmp_path: Path) -> None:
    """torch.save's zip writer reports a full disk as a RuntimeError ("unexpected pos"): hogwild-export
    ended with exit 70, "unexpected ... please report it". It is an OSError now (exit 5 where it
    stops a command), and the half-written temp file is gone."""
    from hogwild.files import atomic_write

    def write(f: object) -> None:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 960 vs 854")

    with pytest.raises(OSError, match="the write failed: .*unexpected pos") as info:
        atomic_write(tmp_path / "w.pt", write)
    assert info.value.filename == str(tmp_path / "w.pt")
    assert list(tmp_path.iterdir()) == []
