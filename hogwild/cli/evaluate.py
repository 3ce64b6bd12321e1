"""``hogwild-eval checkpoint=PATH``: a saved model's test metrics, as JSON (the task's own: see replica/task.py)."""

from __future__ import annotations

import json
import logging
import sys
from typing import Optional

import torch

from hogwild.cli.common import checkpoint_command
from hogwild.errors import guarded

logger = logging.getLogger(__name__)

USAGE = "hogwild-eval checkpoint=PATH [data.root=...] [model._target_=...] [trust_targets=true]"


@guarded
def main(argv: Optional[list[str]] = None) -> None:
    from hogwild.checkpoint import store as checkpoint
    from hogwild.checkpoint.portable import rebuild
    from hogwild.replica.task import build_task, evaluate

    named, trusted, overrides = checkpoint_command(argv, USAGE)  # a user's error: @guarded's one line
    path = named["checkpoint"]
    ckpt = checkpoint.load(path)
    model, cfg, ds = rebuild(ckpt, path, overrides, trusted)
    task = build_task(cfg, ds)
    scores = evaluate(model, ds.test, torch.device("cpu"), task, cfg.eval.batch_size)
    result = {"checkpoint": path, "task": task.kind, **{f"test_{k}": v for k, v in scores.items()},
              **{f"baseline_{k}": v for k, v in task.baseline.items()}, "test_samples": len(ds.test)}
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
