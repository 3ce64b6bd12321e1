"""The outside arms of the language-model race (``scripts/races/link.py --workload gpt|gpt_large``): one
rank of DDP (plain, with torch's fp16 compression hook, or with its PowerSGD hook) or of torchft's
DiLoCo, on the GPT of ``examples/gpt.py`` with hogwild's ``+experiment=gpt`` recipe: AdamW with
decay on matrices only, warm-up, then a cosine over the wall-clock budget, clipping at 1.0,
batches of 32 per process.

Every arm of a race is evaluated the same way as hogwild's leader evaluates (``--eval-every-s`` on
the clock, on the race's small test split, by rank 0), and its final model on the whole test split
off the clock. Prints one ``RESULT {json}`` line (rank 0) with the curve.

    python scripts/harness/arms.py --arm ddp_powersgd --powersgd-rank 2 --rank 0 --world 2 --port 29600 \\
        --size gpt_large --budget 120
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts.harness, examples
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from hogwild.bench import budget_rate  # noqa: E402
from scripts.harness.common import put_result  # noqa: E402

WD, WARMUP, CLIP, BATCH, CONTEXT = 0.05, 100, 1.0, 32, 64
LR = 3e-3
"""``+experiment=gpt``'s peak rate, hogwild's default for this model."""
SIZES: dict[str, dict[str, int]] = {
    # The pacing grid's step times (scripts/races/pace_grid.py), one thread, batch 32 x 64 on this host.
    "gpt_tiny": {"n_layer": 1, "n_embd": 48, "n_head": 2},  # 38k parameters: about 10 ms a step
    "gpt_small": {"n_layer": 2, "n_embd": 64, "n_head": 4},  # 0.11M: about 40 ms a step
    "gpt": {"n_layer": 4, "n_embd": 128, "n_head": 4},  # benchmarks/one-machine.md §15: 0.8M parameters
    "gpt_mid": {"n_layer": 4, "n_embd": 160, "n_head": 4},  # 1.3M: between the two, for where chunks stop paying
    "gpt_large": {"n_layer": 4, "n_embd": 192, "n_head": 4},  # 1.8M: a step's gradient is 7.3 MB
    "gpt_xl": {"n_layer": 7, "n_embd": 256, "n_head": 4},  # 5.6M: the grid's 1 s step
}
TEST_CHARS = 120_000
"""The test split, every arm alike: §15's 1,874 blocks, the last 120,000 characters (the rest trains)."""
EVAL_BLOCKS = 128
"""What every arm scores during training: the test split's first 128 blocks (hogwild: one batch of
``eval.batch_size=128``); the final model is scored on these and on the whole split."""
ARMS = ("ddp", "ddp_fp16", "ddp_powersgd", "torchft_diloco")
SCRIPT = Path(__file__).resolve()
"""This module, which a race runs once per rank of an outside arm."""
LM_ARMS = ("hogwild", "ddp", "ddp_fp16", "ddp_powersgd1", "ddp_powersgd2", "ddp_powersgd4", "torchft_diloco")
"""The language-model race's arms (scripts/races/lm_race.py): hogwild on its defaults, and what a user on
a slow link would pick instead."""
LM_DEFAULT = ("hogwild", "ddp", "ddp_fp16", "ddp_powersgd2", "torchft_diloco")


def hogwild_overrides(size: str, budget: float, eval_every_s: float, warmup: int = WARMUP) -> list[str]:
    """hogwild's run of the race: ``+experiment=gpt`` at ``size``, stopped by its own clock, with
    its evaluations during training on the race's small split at the race's cadence, warmed up over
    ``warmup`` optimizer steps as the outside arms are (``--warmup``)."""
    cfg = SIZES[size]
    return ["+experiment=gpt", *[f"model.kwargs.config.{k}={v}" for k, v in cfg.items()],
            f"sched.warmup_steps={warmup}", f"+data.test_chars={TEST_CHARS}", "train.max_steps=100000000",
            f"train.max_time={budget}",
            f"eval.every_s={eval_every_s}", "eval.max_fraction=1.0", f"eval.batch_size={EVAL_BLOCKS}",
            "eval.max_batches=1", "checkpoint.every_s=100000"]


def rate(lr: float, budget: float, warmup: int = WARMUP, schedule: str = "clock") -> Callable[[int, float], float]:
    """The rate of step ``step`` after ``spent`` seconds of a ``budget``. ``clock``: warm-up over the first
    ``warmup`` steps, times a cosine over the budget's seconds. ``steps``: hogwild's own schedule under
    ``train.max_time`` (hogwild/replica/lr_schedule.py): the warm-up climbs to the peak, then a cosine
    runs over the steps the budget allows at the pace so far. The clock's cosine starts at the first
    second, under the warm-up; a run shorter than its warm-up never decays under ``steps`` (the 1 s
    step's 75-95 step runs), where ``clock`` anneals anyway."""
    if schedule == "clock":
        return lambda step, spent: lr * min(1.0, (step + 1) / warmup) * 0.5 * (
            1 + math.cos(math.pi * min(spent / budget, 1.0)))

    return budget_rate(lr, warmup, budget)


