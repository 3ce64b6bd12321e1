"""In-place update rules over the flat buffer, with state per worker or in shared memory, and
any ``torch.optim`` optimizer (``optim._target_``) stepping the shared parameters in place.

The flat rules reproduce ``torch.optim`` (SGD with momentum, Adam, AdamW, Adagrad) step for step, but
write only through views of the flat buffer with in-place ops under ``no_grad``, and keep
their state in flat buffers too, so the same code serves private and shared state
(design rule 6 in docs/design.md). Sparse gradients (``EmbeddingBag(sparse=True)``) touch only their rows.
"""

from __future__ import annotations

import math
from typing import Callable, ClassVar, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from hogwild.config.registry import OPTIMIZERS
from hogwild.config.schema import OptimConfig
from hogwild.config.targets import call_target, import_target, schema_kwargs
from hogwild.errors import PASSES, ConfigError, first_line, user_call
from hogwild.replica.shared import Slot, param_slots


def state_names(cfg: OptimConfig) -> tuple[str, ...]:
    if cfg._target_:
        return ()  # a torch optimizer keeps its own state, per worker
    return flat_rule(cfg.name).state(cfg)


def row_tables(model: nn.Module) -> list[Slot]:
    """The flat buffer's slots of the model's embedding tables (``nn.Embedding`` and
    ``nn.EmbeddingBag`` weights): under ``optim.rowwise`` their state is one value per row."""
    weights = {id(m.weight) for m in model.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))}
    return [s for s, p in zip(param_slots(model), model.parameters()) if id(p) in weights and p.dim() == 2]


def state_numel(cfg: OptimConfig, n: int, tables: Sequence[Slot]) -> int:
    """Values in each state buffer of the flat rules for a model of ``n`` values: ``n``, less each
    table's values but one per row under ``optim.rowwise``."""
    return n - sum(t.numel - t.shape[0] for t in tables) if cfg.rowwise else n


def state_slot(slot: Slot, tables: Sequence[Slot]) -> tuple[Slot, bool]:
    """Where ``slot`` of the flat buffer keeps its state, and whether row-wise (it is a table of
    ``tables``): the state buffer is the flat buffer's layout with each table cut to one value a row."""
    shrink = sum(t.numel - t.shape[0] for t in tables if t.offset < slot.offset)
    if any(t.offset == slot.offset and t.shape == slot.shape for t in tables):
        return Slot(slot.name, slot.offset - shrink, (slot.shape[0],)), True
    return Slot(slot.name, slot.offset - shrink, slot.shape), False


def decays(cfg: OptimConfig, shapes: list[tuple[int, ...]]) -> list[float]:
    """Each parameter's weight decay: none for biases and normalisation weights (one dimension)
    when ``optim.decay_norm_and_bias=false``."""
    return [cfg.weight_decay if cfg.decay_norm_and_bias or len(shape) > 1 else 0.0 for shape in shapes]


def clip_grad_norm(grads: list[Optional[Tensor]], max_norm: float) -> float:
    """Scale ``grads`` in place to a total L2 norm of at most ``max_norm``; the norm before.
    Sparse gradients count by their stored values, as :func:`grads_finite` reads them."""
    vals = [g._values() if g.is_sparse else g for g in grads if g is not None]
    if not vals:
        return 0.0
    total = float(torch.stack(torch._foreach_norm(vals)).norm())
    if total > max_norm:
        torch._foreach_mul_(vals, max_norm / (total + 1e-6))
    return total


def grads_finite(grads: list[Optional[Tensor]]) -> bool:
    """A NaN or Inf anywhere makes the norms non-finite; one fused op for all tensors."""
    vals = [g._values() if g.is_sparse else g for g in grads if g is not None]
    if not vals:
        return True
    return bool(torch.isfinite(torch.stack(torch._foreach_norm(vals)).sum()))


