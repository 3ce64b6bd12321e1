"""One registry per choice the user makes by name: ``sync.mode``, ``sync.dtype``, ``sched.name``,
``task``, ``optim.name``, ``pace.policy``, ``model.name``, ``data.name``.

The implementations register themselves here (a sync rule class, a model builder, a dataset
loader), and the config checks read the same table: a new rule needs no second list, and the
list in an error message is always the list that works (design rule 21 in docs/design.md).
The config package comes first in the flow, so a registry imports the modules that fill it
(its *providers*) when first read, not at import time.
"""

from __future__ import annotations

import importlib
from typing import Callable, Generic, TypeVar

from hogwild.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, key: str, *providers: str) -> None:
        self.key, self.providers = key, providers
        self._items: dict[str, T] = {}
        self._loaded = False

    def register(self, name: str) -> Callable[[T], T]:
        def add(item: T) -> T:
            if name in self._items and self._items[name] is not item:
                raise ValueError(f"{self.key}: {name!r} is registered twice")
            self._items[name] = item
            return item
        return add

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            for module in self.providers:
                importlib.import_module(module)

    def names(self) -> list[str]:
        self._load()
        return list(self._items)

    def check(self, name: str) -> None:
        if name not in self.names():
            raise ConfigError(f"{self.key}: unknown value {name!r}; choose one of {', '.join(self.names())}")

    def get(self, name: str) -> T:
        self.check(name)
        return self._items[name]


# Typed loosely here (the config package knows no model, loader or rule); each provider
# registers what its own module defines.
SYNC_RULES: Registry[type] = Registry("sync.mode", "hogwild.sync.rules")
WIRES: Registry[Callable[[], object]] = Registry("sync.dtype", "hogwild.sync.wire")
SCHEDULES: Registry[Callable[..., float]] = Registry("sched.name", "hogwild.replica.lr_schedule")
TASKS: Registry[type] = Registry("task", "hogwild.replica.tasks")
OPTIMIZERS: Registry[type] = Registry("optim.name", "hogwild.replica.optim")
PACERS: Registry[type] = Registry("pace.policy", "hogwild.replica.pacing")
MODELS: Registry[Callable[..., object]] = Registry("model.name", "hogwild.replica.models")
DATASETS: Registry[Callable[..., object]] = Registry("data.name", "hogwild.data.datasets", "hogwild.data.mapped",
                                                 "hogwild.data.tokens")
