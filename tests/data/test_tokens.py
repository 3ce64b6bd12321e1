"""``data=tokens``: nanoGPT's train.bin layout, memory-mapped (fast tier, plus one CLI run of a tiny
GPT). Every file is written here, in tmp_path; token ids equal to positions make a block's place in
its file readable off its values."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
import torch

from hogwild.config.schema import DataConfig
from hogwild.data.datasets import load_dataset
from hogwild.data.tokens import RUNS, TokenBlocks, spread
from hogwild.errors import ConfigError
from tests.conftest import REPO, metrics, run_cli

T = 16


def _positions(path: Path, first: int, count: int, dtype: str = "int32") -> Path:
    np.arange(first, first + count, dtype=dtype).tofile(path)
    return path


def _load(path: Optional[str], **kw: Any) -> Any:
    """The Dataset (its splits are MapSplits over TokenBlocks: ``.dataset``, ``.targets``)."""
    return load_dataset(DataConfig(name="tokens", path=path, **{"block_size": T, **kw}))


def _items(ds: TokenBlocks) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [ds[i] for i in range(len(ds))]


@pytest.fixture
def two_files(tmp_path: Path) -> tuple[Path, Path]:
    # 5,000 and 8,001 tokens: neither length divides into blocks, and the ids of file b start far
    # above a's, so a block that crossed from one file into the next would show a jump.
    return _positions(tmp_path / "a.bin", 0, 5000), _positions(tmp_path / "b.bin", 100_000, 8001)


def test_blocks_are_shifted_by_one_and_stay_inside_their_region(two_files: tuple[Path, Path]) -> None:
    a, b = two_files
    ds = _load(f"{a},{b}", dtype="int32", sampling="sequential")
    train, test = ds.train.dataset, ds.test.dataset
    cuts = {0: 5000 - 1000, 100_000: 100_000 + 8001 - 1600}  # each file's first held-out token
    ends = {0: 5000, 100_000: 108_001}
    for split, held_out in ((train, False), (test, True)):
        for x, y in _items(split):
            assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (T,)
            assert torch.equal(y, x + 1)  # the next token at every position, and no jump between files
            base = 0 if x[0] < 100_000 else 100_000
            lo, hi = (cuts[base], ends[base]) if held_out else (base, cuts[base])
            assert lo <= int(x[0]) and int(y[-1]) < hi, (held_out, x[0], y[-1])
    assert ds.input_shape == (T,)


def test_sequential_reads_each_train_block_once_per_epoch(two_files: tuple[Path, Path]) -> None:
    ds = _load(str(two_files[0].parent / "*.bin"), dtype="int32", sampling="sequential")
    starts = [int(x[0]) for x, _ in _items(ds.train.dataset)]
    expected = [*range(0, 3999, T), *range(100_000, 100_000 + 6400, T)]
    expected = [s for s in expected if s + T + 1 <= (4000 if s < 100_000 else 106_401)]
    assert starts == expected and len(ds.train) == (4000 - 1) // T + (6401 - 1) // T


def test_held_out_split_is_disjoint_bounded_and_fixed(two_files: tuple[Path, Path]) -> None:
    a, b = two_files
    full = _load(f"{a},{b}", dtype="int32")
    train_tokens = {int(t) for x, y in _items(full.train.dataset) for t in torch.cat([x, y])}
    test_tokens = {int(t) for x, y in _items(full.test.dataset) for t in torch.cat([x, y])}
    assert train_tokens and test_tokens and not train_tokens & test_tokens
    capped = _load(f"{a},{b}", dtype="int32", test_samples=6)
    again = _load(f"{a},{b}", dtype="int32", test_samples=6, split_seed=9)
    assert len(capped.test) == 6 and torch.equal(capped.test.targets, again.test.targets)
    # The baseline's test labels are the held-out items' own labels.
    assert torch.equal(capped.test.targets, torch.stack([y for _, y in _items(capped.test.dataset)]))
    firsts = capped.test.targets[:, 0]
    assert (firsts < 100_000).any() and (firsts >= 100_000).any()  # spread over both files
    # The label sample behind the baseline is bounded too, and the labels are token sequences.
    assert capped.train.targets.shape == (6, T)
    shuffled = _load(f"{a},{b}", dtype="int32", test_samples=6, sampling="random")
    assert shuffled.train.targets.shape == (6, T) and torch.equal(shuffled.train.targets[:, 1:],
                                                                   shuffled.train.targets[:, :-1] + 1)


@pytest.mark.parametrize("chosen,total", [(1, 1), (1, 9), (5, 5), (RUNS, RUNS), (100, 101), (4096, 12_000_000),
                                          (RUNS + 1, 10 * RUNS), (3000, 3001)])
def test_a_bounded_set_of_blocks_is_runs_spread_from_the_first_block_to_the_last(chosen: int, total: int) -> None:
    blocks = [spread(i, chosen, total) for i in range(chosen)]
    assert blocks == sorted(set(blocks)) and blocks[0] == 0 and blocks[-1] == (total - 1 if chosen > 1 else 0)
    assert sum(b - a > 1 for a, b in zip(blocks, blocks[1:])) <= RUNS - 1  # a few places of the file, not thousands


def test_random_offsets_are_seeded_per_index_and_cover_both_files(two_files: tuple[Path, Path]) -> None:
    a, b = two_files
    ds = _load(f"{a},{b}", dtype="int32", sampling="random", split_seed=3)
    train = ds.train.dataset
    seq = _load(f"{a},{b}", dtype="int32", sampling="sequential").train
    assert len(train) == len(seq)  # an epoch reads as many tokens either way
    starts = np.array([int(train[i][0][0]) for i in range(len(train))])
    in_b = starts >= 100_000
    assert 0.45 < in_b.mean() < 0.8  # b's train part is 62% of all
    assert (starts[~in_b] + T + 1 <= 4000).all() and (starts[in_b] + T + 1 <= 106_401).all()
    assert len(set(starts.tolist())) > 0.8 * len(starts) and not (starts % T == 0).all()
    assert torch.equal(train[57][0], _load(f"{a},{b}", dtype="int32", sampling="random",
                                            split_seed=3).train.dataset[57][0])
    other = _load(f"{a},{b}", dtype="int32", sampling="random", split_seed=4).train.dataset
    assert not all(torch.equal(train[i][0], other[i][0]) for i in range(20))


def test_a_split_pickles_as_paths_and_reopens_its_map(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:  # 64 MB, sparse on disk: the size is what a copy would cost
        f.truncate(64 << 20)
    ds = _load(str(big), block_size=256, sampling="random")
    train = ds.train.dataset
    _ = train.targets, train[5]  # the cached label sample and the open map must not travel
    blob = pickle.dumps(train)
    assert len(blob) < 2000, len(blob)
    back = pickle.loads(blob)
    assert not back._maps and len(back) == len(train)
    assert torch.equal(back[len(back) - 1][0], train[len(train) - 1][0]) and back._maps


def _odd(d: Path) -> str:
    (d / "odd.bin").write_bytes(b"\0" * 1001)
    return str(d / "odd.bin")


def _empty(d: Path) -> str:
    (d / "empty.bin").write_bytes(b"")
    return str(d / "empty.bin")


def _short(d: Path) -> str:
    return str(_positions(d / "short.bin", 0, T, "uint16"))


def _short_held_out(d: Path) -> str:
    return str(_positions(d / "short_test.bin", 0, 60, "uint16"))  # 12 held-out tokens


BAD = [
    ("no path", lambda d: None, "data.path: required for data=tokens"),
    ("no such file", lambda d: str(d / "nope.bin"), "data.path: no such file"),
    ("a glob matching nothing", lambda d: str(d / "*.nothing"), "data.path: no file matches"),
    ("a size that is not a multiple of the dtype", _odd, "1001 bytes is not a multiple of uint16's 2 bytes"),
    ("an empty file", _empty, "is empty (0 bytes)"),
    ("a file shorter than one block", _short, "16 tokens, fewer than data.block_size + 1 = 17"),
    ("a held-out part shorter than one block", _short_held_out, "its held-out part (12 of its 60 tokens"),
]


@pytest.mark.parametrize("name,make,text", BAD, ids=[c[0] for c in BAD])
def test_bad_token_files_are_one_line_naming_the_key_and_file(tmp_path: Path, name: str, make: Any,
                                                               text: str) -> None:
    path = make(tmp_path)
    with pytest.raises(ConfigError) as info:
        _load(path)
    msg = str(info.value)
    assert msg.startswith("data.path: ") and text in msg and "\n" not in msg, msg
    if path and "*" not in path and "nope" not in path:
        assert path in msg


# Seen from a shell: one line, exit 2, no traceback. The file the issue names (a size that is not
# a multiple of the dtype) and a region too short; the rest differ only in their message, checked
# above in this process, and reach the shell by the same path (a ConfigError before any worker).
CLI = [BAD[3], BAD[6]]


@pytest.mark.slow
def test_bad_token_files_exit_2_with_one_line_from_the_cli(tmp_path: Path) -> None:
    for i, (name, make, text) in enumerate(CLI):
        d = tmp_path / str(i)
        d.mkdir()
        path = make(d)
        args = ["data=tokens", f"data.block_size={T}", f"run_dir={d / 'run'}", *([f"data.path={path}"] if path else [])]
        proc = run_cli(args, cwd=d, timeout=120)
        out, err = proc.stdout, proc.stderr
        lines = [ln for ln in err.splitlines() if ln.startswith("hogwild: error:")]
        assert proc.returncode == 2, (name, err[-2000:])
        assert "Traceback" not in out + err and len(lines) == 1, (name, err[-2000:])
        assert lines[0].startswith("hogwild: error: data.path: ") and text in lines[0], (name, lines[0])
        assert not list(d.glob("run/checkpoints/*.pt"))


def _markov_tokens(path: Path, n: int, vocab: int = 64, seed: int = 0) -> None:
    """Mostly ``next = prev + 1``: a bigram a tiny GPT learns in tens of steps, far below the
    unigram's perplexity (about ``vocab``: the ids are near uniform)."""
    rng = np.random.default_rng(seed)
    jump = rng.random(n) < 0.2
    out = np.empty(n, dtype=np.uint16)
    prev = 0
    for i in range(n):
        prev = int(rng.integers(vocab)) if jump[i] else (prev + 1) % vocab
        out[i] = prev
    out.tofile(path)


GPT = ["model._target_=examples.gpt.GPT", "+model.config._target_=examples.gpt.GPTConfig",
       f"+model.config.block_size={T}", "+model.config.vocab_size=64", "+model.config.n_layer=1",
       "+model.config.n_embd=32"]


@pytest.mark.slow
def test_a_tiny_gpt_trains_on_a_token_file_and_beats_the_unigram(tmp_path: Path) -> None:
    _markov_tokens(tmp_path / "train.bin", 40_000)
    run = tmp_path / "run"
    out = run_cli([*GPT, "data=tokens", f"data.path={tmp_path / 'train.bin'}", f"data.block_size={T}",
                   "optim=adamw", "optim.lr=0.01", "train.max_steps=60", "train.batch_size=16", "workers=2",
                   "eval.every_s=60", "checkpoint.every_s=60", f"run_dir={run}"], cwd=REPO, timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    m = metrics(run)
    assert m["status"] == "ok", m
    assert m["test_perplexity"] < 0.7 * m["baseline_perplexity"], (m["test_perplexity"], m["baseline_perplexity"])