class FlatOptimizer:
    def __init__(self, cfg: OptimConfig, flat: Tensor, slots: list[Slot], state: dict[str, Tensor],
                 decay: Optional[list[float]] = None, racing: Optional[bool] = None,
                 tables: Sequence[Slot] = ()) -> None:
        """``decay``: each slot's weight decay, where ``slots`` are pieces of parameters (the
        barrier's shards) whose own shapes no longer say which are biases. ``racing``: other workers
        write the same state while this one reads it (None: when ``optim.state=shared``).
        ``tables``: the model's embedding tables (:func:`row_tables`), row-wise under ``optim.rowwise``."""
        self.cfg, self.lr = cfg, cfg.lr
        self.params = [s.view(flat) for s in slots]
        self.decay = decay if decay is not None else decays(cfg, [s.shape for s in slots])
        placed = [state_slot(s, tables if cfg.rowwise else ()) for s in slots]
        self.rowwise = [row for _, row in placed]
        self.state = {k: [s.view(buf) for s, _ in placed] for k in state_names(cfg) for buf in (state[k],)}
        self.rule = flat_rule(cfg.name)
        self.racing = cfg.state == "shared" if racing is None else racing
        self.t = 0  # Adam's bias-correction step: this worker's own updates, or the replica's (barrier)

    def set_lr(self, lr: float) -> None:
        self.lr = lr

    @staticmethod
    def new_state(cfg: OptimConfig, n: int, alloc: Callable[[int], Tensor]) -> dict[str, Tensor]:
        """A worker's private state for the flat rules (shared state: :func:`new_shared_state`)."""
        return {k: alloc(n) for k in state_names(cfg)}

    @torch.no_grad()
    def step(self, grads: list[Optional[Tensor]]) -> None:
        self.t += 1
        rule, lr = self.rule, self.lr
        for i, (p, g) in enumerate(zip(self.params, grads)):
            if g is None:
                continue
            wd = self.decay[i]
            if g.is_sparse:
                if wd == 0 and rule.sparse_update(self, i, p, g):
                    continue  # rows outside the batch are never written
                g = g.to_dense()
            if rule.decoupled:
                p.mul_(1 - lr * wd)  # decoupled: the decay never enters the rule's state
            elif wd:
                g = g.add(p, alpha=wd)
            rule.update(self, i, p, g)


class FlatRule:
    """One in-place update rule over the flat buffer's views: the state it keeps per parameter
    (model-sized buffers, private or shared) and how one parameter steps."""

    name: ClassVar[str]
    decoupled: ClassVar[bool] = False
    """Weight decay shrinks the weights (AdamW) instead of entering the gradient."""

    def state(self, cfg: OptimConfig) -> tuple[str, ...]:
        return ()

    def rows_only(self, cfg: OptimConfig) -> bool:
        """A sparse gradient's step writes its rows alone (:meth:`sparse_update` takes it)."""
        return False

    def sparse_update(self, opt: FlatOptimizer, i: int, p: Tensor, g: Tensor) -> bool:
        """Step on a sparse gradient's rows alone, without weight decay; False: densify it first."""
        return False

    def update(self, opt: FlatOptimizer, i: int, p: Tensor, g: Tensor) -> None:
        raise NotImplementedError


@OPTIMIZERS.register("sgd")
class SGD(FlatRule):
    def state(self, cfg: OptimConfig) -> tuple[str, ...]:
        return ("momentum",) if cfg.momentum > 0 else ()

    def rows_only(self, cfg: OptimConfig) -> bool:
        return cfg.momentum == 0

    def sparse_update(self, opt: FlatOptimizer, i: int, p: Tensor, g: Tensor) -> bool:
        if not self.rows_only(opt.cfg):
            return False
        p.add_(g, alpha=-opt.lr)
        return True

    def update(self, opt: FlatOptimizer, i: int, p: Tensor, g: Tensor) -> None:
        if opt.cfg.momentum > 0:
            buf = opt.state["momentum"][i]
            buf.mul_(opt.cfg.momentum).add_(g)
            g = buf
        p.add_(g, alpha=-opt.lr)


@OPTIMIZERS.register("adam")
class Adam(FlatRule):
    def state(self, cfg: OptimConfig) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def update(self, opt: FlatOptimizer, i: int, p: Tensor, g: Tensor) -> None:
        m, v = opt.state["exp_avg"][i], opt.state["exp_avg_sq"][i]
        b1, b2 = opt.cfg.betas
        # Shared state is written by other workers while we read it. If we saw another
        # worker's large gradient in m but not yet in v, m/sqrt(v) would explode. So every
        # worker writes v before m, and reads m before v: any m we see has its v in place.
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        m.lerp_(g, 1 - b1)
        m_seen = m.clone() if opt.racing else m
        bc1 = 1 - b1 ** opt.t
        bc2 = 1 - b2 ** opt.t
        denom = (v.sqrt() / math.sqrt(bc2)).add_(opt.cfg.eps)
        p.addcdiv_(m_seen, denom, value=-opt.lr / bc1)


