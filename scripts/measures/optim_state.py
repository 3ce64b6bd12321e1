"""Adam-type optimizers at one and two workers, side by side: the barrier (the default, one state
per replica stepping on the workers' fresh gradients) against Hogwild with per-worker or shared state.

The regression of the issue that asked (a BatchNorm MLP on scikit-learn's diabetes data, MSE,
AdamW at lr 0.01, 30 epochs): test R² of one worker, and of two workers under the barrier
(``optim.update=barrier``) and under Hogwild with per-worker moments (``optim.update=hogwild
optim.state=worker``) and with shared moments (``optim.state=shared``), for torch's AdamW
(``optim._target_=torch.optim.AdamW``) and the flat rule (``optim=adamw``). Repeats interleave
the configurations, one seed per repeat, so a change in the machine's load hits each alike.

    python scripts/measures/optim_state.py --repeats 3 --out bench_results
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts.harness, examples
from scripts.harness.common import train

logger = logging.getLogger("optim_state")

BASE = ["+experiment=regression", "+model.batchnorm=true", "optim.lr=0.01", "optim.weight_decay=0.01",
        "train.epochs=30", "eval.every_s=60"]
OPTIMIZERS = {"torch AdamW": ["optim._target_=torch.optim.AdamW"], "flat adamw": ["optim=adamw"]}
SETUPS = {"1 worker": ["workers=1"],
          "2 workers, barrier (default)": ["workers=2"],
          "2 workers, hogwild, per-worker state": ["workers=2", "optim.update=hogwild", "optim.state=worker"],
          "2 workers, hogwild, shared state": ["workers=2", "optim.update=hogwild", "optim.state=shared"]}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    results: dict[str, list[float]] = {f"{o} | {s}": [] for o in OPTIMIZERS for s in SETUPS}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(a.repeats):
            for opt, opt_args in OPTIMIZERS.items():
                for setup, setup_args in SETUPS.items():
                    value = float(train([*BASE, *opt_args, *setup_args, f"train.seed={seed}"], Path(tmp) / "run",
                                        timeout=600)["test_r2"])
                    results[f"{opt} | {setup}"].append(value)
                    logger.info("seed %d  %-45s R² %.4f", seed, f"{opt} | {setup}", value)
    print("| optimizer | setup | median R² | runs |\n|---|---|---|---|")
    for name, values in results.items():
        opt, setup = name.split(" | ")
        print(f"| {opt} | {setup} | {statistics.median(values):.3f} | {', '.join(f'{v:.3f}' for v in values)} |")
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "optim_state.json").write_text(json.dumps({"command": sys.argv, "base": BASE, "r2": results},
                                                           indent=2) + "\n")


if __name__ == "__main__":
    main()
