"""A stream against the same data map-style: samples/s of hogwild 1 x 2 on the GPT.

The data is ``+experiment=gpt``'s (the standard library's sources in 64-character windows). The
map-style run reads it by index, as the experiment does; the streamed run reads the very same
windows through an ``IterableDataset`` (:func:`streamed`), split round robin between the two
workers, so the only difference is how a worker gets its samples. The two alternate, one pair per
repeat, so host load affects both alike; the figure is metrics.json's ``samples_per_s``.

    python scripts/measures/stream_bench.py --repeats 3 --steps 400 --out bench_results
"""

from __future__ import annotations

import argparse
import logging
import statistics
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts.harness, examples
from torch import Tensor
from torch.utils.data import IterableDataset

REPO = Path(__file__).resolve().parents[2]
logger = logging.getLogger("stream_bench")

GPT = ["+experiment=gpt", "eval.every_s=1000", "checkpoint.every_s=1000", "workers=2"]
MODES = {"map-style": [], "stream": ["data._target_=scripts.measures.stream_bench.streamed"]}


class Windows(IterableDataset):
    """The map-style windows of a dataset, yielded in order: the same data as a stream."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        for i in range(len(self.data)):
            yield self.data[i]


def streamed() -> tuple[Windows, Any]:
    """``+experiment=gpt``'s data, its train split as a stream."""
    from examples.charlm import stdlib_text

    train, test = stdlib_text()
    return Windows(train), test


def run(args: list[str], run_dir: Path) -> dict[str, Any]:
    """One run through the public API (its leader in this process, as a user's script calls it)."""
    import hogwild

    result = hogwild.train([*args, f"run_dir={run_dir}", "resume=false"])
    if result.metrics is None or result.exit_code != 0:
        raise RuntimeError(f"{' '.join(args)}: {result.status} ({result.error})")
    return dict(result.metrics)


def main() -> None:
    # Not at the top: the workers import this module for its data.
    from scripts.harness.common import table_head, write_results

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--out", type=Path, default=REPO / "bench_results")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.chdir(REPO)  # the experiment's data and this module are imported from the repository root
    samples: dict[str, list[float]] = {name: [] for name in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for name, extra in MODES.items():
                m = run([*GPT, *extra, f"train.max_steps={args.steps}", f"train.seed={rep}"], Path(tmp) / "run")
                samples[name].append(float(m["samples_per_s"]))
                logger.info("%s, repeat %d: %.0f samples/s, test loss %.4f", name, rep, samples[name][-1],
                            m["test_loss"])
    med = {name: statistics.median(v) for name, v in samples.items()}
    result = {"workload": "GPT (+experiment=gpt), hogwild 1 x 2", "steps": args.steps, "repeats": args.repeats,
              "samples_per_s": samples, "median": med, "stream_over_map": med["stream"] / med["map-style"]}
    lines = table_head("data", "samples/s (median)", "runs")
    lines += [f"| {name} | {med[name]:.0f} | {', '.join(f'{v:.0f}' for v in samples[name])} |" for name in MODES]
    lines.append(f"\nstream / map-style: {result['stream_over_map']:.3f}")
    write_results(args.out, "stream_bench", result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
