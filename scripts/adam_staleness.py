"""Why two Hogwild workers with AdamW lose to one process on the GPT: a one-process model of
what they do, step by step, without races or timing.

Each "worker" keeps its own AdamW state (hogwild's default ``optim.state=worker``) and the two
alternate, each applying a gradient computed before the other's last update (staleness one,
what two Hogwild workers of equal speed see). Four variants train the GPT of ``examples/gpt.py``
for the same number of updates from the same start, with the §15 recipe (warm-up and cosine,
clipping, decay on matrices), and report the test loss on the first 512 test blocks:

- ``one``: one AdamW, fresh gradients (a single process);
- ``two``: two AdamW states alternating, fresh gradients;
- ``one_stale``: one AdamW, gradients one update old;
- ``two_stale``: two AdamW states alternating, gradients one update old (two Hogwild workers);
- ``two_stale_dc``: ``two_stale`` with the stale gradient corrected to first order for the update
  it missed (delay compensation, as DC-ASGD, Zheng et al. 2017, scaled by Adam's second moment):
  ``g + λ·g²·(w_now − w_read)/sqrt(v)``. An exploration, not a hogwild option.

    python scripts/adam_staleness.py --steps 600 --lr 3e-3 --out bench_results/adam_staleness.json
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

logger = logging.getLogger("adam_staleness")
VARIANTS = ("one", "two", "one_stale", "two_stale", "two_stale_dc")
WD, WARMUP, CLIP, BATCH = 0.05, 100, 1.0, 32


def _rms(opt: torch.optim.Optimizer, p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Adam's running root mean square of ``p``'s gradient (the gradient's size before its first step)."""
    v = opt.state.get(p, {}).get("exp_avg_sq")
    return (v.sqrt() if v is not None else g.abs()) + 1e-8


def run(variant: str, steps: int, lr: float, beta1: float, seed: int, dc_lambda: float = 32.0) -> float:
    from examples.charlm import stdlib_text
    from examples.gpt import GPT, GPTConfig

    train, test = stdlib_text(test_chars=120_000)
    x_all, y_all = torch.stack([train[i][0] for i in range(len(train))]), train.targets
    x_test, y_test = torch.stack([test[i][0] for i in range(512)]), test.targets[:512]
    torch.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=4))
    ps = list(model.parameters())

    def adamw() -> torch.optim.AdamW:
        groups = [{"params": [p for p in ps if p.dim() > 1], "weight_decay": WD},
                  {"params": [p for p in ps if p.dim() <= 1], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr, betas=(beta1, 0.999))

    opts = [adamw(), adamw()] if variant.startswith("two") else [adamw()]
    gen = torch.Generator().manual_seed(seed + 1)
    previous: Any = None
    for t in range(steps):
        rate = lr * min(1.0, (t + 1) / WARMUP) * 0.5 * (1 + math.cos(math.pi * t / steps))
        idx = torch.randint(len(x_all), (BATCH,), generator=gen)
        for p in ps:
            p.grad = None
        model(x_all[idx], y_all[idx])[1].backward()
        fresh = [p.grad.clone() for p in ps]
        use = fresh
        opt = opts[t % len(opts)]
        if "stale" in variant:  # the gradient of the state before the last update, and that state
            now = [p.detach().clone() for p in ps]
            (use, read), previous = (previous if previous is not None else (fresh, now)), (fresh, now)
            if variant.endswith("dc"):
                use = [g + dc_lambda * g * g * (p.detach() - w) / _rms(opt, p, g) for p, g, w in zip(ps, use, read)]
        for p, g in zip(ps, use):
            p.grad = g
        torch.nn.utils.clip_grad_norm_(ps, CLIP)
        for group in opt.param_groups:
            group["lr"] = rate
        opt.step()
    model.eval()
    with torch.no_grad():
        return float(model(x_test, y_test)[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600, help="updates per variant")
    ap.add_argument("--lr", type=float, nargs="+", default=[3e-3], help="peak learning rates to try")
    ap.add_argument("--beta1", type=float, nargs="+", default=[0.9], help="AdamW beta1 values to try")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--dc-lambda", type=float, default=32.0, help="two_stale_dc: the correction's weight")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "bench_results" / "adam_staleness.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    rows = []
    for lr in args.lr:
        for beta1 in args.beta1:
            for variant in args.variants:
                loss = run(variant, args.steps, lr, beta1, args.seed, args.dc_lambda)
                logger.info("%s lr=%g beta1=%g: test loss %.4f", variant, lr, beta1, loss)
                rows.append({"variant": variant, "lr": lr, "beta1": beta1, "steps": args.steps, "test_loss": loss})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": sys.argv, "runs": rows}, indent=1))
    sys.stdout.write("| variant | lr | beta1 | test loss |\n|---|---|---|---|\n")
    for r in rows:
        sys.stdout.write(f"| {r['variant']} | {r['lr']:g} | {r['beta1']:g} | {r['test_loss']:.4f} |\n")


if __name__ == "__main__":
    main()
