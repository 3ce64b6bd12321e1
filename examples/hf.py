"""Hugging Face transformers models built from a config (no download), on dict batches, trained on
their own loss (``model(**batch).loss``) with no adapter. Needs ``pip install -e '.[hf]'``.

    hogwild-train +experiment=hf_gpt2        # GPT2LMHeadModel(GPT2Config(...)) on character tokens
    hogwild-train +experiment=hf_bert        # BertForSequenceClassification(BertConfig(...))

The data are offline: the standard library's sources as character tokens for the causal LM
(``labels`` are the inputs themselves: the model shifts them), and a synthetic two-class
sequence task for the classifier (is token 7 in the sequence?).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.data import Dataset

from examples.charlm import VOCAB, _stdlib_text


class Records(Dataset):
    """Rows of named tensors, as a Hugging Face dataset with ``set_format("torch")`` yields them."""

    def __init__(self, **columns: Tensor) -> None:
        self.columns = columns
        self.n = len(next(iter(columns.values())))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {k: v[i] for k, v in self.columns.items()}


def char_lm(chars: int = 200_000, test_chars: int = 20_000, context: int = 64) -> tuple[Records, Records]:
    """Causal-LM rows: ``input_ids``, ``attention_mask`` and ``labels`` (= ``input_ids``)."""
    codes = torch.frombuffer(bytearray(_stdlib_text(chars)), dtype=torch.uint8).clone().long()
    codes[codes >= VOCAB] = ord("?")

    def rows(part: Tensor) -> Records:
        ids = part[:len(part) // context * context].view(-1, context)
        return Records(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids.clone())

    cut = len(codes) - test_chars
    return rows(codes[:cut]), rows(codes[cut:])


def has_seven(samples: int = 2000, length: int = 16, vocab: int = 32, seed: int = 0) -> tuple[Records, Records]:
    """Sequence-classification rows: ``input_ids``, ``attention_mask``, ``labels`` (1 if token 7 occurs)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(8, vocab, (samples, length), generator=g)
    positive = torch.rand(samples, generator=g) < 0.5
    where = torch.randint(0, length, (samples,), generator=g)
    ids[positive, where[positive]] = 7
    labels = positive.long()
    cut = samples * 4 // 5
    mask = torch.ones_like(ids)
    return (Records(input_ids=ids[:cut], attention_mask=mask[:cut], labels=labels[:cut]),
            Records(input_ids=ids[cut:], attention_mask=mask[cut:], labels=labels[cut:]))
