"""Checkpoint files: lineages, pruning, last.pt, failed writes, safe loading, the run_dir lock,
and the verdict that keeps a bad model out of a checkpoint (fast tier)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

from hogwild.checkpoint import store as checkpoint
from hogwild.checkpoint.health import diverged, loss_bar
from hogwild.config.plan import Plan
from hogwild.errors import EXIT_WRITE, UserError
from hogwild.files import RunDirLock
from hogwild.replica.tasks import chance_accuracy

LONE = Plan("hogwild", False, 1, 1)  # a replica of one Hogwild worker: what these tests build by hand


def _payload(step: int, lineage: str = "aaaa", value: float | None = None) -> dict:
    return {"format": checkpoint.FORMAT, "model": "mlp", "shapes": [[2]], "lineage": lineage,
            "written_at": time.time(), "counters": {"steps": step},
            "flat": torch.full((2,), float(step if value is None else value))}


def _names(run_dir: Path) -> list[str]:
    return sorted(p.name for p in checkpoint.ckpt_dir(run_dir).iterdir())


def test_keeps_last_n_of_its_lineage_and_points_last_at_newest(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        checkpoint.save(tmp_path, _payload(step), keep=2)
    assert _names(tmp_path) == ["last.pt", "step_000000030-aaaa-q000000003.pt", "step_000000040-aaaa-q000000004.pt"]
    assert checkpoint.load(checkpoint.ckpt_dir(tmp_path) / "last.pt")["flat"][0] == 40


def test_a_new_run_never_overwrites_or_prunes_an_older_runs_files(tmp_path: Path) -> None:
    for step in (100, 200):
        checkpoint.save(tmp_path, _payload(step, "old"), keep=1)
    checkpoint.save(tmp_path, _payload(200, "new", value=-1), keep=1)  # resume=false, same step
    assert {"step_000000200-old-q000000002.pt", "step_000000200-new-q000000001.pt"} <= set(_names(tmp_path))
    ckpt, path = checkpoint.load_latest(tmp_path)
    assert ckpt["lineage"] == "new" and path.name == "step_000000200-new-q000000001.pt"


def test_resume_follows_last_pt_not_the_highest_file_number(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, _payload(9000, "old"), keep=3)
    checkpoint.save(tmp_path, _payload(50, "new"), keep=3)
    checkpoint.save(tmp_path, _payload(80, "new"), keep=3)
    ckpt, _ = checkpoint.load_latest(tmp_path)
    assert (ckpt["lineage"], ckpt["counters"]["steps"]) == ("new", 80)


def test_a_later_checkpoint_with_fewer_steps_is_the_newest_and_the_older_ones_are_pruned(tmp_path: Path) -> None:
    """Elastic mode: the job's steps are summed over the current members, so they drop when a
    replica is lost for good. Resume must take the file written last, never roll back to an
    older one with more steps, and pruning must drop the older ones (issue 24, item 3)."""
    checkpoint.save(tmp_path, _payload(300, value=1.0), keep=2)  # three replicas' sum
    checkpoint.save(tmp_path, _payload(200, value=2.0), keep=2)  # a replica gone for good
    checkpoint.save(tmp_path, _payload(250, value=3.0), keep=2)
    ckpt, _ = checkpoint.load_latest(tmp_path)
    assert float(ckpt["flat"][0]) == 3.0 and ckpt["counters"]["steps"] == 250
    assert [p.name for p in checkpoint.candidates(tmp_path)] == [
        "step_000000250-aaaa-q000000003.pt", "step_000000200-aaaa-q000000002.pt"]
    # A new writer (another slot, another attempt) continues the sequence from the files.
    checkpoint.save(tmp_path, {**_payload(100, value=4.0), "seq": 0}, keep=2)
    assert float(checkpoint.load_latest(tmp_path)[0]["flat"][0]) == 4.0


def test_the_newest_is_read_from_the_counters_inside(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, _payload(40), keep=5)
    d = checkpoint.ckpt_dir(tmp_path)
    torch.save(_payload(5), d / "step_000099999-aaaa.pt")  # renamed by hand: the name lies
    (d / "last.pt").unlink()
    ckpt, _ = checkpoint.load_latest(tmp_path)
    assert ckpt["counters"]["steps"] == 40


def test_corrupt_high_numbered_files_neither_win_nor_push_new_checkpoints_out(tmp_path: Path) -> None:
    d = checkpoint.ckpt_dir(tmp_path)
    d.mkdir(parents=True)
    for name in ("step_999999999-aaaa.pt", "step_999999998.pt"):
        (d / name).write_bytes(b"not a checkpoint")
    for step in (10, 20, 30):
        checkpoint.save(tmp_path, _payload(step), keep=2)
    assert {"step_000000020-aaaa-q000000002.pt", "step_000000030-aaaa-q000000003.pt"} <= set(_names(tmp_path))
    ckpt, _ = checkpoint.load_latest(tmp_path)
    assert ckpt["counters"]["steps"] == 30


def test_a_failed_write_is_retried_once_then_a_fault_and_keeps_the_good_files(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, _payload(10), keep=1)
    calls = []

    def full_disk(obj: object, f: object) -> None:
        calls.append(1)
        raise OSError(28, "No space left on device")

    with mock.patch.object(checkpoint.torch, "save", full_disk):
        with pytest.raises(checkpoint.CheckpointWriteError, match="No space left") as e:
            checkpoint.save(tmp_path, _payload(20), keep=1)
    assert len(calls) == 2 and e.value.exit_code == EXIT_WRITE
    assert _names(tmp_path) == ["last.pt", "step_000000010-aaaa-q000000001.pt"], \
        "a temp file was left or a good file lost"


@pytest.mark.parametrize("bad", [
    {"flat": torch.zeros(3)},            # wrong size for the shapes
    {"flat": torch.zeros(1, 2)},         # not flat
    {"shapes": [["x"]]},                 # nonsense shapes
    {"counters": [1, 2]},                # counters not a record
    {"seq": "x"},                        # the fields resume orders by, of the wrong type
    {"written_at": [0]},
    {"counters": {"steps": "many"}},
    {"state_dict": {"fc.weight": "not a tensor"}},   # export wrote it as a state_dict
])
def test_a_damaged_checkpoint_is_one_line_error(tmp_path: Path, bad: dict) -> None:
    torch.save({**_payload(1), **bad}, tmp_path / "x.pt")
    with pytest.raises(checkpoint.CheckpointError, match="damaged"):
        checkpoint.load(tmp_path / "x.pt")


def test_a_checkpoint_with_mistyped_fields_is_skipped_on_resume(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, _payload(10), keep=3)
    bad = {**_payload(20), "seq": 99, "written_at": "late"}  # newest by its sequence, but mistyped
    torch.save(bad, checkpoint.ckpt_dir(tmp_path) / "step_000000020-aaaa-q000000099.pt")
    found = checkpoint.load_latest(tmp_path)
    assert found is not None and found[0]["counters"]["steps"] == 10


def test_refuses_code_in_a_checkpoint(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self):  # noqa: D105 - pickle payload that would run code
            return (print, ("pwned",))

    torch.save({"format": 1, "flat": torch.zeros(1), "x": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(checkpoint.CheckpointError, match="unreadable"):
        checkpoint.load(tmp_path / "evil.pt")


_HOLD = ("import sys,time; from hogwild.files import RunDirLock as L; L(sys.argv[1]).acquire(); "
         "print('held', flush=True); time.sleep(60)")


@pytest.mark.timeout(60)
def test_run_dir_lock_refuses_a_live_holder_and_takes_over_a_dead_ones(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=f"in use by pid {holder.pid} on"):
            RunDirLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()
    lock = RunDirLock(tmp_path)
    lock.acquire()  # the holder died without cleaning up: its lock is gone with it
    assert f"pid {os.getpid()}" in (tmp_path / ".hogwild.lock").read_text()
    lock.release()


def test_verdict_refuses_non_finite_and_diverged_models() -> None:
    bar = loss_bar(2.3, 10)
    assert diverged(True, 0.5, bar) is None
    assert diverged(True, math.nan, bar) is None  # nothing measured yet
    assert "non-finite" in diverged(False, 0.5, bar)
    assert "diverged" in diverged(True, 2.6e26, bar)
    assert "diverged" in diverged(True, math.inf, bar)
    assert chance_accuracy(torch.tensor([0, 1, 1, 1])) == 0.75


def test_a_non_finite_model_is_refused_naming_where_its_nan_values_are() -> None:
    from torch import nn

    from hogwild.checkpoint.health import model_trouble
    from hogwild.replica.shared import layout, share_model

    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
    flat = share_model(model, "cpu")
    slots = layout(model)
    assert model_trouble(flat, slots, 0.5, 10.0) is None
    with torch.no_grad():
        model[0].weight[0, :2] = math.nan
        model[1].running_var[1] = math.inf
    msg = model_trouble(flat, slots, 0.5, 10.0)
    assert msg == "the model holds non-finite values (in 0.weight 2 of 12, 1.running_var 1 of 3)", msg


def test_a_step_that_blew_the_model_up_is_not_written_while_the_loss_average_still_looks_good(
        tmp_path: Path) -> None:
    """The workers' loss average holds the loss measured before the last update. The writer
    judges the values it writes by their own loss, so a good-looking average cannot carry a
    blown-up model over the last good file (checkpoint.keep=1 would have pruned it)."""
    from hogwild.errors import EXIT_FAILED

    model, rep, saver, record = _linear_run(tmp_path)
    assert saver.write(rep, record, loss=1.0) is None
    good = saver.last_good
    with torch.no_grad():
        model.weight.mul_(1e6)  # one update at optim.lr=1e6: finite, and far past the bar
    failed = saver.write(rep, record, loss=1.0)  # the average has not seen a loss of it yet
    assert failed is not None and failed[1] == EXIT_FAILED and failed[0].startswith("the loss diverged"), failed
    assert [n for n in _names(tmp_path) if n.startswith("step_")] == [Path(str(good)).name]
    assert saver.last_good == good


def test_a_model_that_turns_non_finite_while_it_is_written_replaces_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint is written from the live buffer, not a copy: a value that read NaN while the
    file was written must not leave that file as the newest (nor prune the good one), even when the
    live buffer reads finite again by the time the write ends. The file itself is judged."""
    from hogwild.checkpoint import store
    from hogwild.errors import EXIT_FAILED

    model, rep, saver, record = _linear_run(tmp_path)
    assert saver.write(rep, record, loss=1.0) is None
    good = saver.last_good
    real_save = torch.save

    def save_while_a_worker_writes(obj: object, f: object) -> None:
        with torch.no_grad():
            kept = float(model.weight[0, 0])
            model.weight[0, 0] = float("nan")
            real_save(obj, f)  # type: ignore[arg-type]
            model.weight[0, 0] = kept
    monkeypatch.setattr(store.torch, "save", save_while_a_worker_writes)
    failed = saver.write(rep, record, loss=1.0)
    assert failed is not None and failed[1] == EXIT_FAILED, failed
    assert "went non-finite while it was written (in weight 1 of 12)" in failed[0], failed
    assert [n for n in _names(tmp_path) if n.startswith("step_")] == [Path(str(good)).name]
    assert (tmp_path / "checkpoints" / "last.pt").samefile(str(good)) and saver.last_good == good


