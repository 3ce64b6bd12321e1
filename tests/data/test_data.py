"""Datasets, disjoint shards and reproducible batch order (fast tier)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hogwild.config.schema import DataConfig
from hogwild.data.datasets import LAZY_ABOVE, LazyShard, Permutation, ShardSampler, load_dataset, shard
from hogwild.errors import ConfigError


def test_digits_split_is_stratified_and_seeded() -> None:
    a = load_dataset(DataConfig(name="digits"))
    b = load_dataset(DataConfig(name="digits"))
    assert len(a.train) + len(a.test) == 1797 and len(a.test) == 360
    assert torch.equal(a.test.targets, b.test.targets)
    counts = torch.bincount(a.test.targets, minlength=10)
    assert counts.min() >= 34 and counts.max() <= 38  # every class in proportion


def test_digits_upscaled_for_convnet() -> None:
    ds = load_dataset(DataConfig(name="digits", image_size=28))
    assert ds.input_shape == (1, 28, 28)


def test_shards_are_disjoint_and_cover_the_data() -> None:
    parts = [shard(103, 6, i, seed=3) for i in range(6)]
    joined = torch.cat(parts).sort().values
    assert torch.equal(joined, torch.arange(103))


def test_sampler_is_step_addressable() -> None:
    s1, s2 = ShardSampler(torch.arange(50), 8, seed=1), ShardSampler(torch.arange(50), 8, seed=1)
    seq = [s1.batch(i) for i in range(20)]
    # A respawned worker jumping straight to step 13 sees the same batch as one that got there.
    assert torch.equal(s2.batch(13), seq[13])
    assert torch.equal(torch.cat(seq[:7]).sort().values, torch.arange(50))  # one epoch = the shard


@pytest.mark.parametrize("n", [5, 1000, 65537])
def test_a_computed_permutation_takes_every_index_once(n: int) -> None:
    out = Permutation(n, seed=4)(torch.arange(n))
    assert torch.equal(out.sort().values, torch.arange(n)) and not torch.equal(out, torch.arange(n))


def test_shards_of_a_corpus_larger_than_memory_are_computed_not_held() -> None:
    """A 100 GB token file is ~800M blocks of 64 tokens: a list of indices per worker would be 6 GB.
    Its shards are computed (disjoint, each epoch every index of a shard once, step-addressable)."""
    big = shard(800_000_000, 4, 1, seed=0)
    assert isinstance(big, LazyShard) and len(big) == 200_000_000
    sampler, again = ShardSampler(big, 32, seed=2), ShardSampler(big, 32, seed=2)
    assert torch.equal(sampler.batch(6_250_001), again.batch(6_250_001))  # epoch 1, straight there
    assert isinstance(shard(LAZY_ABOVE + 1, 3, 0, seed=1), LazyShard)
    assert not isinstance(shard(LAZY_ABOVE, 3, 0, seed=1), LazyShard)  # every smaller run keeps its order
    n = 10_007  # read whole
    parts = [LazyShard(n, 3, i, seed=1) for i in range(3)]
    joined = torch.cat([p[torch.arange(len(p))] for p in parts]).sort().values
    assert torch.equal(joined, torch.arange(n))
    s = ShardSampler(parts[2], 64, seed=9)
    epoch = torch.cat([s.batch(b) for b in range(s.batches_per_epoch)])
    assert torch.equal(epoch.sort().values, parts[2][torch.arange(len(parts[2]))].sort().values)


def test_npz_with_and_without_test_split(tmp_path: Path) -> None:
    x, y = np.random.rand(50, 3).astype(np.float32), np.arange(50) % 3
    np.savez(tmp_path / "a.npz", X=x, y=y)
    ds = load_dataset(DataConfig(name="npz", path=str(tmp_path / "a.npz")))
    assert len(ds.test) == 10 and ds.num_classes == 3 and ds.input_shape == (3,)
    np.savez(tmp_path / "b.npz", X=x, y=y, X_test=x[:5], y_test=y[:5])
    ds = load_dataset(DataConfig(name="npz", path=str(tmp_path / "b.npz")))
    assert len(ds.train) == 50 and len(ds.test) == 5


def test_npz_images_of_n_x_c_x_h_x_w_train_a_convnet(tmp_path: Path) -> None:
    from hogwild.config.schema import ModelConfig
    from hogwild.replica.models import build_model

    x, y = np.random.rand(40, 1, 8, 8).astype(np.float32), np.arange(40) % 4
    np.savez(tmp_path / "img.npz", X=x, y=y, X_test=x[:8], y_test=y[:8])
    ds = load_dataset(DataConfig(name="npz", path=str(tmp_path / "img.npz")))
    assert ds.input_shape == (1, 8, 8) and ds.num_classes == 4
    model = build_model(ModelConfig(name="convnet"), ds, 0)
    assert model(ds.train.batch(torch.arange(4))[0][0]).shape == (4, 4)
    np.savez(tmp_path / "bad.npz", X=x, y=y, X_test=x[:8, :, :, :4], y_test=y[:8])
    with pytest.raises(ConfigError, match=r"X_test has samples of shape \(1, 8, 4\), X of shape \(1, 8, 8\)"):
        load_dataset(DataConfig(name="npz", path=str(tmp_path / "bad.npz")))


def test_sparse_synthetic_is_sparse_and_learnable_shape() -> None:
    ds = load_dataset(DataConfig(name="sparse_synthetic", num_samples=1000, num_features=4096,
                                 active_features=8))
    idx, val = ds.train.inputs
    assert ds.sparse and idx.shape[1] == 8 and int(idx.max()) < 4096
    assert 0.2 < float(ds.train.targets.float().mean()) < 0.8  # both classes present


def _write_idx(path: Path, arr: np.ndarray, magic: int) -> None:
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in arr.shape)
    path.write_bytes(header + arr.astype(np.uint8).tobytes())


def test_mnist_from_local_idx_files(tmp_path: Path) -> None:
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 30), ("t10k", 10)):
        _write_idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 255, (n, 28, 28)), 2051)
        _write_idx(raw / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, (n,)), 2049)
    ds = load_dataset(DataConfig(name="mnist", root=str(tmp_path)))
    assert len(ds.train) == 30 and len(ds.test) == 10 and ds.input_shape == (1, 28, 28)


def test_missing_mnist_names_path_and_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data\.root: .*data\.download=true"):
        load_dataset(DataConfig(name="mnist", root=str(tmp_path / "nothing")))


def test_a_failed_mnist_download_is_one_line_naming_the_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No network: torchvision raised a RuntimeError that ended in a traceback (exit 70). The
    download is replaced here, so the test never reaches the network either way."""
    import torchvision

    def offline(self: object) -> None:
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz:\nTried mirrors, all failed")
    monkeypatch.setattr(torchvision.datasets.MNIST, "download", offline)
    with pytest.raises(ConfigError, match=r"^data.download: fetching MNIST into .* failed \(RuntimeError: Error "
                                          r"downloading train-images-idx3-ubyte.gz:\); without a network"):
        load_dataset(DataConfig(name="mnist", root=str(tmp_path / "m"), download=True))
