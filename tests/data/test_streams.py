"""Streams (data/streams.py): each worker's part of a stream, read from epoch to epoch, found again
after a restart by its saved state or by skipping; and end to end, every sample once per epoch
over 2 replicas x 2 workers, and a run killed halfway resumed with nothing read twice or missed."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from hogwild.checkpoint import store as checkpoint
from hogwild.data.streams import ItemsInMemory, StreamReader, StreamRecords, StreamSplit, encode
from tests.conftest import REPO, clean_env, metrics, ranks, run_cli, wait_training, zygote_of_this_process
from tests.stream_helpers import Numbered, SelfSplitting, StatefulNumbered, batches, first_batches
from tests.zygote import Forked

B = 4


def _ids(reader: StreamReader, index: int) -> list[int]:
    inputs, _ = reader.batch(index)
    return inputs[1].tolist()


def _reader(ds: Any, place: int = 0, places: int = 1, records: StreamRecords | None = None,
            split: str = "round_robin") -> StreamReader:
    return StreamReader(StreamSplit(ds, "train", "auto", split), place, places, B, records)


def test_the_workers_parts_hold_every_sample_once_per_epoch() -> None:
    readers = [_reader(Numbered(50), g, 3) for g in range(3)]
    # 50 samples over 3 workers: parts of 17, 17 and 16, read in batches of 4 across epoch ends.
    seen = [[i for b in range(13) for i in _ids(r, b)] for r in readers]
    first = Counter(i for g, ids in enumerate(seen) for i in ids[:(17 if g < 2 else 16)])
    assert sorted(first) == list(range(50)) and set(first.values()) == {1}
    for g, ids in enumerate(seen):
        n = 17 if g < 2 else 16
        # Worker g keeps the samples at positions g, g + 3, ...; set_epoch reversed epoch 1's order.
        assert ids[:n] == [j for j in range(50) if j % 3 == g]
        assert ids[n:2 * n] == [49 - j for j in range(50) if j % 3 == g]
        assert readers[g].epoch_len == n and readers[g].epoch >= 1


def test_a_dataset_that_splits_itself_is_told_each_workers_place() -> None:
    from torch.utils.data._utils import worker as dl_worker

    try:
        reader = _reader(SelfSplitting(40), 2, 4, split="worker_info")
        ids = [i for b in range(5) for i in _ids(reader, b)]  # 10 samples a part: 2 epochs
        assert ids == [k for k in range(40) if k % 4 == 2] + [39 - k for k in range(40) if k % 4 == 2]
    finally:
        setattr(dl_worker, "_worker_info", None)  # this test process is no DataLoader worker


def test_a_restarted_reader_skips_to_the_very_batch_it_would_have_read() -> None:
    straight = _reader(Numbered(30), 1, 2)
    want = [_ids(straight, b) for b in range(12)]  # 15 samples a part: batches run over 3 epochs
    resumed = _reader(Numbered(30), 1, 2)
    assert [_ids(resumed, b) for b in range(7, 12)] == want[7:]
    assert _ids(resumed, 11) == want[11]  # asked again (the warm-up's batch is the first step's): held


@pytest.mark.parametrize("stateful", [True, False], ids=["state_dict", "skip"])
def test_a_respawned_reader_continues_from_its_predecessors_record(stateful: bool, caplog: Any) -> None:
    records = StreamRecords(1, 2)
    ds = StatefulNumbered(30) if stateful else Numbered(30)
    first = _reader(ds, 0, 2, records)
    want = [_ids(first, b) for b in range(9)]
    caplog.set_level(logging.INFO, "hogwild.data.streams")
    second = _reader(ds, 0, 2, records)
    assert _ids(second, 8) == want[8]  # the record of batch 8 is in the ring (two slots: 8 and 9)
    said = "from its saved state" if stateful else "by skipping"
    assert any(said in r.getMessage() for r in caplog.records), caplog.text


def test_a_record_being_rewritten_is_not_read() -> None:
    records = StreamRecords(2, 2, record_bytes=4096)
    blob = encode({"epoch": 1, "state": {"pos": 3}})
    assert records.write(1, 5, blob) and records.find(1, 5) == blob
    assert records.find(1, 3) is None and records.find(0, 5) is None
    records.head[1, 5 % 2, 0] = 0  # the worker is mid-write
    assert records.find(1, 5) is None
    assert not records.write(1, 6, b"x" * 5000)  # too big: the caller keeps a record without the state


def test_held_items_pickle_as_one_blob() -> None:
    import pickle

    from multiprocessing.reduction import ForkingPickler

    items = ItemsInMemory([(torch.randn(3), torch.tensor(i)) for i in range(300)])
    back = pickle.loads(ForkingPickler.dumps(items))
    assert len(back) == 300 and torch.equal(back[7][0], items[7][0])


def test_a_changed_schema_field_reaches_a_data_factory_that_takes_it(tmp_path: Path) -> None:
    """data.path=FILE reaches load(path): it used to fail with "missing 1 required positional
    argument: 'path'", the field never passed on."""
    from hogwild.data.datasets import load_dataset
    from tests.conftest import compose_cfg

    (tmp_path / "n.txt").write_text("48")
    cfg = compose_cfg(["data._target_=tests.stream_helpers.by_path", f"data.path={tmp_path / 'n.txt'}",
                       f"run_dir={tmp_path / 'run'}"])
    ds = load_dataset(cfg.data)
    assert isinstance(ds.train, StreamSplit) and len(ds.train.head) == 48  # the whole 48-sample stream, read ahead


