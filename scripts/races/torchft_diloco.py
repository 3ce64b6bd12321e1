"""One replica of torchft's DiLoCo on the same model, data and inner SGD as hogwild's runs: the
outside reference of scripts/races/link.py. Needs ``pip install torchft==0.2.0 opentelemetry-api
opentelemetry-sdk opentelemetry-exporter-otlp-proto-http``; without torchft it says so and
exits 2.

    python scripts/races/torchft_diloco.py --replica 0 --replicas 2 --lighthouse-port 29510 \
        --host 127.0.0.1 --lighthouse-host 127.0.0.1 --workload mlp --interval 50 --target 0.97

Replica 0 also serves the lighthouse. Every replica evaluates the global model right after each
outer sync, off the clock: the replicas hold the same parameters then, so all of them decide to
stop at the same step without a collective of their own. Prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts.harness, examples
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from scripts.harness.baselines import WORKLOADS, Workload, sgd_step, workload_from_args  # noqa: E402
from scripts.harness.common import put_result  # noqa: E402


def run(args: argparse.Namespace, w: Workload) -> dict[str, float]:
    from torchft import Manager, ProcessGroupGloo
    from torchft.coordination import LighthouseServer
    from torchft.local_sgd import DiLoCo

    torch.set_num_threads(1)
    torch.manual_seed(w.seed)  # every replica starts from the same model, as hogwild's do
    lighthouse = None
    if args.replica == 0:
        lighthouse = LighthouseServer(bind=f"[::]:{args.lighthouse_port}", min_replicas=args.replicas)
    ds = w.data()
    model = w.build(ds)
    inner = torch.optim.SGD(model.parameters(), lr=w.lr)
    outer = torch.optim.SGD(model.parameters(), lr=args.outer_lr, momentum=0.9, nesterov=True)
    store = dist.TCPStore(args.host, 0, is_master=True, wait_for_workers=False)
    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=120)), min_replica_size=args.replicas,
                      use_async_quorum=False, load_state_dict=model.load_state_dict,
                      state_dict=model.state_dict,
                      replica_id=f"replica_{args.replica}", store_addr=args.host, store_port=store.port,
                      rank=0, world_size=1, hostname=args.host,
                      # Every replica builds the same model from the same seed, as hogwild's do. The
                      # step-0 heal would fetch it anyway, over an HTTP server that advertises the
                      # host's name, which other namespaces cannot reach.
                      init_sync=False,
                      lighthouse_addr=f"http://{args.lighthouse_host}:{args.lighthouse_port}",
                      timeout=timedelta(seconds=120), quorum_timeout=timedelta(seconds=120),
                      connect_timeout=timedelta(seconds=120))
    sampler = w.sampler(ds, args.replicas, args.replica)
    clock, steps, acc = 0.0, 0, 0.0
    try:
        with DiLoCo(manager, [model], inner, outer, sync_every=args.interval) as _:
            manager.start_quorum()  # the first quorum (startup) off the clock
            for step in range(w.max_epochs * sampler.batches_per_epoch):
                t0 = time.perf_counter()
                # Every sync_every-th inner step is the outer round, inside the optimizer's step.
                sgd_step(model, inner, ds, sampler.batch(step))
                clock += time.perf_counter() - t0
                steps += 1
                if steps % args.interval == 0:
                    acc = w.accuracy(model, ds)
                    if acc >= w.target:
                        break
    finally:
        manager.shutdown()
        if lighthouse is not None:
            lighthouse.shutdown()
    return {"time_to_target_s": clock if acc >= w.target else float("nan"), "test_accuracy": acc,
            "steps": steps * args.replicas}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replica", type=int, required=True)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--host", default="127.0.0.1", help="this replica's address, as the others reach it")
    ap.add_argument("--lighthouse-host", default="127.0.0.1")
    ap.add_argument("--lighthouse-port", type=int, default=29510)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="mlp")
    ap.add_argument("--interval", type=int, default=50)
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--target", type=float, default=None)
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0,
                    help="initial weights, shards and data order (hogwild's train.seed)")
    ap.add_argument("--split-seed", type=int, default=0, help="the digits' train/test split (data.split_seed)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    try:
        import torchft  # noqa: F401
    except ImportError as e:
        sys.stderr.write(f"torchft is not installed here ({e}); benchmarks/links.md §12 has the install line\n")
        raise SystemExit(2) from None
    w = workload_from_args(args)
    put_result(run(args, w))


if __name__ == "__main__":
    main()
