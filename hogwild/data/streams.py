"""Streams: a torch ``IterableDataset`` or a Hugging Face ``datasets`` stream as the training split.

A stream has no length and no index, so the map-style path (disjoint index shards, batch ``step``
of a seeded permutation) does not apply. Instead every worker of every replica reads its own
part of the stream in order, and its data position stays what it is for map-style data: the
batches it has read (``pos`` on the board, carried by every checkpoint). Worker ``g`` of ``G``
gets its part in one of three ways (``data.stream_split``):

- ``by_node``: a ``datasets`` stream is cut by ``datasets.distributed.split_dataset_by_node``
  (whole files per worker when their count divides, else every G-th example);
- ``round_robin``: the worker reads the whole stream and keeps the samples ``j`` with
  ``j % G == g``, as DataLoader's docs suggest for a stream that cannot split itself;
- ``worker_info``: the dataset splits itself by ``torch.utils.data.get_worker_info()``, as under
  a DataLoader; each hogwild worker is given its place there.

A worker's samples run from epoch to epoch without a break (a batch may hold the end of one
epoch and the start of the next), so after ``p`` batches it has read exactly ``p * batch_size``
samples of its part. That makes resuming exact without any help from the stream: skip that many
samples (whole epochs at once once an epoch's length is known). A stream with ``state_dict`` and
``load_state_dict`` (``datasets``' streams, torchdata's convention) is resumed from its state
instead, which reads nothing twice: each worker publishes its state after every batch into a
small ring in shared memory (:class:`StreamRecords`), the checkpoint takes the state that matches
the position it records, and a respawned worker finds its predecessor's there.
"""

from __future__ import annotations

import io
import logging
import pickle
from typing import Any, Iterator, Optional

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import IterableDataset

from hogwild.data.items import batch_tensors, check_fits, collate, label_of, stack_labels
from hogwild.errors import ConfigError, note, user_call

logger = logging.getLogger(__name__)

# Samples read ahead in the leader: the checks, the pre-flight step, the task's kind and baseline.
HEAD = 256
# One record of a stream's state: datasets' are a few hundred bytes; a larger one is not kept
# (that worker then resumes by skipping, and says so).
RECORD_BYTES = 64 * 1024


def is_stream(obj: Any) -> bool:
    """An iterable dataset without an index: torch's IterableDataset, a ``datasets`` stream, or any
    re-iterable object with ``__iter__`` and no ``__getitem__``."""
    if isinstance(obj, IterableDataset):
        return True
    return callable(getattr(obj, "__iter__", None)) and not hasattr(obj, "__getitem__")


def is_hf_stream(obj: Any) -> bool:
    return type(obj).__module__.startswith("datasets.") and hasattr(obj, "n_shards")


def resolve_split(obj: Any, configured: str) -> str:
    """``data.stream_split`` for this stream: auto is by_node for ``datasets``, else round_robin."""
    if configured == "auto":
        return "by_node" if is_hf_stream(obj) else "round_robin"
    return configured


