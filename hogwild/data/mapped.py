"""Map-style datasets: a user's ``data._target_`` and ``data=image_folder``.

Unlike the in-memory tensor path (data/datasets.py), nothing is loaded up front: each worker reads the
items of its own shard by index and collates its batches itself, so per-sample decoding,
transforms and augmentation run inside the workers, in parallel. The dataset object travels
to every spawned worker by pickling, so it must be picklable (torchvision's are).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Iterator, Mapping, Optional, Union

import torch
from torch import Tensor
from torch.utils.data import DataLoader
from torch.utils.data import Dataset as TorchDataset

from hogwild.config.registry import DATASETS
from hogwild.config.schema import DataConfig
from hogwild.config.targets import call_target, import_target, schema_kwargs
from hogwild.data.items import (LABEL_KEYS, Inputs, batch_tensors, check_fits, collate, label_of, labels_key_of,
                                stack_labels)
from hogwild.data.splits import Dataset
from hogwild.data.streams import HEAD, StreamSplit, is_stream, read_test_stream, resolve_split
from hogwild.errors import PASSES, ConfigError, first_line, note, user_call

logger = logging.getLogger(__name__)


# data.* fields hogwild applies to every dataset, never passed to a data._target_.
HOGWILD_FIELDS = ("labels_key", "loader_workers", "test_samples", "stream_split")


class MapSplit:
    """One split of a map-style dataset, with the interface of data.Split. Items are
    ``(inputs..., label)`` or a mapping of named fields (the Hugging Face convention), whose
    batches stay mappings, collated key by key, labels included."""

    def __init__(self, dataset: TorchDataset, name: str, labels_key: str = "auto") -> None:
        self.dataset, self.name, self.labels_key = dataset, name, labels_key
        self._targets: Tensor | None = None

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def item(self, i: int) -> Any:
        return self.dataset[i]

    def batch(self, idx: Tensor) -> tuple[Inputs, Optional[Tensor]]:
        items = []
        for i in idx.tolist():
            try:
                items.append(self.dataset[i])
            except BaseException as e:
                note(e, f"item {i} of the {self.name} set")  # the user's line names the item that failed
                raise
        return self.collate(items)

    def collate(self, items: list[Any]) -> tuple[Inputs, Optional[Tensor]]:
        inputs, y = collate(items, self.labels_key)
        check_fits(batch_tensors(inputs, y), f"data: a batch of the {self.name} set")  # items read on demand
        return inputs, y

    def label_of(self, item: Any) -> Any:
        return label_of(item, self.labels_key)

    @property
    def targets(self) -> Tensor:
        """Every label, from the dataset's ``targets`` when it has them, else read item by item
        (the leader's read before spawning: an item that raises is the user's one line, exit 2,
        as the same item read by a worker is)."""
        if self._targets is None:
            known = getattr(self.dataset, "targets", None)
            labels = known if known is not None else [self._label(i) for i in range(len(self))]
            self._targets = stack_labels(labels)
        return self._targets

    def _label(self, i: int) -> Any:
        with user_call(f"data: reading item {i} of the {self.name} set for its label"):
            return self.label_of(self.dataset[i])

    def share_memory_(self) -> "MapSplit":
        return self  # items are read on demand in each worker: nothing to share


def _check_item(split: Union[MapSplit, StreamSplit], key: str) -> tuple[int, ...]:
    """The input shape of item 0, after checking that items are (inputs..., label) or a mapping
    of tensors with a labels key, where a label is an integer (a class), a float or float tensor
    (regression targets) or an integer tensor (a sequence of tokens)."""
    with user_call(f"{key}: reading item 0 of the {split.name} set"):
        item = split.item(0)
    if isinstance(item, Mapping):
        return _check_mapping(item, split, key)
    ok = isinstance(item, (tuple, list)) and len(item) >= 2 and all(isinstance(t, Tensor) for t in item[:-1])
    label = item[-1] if ok else None
    if not ok or isinstance(label, bool) or not isinstance(label, (int, float, Tensor)):
        raise ConfigError(f"{key}: items must be (input, label), (inputs..., label) or a dict of tensors; item 0 "
                          f"of the {split.name} set is {_describe(item)}")
    return tuple(item[0].shape)


def _check_mapping(item: Mapping[str, Any], split: Union[MapSplit, StreamSplit], key: str) -> tuple[int, ...]:
    bad = [k for k, v in item.items() if not isinstance(v, (Tensor, int, float)) or isinstance(v, bool)]
    if bad or not item:
        raise ConfigError(f"{key}: a dict item must map names to tensors or numbers; item 0 of the {split.name} "
                          f"set has {bad[0]!r}: {type(item[bad[0]]).__name__}" if bad
                          else f"{key}: item 0 is an empty dict")
    label = labels_key_of(item, split.labels_key)
    if label is None:
        wanted = split.labels_key if split.labels_key != "auto" else " or ".join(LABEL_KEYS)
        raise ConfigError(f"data.labels_key: item 0 of the {split.name} set has no {wanted} key (it has "
                          f"{', '.join(map(str, item))}); set data.labels_key to the key holding the labels")
    first = next(v for k, v in item.items() if k != label)
    return tuple(torch.as_tensor(first).shape)


def _describe(item: Any) -> str:
    if isinstance(item, (tuple, list)):
        return f"a {type(item).__name__} of ({', '.join(type(x).__name__ for x in item)})"
    return f"a {type(item).__name__}"


def _shapes(item: Any) -> Any:
    if isinstance(item, Mapping):
        return {k: tuple(torch.as_tensor(v).shape) for k, v in item.items()}
    return [tuple(torch.as_tensor(v).shape) for v in item]


def _check_items(split: Union[MapSplit, StreamSplit], key: str) -> None:
    """Before any worker reads its shard: a length the workers can shard, items in the middle and
    at the end that read and collate with item 0 (equal shapes), and a dataset that pickles (it
    travels to every worker so). Each failed later in every worker, until the respawns ran out.
    A stream's length is its head's, the items read ahead."""
    with user_call(f"{key}: len() of the {split.name} set"):  # a negative __len__ is Python's ValueError
        n = len(split)
    if n < 1:
        raise ConfigError(f"{key}: the {split.name} set is empty")
    first = None
    for i in sorted({0, n // 2, n - 1}):
        with user_call(f"{key}: reading item {i} of the {split.name} set"):
            item = split.item(i)
        shapes = _shapes(item)
        if first is None:
            first = shapes
        elif shapes != first:
            raise ConfigError(f"{key}: items of the {split.name} set differ in shape (item 0: {first}, item {i}: "
                              f"{shapes}); a batch stacks them, so pad or crop them to one shape")
    import pickle

    try:
        with user_call(f"{key}: pickling the {split.name} set", errors=False):
            pickle.dumps(split.dataset)
    except PASSES:
        raise
    except BaseException as e:  # noqa: BLE001 - a lambda, a file handle, a lock: anything pickle refuses
        raise ConfigError(f"{key}: the {split.name} set cannot be pickled to the workers ({type(e).__name__}: "
                          f"{first_line(e)}); keep its state in picklable attributes") from None


def _check_tensors(split: Union[MapSplit, StreamSplit], key: str) -> None:
    """A dataset held in memory (a ``TensorDataset``, or a list of items whose item 0 holds a
    float64 tensor), checked whole before any worker spawns: a float64 value float32 cannot hold
    would otherwise train into NaN (exit 4), or end the run only once a worker reads its batch.
    Datasets that read their items on demand are checked batch by batch, where they are read."""
    data = split.dataset
    tensors = getattr(data, "tensors", None)
    if isinstance(tensors, (tuple, list)):
        check_fits({f"tensor {j} of the {split.name} set": t for j, t in enumerate(tensors)}, key)
    elif isinstance(data, (tuple, list)) and data and any(t.dtype == torch.float64 for t in _item_tensors(data[0])):
        for i, item in enumerate(data):
            for t in _item_tensors(item):
                check_fits({f"item {i} of the {split.name} set": t}, key)


def _item_tensors(item: Any) -> list[Tensor]:
    values = item.values() if isinstance(item, Mapping) else item if isinstance(item, (tuple, list)) else ()
    return [v for v in values if isinstance(v, Tensor)]


def check_pair(train: Any, test: Any, key: str, num_classes: int | None = None, labels_key: str = "auto",
          stream_split: str = "auto") -> Dataset:
    splits: list[Any] = [MapSplit(d, name, labels_key) for d, name in ((train, "train"), (test, "test"))]
    if is_stream(train):
        splits[0] = StreamSplit(train, "train", labels_key, resolve_split(train, stream_split))
        if splits[0].read_head(HEAD, key) == 0:
            raise ConfigError(f"{key}: the train stream is empty")
    shape = _check_item(splits[0], key)
    _check_item(splits[1], key)
    for split in splits:
        _check_items(split, key)
        _check_tensors(split, key)
    train_y, test_y = splits[0].targets, splits[1].targets
    if train_y.is_floating_point():  # regression: the model's outputs are the target's size
        classes = int(train_y[0].numel())
        return Dataset(splits[0], splits[1], classes, shape)  # type: ignore[arg-type]
    classes = num_classes or int(max(int(train_y.max()), int(test_y.max())) + 1)
    return Dataset(splits[0], splits[1], max(classes, 2), shape)  # type: ignore[arg-type]


def load_target(cfg: DataConfig) -> Dataset:
    """``data._target_``: a callable returning (train, test) map-style datasets."""
    path = str(cfg._target_)
    fn = import_target(path, "data._target_")
    # A schema field the user changed (data.path=corpus.jsonl) goes to a factory that takes it, as
    # for model, optim and sched; the fields hogwild applies to any dataset are its own.
    kwargs = {**schema_kwargs(cfg, fn, path, "data", handled=HOGWILD_FIELDS), **cfg.kwargs}
    out = call_target(fn, path, "data", kwargs, kwargs)
    _check_hf_splits(out, path)
    if not (isinstance(out, (tuple, list)) and len(out) == 2
            and all(is_stream(d) or (hasattr(d, "__getitem__") and hasattr(d, "__len__")) for d in out)):
        raise ConfigError(f"data._target_: {path} must return (train, test) datasets, map-style or streams, "
                          f"got {_describe(out)}")
    train, test = out
    if is_stream(test):
        test = read_test_stream(test, cfg.test_samples, "data._target_")
    return check_pair(train, test, "data._target_", labels_key=cfg.labels_key, stream_split=cfg.stream_split)


def _check_hf_splits(out: Any, path: str) -> None:
    """A ``datasets`` DatasetDict where one split was meant, or the splits swapped: each trained
    or scored the wrong samples (a DatasetDict's items are its splits) without a word."""
    def splits_of(d: Any) -> Optional[str]:
        if type(d).__name__ in ("DatasetDict", "IterableDatasetDict"):
            return ", ".join(map(str, d.keys()))
        return None

    for d in (out, *(out if isinstance(out, (tuple, list)) else ())):
        names = splits_of(d)
        if names is not None:
            raise ConfigError(f"data._target_: {path} returned a datasets {type(d).__name__} (splits {names}) "
                              "where a split was meant; return (d['train'], d['test'])")
    if isinstance(out, (tuple, list)) and len(out) == 2:
        if out[0] is out[1]:
            raise ConfigError(f"data._target_: {path} returned one dataset as both the train and the test set; "
                              "a held-out test set is what the scores are judged on")
        train = out[0]
        split = str(getattr(train, "split", "") or "") if type(train).__module__.startswith("datasets.") else ""
        if split in ("test", "validation"):
            raise ConfigError(f"data._target_: {path} returned the datasets split {split!r} as the train set; "
                              "return (train, test) in that order")


@DATASETS.register("image_folder")
def load_image_folder(cfg: DataConfig) -> Dataset:
    """``data=image_folder``: torchvision ImageFolder over ``root/train`` and ``root/val``."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    root = os.path.expanduser(cfg.root)
    for sub in ("train", "val"):
        if not os.path.isdir(os.path.join(root, sub)):
            raise ConfigError(f"data.root: {os.path.abspath(root)!r} has no {sub}/ folder "
                              "(data=image_folder reads DIR/train/<class>/* and DIR/val/<class>/*)")
    side = cfg.image_size or 32
    base = [T.Resize((side, side))]
    aug = [T.RandomCrop(side, padding=max(1, side // 8)), T.RandomHorizontalFlip()] if cfg.augment else []
    tail = [T.ToTensor(), T.Normalize([0.5] * 3, [0.5] * 3)]
    try:
        train = ImageFolder(os.path.join(root, "train"), transform=T.Compose([*base, *aug, *tail]))
        val = ImageFolder(os.path.join(root, "val"), transform=T.Compose([*base, *tail]))
    except (FileNotFoundError, RuntimeError) as e:  # a class folder without images
        raise ConfigError(f"data.root: {first_line(e)}") from None
    if train.classes != val.classes:
        raise ConfigError(f"data.root: train/ has classes {train.classes}, val/ has {val.classes}")
    return check_pair(train, val, "data.root", len(train.classes))


class _StepBatches:
    """The shard's batches in step order from ``start``: the DataLoader's batch sampler."""

    def __init__(self, sampler: Any, start: int) -> None:
        self.sampler, self.start = sampler, start

    def __iter__(self) -> Iterator[list[int]]:
        step = self.start
        while True:
            yield self.sampler.batch(step).tolist()
            step += 1


class Prefetcher:
    """``data.loader_workers`` DataLoader processes that read and transform this worker's next
    batches ahead of its steps. The first call (the warm-up) reads directly; a step out of order
    (never, in the step loop) restarts the loader there."""

    def __init__(self, split: MapSplit, sampler: Any, workers: int) -> None:
        self.split, self.sampler, self.workers = split, sampler, workers
        self._it: Optional[Iterator[Any]] = None
        self._next = -1
        self._warm = False

    def batch(self, step: int) -> tuple[Inputs, Optional[Tensor]]:
        if not self._warm:
            self._warm = True
            return self.split.batch(self.sampler.batch(step))
        if self._it is None or step != self._next:
            loader = DataLoader(self.split.dataset, batch_sampler=_StepBatches(self.sampler, step),  # type: ignore[arg-type]
                                num_workers=self.workers, collate_fn=self.split.collate)
            self._it = iter(loader)
        self._next = step + 1
        return next(self._it)