@OPTIMIZERS.register("adamw")
class AdamW(Adam):
    decoupled = True


@OPTIMIZERS.register("adagrad")
class Adagrad(FlatRule):
    def state(self, cfg: OptimConfig) -> tuple[str, ...]:
        return ("sum",)

    def rows_only(self, cfg: OptimConfig) -> bool:
        return True

    def sparse_update(self, opt: FlatOptimizer, i: int, p: Tensor, g: Tensor) -> bool:
        g = g.coalesce()
        idx, vals, s = g._indices()[0], g._values(), opt.state["sum"][i]
        # Row-wise (FBGEMM's rule): a row's accumulator takes the mean of its squared gradient.
        s.index_add_(0, idx, vals.square().mean(1) if opt.rowwise[i] else vals * vals)
        std = s.index_select(0, idx).sqrt_().add_(opt.cfg.eps)
        p.index_add_(0, idx, vals / (std.unsqueeze(1) if opt.rowwise[i] else std), alpha=-opt.lr)
        return True

    def update(self, opt: FlatOptimizer, i: int, p: Tensor, g: Tensor) -> None:
        s = opt.state["sum"][i]
        if opt.rowwise[i]:
            s.add_(g.square().mean(1))
            p.addcdiv_(g, s.sqrt().add_(opt.cfg.eps).unsqueeze(1), value=-opt.lr)
            return
        s.addcmul_(g, g, value=1.0)
        p.addcdiv_(g, s.sqrt().add_(opt.cfg.eps), value=-opt.lr)


def flat_rule(name: str) -> FlatRule:
    rule = OPTIMIZERS.get(name)
    assert isinstance(rule, type) and issubclass(rule, FlatRule)
    return rule()


class TorchOptimizer:
    """``optim._target_``: a ``torch.optim.Optimizer`` over a worker's parameters, which are views
    of the shared buffer. torch's update rules write parameters in place (``add_``, ``addcdiv_``,
    ``_foreach_*``), so every step lands in shared memory; the state stays in this worker."""

    def __init__(self, opt: torch.optim.Optimizer) -> None:
        self.opt = opt

    def set_lr(self, lr: float) -> None:
        for group in self.opt.param_groups:
            group["lr"] = lr

    def step(self, grads: list[Optional[Tensor]]) -> None:
        del grads  # torch's optimizers read .grad, which holds the same tensors
        self.opt.step()


def torch_optimizer(cfg: OptimConfig, params: list[Tensor]) -> TorchOptimizer:
    """Build ``optim._target_`` over ``params``; every way it can fail is one line naming the key."""
    path = str(cfg._target_)
    cls = import_target(path, "optim._target_")
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise ConfigError(f"optim._target_: {path} is not a torch.optim.Optimizer class")
    wd = decays(cfg, [tuple(p.shape) for p in params])
    groups = [{"params": [p for p, d in zip(params, wd) if d == w], "weight_decay": w} for w in sorted(set(wd))]
    # weight_decay goes in the groups; the clip and the state's place are hogwild's own.
    own = schema_kwargs(cfg, cls, path, "optim", handled=("lr", "weight_decay", "decay_norm_and_bias", "state",
                                                           "clip_grad_norm", "update"))
    kwargs = {"lr": cfg.lr, **own, **cfg.kwargs}
    given = {**own, **cfg.kwargs, "lr": cfg.lr}
    return TorchOptimizer(call_target(lambda **kw: cls(groups, **kw), path, "optim", kwargs, given))


Optimizer = Union[FlatOptimizer, TorchOptimizer]

# A torch optimizer's state in shared memory: a key shaped as its parameter lives in a flat buffer
# laid out as the parameters are ("torch:exp_avg"), a scalar one (Adam's "step") in a buffer of one
# value per parameter, always on the CPU, where torch keeps step counts ("torch:step:scalar"), and a
# key of any other shape (Adafactor's row and column variances) in a buffer of every parameter's
# values of it, one after another ("torch:row_var:packed").
TORCH_KEY, SCALAR, PACKED = "torch:", ":scalar", ":packed"