def resumable(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


class StreamSplit:
    """The training split as a stream. Its first items (the head, read once in the leader) stand
    in for the split wherever the leader needs samples by index: the checks, the pre-flight step,
    the task's kind and baseline, the checkpoint's probe batch. The workers read the stream
    itself (:class:`StreamReader`)."""

    stream = True

    def __init__(self, dataset: Any, name: str, labels_key: str, split: str) -> None:
        self.dataset, self.name, self.labels_key, self.split = dataset, name, labels_key, split
        self.head: list[Any] = []
        self._ended = False
        self._targets: Optional[Tensor] = None

    def read_head(self, n: int, key: str = "data._target_") -> int:
        """Read the stream's first ``n`` items (or all, if it holds fewer); returns how many it holds."""
        if len(self.head) >= n or self._ended:
            return len(self.head)
        items: list[Any] = []
        with user_call(f"{key}: reading the first {n} items of the {self.name} stream"):
            for item in self.dataset:
                items.append(item)
                if len(items) >= n:
                    break
        self._ended = len(items) < n
        self.head, self._targets = items, None
        return len(items)

    def __getstate__(self) -> dict[str, Any]:
        # A worker reads the stream itself: of the head it needs only a sample to tell the task's kind.
        return {**self.__dict__, "head": ItemsInMemory(self.head[:2]), "_targets": None}

    def __len__(self) -> int:
        """The samples read ahead, not the stream's length (it has none)."""
        return len(self.head)

    def item(self, i: int) -> Any:
        return self.head[i]

    def batch(self, idx: Tensor) -> tuple[Any, Optional[Tensor]]:
        return self.collate([self.item(int(i)) for i in idx])

    def collate(self, items: list[Any]) -> tuple[Any, Optional[Tensor]]:
        inputs, y = collate(items, self.labels_key)
        # A stream cannot be checked ahead: each batch is, where it is read (in a worker, a batch
        # that does not fit ends the run as the user's data error, exit 2).
        check_fits(batch_tensors(inputs, y), f"data: a batch of the {self.name} stream")
        return inputs, y

    @property
    def targets(self) -> Tensor:
        """The head's labels: a stream's baseline is judged on its first samples."""
        if self._targets is None:
            self._targets = stack_labels([label_of(item, self.labels_key) for item in self.head])
        return self._targets

    def share_memory_(self) -> "StreamSplit":
        return self  # read in order by each worker: nothing to share


def read_test_stream(dataset: Any, limit: int, key: str) -> list[Any]:
    """A test stream, bounded: its first ``limit`` items, read once and held (every evaluation
    then scores the same samples)."""
    items: list[Any] = []
    with user_call(f"{key}: reading the test stream"):
        for item in dataset:
            items.append(item)
            if len(items) >= limit:
                break
    if not items:
        raise ConfigError(f"{key}: the test stream is empty")
    logger.info("data: the test stream's first %d samples are the test split (data.test_samples=%d)",
                len(items), limit)
    return ItemsInMemory(items)


class ItemsInMemory(list):  # type: ignore[type-arg]
    """Items read off a stream and held in memory (only ever pickled from a leader to its own workers,
    never read from a file). Pickled as one blob: as a plain list each tensor in
    it would travel to a spawned worker as a file descriptor of its own, and multiprocessing's fork
    server takes at most 256 ("too many fds")."""

    def __reduce__(self) -> tuple[Any, ...]:
        buf = io.BytesIO()
        torch.save(list(self), buf)
        return _held, (buf.getvalue(),)


def _held(blob: bytes) -> ItemsInMemory:
    return ItemsInMemory(torch.load(io.BytesIO(blob), weights_only=False))


class StreamRecords:
    """Each worker's stream position details, in shared memory, written only by that worker and read
    by the leader (checkpoints, the report) and by a respawned worker:

    - ``epochs`` and ``lengths``: the epoch each worker is in, and the length of its part's epoch
      once it has read one (0 before), which lets a skip jump whole epochs;
    - for a stream with ``state_dict``, ``slots`` records per worker, each its state after the
      batch it names. A record is ``[pos + 1, length]`` (0: empty or being written) and its bytes;
      a reader copies the bytes and checks the header did not change meanwhile.

    Records are pickled: they pass only between a leader and its own workers, and pickling one
    takes microseconds where ``torch.save`` took a tenth of a millisecond, on every batch. A
    checkpoint holds them in ``torch.save``'s form (:func:`to_checkpoint`), which loads with
    ``weights_only=True``; a pickle from a file could run anything."""

    def __init__(self, workers: int, slots: int, record_bytes: int = RECORD_BYTES) -> None:
        self.slots = slots
        self.data = torch.zeros(workers, slots, record_bytes, dtype=torch.uint8).share_memory_()
        self.head = torch.zeros(workers, slots, 2, dtype=torch.int64).share_memory_()
        self.epochs = torch.zeros(workers, dtype=torch.int64).share_memory_()
        self.lengths = torch.zeros(workers, dtype=torch.int64).share_memory_()

    @property
    def record_bytes(self) -> int:
        return int(self.data.shape[2])

    def write(self, worker: int, pos: int, blob: bytes) -> bool:
        """Record ``blob`` as the state at batch ``pos``; False when it does not fit."""
        if len(blob) > self.record_bytes:
            return False
        head, data = self.head.numpy(), self.data.numpy()
        slot = pos % self.slots
        head[worker, slot, 0] = 0  # being written: a reader now sees no record here
        data[worker, slot, :len(blob)] = np.frombuffer(blob, dtype=np.uint8)
        head[worker, slot, 1] = len(blob)
        head[worker, slot, 0] = pos + 1
        return True

    def find(self, worker: int, pos: int) -> Optional[bytes]:
        """The record of ``worker`` at batch ``pos``, if one is held (None while it is rewritten)."""
        head, data = self.head.numpy(), self.data.numpy()
        slot = pos % self.slots
        if int(head[worker, slot, 0]) != pos + 1:
            return None
        blob = data[worker, slot, :int(head[worker, slot, 1])].tobytes()
        return blob if int(head[worker, slot, 0]) == pos + 1 else None

    def to_checkpoint(self, worker: int, pos: int) -> Optional[Tensor]:
        """The record at ``pos`` as a checkpoint holds it (``torch.save``'s bytes), if held."""
        blob = self.find(worker, pos)
        return torch.frombuffer(bytearray(encode(pickle.loads(blob))), dtype=torch.uint8) if blob else None

    def from_checkpoint(self, worker: int, pos: int, saved: Tensor) -> None:
        """A checkpoint's record, for a worker about to start at ``pos``."""
        self.write(worker, pos, pickle.dumps(decode(saved.numpy().tobytes())))

    def note_epoch(self, worker: int, epoch: int, length: Optional[int]) -> None:
        self.epochs[worker] = epoch
        if length:
            self.lengths[worker] = length

    def epoch_length(self, worker: int) -> Optional[int]:
        return int(self.lengths[worker]) or None


def encode(record: dict[str, Any]) -> bytes:
    # torch.save, not pickle: a checkpoint is loaded with weights_only=True, and a stream's state
    # (nested dicts of numbers and strings) is what that loader accepts.
    buf = io.BytesIO()
    torch.save(record, buf)
    return buf.getvalue()


def decode(blob: bytes) -> dict[str, Any]:
    return torch.load(io.BytesIO(blob), weights_only=True)  # type: ignore[no-any-return]


class StreamReader:
    """One worker's part of the stream, read in order: ``batch(p)`` is its ``p``-th batch of
    ``batch_size`` samples. Asked for another batch than the next (a resumed or respawned worker,
    or a position learned from a peer), it seeks there: from the recorded state when the stream
    has one, else by skipping the samples before it."""

    def __init__(self, split: StreamSplit, place: int, places: int, batch_size: int,
                 records: Optional[StreamRecords] = None, local_index: int = 0) -> None:
        self.split, self.place, self.places, self.batch_size = split, place, places, batch_size
        self.records, self.local_index = records, local_index
        self._blob = pickle.dumps(split.dataset)  # a fresh copy per epoch: no state carried over
        self.epoch = 0
        self.in_epoch = 0
        """Samples of this worker's part read in this epoch."""
        self.inner = 0
        """Samples of the stream read in this epoch (round_robin reads the others' too)."""
        self.epoch_len: Optional[int] = None
        self._view: Any = None
        self._it: Optional[Iterator[Any]] = None
        self._next = -1
        self._cached: Optional[tuple[int, Any]] = None
        self._too_big = False
        if split.split == "worker_info":
            _set_worker_info(place, places, split.dataset)

    def batch(self, index: int) -> tuple[Any, Optional[Tensor]]:
        if self._cached is not None and self._cached[0] == index:
            return self._cached[1]  # type: ignore[no-any-return]
        if index != self._next:
            self._seek(index)
        try:
            items = [self._one() for _ in range(self.batch_size)]
        except BaseException as e:
            note(e, f"item {self.in_epoch} of epoch {self.epoch} of worker {self.place}'s part of the stream")
            raise
        self._next = index + 1
        self._publish()
        out = self.split.collate(items)
        self._cached = (index, out)
        return out

    def _fresh(self, epoch: int) -> Any:
        view = pickle.loads(self._blob)
        if self.split.split == "by_node":
            from datasets.distributed import split_dataset_by_node

            view = split_dataset_by_node(view, rank=self.place, world_size=self.places)
        if callable(getattr(view, "set_epoch", None)):
            view.set_epoch(epoch)  # a shuffling stream draws a new order per epoch
        return view

    def _start_epoch(self, epoch: int, state: Any = None, in_epoch: int = 0, inner: int = 0) -> None:
        self._view = self._fresh(epoch)
        if state is not None:
            self._view.load_state_dict(state)
        self._it = iter(self._view)
        self.epoch, self.in_epoch, self.inner = epoch, in_epoch, inner

    def _one(self) -> Any:
        if self._it is None:
            self._start_epoch(0)
        while True:
            assert self._it is not None
            try:
                item = next(self._it)
            except StopIteration:
                if self.in_epoch == 0:
                    raise RuntimeError(f"worker {self.place}'s part of the training stream is empty "
                                       f"({self.places} workers share it, data.stream_split="
                                       f"{self.split.split})") from None
                self.epoch_len = self.in_epoch
                self._start_epoch(self.epoch + 1)
                continue
            j = self.inner
            self.inner += 1
            if self.split.split == "round_robin" and j % self.places != self.place:
                continue
            self.in_epoch += 1
            return item

    def record(self) -> dict[str, Any]:
        state = self._view.state_dict() if self._view is not None and resumable(self._view) else None
        return {"epoch": self.epoch, "in_epoch": self.in_epoch, "inner": self.inner, "state": state}

    def _publish(self) -> None:
        """After each batch: the epoch (a cell write), and a stream's state where it has one."""
        if self.records is None:
            return
        self.records.note_epoch(self.local_index, self.epoch, self.epoch_len)
        if self._view is None or not resumable(self._view) or self._too_big:
            return
        blob = pickle.dumps(self.record())
        if not self.records.write(self.local_index, self._next, blob):
            self._too_big = True
            logger.warning("data: the stream's state_dict takes %d bytes, over the %d kept per worker; a "
                           "resume of this worker skips its samples instead", len(blob), self.records.record_bytes)

    def _seek(self, index: int) -> None:
        """Continue at batch ``index`` of this worker's part."""
        self._cached = None
        if index == 0:
            self._start_epoch(0)
            return
        blob = self.records.find(self.local_index, index) if self.records is not None else None
        if self.records is not None:
            self.epoch_len = self.epoch_len or self.records.epoch_length(self.local_index)
        if blob is not None:
            rec = pickle.loads(blob)
            self._start_epoch(int(rec["epoch"]), rec["state"], int(rec["in_epoch"]), int(rec["inner"]))
            logger.info("data: stream resumed at batch %d (epoch %d) from its saved state", index, self.epoch)
            return
        skip = index * self.batch_size
        epoch = 0
        if self.epoch_len:
            epoch, skip = divmod(skip, self.epoch_len)
        self._start_epoch(epoch)
        for _ in range(skip):
            self._one()
        logger.info("data: stream resumed at batch %d (epoch %d) by skipping %d samples%s", index, self.epoch,
                    skip, "" if resumable(self.split.dataset) else " (the stream has no state_dict)")


def _set_worker_info(place: int, places: int, dataset: Any) -> None:
    """``torch.utils.data.get_worker_info()`` in this worker answers as in DataLoader worker
    ``place`` of ``places``: a dataset that splits itself by it then reads its part."""
    from torch.utils.data._utils import worker as dl_worker

    # get_worker_info() returns this module global, which DataLoader's worker loop sets and nothing
    # public does; set the same way, so a dataset written for DataLoader needs no change.
    setattr(dl_worker, "_worker_info", dl_worker.WorkerInfo(id=place, num_workers=places, seed=0, dataset=dataset))

