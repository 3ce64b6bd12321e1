"""Simulated machines on shaped links, shared by the races across machines (races/link.py,
lm_race.py, rows.py, tables.py, straggler_race.py).

N machines live in network namespaces, each pinned to its cores (with more machines than cores,
each gets an equal CFS share of them instead), each with one veth into a bridge (a switch) and its
egress shaped with ``tbf`` to the rate, plus ``netem`` delay where the kernel has it; where it has
not, a delay makes the machines meet through a userspace router that holds each packet
(:mod:`scripts.harness.delay_router`) instead of the bridge. Needs root and iproute2
(:func:`available` says why not). A race sets :data:`LOOPBACK`, :data:`RUN_TIMEOUT_S` and
:data:`CORES` from its options before it runs anything.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from scripts.harness import delay_router
from scripts.harness.common import sh, train_cmd

logger = logging.getLogger("link")
BRIDGE = "hwlinkbr"


def chosen_methods(names: str, variants: list[str], table: dict[str, Optional[list[str]]]) -> list[str]:
    """``--methods`` (comma-separated) and each ``--variant NAME=OVERRIDE[,OVERRIDE...]``, which
    becomes a hogwild method of ``table`` with those overrides, in that order."""
    for v in variants:
        name, _, overrides = v.partition("=")
        table[name] = [o for o in overrides.split(",") if o]
    return [m for m in names.split(",") if m] + [v.partition("=")[0] for v in variants]


def known(methods: list[str], table: dict[str, Optional[list[str]]], choices: list[str]) -> list[str]:
    """``methods`` when ``table`` has every one; else the race stops in one line naming ``choices``."""
    unknown = [m for m in methods if m not in table]
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; choose from {', '.join(choices)}")
    return methods


def runs_folder(out: Path) -> Path:
    """``out/runs``, made with ``out``: where a race's runs write."""
    root = out / "runs"
    root.mkdir(parents=True, exist_ok=True)
    return root


def ns(i: int) -> str:
    return f"hwlink{i}"


def iface(i: int) -> str:
    return f"hwl{i}"


LOOPBACK = False
"""--loopback: the machines are processes on 127.0.0.1, no namespaces, no shaping."""
RUN_TIMEOUT_S = 3600.0
"""--run-timeout-s: a run past it counts as missed, its time unknown."""
TBF_BURST_BYTES = 256 * 1024
"""tbf's bucket (tc's ``256kb`` is kilobytes): a sender idle long enough sends this many bytes at line
speed before the rate holds it, so the rate is an average over bursts, not every round's pace
(scripts/models/scale_sim.py models it: ``Job.burst_bytes``)."""
CONGESTION: Optional[str] = None
"""``--congestion``: every machine's TCP congestion control (``net.ipv4.tcp_congestion_control`` in
its namespace); None: what a new namespace takes from the host. It is not neutral: BBR (this host's
default) paces a round's burst at a rate it estimates from the round trip, so at 10 ms one way a
round of 19 KB hops took 12 ms more under BBR than under cubic at R = 2 (docs/scale.md, "The latency
term, measured"). Every shaped run's ``shaping`` names the one it ran under."""
CORES = 1
"""Cores per machine (``--cores-per-machine``): machine i holds cores i*CORES .. i*CORES + CORES - 1."""
SHARE = "quota"
"""``--share``, where there are more machines than cores: ``quota``, each machine a cgroup with an
equal CFS quota (:func:`cpu_shares`); ``pin``, machine i on core i mod the cores, no quota, so the
machines on a core take turns as the scheduler sees fit. A quota throttles a machine that spent it
until the next period, and that stall falls inside the hops its peers wait on: at R = 8 of 1/4 of a
core each, a round's time at 10 ms one way less its time at 2 ms was 24 one-way delays, 25 pinned
(the model's 28: the ring's 2 (R - 1) hops of 2 each; docs/scale.md, "The latency term, measured")."""


