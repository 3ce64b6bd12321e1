"""Time-to-accuracy over a constrained network: hogwild (2 machines x 1 worker) vs DDP (2 ranks).

Two simulated machines live in network namespaces joined by a veth pair shaped with
``tc netem`` (default 100 Mbit/s and 20 ms each way). Needs root and iproute2; anywhere
else it says why and exits 0, so a benchmark run never fails on it.

    python scripts/netem.py --repeats 3 --out bench_results
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import reached  # noqa: E402

logger = logging.getLogger("netem")
NS = ("hwbench0", "hwbench1")
IFACE = ("hwveth0", "hwveth1")
ADDR = ("192.168.77.1", "192.168.77.2")  # only ever inside the two namespaces made here


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def teardown() -> None:
    for ns in NS:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def setup(delay_ms: int, rate: str) -> str:
    """Make the namespaces and shape the link; returns the shaping actually applied."""
    teardown()
    for ns in NS:
        _sh("ip", "netns", "add", ns)
    _sh("ip", "link", "add", IFACE[0], "type", "veth", "peer", "name", IFACE[1])
    for i in (0, 1):
        _sh("ip", "link", "set", IFACE[i], "netns", NS[i])
        _sh("ip", "-n", NS[i], "addr", "add", f"{ADDR[i]}/24", "dev", IFACE[i])
        _sh("ip", "-n", NS[i], "link", "set", IFACE[i], "up")
        _sh("ip", "-n", NS[i], "link", "set", "lo", "up")
    shaping = f"netem {delay_ms} ms each way, {rate}"
    for i in (0, 1):
        netem = subprocess.run(["tc", "-n", NS[i], "qdisc", "add", "dev", IFACE[i], "root", "netem",
                                "delay", f"{delay_ms}ms", "rate", rate], capture_output=True, text=True)
        if netem.returncode != 0:
            # Kernels without sch_netem still have tbf: shape the rate, say the delay is missing.
            _sh("tc", "-n", NS[i], "qdisc", "add", "dev", IFACE[i], "root", "tbf", "rate", rate,
                "burst", "64kb", "latency", "400ms")
            shaping = f"tbf {rate}, no added delay (this kernel lacks sch_netem: {netem.stderr.strip()})"
    logger.info("link shaping: %s", shaping)
    return shaping


def available() -> str | None:
    """None when namespaces can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "needs root for ip netns"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "needs iproute2 (ip, tc)"
    probe = subprocess.run(["ip", "netns", "add", "hwbenchprobe"], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", "hwbenchprobe"], capture_output=True)
    return None if probe.returncode == 0 else f"ip netns add failed: {probe.stderr.strip()}"


def _env(i: int) -> dict[str, str]:
    return {**os.environ, "GLOO_SOCKET_IFNAME": IFACE[i], "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _both(cmds: list[list[str]], timeout: float) -> list[str]:
    # One core per simulated machine: otherwise each machine sizes its threads for the whole
    # host and the two oversubscribe it (design rule 4 in docs/design.md), which measures the simulation, not us.
    cores = os.cpu_count() or 1
    procs = [subprocess.Popen(["ip", "netns", "exec", NS[i], "taskset", "-c", str(i % cores), *cmds[i]],
                              env=_env(i), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for i in (0, 1)]
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, log in zip(procs, logs):
        if p.returncode != 0:
            raise RuntimeError(log[-3000:])
    return logs


def hogwild(target: float, interval: int, extra: list[str], root: Path) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(dir=root))
    port = 29500 + int(time.time()) % 1000
    cmds = [[sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
             f"--node-rank={i}", f"--master-addr={ADDR[0]}", f"--master-port={port}", "-m", "hogwild.cli.train",
             "workers=1", "train.epochs=60", "eval.every_s=0.05", f"train.target_accuracy={target}",
             f"sync.interval={interval}", f"run_dir={run_dir}", "checkpoint.every_s=3600", *extra]
            for i in (0, 1)]
    _both(cmds, 900)
    return json.loads((run_dir / "metrics.json").read_text())


def _ddp_rank(rank: int, port: int, target: float) -> None:
    from baselines import MLP
    from baselines import _ddp_rank as run_rank

    out: dict[str, Any] = {}
    run_rank(rank, 2, port, out, dataclasses.replace(MLP, target=target), addr=ADDR[0])
    if rank == 0:
        sys.stdout.write("RESULT " + json.dumps(out["r"]) + "\n")


def ddp(target: float) -> dict[str, Any]:
    port = 29500 + (int(time.time()) + 500) % 1000
    cmds = [[sys.executable, str(Path(__file__).resolve()), "--ddp-rank", str(i), "--port", str(port),
             "--target", str(target)] for i in (0, 1)]
    logs = _both(cmds, 1800)
    line = next(ln for ln in logs[0].splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench_results"))
    ap.add_argument("--delay-ms", type=int, default=20)
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--target", type=float, default=0.97)
    ap.add_argument("--ddp-rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="[netem] %(message)s")
    if args.ddp_rank is not None:
        _ddp_rank(args.ddp_rank, args.port, args.target)
        return
    why = available()
    if why:
        logger.warning("skipping the constrained-network benchmark: %s", why)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    root = args.out / "runs"
    root.mkdir(exist_ok=True)
    shaping = setup(args.delay_ms, args.rate)
    try:
        res: dict[str, Any] = {"shaping": shaping, "target": args.target}
        for label, fn in (("ddp", lambda: ddp(args.target)),
                          ("hogwild 2x1 average", lambda: hogwild(args.target, 50, [], root)),
                          ("hogwild 2x1 diloco", lambda: hogwild(args.target, 50, ["sync.mode=diloco"], root)),
                          ("hogwild 2x1 average bf16", lambda: hogwild(args.target, 50, ["sync.dtype=bf16"], root))):
            logger.info("%s over %d ms / %s", label, args.delay_ms, args.rate)
            runs = [fn() for _ in range(args.repeats)]
            vals = [r["time_to_target_s"] for r in runs if reached(r["time_to_target_s"])]
            res[label] = {"median_s": statistics.median(vals) if vals else float("nan"),
                          "missed": len(runs) - len(vals),
                          "accuracy": statistics.median(r["test_accuracy"] for r in runs), "runs": runs}
    finally:
        teardown()
    (args.out / "netem.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    d = res["ddp"]["median_s"]
    lines = [f"Link: {shaping}", "", f"| method | median s to {args.target} | final acc | DDP time / this |",
             "|---|---|---|---|"]
    lines += [f"| {k} | {v['median_s']:.2f} | {v['accuracy']:.4f} | {d / v['median_s']:.2f}x |"
              for k, v in res.items() if isinstance(v, dict)]
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
