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
from datetime import timedelta

import torch.distributed as dist

from hogwild.errors import first_line, say_error

logger = logging.getLogger("hogwild.elastic.coordinator")


def serve(host: str, port: int, ready: threading.Event | None = None, stop: threading.Event | None = None) -> None:
    store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    logger.info("coordinator listening on %s:%d", host, store.port)
    stop = stop or threading.Event()
    if ready is not None:
        ready.set()
    while not stop.wait(1.0):  # a timeout, so SIGINT/SIGTERM handlers get to run promptly
        pass
    del store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="0.0.0.0", help="address to listen on (default: all)")
    ap.add_argument("--port", type=int, default=29400)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve(args.host, args.port, stop=stop)
    except (RuntimeError, dist.DistError) as e:
        say_error(f"--port {args.port}: cannot listen on {args.host}:{args.port}: {first_line(e)}")
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