def addr(i: int) -> str:
    return "127.0.0.1" if LOOPBACK else f"192.168.78.{i + 1}"  # only ever inside the namespaces made here


def teardown(machines: int = 8) -> None:
    delay_router.stop()  # first: its namespace holds the machines' peers when routed
    for i in range(machines):
        subprocess.run(["ip", "netns", "del", ns(i)], capture_output=True)
        subprocess.run(["ip", "link", "del", f"{iface(i)}b"], capture_output=True)
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


def _machine(i: int, rate: str, netem_ms: float = 0) -> None:
    """Machine i's namespace and veth, its address, its egress shaped; the peer ``hwl{i}b`` is left
    down in the root namespace, for a switch or a router to take."""
    sh("ip", "netns", "add", ns(i))
    sh("ip", "link", "add", iface(i), "type", "veth", "peer", "name", f"{iface(i)}b")
    sh("ip", "link", "set", iface(i), "netns", ns(i))
    sh("ip", "-n", ns(i), "addr", "add", f"{addr(i)}/24", "dev", iface(i))
    sh("ip", "-n", ns(i), "link", "set", iface(i), "up")
    sh("ip", "-n", ns(i), "link", "set", "lo", "up")
    if CONGESTION:
        sh("ip", "netns", "exec", ns(i), "sysctl", "-qw", f"net.ipv4.tcp_congestion_control={CONGESTION}")
    qdisc = (["netem", "delay", f"{netem_ms:g}ms", "rate", rate] if netem_ms
             else ["tbf", "rate", rate, "burst", f"{TBF_BURST_BYTES // 1024}kb", "latency", "400ms"])
    sh("tc", "-n", ns(i), "qdisc", "add", "dev", iface(i), "root", *qdisc)


def _no_netem() -> Optional[str]:
    """None where tc can add a netem qdisc, else why not (tried in a scratch namespace)."""
    subprocess.run(["ip", "netns", "add", "hwlinkprobe"], capture_output=True)
    try:
        tried = subprocess.run(["tc", "-n", "hwlinkprobe", "qdisc", "add", "dev", "lo", "root", "netem", "delay",
                                "1ms"], capture_output=True, text=True)
    finally:
        subprocess.run(["ip", "netns", "del", "hwlinkprobe"], capture_output=True)
    return None if tried.returncode == 0 else tried.stderr.strip() or f"tc exit {tried.returncode}"


def setup(machines: int, rate: str, delay_ms: float) -> str:
    """Make the machines and the switch, shape each machine's egress; returns what was applied. A
    delay without netem goes through :func:`setup_routed` instead of the switch."""
    if delay_ms and (why := _no_netem()):
        logger.info("no netem here (%s): the delay is a userspace router's", why)
        return setup_routed(machines, rate, delay_ms)
    teardown()
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "link", "set", BRIDGE, "up")
    for i in range(machines):
        _machine(i, rate, delay_ms)
        sh("ip", "link", "set", f"{iface(i)}b", "master", BRIDGE)
        sh("ip", "link", "set", f"{iface(i)}b", "up")
    shaping = f"tbf {rate}" + (f" + netem {delay_ms:g} ms" if delay_ms else "") + congestion_in_use()
    logger.info("%d machines, link shaping: %s", machines, shaping)
    return shaping


def setup_routed(machines: int, rate: str, delay_ms: float) -> str:
    """The machines of :func:`setup`, each link shaped alike, meeting through a router that holds
    every packet ``delay_ms`` (scripts/harness/delay_router.py) instead of a switch: a ping's
    round trip between two machines is about twice the delay. Works with ``delay_ms`` 0 too (the
    router's own cost)."""
    teardown()
    sh("ip", "netns", "add", delay_router.ROUTER_NS)
    for i in range(machines):
        _machine(i, rate)
        sh("ip", "link", "set", f"{iface(i)}b", "netns", delay_router.ROUTER_NS)
        sh("ip", "-n", delay_router.ROUTER_NS, "link", "set", f"{iface(i)}b", "up")
    delay_router.start({f"{iface(i)}b": addr(i) for i in range(machines)}, delay_ms)
    shaping = (f"tbf {rate} + {delay_ms:g} ms one way (a userspace router over TUN: this kernel lacks sch_netem)"
               + congestion_in_use())
    logger.info("%d machines, link shaping: %s", machines, shaping)
    return shaping


