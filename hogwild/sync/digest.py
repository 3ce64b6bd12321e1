"""A replica's final state in a few bytes: what metrics.json's ``replica_final_state`` gives by
rank, so that a job's replicas can be seen to end on one model, bit for bit, without shipping the
models anywhere."""

from __future__ import annotations

import hashlib
from typing import Mapping

import torch
from torch import Tensor

DIGEST_HEX = 12
"""Hex digits kept: 48 bits, which a float64 holds exactly, so a digest travels in the rounds'
final gather with the other figures."""


def digest(state: Mapping[str, Tensor]) -> float:
    """The first 48 bits of a SHA-256 over ``state``'s names and tensors' bytes, in the names'
    order, as a float."""
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode() + b"\0")
        h.update(state[name].detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return float(int(h.hexdigest()[:DIGEST_HEX], 16))


def hex_of(value: float) -> str:
    """A digest as metrics.json writes it."""
    return f"{int(value):0{DIGEST_HEX}x}"