def adamw(model: torch.nn.Module, lr: float) -> torch.optim.AdamW:
    ps = list(model.parameters())
    return torch.optim.AdamW([{"params": [p for p in ps if p.dim() > 1], "weight_decay": WD},
                              {"params": [p for p in ps if p.dim() <= 1], "weight_decay": 0.0}], lr=lr)


def test_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean token cross-entropy of ``model`` on blocks ``x`` -> ``y``, in eval mode."""
    model.eval()
    with torch.no_grad():
        total = sum(float(model(x[i:i + 256], y[i:i + 256])[1]) * len(x[i:i + 256]) for i in range(0, len(x), 256))
    model.train()
    return total / len(x)


def gpt(size: str) -> torch.nn.Module:
    from examples.gpt import GPT, GPTConfig

    return GPT(GPTConfig(**SIZES[size]))


@dataclass
class Race:
    """What every arm shares: the data, the model's start, the clock and the evaluations."""

    args: argparse.Namespace

    def __post_init__(self) -> None:
        from examples.charlm import stdlib_text

        train, test = stdlib_text(test_chars=TEST_CHARS)
        self.x, self.y = torch.stack([train[i][0] for i in range(len(train))]), train.targets
        self.x_test, self.y_test = torch.stack([test[i][0] for i in range(len(test))]), test.targets
        self.x_eval, self.y_eval = self.x_test[:EVAL_BLOCKS], self.y_test[:EVAL_BLOCKS]
        torch.manual_seed(self.args.seed)  # every rank and replica starts from the same model
        self.model = gpt(self.args.size)
        self.gen = torch.Generator().manual_seed(1000 * self.args.seed + self.args.rank)
        self.curve: list[dict[str, float]] = []
        self.eval_s = 0.0
        self.next_eval = 0.0

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(len(self.x), (BATCH,), generator=self.gen)
        return self.x[idx], self.y[idx]

    def maybe_evaluate(self, spent: float, step: int) -> None:
        """Rank 0 scores the race's small split every ``--eval-every-s`` of training, on the clock,
        as hogwild's leader does."""
        if self.args.rank != 0 or spent < self.next_eval:
            return
        t0 = time.monotonic()
        self.curve.append({"s": spent, "step": step, "loss": test_loss(self.model, self.x_eval, self.y_eval)})
        self.eval_s += time.monotonic() - t0
        self.next_eval = spent + self.args.eval_every_s

    def scores(self, model: torch.nn.Module) -> tuple[float, float]:
        """``model``'s test loss on the race's blocks and on the whole split, off the clock."""
        return test_loss(model, self.x_eval, self.y_eval), test_loss(model, self.x_test, self.y_test)

    def result(self, steps: int, spent: float, world: int) -> dict[str, Any]:
        """Rank 0's record: the final model on the race's blocks (the curve's last point) and on the
        whole test split, both off the clock."""
        subset, loss = self.scores(self.model)
        self.curve.append({"s": spent, "step": steps, "loss": subset})
        return {"loss": loss, "steps": steps * world, "steps_per_replica": steps, "train_s": spent,
                "tokens_per_s": steps * world * BATCH * CONTEXT / max(spent, 1e-9), "curve": self.curve,
                "eval_fraction": self.eval_s / max(spent, 1e-9),
                "params": sum(p.numel() for p in self.model.parameters())}


def _join(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{args.addr}:{args.port}", rank=args.rank,
                            world_size=args.world, timeout=timedelta(seconds=600))


def _hook(ddp: Any, args: argparse.Namespace) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    if args.arm == "ddp_fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif args.arm == "ddp_powersgd":
        # torch's recommended setup: error feedback and warm start on, compression from
        # start_powerSGD_iter on (plain all-reduce before it, where the early steps are fragile).
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                   start_powerSGD_iter=args.powersgd_start, use_error_feedback=True,
                                   warm_start=True, min_compression_rate=2)
        ddp.register_comm_hook(state, psgd.powerSGD_hook)


def ddp_rank(args: argparse.Namespace) -> Optional[dict[str, Any]]:
    """One DDP rank: every step all-reduces the gradients (through the arm's hook)."""
    _join(args)
    race = Race(args)
    net = torch.nn.parallel.DistributedDataParallel(race.model)
    _hook(net, args)
    opt = adamw(race.model, args.lr)
    lr_at = rate(args.lr, args.budget, args.warmup, args.schedule)
    step, t0, spent = 0, None, 0.0
    over = torch.zeros(1)
    while True:
        spent = 0.0 if t0 is None else time.monotonic() - t0
        if t0 is not None:
            race.maybe_evaluate(spent, step)
            over[0] = float(spent >= args.budget)
            dist.all_reduce(over, op=dist.ReduceOp.MAX)  # every rank stops at the same step
            if over[0] > 0:
                break
        for g in opt.param_groups:
            g["lr"] = lr_at(step, spent)
        opt.zero_grad(set_to_none=True)
        x, y = race.batch()
        net(x, y)[1].backward()
        torch.nn.utils.clip_grad_norm_(race.model.parameters(), CLIP)
        opt.step()
        step += 1
        if t0 is None:
            t0 = time.monotonic()  # start-up and the first step's one-off costs are off the clock
    out = race.result(step, spent, args.world) if args.rank == 0 else None
    dist.barrier()
    return out


