"""A worker's model on the shared buffer, without first writing a private copy of its values.

A worker builds the model as the leader did and then points every parameter at the shared
buffer (replica/shared.py: ``bind``), which frees the values the build drew. For a model of
embedding tables those values are the whole model, per worker, all at once at start-up: two
workers of a 610 MiB table put 1.2 GB on top of the replica for a second, its highest peak.

Memory costs nothing until it is written: ``torch.empty`` takes pages the kernel only provides
when they are first touched. So the worker builds under :class:`NoParameterInit`, which lets
every in-place write to a parameter during the build (``reset_parameters``'s ``normal_``,
``nn.init.uniform_``, a Hugging Face model's ``weight.data.zero_()``) return without writing:
the values would be replaced by the shared buffer's a moment later anyway. Everything else
(buffers, tensors a module keeps as plain attributes, anything computed from a parameter's
shape) is built as before. What this cannot keep right, a module whose construction reads a
parameter's initial values into something the shared buffer does not hold, would see
uninitialised values; none of the models hogwild is tested with does.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from hogwild.config.schema import ModelConfig
from hogwild.data.splits import Dataset
from hogwild.replica.models import build_model
from hogwild.replica.shared import bind

logger = logging.getLogger(__name__)


# In-place ops that only write values: initialisers (torch.nn.init's, and the methods they call)
# and the arithmetic of an init (trunc_normal_'s). An op that changes anything else about a
# parameter (requires_grad_, resize_, set_, transpose_) always runs: skipping one of those would
# change the model, not just leave values unwritten. An op missing here only costs memory.
VALUE_WRITES = frozenset({
    "normal_", "uniform_", "zero_", "fill_", "copy_", "random_", "bernoulli_", "exponential_", "geometric_",
    "log_normal_", "cauchy_", "fill_diagonal_", "masked_fill_", "index_fill_",
    "mul_", "div_", "add_", "sub_", "clamp_", "clamp_min_", "clamp_max_", "erfinv_", "addcmul_", "addcdiv_",
    "constant_", "ones_", "zeros_", "eye_", "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
    "kaiming_normal_", "trunc_normal_", "orthogonal_", "sparse_",
})


class NoParameterInit(TorchFunctionMode):
    """In-place writes of values (:data:`VALUE_WRITES`) to a parameter's storage, through the
    parameter or its ``.data``, do nothing while active."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: set[int] = set()
        """The storages of every parameter seen: ``.data`` is a plain tensor on the same storage."""
        self.skipped = 0

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: Optional[dict[str, Any]] = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        # nn.init's functions come here with their tensor as a keyword.
        t = args[0] if args else kwargs.get("tensor", kwargs.get("input"))
        if isinstance(t, Tensor) and not t.is_meta:
            if isinstance(t, nn.Parameter):
                self.storages.add(t.untyped_storage().data_ptr())
            if name in VALUE_WRITES and t.untyped_storage().data_ptr() in self.storages:
                self.skipped += 1
                return t
        return func(*args, **kwargs)


def build_bound(cfg: ModelConfig, ds: Dataset, seed: int, flat: Tensor) -> nn.Module:
    """The model with every parameter and float buffer a view of ``flat``, its parameters never
    written before they are bound."""
    with NoParameterInit() as mode:
        model = build_model(cfg, ds, seed)
    bind(model, flat)
    logger.debug("model bound to the shared buffer; %d writes to parameters skipped while it was built", mode.skipped)
    return model
