"""The coordinator: the store that elastic replicas register, heartbeat and form their groups
through (``sync.coordinator=HOST:PORT``); ``hogwild-coordinator`` (cli/coordinator.py) runs it."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

import torch.distributed as dist

logger = logging.getLogger("hogwild.coordinator")


def serve(host: str, port: int, ready: threading.Event | None = None, stop: threading.Event | None = None) -> None:
    store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    logger.info("coordinator listening on %s:%d", host, store.port)
    stop = stop or threading.Event()
    if ready is not None:
        ready.set()
    while not stop.wait(1.0):  # a timeout, so SIGINT/SIGTERM handlers get to run promptly
        pass
    del store
