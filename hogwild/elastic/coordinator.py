"""The coordinator: the store that elastic replicas register, heartbeat and form their groups
through (``elastic.coordinator=HOST:PORT``); ``hogwild-coordinator`` (cli/coordinator.py) runs it."""

from __future__ import annotations

import logging
import socket
import threading
import time
from datetime import timedelta

import torch.distributed as dist

logger = logging.getLogger("hogwild.coordinator")


def listen(host: str, port: int) -> socket.socket:
    """A listening socket bound to ``host`` alone. A master ``TCPStore`` given only a host name
    listens on every interface whatever the name says, so a coordinator asked to stay on
    127.0.0.1 would be reachable from the network; handing it a socket we bound keeps the
    address the user chose (docs/machines.md's advice on keeping the port private relies on it)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise OSError(f"cannot resolve host {host!r} ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:  # "::" means IPv6 only, as "0.0.0.0" means IPv4 only
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


FINISHED = "finished"
"""The key the job's last writer sets when the job is done (leader/elastic.py)."""


def serve(host: str, port: int, ready: threading.Event | None = None, stop: threading.Event | None = None,
          exit_after_finish: float | None = None) -> None:
    """Serve until ``stop`` is set, or (``exit_after_finish``) that many seconds after the job
    finished: a scheduler that runs the coordinator as a role of the job (TorchX, Kubernetes) sees
    the job end, and a replica that wakes in the grace still learns that it finished."""
    sock = listen(host, port)
    bound = sock.getsockname()[1]
    try:
        store = dist.TCPStore(host, bound, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30),
                              master_listen_fd=sock.fileno())
    except BaseException:
        sock.close()
        raise
    # The store owns the descriptor from here and closes it when it goes: closing it again
    # could close whatever the process opened under the same number meanwhile.
    sock.detach()
    logger.info("coordinator listening on %s:%d", host, bound)
    stop = stop or threading.Event()
    if ready is not None:
        ready.set()
    finished_at: float | None = None
    while not stop.wait(1.0):  # a timeout, so SIGINT/SIGTERM handlers get to run promptly
        if exit_after_finish is None:
            continue
        if finished_at is None and store.check([FINISHED]):
            finished_at = time.monotonic()
            logger.info("the job finished: the coordinator exits in %gs", exit_after_finish)
        if finished_at is not None and time.monotonic() - finished_at >= exit_after_finish:
            break
    del store