def diloco_rank(args: argparse.Namespace) -> Optional[dict[str, Any]]:
    """One replica of torchft's DiLoCo: AdamW inside, outer Nesterov SGD every ``--interval``
    steps. The replicas agree at each outer step whether another interval fits the budget (replica
    0 decides, over a store), so both end on the same global model, near the budget."""
    from torchft import Manager, ProcessGroupGloo
    from torchft.coordination import LighthouseServer
    from torchft.local_sgd import DiLoCo

    torch.set_num_threads(1)
    race = Race(args)
    lighthouse = None
    if args.rank == 0:
        lighthouse = LighthouseServer(bind=f"[::]:{args.port}", min_replicas=args.world)
    votes = dist.TCPStore(args.addr, args.port + 1, args.world, is_master=args.rank == 0,
                          timeout=timedelta(seconds=600))
    store = dist.TCPStore(args.host, 0, is_master=True, wait_for_workers=False)
    inner = adamw(race.model, args.lr)
    outer = torch.optim.SGD(race.model.parameters(), lr=args.outer_lr, momentum=0.9, nesterov=True)
    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=600)), min_replica_size=args.world,
                      use_async_quorum=False, load_state_dict=race.model.load_state_dict,
                      state_dict=race.model.state_dict, replica_id=f"replica_{args.rank}", store_addr=args.host,
                      store_port=store.port, rank=0, world_size=1, hostname=args.host,
                      # Every replica builds the same model from the same seed (see torchft_diloco.py).
                      init_sync=False, lighthouse_addr=f"http://{args.addr}:{args.port}",
                      timeout=timedelta(seconds=600), quorum_timeout=timedelta(seconds=600),
                      connect_timeout=timedelta(seconds=600))
    lr_at = rate(args.lr, args.budget, args.warmup, args.schedule)
    step, t0, spent, per_step = 0, None, 0.0, 0.0
    try:
        with DiLoCo(manager, [race.model], inner, outer, sync_every=args.interval):
            manager.start_quorum()
            while True:
                spent = 0.0 if t0 is None else time.monotonic() - t0
                if t0 is not None:
                    race.maybe_evaluate(spent, step)
                for g in inner.param_groups:
                    g["lr"] = lr_at(step, spent)
                inner.zero_grad(set_to_none=True)
                x, y = race.batch()
                race.model(x, y)[1].backward()
                torch.nn.utils.clip_grad_norm_(race.model.parameters(), CLIP)
                inner.step()  # every interval-th step is the outer round, inside this call
                step += 1
                if t0 is None:
                    t0 = time.monotonic()
                if step % args.interval:
                    continue
                spent = time.monotonic() - t0
                per_step = spent / max(step - 1, 1)
                key = f"stop{step}"
                if args.rank == 0:  # end where the next interval would overshoot the budget by more than half
                    votes.set(key, "1" if spent + per_step * args.interval / 2 >= args.budget else "0")
                if votes.get(key) == b"1":
                    break
    finally:
        manager.shutdown()
        if lighthouse is not None:
            lighthouse.shutdown()
    return race.result(step, spent, args.world) if args.rank == 0 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arm", choices=ARMS, required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--addr", default="127.0.0.1", help="rank 0's address (DDP's store, torchft's lighthouse)")
    ap.add_argument("--host", default="127.0.0.1", help="torchft: this replica's address, as the others reach it")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--size", choices=sorted(SIZES), default="gpt")
    ap.add_argument("--budget", type=float, default=120.0, help="seconds of training from the first step")
    ap.add_argument("--lr", type=float, default=LR)
    ap.add_argument("--eval-every-s", type=float, default=10.0)
    ap.add_argument("--warmup", type=int, default=WARMUP, help="optimizer steps of the rate's linear warm-up")
    ap.add_argument("--schedule", choices=("clock", "steps"), default="clock",
                    help="the cosine over the budget's seconds, times the warm-up (clock), or hogwild's own (steps)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--powersgd-rank", type=int, default=2)
    ap.add_argument("--powersgd-start", type=int, default=2,
                    help="steps of plain all-reduce before PowerSGD compresses (torch's start_powerSGD_iter)")
    ap.add_argument("--interval", type=int, default=30, help="torchft DiLoCo: inner steps between outer steps")
    ap.add_argument("--outer-lr", type=float, default=0.7, help="torchft DiLoCo: outer Nesterov rate (momentum 0.9)")
    args = ap.parse_args()
    out = diloco_rank(args) if args.arm == "torchft_diloco" else ddp_rank(args)
    if out is not None:
        put_result(out)
    sys.stdout.flush()
    # torch's exit after a Gloo run sometimes aborts in a C++ destructor (see races/link.py): the result is out.
    os._exit(0)


if __name__ == "__main__":
    main()
