"""A user's model module that says so as it is imported, as some libraries do (a banner, a
registry's print): tests/replica/test_start.py counts its lines to see which processes imported it."""

from __future__ import annotations

import multiprocessing
import sys

from torch import nn

# The process's name: a worker's is hogwild-worker-N from its start (multiprocessing sets it
# before it unpickles anything), the leader's and its fork server's MainProcess.
print(f"loud_model imported in {multiprocessing.current_process().name}", file=sys.stderr, flush=True)


def net(num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))