def congestion_in_use() -> str:
    """``, tcp NAME``: the congestion control machine 0's connections use (see :data:`CONGESTION`)."""
    return ", tcp " + sh("ip", "netns", "exec", ns(0), "sysctl", "-n", "net.ipv4.tcp_congestion_control").stdout.strip()


def congestion_choices() -> list[str]:
    """The congestion controls this kernel offers (``--congestion``'s choices)."""
    try:
        return Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    except OSError:
        return []


ALLOWED_CONGESTION = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")


def congestion_problem(name: str) -> Optional[str]:
    """None where every machine's namespace may run congestion control ``name``, else why not: a
    namespace other than the host's may pick only from the host's allowed list, which can be
    shorter than what the kernel offers (a fresh host here allowed "reno bbr" of "reno bbr cubic")."""
    offered = congestion_choices()
    if name not in offered:
        return f"this kernel offers {' '.join(offered)}"
    try:
        allowed = ALLOWED_CONGESTION.read_text().split()
    except OSError:
        return None
    if name in allowed:
        return None
    return (f"a namespace may pick only from the host's allowed list ({' '.join(allowed)}); as root: "
            f"sysctl -w net.ipv4.tcp_allowed_congestion_control='{' '.join([*allowed, name])}'")


def available() -> Optional[str]:
    """None when namespaces can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "needs root for ip netns"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "needs iproute2 (ip, tc)"
    probe = subprocess.run(["ip", "netns", "add", "hwlinkprobe"], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", "hwlinkprobe"], capture_output=True)
    return None if probe.returncode == 0 else f"ip netns add failed: {probe.stderr.strip()}"


def cannot_run() -> bool:
    """True, after a warning that says why, where this race's machines cannot be made here (never
    on loopback)."""
    why = None if LOOPBACK else available()
    if why:
        logger.warning("skipping the link benchmark: %s", why)
    return why is not None


def tx_bytes(i: int) -> float:
    if LOOPBACK:  # every process shares lo: no per-machine count
        return float("nan")
    out = sh("ip", "netns", "exec", ns(i), "cat", f"/sys/class/net/{iface(i)}/statistics/tx_bytes")
    return float(out.stdout.strip())


def own_tx_bytes(i: int) -> float:
    """What machine i has sent, read from inside it: ``/proc/self/net/dev`` is the reading
    process's network namespace (its ``/sys`` is the host's, under ``nsenter --net``)."""
    if LOOPBACK:
        return float("nan")
    for line in Path("/proc/self/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == iface(i):
            return float(counters.split()[8])  # 8 receive counters, then transmitted bytes
    return float("nan")


def _env(i: int) -> dict[str, str]:
    return {**os.environ, "GLOO_SOCKET_IFNAME": "lo" if LOOPBACK else iface(i), "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1", "RUST_LOG": "error"}


CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
"""cgroup v1's cpu controller: where the machines get equal shares when there are more of them
than cores."""


CFS_PERIOD_US = 10_000
"""A short period: a machine that spends its quota early waits at most ~3 ms, not ~33 ms, so it
behaves more like a slower core than like a core that stops now and then."""


def cpu_shares(machines: int) -> Optional[str]:
    """With more machines than cores, give each machine a cgroup whose CFS quota is an equal share
    of the host's cores (3 machines on 2 cores: 2/3 of a core each, however the scheduler places
    them); pinning them instead would put two machines on one core and leave the third one alone.
    Returns what was applied, or None where every machine has a core of its own."""
    cores = os.cpu_count() or 1
    if machines <= cores:
        return None
    if SHARE == "pin":
        return f"machine i on core i mod {cores} ({cores} cores shared by the scheduler, no quota)"
    period = CFS_PERIOD_US
    try:
        for i in range(machines):
            d = CGROUP_CPU / ns(i)
            d.mkdir(exist_ok=True)
            (d / "cpu.cfs_period_us").write_text(f"{period}\n")
            (d / "cpu.cfs_quota_us").write_text(f"{period * cores // machines}\n")
    except OSError as e:
        raise SystemExit(f"--machines {machines}: more machines than this host's {cores} cores needs "
                         f"cgroup v1's cpu controller at {CGROUP_CPU} to share them evenly ({e})") from None
    return f"{cores}/{machines} of a core each (CFS quota, {cores} cores shared)"


def drop_cpu_shares(machines: int = 8) -> None:
    for i in range(machines):
        try:
            (CGROUP_CPU / ns(i)).rmdir()
        except OSError:  # not made, or a process of a killed run still in it: the next run reuses it
            pass


def _placement(i: int, machines: int) -> list[str]:
    """The prefix that puts machine i's processes on its CPU: its cgroup (entered before the
    namespace, whose /sys hides the host's cgroup mount) or a core of its own."""
    cores = os.cpu_count() or 1
    if machines > cores and SHARE == "pin":
        return ["taskset", "-c", str(i % cores)]
    if machines > cores:
        procs = CGROUP_CPU / ns(i) / "cgroup.procs"
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh"]
    return ["taskset", "-c", f"{i * CORES}-{i * CORES + CORES - 1}" if CORES > 1 else str(i)]


