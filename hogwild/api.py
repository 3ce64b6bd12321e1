"""hogwild from Python: train with the same overrides as the command line, get a typed result,
and load a checkpoint into your own module.

    import hogwild
    result = hogwild.train(["workers=2", "train.epochs=3", "run_dir=runs/a"])
    print(result.metrics["test_accuracy"], result.checkpoint)
    model = hogwild.load_model(result.checkpoint, model=MyNet())

Errors are exceptions, never ``sys.exit``: a bad setting raises :class:`ConfigError` (a
:class:`UserError`, the command line's exit 2) before anything starts, and a run that ends
badly raises :class:`RunFailed`, which carries its :class:`RunResult`. The run installs its
SIGINT/SIGTERM handlers only while it runs (and only from the main thread), then gives the
caller's back.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from torch import nn

from hogwild.config.schema import Config
from hogwild.errors import ConfigError, Fault, UserError, WriteFailed
from hogwild.files import make_run_dir
from hogwild.report.summary import RunResult, Status  # noqa: F401 - Status: part of the API

logger = logging.getLogger(__name__)

Overrides = Union[Sequence[str], Mapping[str, Any]]


class RunFailed(Fault):
    """The run ended with a non-zero exit code (a fault, failed training, a full disk, a signal);
    ``result`` says how, and what it left (``result.checkpoint``)."""

    def __init__(self, result: RunResult) -> None:
        super().__init__(result.error or f"the run ended with status {result.status}")
        self.result = result


def _dotlist(overrides: Overrides) -> list[str]:
    """``{"optim.lr": 0.1, "model._target_": MyNet}`` -> ``["optim.lr=0.1", "model._target_=mod.MyNet"]``:
    a class or function is named by its import path, which the spawned workers import too."""
    if isinstance(overrides, str):
        raise ConfigError(f"overrides: a list of key=value strings or a dict, got the string {overrides!r}")
    if not isinstance(overrides, Mapping):
        return [str(o) for o in overrides]
    out = []
    for key, value in overrides.items():
        if callable(value) and hasattr(value, "__qualname__"):
            if "<locals>" in value.__qualname__ or value.__module__ == "__main__":
                raise ConfigError(f"{key}: {value.__qualname__} must live in an importable module "
                                  "(workers are spawned processes that import it by name)")
            value = f"{value.__module__}.{value.__qualname__}"
        out.append(f"{key}={value}")
    return out


def compose(overrides: Overrides = ()) -> Config:
    """The validated config of these overrides (the command line's, without Hydra's own flags)."""
    from hogwild.config.compose import compose as compose_job
    from hogwild.config.compose import register_resolvers

    register_resolvers()
    return compose_job(_dotlist(overrides))


def _refuse_unguarded_script() -> None:
    """Workers start from a process that imports the calling script again (as multiprocessing
    does for spawn and the fork server): a script that calls ``train`` at its top level, without
    ``if __name__ == "__main__":``, would train again in every worker, which then fails with
    multiprocessing's tracebacks. Said here in one line instead, before anything starts."""
    import ast
    import sys

    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or getattr(main, "__spec__", None) is not None:
        return  # an interactive session, a notebook, or ``python -m`` (its module is imported by name)
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return
    guarded = any(isinstance(node, ast.If) and "__main__" in ast.dump(node.test) for node in tree.body)
    if not guarded:
        raise ConfigError(f"{path}: calls hogwild.train at its top level; put the call under "
                          "'if __name__ == \"__main__\":' (the workers import the script again)")


def train(overrides: Overrides = (), *, config: Optional[Config] = None) -> RunResult:
    """Train one replica (or this rank's, under torchrun or with ``elastic.coordinator``) and
    return how it ended. ``config`` replaces composing from ``overrides``."""
    from hogwild.leader.choose import leader_for

    _refuse_unguarded_script()
    dotlist = None if config is not None else _dotlist(overrides)
    cfg = config if config is not None else compose(dotlist or [])
    make_run_dir(cfg.run_dir)
    try:
        result = leader_for(cfg, cfg.run_dir, overrides=dotlist).run()
    except OSError as e:  # as the CLI: a write failure is WriteFailed (exit code 5), never a raw OSError
        raise WriteFailed.of(e) from None
    if result.exit_code != 0:
        raise RunFailed(result)
    return result


def load_model(checkpoint: Union[str, Path], model: Optional[nn.Module] = None, *,
               trust_targets: bool = False, overrides: Overrides = ()) -> nn.Module:
    """The checkpoint's model. With ``model`` (your module, built as for training) its weights
    are loaded into it; without, the model the checkpoint's config names is built, which calls
    a stored ``model._target_`` only with ``trust_targets=True`` (a checkpoint could name any
    code) or when ``overrides`` names it."""
    from hogwild.checkpoint import store
    from hogwild.checkpoint.portable import load_into, rebuild

    path = str(checkpoint)
    if model is not None:
        return load_into(model, path)
    ckpt = store.load(path)
    built, _, _ = rebuild(ckpt, path, _dotlist(overrides), trust_targets, calls=("model", "data"))
    return built


__all__ = ["ConfigError", "RunFailed", "RunResult", "UserError", "compose", "load_model", "train"]
