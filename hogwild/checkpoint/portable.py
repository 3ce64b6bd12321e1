"""Checkpoints that leave hogwild: the model as a standard ``state_dict``, and the model rebuilt
from a checkpoint for evaluation, export or a user's script.

A checkpoint's ``state_dict`` entry has the module's own names, so it loads into the user's
``nn.Module`` with ``load_state_dict`` and no hogwild at all. Files written before that entry
existed hold only the flat buffer; their names come from the model the checkpoint's config
builds, which runs a stored ``_target_`` only when the caller trusts it (config/targets.py).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from hogwild.checkpoint import store
from hogwild.config.compose import to_config
from hogwild.config.moved import moved_tree
from hogwild.config.schema import Config
from hogwild.config.targets import refuse_stored_targets
from hogwild.data.datasets import Dataset, load_dataset
from hogwild.errors import ConfigError, WriteFailed, first_line
from hogwild.replica.models import build_model, model_id
from hogwild.replica.shared import bind, layout, state_dict_of

logger = logging.getLogger(__name__)


def _merged_config(ckpt: dict[str, Any], overrides: Sequence[str]) -> DictConfig:
    """The run's own config, with ``key=value`` overrides (e.g. data.root) on top; a key that moved
    since the checkpoint was written is read at its new place (config/moved.py)."""
    try:
        base = OmegaConf.merge(OmegaConf.structured(Config), moved_tree(ckpt["config"]))
    except Exception as e:  # noqa: BLE001 - a config this version cannot read
        key = getattr(e, "full_key", "") or "config"
        raise ConfigError(f"checkpoint: its config does not fit this version of hogwild "
                          f"({key}: {first_line(e)})") from None
    try:
        merged = OmegaConf.merge(base, OmegaConf.from_dotlist(list(overrides)))
    except Exception as e:  # noqa: BLE001 - OmegaConf raises many types for bad dotlists
        raise ConfigError(f"{getattr(e, 'full_key', '') or 'override'}: {first_line(e)}") from None
    assert isinstance(merged, DictConfig)
    return merged


def _resolved(merged: DictConfig, source: str) -> dict[str, Any]:
    try:
        container = OmegaConf.to_container(merged, resolve=True)
    except Exception as e:  # noqa: BLE001 - a ${...} that points nowhere, a resolver that fails
        key = getattr(e, "full_key", "") or "config"
        raise ConfigError(f"{key}: {source} holds a config that cannot be resolved ({first_line(e)})") from None
    assert isinstance(container, dict)
    return container


def rebuild(ckpt: dict[str, Any], path: str, overrides: Sequence[str] = (), trusted: bool = False,
            calls: Sequence[str] = ("model", "data", "loss")) -> tuple[nn.Module, Config, Dataset]:
    """The checkpoint's model, built from its config (with ``overrides``) and holding its values.
    The data is loaded too: a built-in model takes its input shape and class count from it.
    The target gate judges the very config that is then built, interpolations resolved."""
    source = f"checkpoint {path}"
    merged = _merged_config(ckpt, overrides)
    refuse_stored_targets(_resolved(merged, source), list(overrides), trusted, source, calls=tuple(calls))
    cfg = to_config(merged)
    ds = load_dataset(cfg.data)
    model = build_model(cfg.model, ds, cfg.train.seed)
    store.check_compatible(ckpt, path, model_id(cfg.model), [s.shape for s in layout(model)])
    bind(model, ckpt["flat"].float().clone())
    return model, cfg, ds


def portable_state_dict(ckpt: dict[str, Any], path: str, model: Optional[nn.Module] = None,
                        overrides: Sequence[str] = (), trusted: bool = False) -> dict[str, Tensor]:
    """The checkpoint's ``state_dict``: stored in it, or named by ``model`` (the user's own
    module), or by the model its config builds (older files)."""
    stored = ckpt.get("state_dict")
    if stored:
        return dict(stored)
    flat = ckpt["flat"].float().clone()
    if model is None:
        model = rebuild(ckpt, path, overrides, trusted, calls=("model", "data"))[0]
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    theirs, mine = [tuple(s) for s in ckpt.get("shapes", [])], [s.shape for s in layout(model)]
    if theirs != mine:
        raise store.CheckpointError(f"checkpoint: {path} holds shapes {theirs}, which do not fit this model's {mine}")
    return {k: v.clone() for k, v in state_dict_of(model, flat).items()}


def load_into(model: nn.Module, path: str) -> nn.Module:
    """Load the checkpoint at ``path`` into ``model`` (the user's own module, built as for
    training); a mismatch of names or shapes is one line naming the file."""
    ckpt = store.load(path)
    state = portable_state_dict(ckpt, path, model)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise store.CheckpointError(f"checkpoint: {path} does not fit this model ({first_line(e)})") from None
    return model


def _refuse_overwriting_checkpoints(checkpoint: Path, out: Path) -> None:
    """A bare ``state_dict`` written over the checkpoint it came from, or over any file of its run's
    ``checkpoints/`` folder, would replace the run's only resumable state: refused before
    anything is read or written."""
    def same(a: Path, b: Path) -> bool:
        try:
            return a.exists() and b.exists() and os.path.samefile(a, b)
        except OSError:
            return False

    if same(out, checkpoint) or out.resolve() == checkpoint.resolve():
        raise ConfigError(f"out: {str(out)!r} is the checkpoint itself; write the state_dict elsewhere")
    run_ckpts = checkpoint.resolve().parent
    if run_ckpts.name == store.ckpt_dir("").name and (out.resolve().parent == run_ckpts or same(out.parent, run_ckpts)):
        raise ConfigError(f"out: {str(out)!r} is in the run's checkpoint folder {str(run_ckpts)!r}; exporting there "
                          "could replace a checkpoint the run resumes from: write it elsewhere")


def export(path: str, out: str, overrides: Sequence[str] = (), trusted: bool = False) -> int:
    """Write the checkpoint's ``state_dict`` alone to ``out`` (atomically); its tensor count."""
    from pathlib import Path

    from hogwild.files import atomic_write

    target = Path(out)
    if not target.parent.is_dir():
        raise ConfigError(f"out: no such folder {str(target.parent)!r}")
    _refuse_overwriting_checkpoints(Path(path), target)
    ckpt = store.load(path)
    state = {k: v.detach().clone().contiguous() for k, v in portable_state_dict(ckpt, path, None, overrides,
                                                                                 trusted).items()}
    try:
        atomic_write(target, lambda f: torch.save(state, f))
    except OSError as e:  # a full disk, no permission: an output not written (exit 5)
        raise WriteFailed(f"out: cannot write {out!r} ({first_line(e)})") from None
    return len(state)
