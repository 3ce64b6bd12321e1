"""``hogwild-coordinator``: the store that elastic replicas register, heartbeat and form
their groups through (``sync.coordinator=HOST:PORT``). Run one per job on a host every
machine can reach; it holds no training state and uses almost no CPU.

    hogwild-coordinator --port 29400
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading

import torch.distributed as dist

from hogwild.elastic.coordinator import serve
from hogwild.errors import first_line, guarded, say_error


@guarded
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="0.0.0.0", help="the one address to listen on (default: 0.0.0.0, every IPv4 interface)")
    ap.add_argument("--port", type=int, default=29400)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve(args.host, args.port, stop=stop)
    except (OSError, RuntimeError, dist.DistError) as e:
        say_error(f"--port {args.port}: cannot listen on {args.host}:{args.port}: {first_line(e)}")
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
