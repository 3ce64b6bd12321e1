"""hogwild: Hogwild! inside a machine, periodic sync rounds between machines, for PyTorch.

The Python API (see hogwild/api.py and docs/api.md): ``train``, ``compose``,
``load_model``, the result type ``RunResult`` and the errors ``ConfigError`` and ``RunFailed``.
Importing the package is cheap; each name loads its module on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ConfigError", "RunFailed", "RunResult", "Status", "UserError", "compose", "load_model", "train"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Lazy: spawned workers import hogwild.replica.worker through this package, and must not
    # pay for Hydra or the leader.
    if name in __all__:
        from hogwild import api

        return getattr(api, name)
    raise AttributeError(f"module 'hogwild' has no attribute {name!r}")
