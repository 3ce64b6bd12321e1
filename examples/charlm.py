"""A character-level transformer language model on text every machine has: the Python standard
library's own source files (``hogwild-train +experiment=charlm``, from the repository root).

Each sample is ``context`` characters and the next character at each position; the model returns
``(batch, context, vocab)`` logits, so the task is language modelling (perplexity, against a
unigram model of the training characters). The text is ASCII (other characters become ``?``),
read in a fixed order, so every replica of a job, on any machine with the same Python version,
builds the same data.
"""

from __future__ import annotations

import logging
import sysconfig
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

logger = logging.getLogger(__name__)

VOCAB = 128


class Windows(Dataset):
    """Non-overlapping windows of ``context + 1`` characters: (input, next characters)."""

    def __init__(self, codes: Tensor, context: int) -> None:
        n = (len(codes) - 1) // context
        self.codes, self.context, self.n = codes[:n * context + 1], context, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        w = self.codes[i * self.context:(i + 1) * self.context + 1].long()
        return w[:-1], w[1:]

    @property
    def targets(self) -> Tensor:
        """Every sample's next characters at once (hogwild reads them for the unigram baseline)."""
        return self.codes[1:self.n * self.context + 1].long().view(self.n, self.context)


def _stdlib_text(chars: int) -> bytes:
    root = Path(sysconfig.get_paths()["stdlib"])
    out, size = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        out.append(data)
        size += len(data)
        if size >= chars:
            break
    if size == 0:
        raise FileNotFoundError(f"no Python source files in {root}")
    return b"\n".join(out)[:chars]


def stdlib_text(chars: int = 1_000_000, test_chars: int = 50_000, context: int = 64) -> tuple[Windows, Windows]:
    """The first ``chars`` characters of the standard library's top-level modules (sorted by
    name); the last ``test_chars`` of them are the test split."""
    codes = torch.frombuffer(bytearray(_stdlib_text(chars)), dtype=torch.uint8).clone()
    codes[codes >= VOCAB] = ord("?")
    cut = len(codes) - test_chars
    logger.info("stdlib text: %d training and %d test characters", cut, len(codes) - cut)
    return Windows(codes[:cut], context), Windows(codes[cut:], context)


class CharTransformer(nn.Module):
    """A small decoder-only transformer: token and position embeddings, pre-norm causal blocks."""

    def __init__(self, vocab: int = VOCAB, context: int = 64, width: int = 128, layers: int = 2,
                 heads: int = 4, dropout: float = 0.0) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, x: Tensor) -> Tensor:
        t = x.shape[1]
        h = self.tok(x) + self.pos(torch.arange(t, device=x.device))
        # Built per call, not kept as a buffer: float buffers live in hogwild's shared flat buffer
        # and are synced, and this one holds -inf, which a round's health check reads as poison.
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=x.device)
        h = self.blocks(h, mask=mask, is_causal=True)
        return self.head(self.norm(h))
