"""Hugging Face ``datasets`` with hogwild, from local files only (``pip install 'hogwild[datasets]'``).

Two factories for ``data._target_``, both for the character-level GPT of ``+experiment=gpt``
(128 ASCII codes; items ``{"idx": input ids, "targets": the next ids}``, the names of
``examples.gpt.GPT.forward``'s arguments, so the model computes its own loss):

- :func:`text_blocks`: a local text file tokenised into a map-style ``datasets.Dataset``
  (``load_dataset("text")`` and a batched ``map`` that cuts the characters into blocks)::

      hogwild-train +experiment=gpt data._target_=examples.hf_datasets.text_blocks data.path=corpus.txt

- :func:`jsonl_stream`: local JSON lines (``{"text": ...}`` per line) read as a stream
  (``load_dataset("json", streaming=True)``), one block per line; hogwild splits it among its
  workers with ``split_dataset_by_node`` and resumes it from its ``state_dict``. A stream has no
  length, so the run is bounded by ``train.max_steps`` or ``train.max_time``::

      hogwild-train +experiment=gpt data._target_=examples.hf_datasets.jsonl_stream \\
          data.path=train.jsonl +data.test_path=test.jsonl train.max_steps=2000

Nothing is downloaded: the tokeniser is the character codes themselves. Set
``HF_DATASETS_OFFLINE=1`` where there is no network, as ``datasets`` otherwise may look online.
"""

from __future__ import annotations

import functools
from typing import Any

try:  # here, not in the factories: hogwild's fork server imports this module before it forks the
    # workers, so they unpickle their streams without importing datasets again (1 CPU-s each)
    import datasets
except ImportError:
    datasets = None  # type: ignore[assignment]

VOCAB = 128


def _codes(text: str, n: int) -> list[int]:
    """``n`` character codes of ``text`` (ASCII; others become ``?``), padded with spaces."""
    codes = [c if c < VOCAB else 63 for c in text.encode("ascii", "replace")[:n]]
    return codes + [32] * (n - len(codes))


def _require_datasets() -> Any:
    if datasets is None:
        raise ImportError("examples.hf_datasets needs the datasets package: pip install 'hogwild[datasets]'")
    return datasets


def text_blocks(path: str, block_size: int = 64, test_fraction: float = 0.1, seed: int = 0) -> tuple[Any, Any]:
    """(train, test) map-style ``datasets.Dataset`` of ``block_size``-character blocks of ``path``."""
    datasets = _require_datasets()
    lines = datasets.load_dataset("text", data_files={"train": path}, split="train", keep_linebreaks=True)

    def blocks(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        text = "".join(batch["text"])
        n = (len(text) - 1) // block_size
        codes = _codes(text, n * block_size + 1)
        return {"idx": [codes[i * block_size:(i + 1) * block_size] for i in range(n)],
                "targets": [codes[i * block_size + 1:(i + 1) * block_size + 1] for i in range(n)]}

    # 1,000 lines to a map batch: blocks span lines within it, as in Hugging Face's group_texts.
    ds = lines.map(blocks, batched=True, batch_size=1000, remove_columns=["text"]).with_format("torch")
    split = ds.train_test_split(test_size=test_fraction, seed=seed)
    return split["train"], split["test"]


def _block(example: dict[str, Any], block_size: int) -> dict[str, Any]:
    codes = _codes(str(example["text"]), block_size + 1)
    return {"idx": codes[:-1], "targets": codes[1:]}


def _line_stream(path: str, block_size: int) -> Any:
    datasets = _require_datasets()
    stream = datasets.load_dataset("json", data_files=path, split="train", streaming=True)
    # A module-level function: the stream travels to each worker by pickle, which a closure defeats.
    return stream.map(functools.partial(_block, block_size=block_size), remove_columns=["text"]).with_format("torch")


def jsonl_stream(path: str, test_path: str, block_size: int = 64) -> tuple[Any, Any]:
    """(train, test) ``datasets`` streams of ``path`` and ``test_path``, one block per JSON line;
    other fields of a line (an ``id``) stay in the batch, and the model takes only its own."""
    return _line_stream(path, block_size), _line_stream(test_path, block_size)
