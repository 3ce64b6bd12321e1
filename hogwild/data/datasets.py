"""Dataset registry, disjoint worker shards and step-addressable batch order.

Every dataset is loaded once by the leader into tensors that are moved to shared memory,
so K workers on a machine hold one copy, not K.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Callable, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from hogwild.config.registry import DATASETS
from hogwild.config.schema import DataConfig
from hogwild.data.items import CHECK_CHUNK, FLOAT32_MAX, too_large
from hogwild.data.splits import Dataset, Split
from hogwild.errors import ConfigError, first_line

__all__ = ["Dataset", "Split", "ShardSampler", "load_dataset", "shard"]

logger = logging.getLogger(__name__)


Loader = Callable[[DataConfig], Dataset]
Size = Callable[[DataConfig], Optional[int]]


@dataclass(frozen=True)
class Builtin:
    """A built-in dataset, chosen by ``data.name``: its loader, and the float32 bytes it will hold
    once loaded, known before it loads (the memory check reads them; None: not known cheaply)."""

    load: Loader
    nbytes: Size

    def __call__(self, cfg: DataConfig) -> Dataset:
        return self.load(cfg)


def register(name: str, nbytes: Size = lambda cfg: None) -> Callable[[Loader], Loader]:
    """The config check reads the same registry."""
    def add(load: Loader) -> Loader:
        DATASETS.register(name)(Builtin(load, nbytes))
        return load
    return add


def _images(n: int, side: int, channels: Optional[int] = None) -> Size:
    """``n`` images ``side`` pixels square (``data.image_size`` resizes them) of ``channels``
    (None: ``data.channels``)."""
    return lambda cfg: n * (channels or cfg.channels) * (cfg.image_size or side) ** 2 * 4


def load_dataset(cfg: DataConfig) -> Dataset:
    from hogwild.data.mapped import load_target

    name = cfg._target_ or cfg.name
    ds = load_target(cfg) if cfg._target_ else DATASETS.get(cfg.name)(cfg)
    for split_name, split in (("train", ds.train), ("test", ds.test)):
        if len(split) == 0:
            raise ConfigError(f"data: the {split_name} split of {name!r} is empty")
    train = "a stream of" if getattr(ds.train, "stream", False) else f"{len(ds.train)}"
    logger.info("data %s: %s train / %d test samples, %d classes, input %s",
                name, train, len(ds.test), ds.num_classes, ds.input_shape)
    return ds


def _split(x: Tensor, y: Tensor, fraction: float, seed: int, stratify: bool = True) -> tuple[Split, Split]:
    """Seeded test split of ``ceil(fraction * n)`` samples, stratified by class: every class
    gives its share (largest remainders first), so a small test set still sees each class."""
    n = len(y)
    n_test = min(n - 1, max(1, math.ceil(fraction * n))) if n > 1 else 0
    rng = np.random.default_rng(seed)
    labels = y.numpy() if stratify else np.zeros(n, dtype=np.int64)
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * (n_test / n)
    take = np.floor(exact).astype(np.int64)
    for i in np.argsort(-(exact - take), kind="stable")[:n_test - int(take.sum())]:
        take[i] += 1
    test_idx = [rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in zip(classes, take)]
    is_test = np.zeros(n, dtype=bool)
    is_test[np.concatenate(test_idx)] = True
    tr_t, te_t = torch.from_numpy(np.flatnonzero(~is_test)), torch.from_numpy(np.flatnonzero(is_test))
    return Split((x[tr_t],), y[tr_t]), Split((x[te_t],), y[te_t])


def _resize(x: Tensor, size: int) -> Tensor:
    if size <= 0 or size == x.shape[-1]:
        return x
    return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits (1,797 images, no download), read straight from its
    file: importing sklearn pulls in scipy, over a second of every run's start-up."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz") \
        if spec and spec.submodule_search_locations else ""
    if not os.path.isfile(path):  # a layout we do not know: the public API finds it
        from sklearn.datasets import load_digits

        d = load_digits()
        return d.images, d.target
    table = np.loadtxt(path, delimiter=",")
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)


@register("digits", _images(1797, 8))
def _digits(cfg: DataConfig) -> Dataset:
    images, labels = _digits_arrays()
    x = torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = _resize(x, cfg.image_size)
    x = ((x - 0.5) / 0.5).expand(-1, cfg.channels, -1, -1).contiguous()
    y = torch.tensor(labels, dtype=torch.int64)
    train, test = _split(x, y, cfg.test_fraction, cfg.split_seed)
    return Dataset(train, test, 10, tuple(x.shape[1:]))


def _torchvision(cfg: DataConfig, cls_name: str, mean: float, std: float) -> Dataset:
    import torchvision

    cls = getattr(torchvision.datasets, cls_name)
    root = os.path.expanduser(cfg.root)
    splits = []
    for train in (True, False):
        try:
            ds = cls(root=root, train=train, download=cfg.download)
        except (RuntimeError, OSError) as e:
            if "not found" in str(e).lower() or "corrupted" in str(e).lower():
                raise ConfigError(
                    f"data.root: {cls_name} files not found under {os.path.abspath(root)!r}; "
                    f"put them there or pass data.download=true") from None
            if cfg.download:  # no network (every mirror failed), or a root that cannot be written
                raise ConfigError(
                    f"data.download: fetching {cls_name} into {os.path.abspath(root)!r} failed "
                    f"({type(e).__name__}: {first_line(e)}); without a network, copy the files there and "
                    "leave data.download=false") from None
            raise
        data = torch.as_tensor(np.asarray(ds.data))
        if data.ndim == 4:  # CIFAR stores NHWC uint8
            data = data.permute(0, 3, 1, 2)
        else:
            data = data.unsqueeze(1)
        x = (data.float() / 255.0 - mean) / std
        x = _resize(x, cfg.image_size)
        y = torch.as_tensor(np.asarray(ds.targets), dtype=torch.int64)
        splits.append(Split((x.contiguous(),), y))
    return Dataset(splits[0], splits[1], 10, tuple(splits[0].inputs[0].shape[1:]))


@register("mnist", _images(70000, 28, 1))
def _mnist(cfg: DataConfig) -> Dataset:
    return _torchvision(cfg, "MNIST", 0.1307, 0.3081)


@register("fashion_mnist", _images(70000, 28, 1))
def _fashion(cfg: DataConfig) -> Dataset:
    return _torchvision(cfg, "FashionMNIST", 0.2860, 0.3530)


@register("cifar10", _images(60000, 32, 3))
def _cifar(cfg: DataConfig) -> Dataset:
    return _torchvision(cfg, "CIFAR10", 0.4734, 0.2516)


def array_beyond_float32(x: np.ndarray) -> Optional[float]:
    """The first finite value of a float array wider than float32 (float64, longdouble) that
    float32 cannot hold, else None; read in chunks along the first axis, never copied whole."""
    if x.dtype.kind != "f" or x.dtype.itemsize <= 4 or x.size == 0:
        return None
    rows = max(1, CHECK_CHUNK // max(1, x.size // len(x)))
    for start in range(0, len(x), rows):
        part = x[start:start + rows]
        over = np.abs(part) > FLOAT32_MAX
        over &= np.isfinite(part)
        if over.any():
            return float(part[over][0])
    return None


def _npz_array(z: "np.lib.npyio.NpzFile", key: str, path: str) -> np.ndarray:
    try:
        return np.asarray(z[key])
    except Exception as e:  # noqa: BLE001 - a broken member is a user file problem
        raise ConfigError(f"data.path: {path}: array {key!r} is unreadable ({type(e).__name__})") from None


def _npz_pair(z: "np.lib.npyio.NpzFile", xk: str, yk: str, path: str) -> tuple[Tensor, Tensor]:
    x, y = _npz_array(z, xk, path), _npz_array(z, yk, path)
    if x.ndim < 2 or 0 in x.shape:
        raise ConfigError(f"data.path: {path}: {xk} must be a non-empty N x ... array (N x D features, or "
                          f"N x C x H x W images), got shape {x.shape}")
    if y.ndim != 1:
        raise ConfigError(f"data.path: {path}: {yk} must be a 1-D label array, got shape {y.shape}")
    if len(x) != len(y):
        raise ConfigError(f"data.path: {path}: {xk} has {len(x)} rows but {yk} has {len(y)} labels")
    if not np.issubdtype(x.dtype, np.number):
        raise ConfigError(f"data.path: {path}: {xk} must be numeric, got dtype {x.dtype}")
    if not np.isfinite(x).all():
        raise ConfigError(f"data.path: {path}: {xk} contains NaN or Inf values")
    bad = array_beyond_float32(x)
    if bad is not None:  # before the float32 copy below, which would hold inf there
        raise ConfigError(too_large(f"data.path: {path}", xk, bad))
    if not np.issubdtype(y.dtype, np.integer) or (y < 0).any():
        raise ConfigError(f"data.path: {path}: {yk} must hold non-negative integer class labels")
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.int64)


def _npz_bytes(cfg: DataConfig) -> Optional[int]:
    if not (cfg.path and os.path.isfile(cfg.path)):
        return None
    try:
        with np.load(cfg.path, allow_pickle=False, mmap_mode="r") as z:
            return sum(int(math.prod(z[k].shape)) * 4 for k in z.files if k.startswith("X"))
    except Exception:  # noqa: BLE001 - the loader reports a bad file in its own words
        return None


@register("npz", _npz_bytes)
def _npz(cfg: DataConfig) -> Dataset:
    path = os.path.expanduser(cfg.path or "")
    if not os.path.isfile(path):
        raise ConfigError(f"data.path: no such file {path!r}")
    try:
        z = np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - any unreadable file is a user error
        raise ConfigError(f"data.path: {path} is not a readable .npz file ({type(e).__name__})") from None
    with z:
        missing = [k for k in ("X", "y") if k not in z.files]
        if missing:
            raise ConfigError(f"data.path: {path} lacks array(s) {', '.join(missing)} (needs X and y)")
        x, y = _npz_pair(z, "X", "y", path)
        if "X_test" in z.files or "y_test" in z.files:
            xt, yt = _npz_pair(z, "X_test", "y_test", path)
            if xt.shape[1:] != x.shape[1:]:
                raise ConfigError(f"data.path: {path}: X_test has samples of shape {tuple(xt.shape[1:])}, "
                                  f"X of shape {tuple(x.shape[1:])}")
            train, test = Split((x,), y), Split((xt,), yt)
        else:
            if len(y) < 2:
                raise ConfigError(f"data.path: {path}: needs at least 2 samples to hold out a test split")
            train, test = _split(x, y, cfg.test_fraction, cfg.split_seed)
    num_classes = int(max(int(train.targets.max()), int(test.targets.max())) + 1)
    return Dataset(train, test, max(num_classes, 2), tuple(x.shape[1:]))


@register("sparse_synthetic", lambda cfg: cfg.num_samples * cfg.active_features * 12)  # int64 index + float32 value
def _sparse_synthetic(cfg: DataConfig) -> Dataset:
    """RCV1-like: ``active_features`` of ``num_features`` non-zero, labels from a hidden model."""
    g = torch.Generator().manual_seed(cfg.split_seed)
    n, f, a, c = cfg.num_samples, cfg.num_features, cfg.active_features, cfg.num_classes
    # Zipf feature popularity, as in text: a few hot features, a long cold tail. The hidden
    # weights scale with sqrt(popularity) so the signal sits where the data is (a linear
    # model can learn it from 16k samples of 2^18 features); labels are quantiles of the
    # hidden score, so classes are balanced.
    popularity = 1.0 / torch.arange(1, f + 1, dtype=torch.float64)
    idx = torch.multinomial(popularity.float(), n * a, replacement=True, generator=g).view(n, a)
    val = torch.rand(n, a, generator=g) / math.sqrt(a)
    w_true = torch.randn(f, generator=g) * (popularity / popularity[0]).float().sqrt()
    score = (w_true[idx] * val).sum(1)
    y = torch.bucketize(score, score.quantile(torch.linspace(0, 1, c + 1)[1:-1]))
    n_test = max(1, int(n * cfg.test_fraction))
    perm = torch.randperm(n, generator=g)
    te, tr = perm[:n_test].sort().values, perm[n_test:].sort().values
    return Dataset(Split((idx[tr], val[tr]), y[tr]), Split((idx[te], val[te]), y[te]), c, (f,), sparse=True)


# Above this many samples a shard is not held as a list of indices: a worker's shard and its epoch's
# shuffle cost 8 bytes a sample each, and the permutation they are cut from 8 bytes a sample of the
# whole dataset, per worker: 6 GB per worker for a 100 GB token file. Below it, the lists are cheap
# and keep the orders every earlier run used.
LAZY_ABOVE = 1 << 22


class Permutation:
    """A seeded pseudo-random permutation of ``range(n)`` computed index by index in O(1) memory:
    a four-round Feistel network over the smallest even-bit power of two holding ``n`` (a bijection
    whatever its round function), walked until it lands below ``n`` (at most a few steps: the
    domain is under 4n)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        bits = max(2, (n - 1).bit_length())
        self.half = (bits + 1) // 2
        self.mask = (1 << self.half) - 1
        gen = torch.Generator().manual_seed(seed)
        self.keys = torch.randint(0, 1 << 31, (4,), generator=gen).tolist()

    def _round(self, r: Tensor, key: int) -> Tensor:
        # int64 products wrap around, which is all a round function needs.
        h = (r * 0x9E3779B1 + key) & 0xFFFFFFFF
        h = (h ^ (h >> 15)) * 0x2C1B3C6D & 0xFFFFFFFF
        return (h ^ (h >> 12)) & self.mask

    def _once(self, x: Tensor) -> Tensor:
        left, right = x >> self.half, x & self.mask
        for key in self.keys:
            left, right = right, left ^ self._round(right, key)
        return (left << self.half) | right

    def __call__(self, idx: Tensor) -> Tensor:
        out = self._once(idx.long())
        outside = out >= self.n
        while bool(outside.any()):
            out[outside] = self._once(out[outside])
            outside = out >= self.n
        return out


