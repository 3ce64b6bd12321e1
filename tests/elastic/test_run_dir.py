"""Where an elastic slot writes: the run_dir it was given, or the job's when it was given none
(hogwild/elastic/outputs.py). Slot 0 was given run_dir=.../e0 and wrote into slot 1's .../e1
without a word."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Optional

import pytest

from hogwild.config.env import is_default_run_dir
from hogwild.elastic.outputs import outputs_of
from tests.conftest import REPO, clean_env, metrics
from tests.elastic.helpers import coordinator_thread
from tests.zygote import Zygote

ARGS = ["elastic.replicas=2", "workers=1", "sync.interval=10", "train.max_steps=60", "elastic.peer_timeout_s=2"]


def _job(tmp_path: Path, zygote: Zygote, slot0_run_dir: Optional[Path]) -> str:
    """Slot 1 registers first with run_dir=e1 (the job's), then slot 0 with ``slot0_run_dir``
    (none: the default); both run to the end. Slot 0's log."""
    import torch.distributed as dist

    env = clean_env(OMP_NUM_THREADS="1", LOCAL_WORLD_SIZE="2", PYTHONPATH=str(REPO))
    logs = [tmp_path / f"slot{s}.log" for s in range(2)]
    with coordinator_thread() as port:
        common = [f"elastic.coordinator=127.0.0.1:{port}", *ARGS]
        first = zygote.start("hogwild.cli.train", ["elastic.slot=1", f"run_dir={tmp_path / 'e1'}", *common],
                             cwd=tmp_path, env=env, log=logs[1])
        procs = [first]
        try:
            store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
            deadline = time.monotonic() + 120
            while not store.check(["run_dir"]):  # slot 1's run_dir is the job's
                assert first.poll() is None and time.monotonic() < deadline, logs[1].read_text()[-3000:]
                time.sleep(0.05)
            mine = [f"run_dir={slot0_run_dir}"] if slot0_run_dir is not None else []
            procs.append(zygote.start("hogwild.cli.train", ["elastic.slot=0", *mine, *common], cwd=tmp_path, env=env,
                                      log=logs[0]))
            codes = [p.wait(240) for p in procs]
        finally:
            for p in procs:
                p.kill()
    assert codes == [0, 0], [log.read_text()[-3000:] for log in logs]
    return logs[0].read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_slot_given_its_own_run_dir_writes_there_and_says_so(tmp_path: Path, zygote: Zygote) -> None:
    e0, e1 = tmp_path / "e0", tmp_path / "e1"
    log = _job(tmp_path, zygote, e0)
    said = [line for line in log.splitlines() if "run_dir: slot 0 writes to" in line]
    assert len(said) == 1 and f"writes to {e0}, not to the job's run_dir {e1}" in said[0], log[-3000:]
    # Slot 0 is the lowest slot, the writer: the job's report and checkpoints are where it was told.
    assert metrics(e0)["status"] == "ok"
    assert list((e0 / "checkpoints").glob("*.pt"))
    assert (e0 / "progress" / "rank0.board").exists()
    # And nothing of slot 0's landed in the job's folder.
    assert not (e1 / "metrics.json").exists() and not (e1 / "checkpoints").exists()
    assert not (e1 / "progress" / "rank0.board").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_slot_given_no_run_dir_writes_to_the_jobs(tmp_path: Path, zygote: Zygote) -> None:
    e1 = tmp_path / "e1"
    log = _job(tmp_path, zygote, None)
    assert f"this slot's checkpoints, metrics.json and progress go to the job's run_dir {e1}" in log, log[-3000:]
    assert metrics(e1)["status"] == "ok"
    assert (e1 / "progress" / "rank0.board").exists()
    # Its own default folder (named after its start time) holds its log and nothing else.
    own = [p for p in (tmp_path / "outputs").rglob("*") if p.is_file()]
    assert [p.name for p in own] == ["train.log"], own


def test_the_schemas_default_run_dir_is_told_from_a_chosen_one() -> None:
    assert is_default_run_dir("/home/u/outputs/2026-11-28/11-56-19", {})
    assert is_default_run_dir("outputs/abc123", {"TORCHELASTIC_RUN_ID": "abc123"})
    assert not is_default_run_dir("/shared/exp1", {})
    assert not is_default_run_dir("/home/u/outputs/exp1", {})
    assert not is_default_run_dir("outputs/abc123", {})


def test_a_chosen_run_dir_is_followed_and_a_default_one_adopts_the_jobs(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    job = str(tmp_path / "e1")
    with caplog.at_level("INFO", logger="hogwild.elastic.outputs"):
        assert outputs_of(0, tmp_path / "e0", job, {}) == tmp_path / "e0"
        assert outputs_of(0, tmp_path / "outputs" / "2026-11-28" / "11-56-19", job, {}) == Path(job)
        assert outputs_of(0, Path(job), job, {}) == Path(job)
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]  # the same folder: nothing to say