# ---------------------------------------------------------------------------------------------
# End to end, through the CLI: Hugging Face datasets (the extra), a GPT, 2 replicas x 2 workers.

datasets = pytest.importorskip("datasets", reason="the datasets extra is not installed")

GPT = ["+experiment=gpt", "model.kwargs.config.block_size=16", "model.kwargs.config.n_layer=1",
       "model.kwargs.config.n_embd=32", "model.kwargs.config.n_head=2", "sched.warmup_steps=2",
       "train.batch_size=8", "eval.every_s=1000"]


def _jsonl(path: Path, n: int) -> Path:
    words = "the quick brown fox jumps over a lazy dog while hogwild workers share one model".split()
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": i, "text": " ".join(words[(i + k) % len(words)] for k in range(6))}) + "\n")
    return path


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    return clean_env(OMP_NUM_THREADS="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp / "hf"), **extra)


def _stream_args(tmp: Path, n: int) -> list[str]:
    log = tmp / "log"
    log.mkdir(exist_ok=True)
    return [*GPT, "data._target_=examples.hf_datasets.jsonl_stream", f"data.path={_jsonl(tmp / 'train.jsonl', n)}",
            f"+data.test_path={_jsonl(tmp / 'test.jsonl', 16)}", "data.block_size=16",
            "step._target_=tests.stream_helpers.counting_step", f"+step.log_dir={log}"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_map_style_datasets_dataset_trains_each_sample_once_per_epoch_on_2_replicas(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [*GPT, "data._target_=tests.stream_helpers.numbered_blocks", "+data.n=128",
            "step._target_=tests.stream_helpers.counting_step", f"+step.log_dir={tmp_path / 'log'}"]
    (tmp_path / "log").mkdir()
    proc = ranks(2, [*args, "workers=2", "train.max_steps=16", f"run_dir={out}"], cwd=REPO, env=_env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    seen = Counter(i for worker in batches(tmp_path / "log") for b in worker for i in b)
    assert sorted(seen) == list(range(128)) and set(seen.values()) == {2}, seen


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_text_blocks_example_tokenises_a_local_file_and_trains_the_gpt(tmp_path: Path) -> None:
    """examples/hf_datasets.py's map-style factory, as docs/data.md runs it: load_dataset("text")
    on a local file, cut into blocks by a batched map, offline, the cache under HF_HOME."""
    words = "the quick brown fox jumps over a lazy dog while hogwild workers share one model".split()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join(words[(i + k) % len(words)] for k in range(8)) for i in range(300)) + "\n")
    out = tmp_path / "run"
    proc = run_cli([*GPT, "train.max_steps=300", "data._target_=examples.hf_datasets.text_blocks",
                    f"data.path={corpus}", "data.block_size=16", "workers=2", f"run_dir={out}"],
                   cwd=REPO, env=_env(tmp_path), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = metrics(out)
    assert m["task"] == "language_model" and m["test_perplexity"] < 0.5 * m["baseline_perplexity"], m
    assert (tmp_path / "hf").is_dir()  # the datasets cache stayed under HF_HOME


def _start(args: list[str], cwd: Path, env: dict[str, str], log: Path) -> Forked:
    """The CLI forked from this test process's zygote (tests/zygote.py), output to ``log``, in a
    process group of its own: ``os.killpg`` ends the leader and its workers at once."""
    return zygote_of_this_process().start("hogwild.cli.train", args, cwd, env, log, session=True)


def _resumed_positions(out: Path) -> torch.Tensor:
    """The positions resume=true takes: the newest checkpoint (store.load_latest), which a kill
    between a step file's rename and last.pt's update leaves one ahead of last.pt (the suite saw
    last.pt's positions 2 batches behind a worker's, those 8 lines counted 3 times instead of 4)."""
    latest = checkpoint.load_latest(out)
    assert latest is not None, "no checkpoint to resume from"
    return latest[0]["positions"]


def _kill_when_checkpointed(proc: Forked, out: Path, output: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not list((out / "checkpoints").glob("step_*.pt")):
        assert proc.poll() is None, output.read_text()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint within the timeout"
        time.sleep(0.05)
    time.sleep(0.5)  # and some steps past it: those are read again after the resume
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_killed_halfway_resumes_with_no_sample_read_twice_or_missed(tmp_path: Path) -> None:
    """1 x 2 workers on a plain IterableDataset, killed (SIGKILL, the whole process group) after a
    checkpoint; the resumed run's batches and the killed run's batches up to the checkpoint's
    positions hold every sample exactly four times (4 epochs): the batches read after the checkpoint
    are read again, as docs/data.md says. (A ``datasets`` stream resumed from its saved state, and
    by skipping, is the 2 x 2 job below: its rank 0 is this job's leader with a stateful stream.)"""
    out, log = tmp_path / "run", tmp_path / "log"
    log.mkdir()
    args = ["data._target_=tests.stream_helpers.numbered", "+data.n=64", "model._target_=tests.stream_helpers.Net",
            "train.batch_size=8", "step._target_=tests.stream_helpers.counting_step", f"+step.log_dir={log}"]
    # 64 samples, 2 workers: 4 batches of 8 an epoch; 4 epochs are 32 batches. Slow steps (150 ms)
    # leave time to kill it halfway.
    common = [*args, "workers=2", "train.max_steps=32", "checkpoint.every_s=0.2", "eval.every_s=1000",
              f"run_dir={out}"]
    proc = _start(common, REPO, _env(tmp_path, HOGWILD_FAULT="slow:0:150,slow:1:150"), tmp_path / "killed.log")
    wait_training(out, proc)
    _kill_when_checkpointed(proc, out, tmp_path / "killed.log")
    start = _resumed_positions(out)[0].tolist()  # what resume=true takes
    killed = {tuple(b[0] % 2 for b in w[:1]): w for w in batches(log)}
    for p in log.glob("*.jsonl"):
        p.rename(p.with_suffix(".killed"))
    again = run_cli([*common, "resume=true"], cwd=REPO, env=_env(tmp_path), timeout=240)
    assert again.returncode == 0, again.stderr[-4000:]
    assert 0 < sum(start) < 32, start  # killed halfway
    kept = [i for (g,), w in killed.items() for i in first_batches(w, int(start[g]), 8)]
    seen = Counter(kept + [i for w in batches(log) for b in w for i in b])
    assert sorted(seen) == list(range(64)) and set(seen.values()) == {4}, (start, seen)
    assert "by skipping" in again.stderr + again.stdout
    # Resumed once more, the finished run trains nothing, and its workers are still in epoch 3
    # (a warm-up that read past the quota began epoch 4).
    assert metrics(out)["stream_epochs"] == [3, 3]
    lines = sum(len(w) for w in batches(log))
    done = run_cli([*common, "resume=true"], cwd=REPO, env=_env(tmp_path), timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    assert sum(len(w) for w in batches(log)) == lines and metrics(out)["stream_epochs"] == [3, 3]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_worker_killed_mid_run_is_respawned_and_continues_its_own_part(tmp_path: Path) -> None:
    """SIGKILL one worker of 1 x 2 on a stateful stream: its respawn finds its predecessor's state
    at the position on the board and goes on from there. Its predecessor's batches up to that
    position and its own hold its part exactly four times (4 epochs); the other worker's, too."""
    import re

    from tests.conftest import worker_pids

    out, log = tmp_path / "run", tmp_path / "log"
    log.mkdir()
    args = ["data._target_=tests.stream_helpers.numbered", "+data.n=64", "+data.stateful=true",
            "model._target_=tests.stream_helpers.Net", "train.batch_size=8", "workers=2", "train.max_steps=32",
            "step._target_=tests.stream_helpers.counting_step", f"+step.log_dir={log}", "eval.every_s=1000",
            f"run_dir={out}"]
    output = tmp_path / "run.log"
    proc = _start(args, REPO, _env(tmp_path, HOGWILD_FAULT="slow:0:150,slow:1:150"), output)
    wait_training(out, proc)
    time.sleep(0.6)
    victims = worker_pids(proc.pid)
    assert len(victims) == 2
    os.kill(victims[0], signal.SIGKILL)
    proc.wait(240)
    text = output.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert metrics(out)["worker_restarts"] == 1
    resumed = [int(n) for n in re.findall(r"stream resumed at batch (\d+) \(epoch \d+\) from its saved state", text)]
    assert len(resumed) == 1 and 0 < resumed[0] < 16, text[-3000:]
    logs = {int(p.stem): [json.loads(line) for line in p.read_text().splitlines()] for p in log.glob("*.jsonl")}
    dead = first_batches(logs.pop(victims[0]), resumed[0], 8)  # what the board says it had trained on
    seen = Counter(dead) + Counter(i for w in logs.values() for b in w for i in b)
    assert sorted(seen) == list(range(64)) and set(seen.values()) == {4}, (resumed, seen)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_2_by_2_stream_job_killed_halfway_resumes_every_worker_where_the_checkpoint_says(tmp_path: Path) -> None:
    """A datasets stream of JSON lines trains the GPT on 2 replicas x 2 workers, split by
    split_dataset_by_node. Both replicas SIGKILLed after a checkpoint, then resumed: rank 0's
    workers from the stream states the checkpoint holds, rank 1's by skipping to the positions it
    holds for them. Counted from those positions, each of the 128 lines is trained on exactly four
    times (4 epochs), none read twice or missed."""
    from tests.conftest import free_port

    out, log = tmp_path / "run", tmp_path / "log"
    # Rounds every 4 replica steps bring the checkpoints, each with every replica's positions.
    # Steps of 0.4 s or more: 16 a worker leave seconds between the first such checkpoint and the
    # end, so a loaded machine's late look at it still kills the job halfway (150 ms did not on CI).
    common = [*_stream_args(tmp_path, 128), "workers=2", "train.max_steps=32", "checkpoint.every_s=0.2",
              "sync.interval=4", f"run_dir={out}"]
    port, procs = free_port(), []
    for rank in range(2):
        env = _env(tmp_path, HOGWILD_FAULT="slow:0:400,slow:1:400,slow:2:400,slow:3:400", RANK=str(rank),
                   WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        procs.append(_start(common, REPO, env, tmp_path / f"rank{rank}.log"))
    wait_training(out, procs[0])
    deadline = time.monotonic() + 120

    def both_placed() -> bool:  # a checkpoint that a round brought: it holds rank 1's positions too
        try:
            return bool(checkpoint.load(out / "checkpoints" / "last.pt")["positions"][1].sum() > 0)
        except Exception:  # noqa: BLE001 - not written yet, or being replaced
            return False

    while not both_placed():
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, "no such checkpoint"
        time.sleep(0.05)
    time.sleep(0.3)
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    start = _resumed_positions(out).reshape(-1).tolist()
    assert 0 < sum(start[:2]) and 0 < sum(start[2:]) and sum(start) < 64, start  # both replicas, halfway
    killed = {w[0][0] % 4: w for w in batches(log) if w}  # worker g reads lines g, g + 4, ... (by_node)
    for p in log.glob("*.jsonl"):
        p.rename(p.with_suffix(".killed"))
    again = ranks(2, [*common, "resume=true"], cwd=REPO, env=_env(tmp_path))
    assert again.returncode == 0, again.stderr[-4000:]
    kept = [i for g, w in killed.items() for i in first_batches(w, int(start[g]), 8)]
    seen = Counter(kept + [i for w in batches(log) for b in w for i in b])
    assert sorted(seen) == list(range(128)) and set(seen.values()) == {4}, (start, seen)
    assert "from its saved state" in again.stderr and "by skipping" in again.stderr
    m = metrics(out)  # 16 batches of 4 a worker's epoch: each of rank 0's workers is in epoch 3
    assert m["stream_epochs"] == [3, 3] and m["compile"] == "off" and m["steps"] == 64