class LazyShard:
    """Shard ``g`` of ``G`` of a seeded permutation of ``range(n)``, as :func:`shard` cuts it, with
    its indices computed when asked for: element ``j`` is ``perm(g + j * G)``."""

    def __init__(self, n: int, num_shards: int, shard_id: int, seed: int) -> None:
        self.perm = Permutation(n, seed)
        self.num_shards, self.shard_id = num_shards, shard_id
        self.size = -(-(n - shard_id) // num_shards)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, j: Tensor) -> Tensor:
        return self.perm(self.shard_id + j.long() * self.num_shards)


def shard(n: int, num_shards: int, shard_id: int, seed: int) -> Union[Tensor, LazyShard]:
    """Disjoint, seeded shard ``shard_id`` of ``range(n)``: shards of all workers of all replicas."""
    if num_shards > n:
        raise ConfigError(f"workers: {num_shards} workers in the job but only {n} training samples")
    if n > LAZY_ABOVE:
        return LazyShard(n, num_shards, shard_id, seed)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[shard_id::num_shards].clone()


class ShardSampler:
    """Batch ``step`` of a shard, reproducibly: a restarted worker resumes at its step count."""

    def __init__(self, shard_idx: Union[Tensor, LazyShard], batch_size: int, seed: int) -> None:
        self.shard = shard_idx
        self.batch_size = min(batch_size, len(shard_idx))
        self.seed = seed
        # A trailing batch of one sample is dropped: BatchNorm cannot train on it.
        full, rest = divmod(len(shard_idx), self.batch_size)
        self.batches_per_epoch = full + (1 if rest > 1 else 0)
        self._epoch = -1
        self._perm: Optional[Tensor] = None
        self._lazy: Optional[Permutation] = None

    def batch(self, step: int) -> Tensor:
        epoch, pos = divmod(step, self.batches_per_epoch)
        first, end = pos * self.batch_size, min((pos + 1) * self.batch_size, len(self.shard))
        if isinstance(self.shard, LazyShard):  # the epoch's order computed for this batch alone
            if epoch != self._epoch:
                self._lazy, self._epoch = Permutation(len(self.shard), self.seed * 100003 + epoch), epoch
            assert self._lazy is not None
            return self.shard[self._lazy(torch.arange(first, end))]
        if epoch != self._epoch:
            gen = torch.Generator().manual_seed(self.seed * 100003 + epoch)
            self._perm = self.shard[torch.randperm(len(self.shard), generator=gen)]
            self._epoch = epoch
        assert self._perm is not None
        return self._perm[first:end]