def torch_state_probe(cfg: OptimConfig, params: list[Tensor], key: str = "optim.state",
                      sparse: Optional[list[bool]] = None) -> list[dict[str, object]]:
    """Each parameter's state as ``optim._target_`` keeps it, at its initial values: read off
    the optimizer built over copies of ``params`` and stepped once with zero gradients (torch
    creates most state lazily, at the first step; values it set at construction, Adagrad's
    initial accumulator, are kept). An optimizer that cannot step so (``LBFGS`` wants a closure,
    ``SparseAdam`` sparse gradients) would kill every worker at its first step: it is refused
    here in one line naming ``key``."""
    copies = [p.detach().clone().requires_grad_(p.requires_grad) for p in params]
    opt = torch_optimizer(cfg, copies).opt
    before = [dict(opt.state[c]) for c in copies]
    before = [{k: v.clone() if isinstance(v, Tensor) else v for k, v in b.items()} for b in before]
    for c, is_sparse in zip(copies, sparse or [False] * len(copies)):
        if c.requires_grad:  # zeros in the layout the model's backward gives (preflight's ``sparse``)
            c.grad = torch.zeros_like(c).to_sparse() if is_sparse else torch.zeros_like(c)
    try:
        with user_call(f"{key}: {cfg._target_}.step()", errors=False):
            opt.step()
    except PASSES:
        raise
    except BaseException as e:  # noqa: BLE001 - LBFGS wants a closure, SparseAdam sparse gradients
        what = {"optim.state": "shared state needs",
                "optim.update": "the barrier needs"}.get(key, "a Hogwild worker needs")
        raise ConfigError(f"{key}: {what} an optimizer that steps on its own with the model's gradients; "
                          f"{cfg._target_}.step() raised {type(e).__name__}: {first_line(e)}") from None
    probe: list[dict[str, object]] = []
    for c, b in zip(copies, before):
        probe.append({k: b[k] if k in b else (torch.zeros_like(v) if isinstance(v, Tensor) else v)
                      for k, v in opt.state[c].items()})
    return probe


def _shareable(value: object, param: Tensor) -> Optional[str]:
    """Which shared buffer holds this state value: a parameter-shaped, a scalar or a packed one
    (None: private, for a value that is not a float32 tensor)."""
    if not isinstance(value, Tensor) or value.dtype != torch.float32:
        return None
    if value.shape == param.shape:
        return ""
    return SCALAR if value.numel() == 1 else PACKED


def _state_views(params: list[Tensor], slots: list[Slot], probe: list[dict[str, object]],
                 state: dict[str, Tensor]) -> list[dict[str, Tensor]]:
    """Each parameter's shared state values as views of ``state``'s buffers (which must hold
    every name the probe gives); a packed key's values follow each other in parameter order."""
    packed_at: dict[str, int] = {}
    views: list[dict[str, Tensor]] = []
    for i, (p, values) in enumerate(zip(params, probe)):
        own: dict[str, Tensor] = {}
        for key, value in values.items():
            kind = _shareable(value, p)
            if kind is None:
                continue
            assert isinstance(value, Tensor)
            buf = state[f"{TORCH_KEY}{key}{kind}"]
            if kind == "":
                own[key] = slots[i].view(buf)
            elif kind == SCALAR:
                own[key] = buf[i].view(value.shape)
            else:
                at = packed_at.get(key, 0)
                own[key] = buf[at:at + value.numel()].view(value.shape)
                packed_at[key] = at + value.numel()
        views.append(own)
    return views


def new_shared_state(cfg: OptimConfig, params: list[Tensor], slots: list[Slot], n: int,
                     alloc: Callable[[int, str], Tensor], device: str) -> dict[str, Tensor]:
    """One state per replica in shared memory (the barrier path, or ``optim.state=shared``): the
    buffers the optimizer updates in place, for the flat rules or for a torch optimizer, at its
    initial values."""
    if not cfg._target_:
        return {k: alloc(n, device) for k in state_names(cfg)}
    probe = torch_state_probe(cfg, params)
    sizes: dict[str, int] = {}
    for p, values in zip(params, probe):
        for key, value in values.items():
            kind = _shareable(value, p)
            if kind == PACKED:
                sizes[f"{TORCH_KEY}{key}{kind}"] = sizes.get(f"{TORCH_KEY}{key}{kind}", 0) + value.numel()  # type: ignore[union-attr]
            elif kind is not None:
                sizes[f"{TORCH_KEY}{key}{kind}"] = n if kind == "" else len(params)
    state = {name: alloc(size, "cpu" if name.endswith(SCALAR) else device) for name, size in sizes.items()}
    for own, values in zip(_state_views(params, slots, probe, state), probe):
        for key, view in own.items():
            view.copy_(values[key].reshape(view.shape))  # type: ignore[union-attr]
    return state


