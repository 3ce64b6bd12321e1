"""``hogwild-eval checkpoint=PATH``: a saved model's test metrics, as JSON (the task's own: see replica/task.py)."""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Optional

import torch
from omegaconf import OmegaConf

from hogwild.config.compose import to_config
from hogwild.config.schema import Config
from hogwild.errors import ConfigError, UserError, first_line, report
from hogwild.config.targets import TRUST_FLAG, refuse_stored_targets

logger = logging.getLogger(__name__)


def config_from_checkpoint(ckpt: dict, overrides: list[str]) -> Config:
    """The run's own config, with ``key=value`` overrides (e.g. data.root) on top."""
    try:
        base = OmegaConf.merge(OmegaConf.structured(Config), ckpt["config"])
    except Exception as e:  # noqa: BLE001 - a config this version cannot read
        key = getattr(e, "full_key", "") or "config"
        raise ConfigError(f"checkpoint: its config does not fit this version of hogwild ({key}: {first_line(e)})") from None
    try:
        merged = OmegaConf.merge(base, OmegaConf.from_dotlist(overrides))
    except Exception as e:  # noqa: BLE001 - OmegaConf raises many types for bad dotlists
        raise ConfigError(f"{getattr(e, 'full_key', '') or 'override'}: {first_line(e)}") from None
    return to_config(merged)


def _flag(arg: str) -> bool:
    key, _, value = arg.partition("=")
    if value.lower() not in ("true", "false"):
        raise ConfigError(f"{key}: must be true or false, got {value!r}")
    return value.lower() == "true"


def main(argv: Optional[list[str]] = None) -> None:
    # A user's model module next to where the command runs (model._target_=mynets.Net) must
    # import here and in every spawned worker, which inherits this sys.path.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    from hogwild.checkpoint import store as checkpoint
    from hogwild.data.datasets import load_dataset
    from hogwild.replica.models import build_model, model_id
    from hogwild.replica.shared import bind, layout
    from hogwild.replica.task import build_task, evaluate

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s] %(message)s")
    args = sys.argv[1:] if argv is None else argv
    try:
        ck = [a for a in args if a.startswith("checkpoint=")]
        if len(ck) != 1:
            raise ConfigError("checkpoint: usage: hogwild-eval checkpoint=PATH [data.root=...] "
                              "[model._target_=...] [trust_targets=true]")
        path = ck[0].split("=", 1)[1]
        trust = [a for a in args if a.startswith(f"{TRUST_FLAG}=")]
        trusted = _flag(trust[-1]) if trust else False
        overrides = [a for a in args if a not in ck and a not in trust]
        ckpt = checkpoint.load(path)
        refuse_stored_targets(ckpt.get("config"), overrides, trusted, f"checkpoint {path}")
        cfg = config_from_checkpoint(ckpt, overrides)
        ds = load_dataset(cfg.data)
        model = build_model(cfg.model, ds, cfg.train.seed)
        checkpoint.check_compatible(ckpt, path, model_id(cfg.model), [s.shape for s in layout(model)])
        bind(model, ckpt["flat"].float())
        task = build_task(cfg, ds)
        scores = evaluate(model, ds.test, torch.device("cpu"), task)
    except UserError as e:
        report(e)
    result = {"checkpoint": path, "task": task.kind, **{f"test_{k}": v for k, v in scores.items()},
              **{f"baseline_{k}": v for k, v in task.baseline.items()}, "test_samples": len(ds.test)}
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
