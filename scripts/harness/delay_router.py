"""A one-way latency between simulated machines without ``netem``: a userspace delay router over TUN.

This host's kernel has no ``sch_netem``, so ``tc qdisc ... netem delay`` fails and the machines of
:mod:`scripts.harness.links` would meet with no latency at all, which leaves the latency term of a
ring all_reduce (2 (N - 1) hops, each paying the link's delay) impossible to tell from its
bandwidth term. Instead of the bridge, the machines' links end in a router namespace
(:data:`ROUTER_NS`) that sends every packet it receives from a machine, by policy routing, into a
TUN device (:data:`IN`). This module's loop, a process of its own in that namespace, reads each IP
packet there, holds it in a FIFO until ``now + delay`` and writes it to a second TUN device
(:data:`OUT`): the kernel takes it as received there and forwards it by the main table, whose host
routes lead to the destination machine. A constant delay never reorders packets, so one FIFO holds
them all.

Each machine's own egress keeps its ``tbf`` (links.py), so a packet pays the rate at the sender,
then the delay once on its way through the router: a ping's round trip is about twice the delay.
The TUN devices are made without a virtio header, so the kernel segments a TSO/GSO packet before
it reaches :data:`IN` and the loop only ever sees packets of at most the MTU; the price is one
read and one write per packet in Python, which caps what the router carries: one TCP flow got
about 650 Mbit/s through it on a busy 2-core host (940 through the bridge), so at 1gbit the
router, not ``tbf``, may set the rate; at 100mbit and below it holds. The loop's wake-ups add
about 0.25 ms to a round trip (a ping takes 10.5 ms at a 5 ms delay, 0.24 ms at none, 0.1 ms
through the bridge).

    ip netns exec hwlinkrt python -m scripts.harness.delay_router --delay-ms 5

is what :func:`start` runs; it prints :data:`READY` once both devices are up and ends on SIGTERM.
"""

from __future__ import annotations

import argparse
import collections
import errno
import fcntl
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from scripts.harness.common import sh

logger = logging.getLogger("delay_router")

ROUTER_NS = "hwlinkrt"
IN, OUT = "hwdelayin", "hwdelayout"
"""Where the machines' packets enter the delay, and where they leave it to be forwarded."""
TABLE = "100"
"""The routing table of packets from a machine: everything into :data:`IN`."""
ROUTER_ADDR = "192.168.78.254"
"""The router's own address, on its loopback: the source of its ARP requests to the machines
(with none at all it would ask from 0.0.0.0)."""
READY = "delay router ready"
LOG = Path(tempfile.gettempdir()) / "hwlinkrt.log"
_router: Optional[subprocess.Popen[str]] = None
"""The router this process started, reaped by :func:`stop` (one started elsewhere is found by its
namespace instead)."""

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI, IFF_UP = 0x0001, 0x1000, 0x1
SIOCGIFFLAGS, SIOCSIFFLAGS = 0x8913, 0x8914
MAX_PACKET = 65536
BATCH = 64
"""Packets read at most before the loop looks at the clock again: a burst on IN must not hold back
packets already due on OUT."""


class DelayLine:
    """Packets in arrival order, each with the time it is due: the router's logic, without TUN.

    ``limit`` bounds the packets held (netem's own default is 1000); past it a packet is dropped,
    as a full queue on a real link would, rather than the router's memory growing without end."""

    def __init__(self, delay_s: float, limit: int = 10_000) -> None:
        if delay_s < 0:
            raise ValueError(f"delay_s {delay_s} < 0")
        self.delay_s = delay_s
        self.limit = limit
        self.dropped = 0
        self._queue: collections.deque[tuple[float, bytes]] = collections.deque()

    def __len__(self) -> int:
        return len(self._queue)

    def push(self, packet: bytes, now: float) -> bool:
        """Hold ``packet`` until ``now + delay``; False where the line is full and it was dropped."""
        if len(self._queue) >= self.limit:
            self.dropped += 1
            return False
        self._queue.append((now + self.delay_s, packet))
        return True

    def due(self, now: float) -> list[bytes]:
        """Every packet due by ``now``, oldest first, taken off the line."""
        out = []
        while self._queue and self._queue[0][0] <= now:
            out.append(self._queue.popleft()[1])
        return out

    def next_timeout(self, now: float) -> Optional[float]:
        """Seconds until the oldest packet is due (0 where it already is); None when the line is empty."""
        if not self._queue:
            return None
        return max(0.0, self._queue[0][0] - now)


