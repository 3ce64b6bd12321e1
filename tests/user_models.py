"""Model and data factories that go wrong, for the bad-input tests of ``_target_``."""

from __future__ import annotations

import sys

import torch
from torch import Tensor, nn


def broken(num_classes: int) -> nn.Module:
    raise RuntimeError("this factory always fails")


def exits(num_classes: int) -> nn.Module:
    sys.exit(0)  # a script's habit: it used to end the run with exit 0 and nothing trained


def not_a_module(num_classes: int) -> int:
    return num_classes


class Doubles(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(64, num_classes).double()

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x.flatten(1).double()).float()


def no_pair() -> list:
    return [1, 2, 3]


def wrong_items() -> tuple[list, list]:
    return [("not a tensor", 0)], [("not a tensor", 0)]


def float_labels() -> tuple[list, list]:
    import torch

    item = (torch.zeros(4), torch.tensor(0.5))
    return [item, item], [item, item]


def per_sample_loss(output: Tensor, target: Tensor) -> Tensor:
    """A loss that forgot its reduction: one value per sample."""
    return nn.functional.cross_entropy(output, target, reduction="none")


class ExitsInForward(nn.Module):
    """A forward pass that ends the process as a script would: sys.exit(0)."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        sys.exit(0)


class _FailsInLaterEval(nn.Module):
    """Trains, and fails in its seventh forward in eval() mode: the leader's evaluation or a
    checkpoint's probe, mid-run."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(64, num_classes)
        self.evals = 0

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            self.evals += 1
            if self.evals > 6:
                self.fail()
        return self.fc(x.reshape(len(x), -1))

    def fail(self) -> None:
        raise NotImplementedError


class ExitsInLaterEval(_FailsInLaterEval):
    def fail(self) -> None:
        sys.exit(3)


class RaisesInLaterEval(_FailsInLaterEval):
    def fail(self) -> None:
        raise RuntimeError("evaluation broke")


def interrupting_loss(output: Tensor, target: Tensor) -> Tensor:
    raise KeyboardInterrupt  # no signal: the user's code raised it


class _ExitingItems:
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        sys.exit(3)


def exiting_items() -> tuple[_ExitingItems, _ExitingItems]:
    return _ExitingItems(), _ExitingItems()


class _LateExit:
    """Items past the first hundred call sys.exit, except the middle and last ones, which the
    leader's checks read: only a worker meets one."""

    targets = [i % 2 for i in range(400)]

    def __len__(self) -> int:
        return 400

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        import torch

        if i >= 100 and i not in (200, 399):
            sys.exit(0)
        return torch.zeros(64), i % 2


def late_exit_items() -> tuple[_LateExit, _LateExit]:
    return _LateExit(), _LateExit()


class _Items:
    """A map-style dataset of (64 features, label) with one way to go wrong (``how``)."""

    def __init__(self, how: str) -> None:
        self.how = how
        if how == "unpicklable":
            self.read = lambda i: i  # a lambda: pickle refuses it

    def __len__(self) -> int:
        return -1 if self.how == "negative length" else 40

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        import torch

        if (self.how, i) in (("item 20 raises", 20), ("item 10 raises", 10)):
            raise OSError("a missing image file")
        side = 65 if self.how == "shapes vary" and i == 39 else 64
        return torch.zeros(side), i % 2


def bad_items(how: str) -> tuple[_Items, _Items]:
    return _Items(how), _Items("fine")


class MetaNet(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(64, num_classes, device="meta")

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x.flatten(1))


class LateExitSGD(torch.optim.SGD):
    """An optimizer whose third step calls sys.exit: the preflight's one probe step passes, a
    worker meets it."""

    def step(self, closure=None):  # type: ignore[no-untyped-def, override]
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls >= 3:
            sys.exit(4)
        return super().step(closure)


class RebindingMomentum(torch.optim.Optimizer):
    """Momentum that keeps a new tensor at every step instead of updating the one it has: fine
    for one process, but under optim.update=barrier its shared state would never move."""

    def __init__(self, params, lr: float = 0.1) -> None:  # type: ignore[no-untyped-def]
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[no-untyped-def, override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                state["buf"] = state.get("buf", torch.zeros_like(p)) * 0.9 + p.grad
                p.add_(state["buf"], alpha=-group["lr"])


class PartlyFrozen(nn.Module):
    """A frozen feature layer (every weight 0.01) under a trainable head: an optimizer must never
    step the frozen one, decay included."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Linear(64, 32)
        nn.init.constant_(self.features.weight, 0.01)
        self.features.requires_grad_(False)
        self.head = nn.Linear(32, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.relu(self.features(x.flatten(1))))