def _linear_run(tmp_path: Path) -> tuple[Any, Any, Any, Any]:
    """A shared nn.Linear, its replica, a writer into ``tmp_path`` and what the write records."""
    from torch import nn

    from hogwild.checkpoint.saver import Record, Saver
    from hogwild.data.splits import Dataset, Split
    from hogwild.replica.board import Counts
    from hogwild.replica.build import Replica
    from hogwild.replica.shared import share_model
    from hogwild.replica.task import DEFAULT_LOSS, Task

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(100, 4, generator=g), torch.randint(0, 3, (100,), generator=g)
    ds = Dataset(Split((x,), y), Split((x,), y), 3, (4,))
    model = nn.Linear(4, 3)
    rep = Replica(ds, model, share_model(model, "cpu"), None,
                  Task("classification", DEFAULT_LOSS["classification"], 3), LONE)
    saver = Saver(tmp_path, keep=1, lineage="aaaa", model_name="linear")
    saver.loss_bar = loss_bar(1.1, 3)
    return model, rep, saver, Record(torch.zeros(1, 1, dtype=torch.float64), Counts(), {}, {})


def test_a_nan_loss_is_called_nan_not_infinite(tmp_path: Path) -> None:
    from torch import nn

    from hogwild.checkpoint.saver import Record, Saver
    from hogwild.data.splits import Dataset, Split
    from hogwild.replica.board import Counts
    from hogwild.replica.build import Replica
    from hogwild.replica.shared import share_model
    from hogwild.replica.task import DEFAULT_LOSS, Task

    class NaNLoss(nn.Module):  # finite weights whose loss is NaN: model_trouble sees nothing wrong
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) * float("nan")

    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    ds = Dataset(Split((x,), y), Split((x,), y), 3, (4,))
    model = NaNLoss()
    rep = Replica(ds, model, share_model(model, "cpu"), None, Task("classification", DEFAULT_LOSS["classification"], 3),
                  LONE)
    saver = Saver(tmp_path, keep=1, lineage="aaaa", model_name="nan")
    saver.loss_bar = loss_bar(1.1, 3)
    failed = saver.write(rep, Record(torch.zeros(1, 1, dtype=torch.float64), Counts(), {}, {}), loss=1.0)
    assert failed is not None and failed[0].startswith("the loss is NaN"), failed


def test_sizes_below_a_gigabyte_are_said_in_mib() -> None:
    from hogwild.replica.resources import size

    assert size(64 * 2**20) == "64.0 MiB" and size(3 * 2**30) == "3.0 GB"


def test_a_checkpoint_holds_the_model_once(tmp_path: Path) -> None:
    # The file's flat and optimizer state are the buffers handed in, not copies of them: for a model
    # of embedding tables a copy was hundreds of MB at the replica's peak.
    _, rep, saver, record = _linear_run(tmp_path)
    rep.opt_state = state = {"sum": torch.ones(rep.flat.numel())}
    held = saver.payload(rep, record)
    assert held["flat"].data_ptr() == rep.flat.data_ptr()
    assert held["opt_state"]["sum"].data_ptr() == state["sum"].data_ptr()