def _enter(i: int) -> list[str]:
    """Into machine i's network namespace only: ``ip netns exec`` also remounts /sys, which
    hides the cgroup mount, and hogwild reads its CPU quota there (replica/resources.py)."""
    if shutil.which("nsenter"):
        return ["nsenter", f"--net=/var/run/netns/{ns(i)}"]
    return ["ip", "netns", "exec", ns(i)]


def on_machines(cmds: list[list[str]], timeout: float,
                machine_of: Optional[list[int]] = None) -> tuple[list[str], float]:
    """Run ``cmds[j]`` on machine ``machine_of[j]`` (default: machine j), on cores of its own where
    there are enough, else on an equal share of the cores (:func:`cpu_shares`); returns their logs
    and the mean bytes a machine sent on its link."""
    where = machine_of if machine_of is not None else list(range(len(cmds)))
    machines = max(where) + 1
    before = [tx_bytes(i) for i in range(machines)]
    enter = (lambda i: []) if LOOPBACK else _enter
    procs = [subprocess.Popen([*_placement(i, machines), *enter(i), *cmd],
                              env=_env(i), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for i, cmd in zip(where, cmds)]
    try:
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, log in zip(procs, logs):
        if p.returncode != 0:
            raise RuntimeError(log[-3000:])
    sent = [tx_bytes(i) - b for i, b in enumerate(before)]
    return logs, sum(sent) / len(sent)


def port() -> int:
    """A port for a run's rendezvous, fresh each millisecond."""
    return 29500 + int(time.time() * 1000) % 2000


def torchrun_on_machines(machines: int, args: list[str]) -> list[list[str]]:
    """``hogwild-train ARGS`` under torchrun, one leader a machine, meeting at machine 0 on a fresh
    port: each machine's command for :func:`on_machines`."""
    master = port()
    return [[sys.executable, "-m", "torch.distributed.run", f"--nnodes={machines}", "--nproc-per-node=1",
             f"--node-rank={i}", f"--master-addr={addr(0)}", f"--master-port={master}", *train_cmd(args)[1:]]
            for i in range(machines)]