def open_tun(name: str) -> int:
    """A TUN device ``name`` (made by this call, gone when the process ends), up, non-blocking."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    # Up through an ioctl, not `ip link`: no other process has to run between making and using it.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH", name.encode(), 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, req + bytes(22))[:18])[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH", name.encode(), flags | IFF_UP) + bytes(22))
    return fd


def run(delay_ms: float, limit: int = 10_000) -> None:
    """The router's loop, until SIGTERM or SIGINT: read what :data:`IN` gets, write it to
    :data:`OUT` ``delay_ms`` later."""
    line = DelayLine(delay_ms / 1000, limit)
    rd, wr = os.pipe()
    os.set_blocking(wr, False)
    stop = False

    def _stop(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    # The wakeup pipe ends a select() at once on a signal; without it Python retries the select
    # for its whole timeout (PEP 475).
    signal.set_wakeup_fd(wr)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    fd_in, fd_out = open_tun(IN), open_tun(OUT)
    print(READY, flush=True)
    logger.info("%s -> %s, %.3f ms one way", IN, OUT, delay_ms)
    sent = 0
    while not stop:
        ready, _, _ = select.select([fd_in, rd], [], [], line.next_timeout(time.monotonic()))
        if rd in ready:
            os.read(rd, 512)
        if fd_in in ready:
            for _ in range(BATCH):
                try:
                    packet = os.read(fd_in, MAX_PACKET)
                except BlockingIOError:
                    break
                line.push(packet, time.monotonic())
        for packet in line.due(time.monotonic()):
            try:
                os.write(fd_out, packet)
                sent += 1
            except OSError as e:  # a packet the kernel refuses is one lost packet, not the router's end
                if e.errno not in (errno.EINVAL, errno.EAGAIN, errno.ENOBUFS):
                    raise
    logger.info("stopped: %d packets forwarded, %d dropped (line full), %d held", sent, line.dropped, len(line))
    os.close(fd_in)
    os.close(fd_out)


def _sysctl(key: str, value: str) -> None:
    """``key`` (``net/ipv4/...``) inside the router's namespace: ``ip netns exec`` mounts that
    namespace's /proc/sys view."""
    sh("ip", "netns", "exec", ROUTER_NS, "sh", "-c", f"echo {value} > /proc/sys/{key}")


def start(hosts: dict[str, str], delay_ms: float, timeout_s: float = 10.0) -> None:
    """Route between machines through the delay: ``hosts`` maps each router-side link (already in
    :data:`ROUTER_NS`, up) to its machine's address. Starts the router process and returns once it
    is forwarding."""
    _sysctl("net/ipv4/ip_forward", "1")
    for dev in ["all", "default", *hosts]:
        _sysctl(f"net/ipv4/conf/{dev}/rp_filter", "0")  # a packet comes back from OUT, not its machine's link
    sh("ip", "-n", ROUTER_NS, "link", "set", "lo", "up")
    sh("ip", "-n", ROUTER_NS, "addr", "add", f"{ROUTER_ADDR}/32", "dev", "lo")
    for dev, host in hosts.items():
        # The machines keep their /24 and ask ARP for each other: the router answers for all of
        # them, at once (proxy_delay 0, not up to 0.8 s at random).
        _sysctl(f"net/ipv4/conf/{dev}/proxy_arp", "1")
        _sysctl(f"net/ipv4/neigh/{dev}/proxy_delay", "0")
        sh("ip", "-n", ROUTER_NS, "route", "add", f"{host}/32", "dev", dev, "src", ROUTER_ADDR)
        sh("ip", "-n", ROUTER_NS, "rule", "add", "iif", dev, "lookup", TABLE)
    repo = Path(__file__).resolve().parents[2]
    with LOG.open("w") as log:
        proc = subprocess.Popen(["ip", "netns", "exec", ROUTER_NS, sys.executable, "-m", "scripts.harness.delay_router",
                                 "--delay-ms", f"{delay_ms:g}"], cwd=repo, stdout=subprocess.PIPE, stderr=log,
                                text=True, start_new_session=True)  # its own session: a race's Ctrl-C is for the race
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if select.select([proc.stdout], [], [], 0.1)[0]:
            if proc.stdout.readline().strip() == READY:
                break
    else:
        proc.kill()
        raise RuntimeError(f"the delay router did not start in {timeout_s:g} s: {LOG.read_text()[-2000:]}")
    proc.stdout.close()
    global _router
    _router = proc
    for dev in (IN, OUT):
        _sysctl(f"net/ipv4/conf/{dev}/rp_filter", "0")
    sh("ip", "-n", ROUTER_NS, "route", "add", "default", "dev", IN, "table", TABLE)


def stop() -> None:
    """End every process in :data:`ROUTER_NS` (the router; deleting the namespace alone would leave
    it running, and the namespace with it) and delete the namespace; nothing where there is none."""
    pids = [int(p) for p in subprocess.run(["ip", "netns", "pids", ROUTER_NS], capture_output=True,
                                           text=True).stdout.split()]
    _signal(pids, signal.SIGTERM)
    deadline = time.monotonic() + 5.0
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _alive(p)]
        time.sleep(0.02)
    _signal(pids, signal.SIGKILL)
    global _router
    if _router is not None:
        _router.wait(timeout=5)
        _router = None
    subprocess.run(["ip", "netns", "del", ROUTER_NS], capture_output=True)


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:  # gone already
            pass


def _alive(pid: int) -> bool:
    """Still running, not a zombie waiting for its parent to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay of every packet")
    ap.add_argument("--limit", type=int, default=10_000, help="packets held at most; past it they drop")
    args = ap.parse_args()
    if args.delay_ms < 0:
        ap.error("--delay-ms at least 0")
    logging.basicConfig(level=logging.INFO, format="[delay_router] %(asctime)s %(message)s", datefmt="%H:%M:%S")
    run(args.delay_ms, args.limit)


if __name__ == "__main__":
    main()
