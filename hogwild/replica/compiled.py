"""``train.compile``: the workers' forward (and so their backward) under ``torch.compile``.

The leader checks once, before any worker spawns, that the compiler works on this machine
(:func:`check_compiler`) and resolves the mode the workers receive; each worker then compiles its
own model in place right after binding it to the shared buffer (:func:`compile_model`). The
leader's model, which evaluates, stays eager: compiling it would add a compile to the leader's
start-up, and another for each new shape of the test split's batches, for a few evaluations.
"""

from __future__ import annotations

import logging
import time

import torch
from torch import nn

from hogwild.errors import ConfigError, StopNow, first_line

logger = logging.getLogger(__name__)

OFF, AUTO, DEFAULT = "off", "auto", "default"
BACKEND = "inductor"
# torch's CUDA wheels log this from the C++ build of every compile on a machine without a GPU:
# one line per process (the leader and each worker) that names a CUDA install nobody uses.
_CPP_EXTENSION = "torch.utils.cpp_extension"
_NO_CUDA = "No CUDA runtime is found"


class _DropNoCudaNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_NO_CUDA)


def _quiet_cpp_extension() -> None:
    log = logging.getLogger(_CPP_EXTENSION)
    if not any(isinstance(f, _DropNoCudaNotice) for f in log.filters):
        log.addFilter(_DropNoCudaNotice())


def _stopped(e: BaseException) -> bool:
    """Whether ``e`` is, or wraps, the :class:`StopNow` a signal raised in the leader while it
    compiled: inductor hands it back as an ``InductorError`` (which keeps it as ``inner_exception``),
    and the probe then read as a compiler that does not work here (exit 2, or eager under auto)."""
    todo, seen = [e], set()
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, StopNow):
            return True
        todo += [x.__cause__, x.__context__, getattr(x, "inner_exception", None)]
    return False


def _why(e: BaseException) -> str:
    """``Type: first line`` of the failure's root cause: torch may raise its own wrapper from the
    compiler's error, and the innermost one names what to fix. (An ``InductorError`` carries no
    cause but names its inner error first: ``InductorError: InvalidCxxCompiler: No working C++
    compiler found ...``.)"""
    while e.__cause__ is not None:
        e = e.__cause__
    return f"{type(e).__name__}: {first_line(e)}"


def _probe(mode: str, device: torch.device) -> None:
    """Compile and run one tiny forward and backward, as a worker's first step would."""
    lin = nn.Linear(8, 4).to(device)
    # A Linear alone lowers to an external matmul that needs no C++ compiler; the tanh and the sum
    # make inductor generate and build kernels of its own, forward and backward, as a real model does.
    fn = torch.compile(lambda x: torch.tanh(lin(x)).sum(), mode=mode, backend=BACKEND, fullgraph=True)
    fn(torch.randn(2, 8, device=device)).backward()
    if lin.weight.grad is None:
        raise RuntimeError("the compiled backward left no gradient")


def check_compiler(mode: str, device: torch.device) -> str:
    """The mode the workers compile with (``off``: none), checked here in the leader before any
    worker spawns: a compiler that fails in every worker would otherwise kill them one by one
    (each respawn failing again) with a traceback file each, instead of one line before training.

    Raises :class:`ConfigError` (exit 2) for an explicit mode that does not work here; ``auto``
    then trains uncompiled with one warning, and means ``default`` where compiling works."""
    if mode == OFF:
        return OFF
    wanted = DEFAULT if mode == AUTO else mode
    _quiet_cpp_extension()
    t0 = time.perf_counter()
    try:
        _probe(wanted, device)
    except Exception as e:  # noqa: BLE001 - any failure of torch.compile here is the environment's
        if _stopped(e):  # a SIGINT/SIGTERM during the probe: a stop (exit 130/143), not a broken compiler
            raise StopNow() from None
        why = _why(e)
        if mode == AUTO:
            logger.warning("train.compile=auto: torch.compile does not work here (%s); training uncompiled (eager)",
                           why)
            return OFF
        raise ConfigError(f"train.compile: torch.compile does not work here ({why}); set train.compile=off, "
                          "or auto to fall back to eager") from None
    logger.debug("train.compile: the compiler probe (mode %s on %s) took %.2f s", wanted, device,
                 time.perf_counter() - t0)
    logger.info("train.compile=%s: each worker compiles the model's forward and backward (torch.compile, mode %s) "
                "at start-up; the leader's evaluation stays eager", mode, wanted)
    return wanted


def compile_model(model: nn.Module, mode: str) -> None:
    """Compile ``model`` in place with ``mode`` as resolved by :func:`check_compiler` (``off``:
    nothing). Called in a worker after :func:`hogwild.replica.shared.bind`; the compile itself
    happens at the model's first call, the worker's warm-up step, so it counts as start-up."""
    if mode == OFF:
        return
    if mode == AUTO:
        raise ValueError("train.compile=auto reached a worker unresolved: check_compiler must run in the leader first")
    _quiet_cpp_extension()
    # In place, not ``torch.compile(model)``: nn.Module.compile keeps this very module object and
    # its parameter tensors, which are views of the replica's flat shared buffer. Every other
    # worker's update lands in those views and the leader reads and syncs the buffer; a copy or a
    # rebinding would train a private model nobody sees. The step contract (replica/step.py) and a
    # user's step._target_ keep calling ``model(...)`` and reading ``model.forward``'s signature.
    model.compile(mode=mode, backend=BACKEND)


def warm_up_in_training_mode(model: nn.Module, mode: str) -> bool:
    """Whether a worker's throw-away warm-up step runs ``model`` in training mode: when it is
    compiled and holds no float buffer. Dynamo specialises on ``module.training`` (dropout reads
    it), so an eval-mode warm-up compiled a graph training never runs and left the training graph's
    compile (over ten seconds for the GPT of ``+experiment=gpt`` on 2 busy cores) to the first
    training step, on the training clock. A model with float buffers (BatchNorm's running statistics, which every
    worker shares) keeps the eval-mode warm-up: a training forward would move them."""
    return mode != OFF and not any(b.is_floating_point() for b in model.buffers())