def bind_shared_state(opt: torch.optim.Optimizer, params: list[Tensor], slots: list[Slot],
                      state: dict[str, Tensor], probe: list[dict[str, object]]) -> dict[tuple[int, str], int]:
    """Give ``opt`` state tensors that are views of the shared buffers (the rest private, at their
    initial values): torch's update rules write state in place (``lerp_``, ``mul_``,
    ``addcmul_``, ``step += 1``), so every worker's update lands in the same moments, Hogwild-style.
    Returns where each shared value lives, for :func:`rebound_state`."""
    return bind_views(opt, params, probe, _state_views(params, slots, probe, state))


def bind_views(opt: torch.optim.Optimizer, params: list[Tensor], probe: list[dict[str, object]],
               views: list[dict[str, Tensor]]) -> dict[tuple[int, str], int]:
    """:func:`bind_shared_state` for some of the model's parameters, with their entries of the
    whole model's probe and state views (a packed key's place depends on every parameter before)."""
    where: dict[tuple[int, str], int] = {}
    for i, (p, values, shared) in enumerate(zip(params, probe, views)):
        opt.state[p] = {key: shared[key] if key in shared else (value.clone() if isinstance(value, Tensor) else value)
                        for key, value in values.items()}
        where.update({(i, key): view.data_ptr() for key, view in shared.items()})
    return where


def state_views(cfg: OptimConfig, params: list[Tensor], slots: list[Slot], state: dict[str, Tensor]
                ) -> tuple[list[dict[str, object]], list[dict[str, Tensor]]]:
    """Every parameter's probe and its shared state views, probed one parameter at a time: a
    worker then never holds a second copy of the whole model and its state, as a probe of all of
    them at once would."""
    probe = [torch_state_probe(cfg, [p])[0] for p in params]
    return probe, _state_views(params, slots, probe, state)


def check_in_place(cfg: OptimConfig, params: list[Tensor], sparse: list[bool]) -> None:
    """Refuse, in one line naming ``optim._target_``, a torch optimizer that assigns new state
    tensors instead of updating the ones it holds: under the barrier its state is views of the
    replica's shared state, and such an optimizer's steps would never reach it. Two steps on copies
    of the parameters, with state bound as a worker binds it, tell."""
    copies = [p.detach().clone().requires_grad_(p.requires_grad) for p in params]
    opt = torch_optimizer(cfg, copies).opt
    probe = torch_state_probe(cfg, copies, sparse=sparse)
    views = [{k: v.clone() for k, v in values.items() if isinstance(v, Tensor) and _shareable(v, c) is not None}
             for c, values in zip(copies, probe)]
    where = bind_views(opt, copies, probe, views)
    for _ in range(2):
        for c, is_sparse in zip(copies, sparse):
            if c.requires_grad:
                c.grad = torch.ones_like(c).to_sparse() if is_sparse else torch.ones_like(c)
        opt.step()
    key = rebound_state(opt, copies, where)
    if key is not None:
        raise ConfigError(f"optim._target_: {cfg._target_} replaces its state {key!r} with a new tensor at each step "
                          "instead of updating it in place, so the replica's one shared state (optim.update=barrier) "
                          "would never move; use optim.update=hogwild")


def rebound_state(opt: torch.optim.Optimizer, params: list[Tensor], where: dict[tuple[int, str], int]) -> Optional[str]:
    """The first shared state key that ``opt`` no longer keeps in the tensor it was given (an
    optimizer that assigns new state tensors instead of updating them in place), or None: its
    updates would stay in one process while the shared state never moved."""
    for (i, key), ptr in where.items():
        value = opt.state.get(params[i], {}).get(key)
        if not isinstance(value, Tensor) or value.data_ptr() != ptr:
            return key
    return None


def make_optimizer(cfg: OptimConfig, flat: Tensor, slots: list[Slot], params: list[Tensor],
                   state: dict[str, Tensor], tables: Sequence[Slot] = ()) -> Optimizer:
    """The worker's optimizer: a torch one (``optim._target_``), with its state in ``state`` when
    that holds shared buffers, or a flat rule (``tables``: :func:`row_tables`)."""
    if cfg._target_:
        opt = torch_optimizer(cfg, params)
        if any(k.startswith(TORCH_KEY) for k in state):
            bind_shared_state(opt.opt, params, slots, state, torch_state_probe(cfg, params))
        return opt
    return FlatOptimizer(cfg, flat, slots, state, tables=tables)
