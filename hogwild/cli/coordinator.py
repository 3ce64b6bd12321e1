"""``hogwild-coordinator``: the store that elastic replicas register, heartbeat and form
their groups through (``elastic.coordinator=HOST:PORT``). Run one per job on a host every
machine can reach; it holds no training state and uses almost no CPU.

    hogwild-coordinator --port 29400
    hogwild-coordinator --port 29400 --exit-after-finish 60   # as one of the job's roles (TorchX)
"""

from __future__ import annotations

import argparse
import signal
import threading
from typing import NoReturn, Optional

import torch.distributed as dist

from hogwild import logs
from hogwild.elastic.coordinator import serve
from hogwild.errors import EXIT_USAGE, first_line, guarded, say_error


class _OneLineParser(argparse.ArgumentParser):
    """argparse's errors as the project's one line (``hogwild: error: --port: ...``), exit 2."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        say_error(message.replace("argument ", "", 1) if message.startswith("argument ") else message)
        raise SystemExit(EXIT_USAGE)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535, got {port}")
    return port


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not 0 <= seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text!r}")
    return seconds


@guarded
def main(argv: Optional[list[str]] = None) -> None:
    ap = _OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="0.0.0.0",
                    help="the one address to listen on (default: 0.0.0.0, every IPv4 interface)")
    ap.add_argument("--port", type=_port, default=29400, help="0..65535 (0: any free port, logged)")
    ap.add_argument("--exit-after-finish", type=_seconds, default=None, metavar="SECONDS",
                    help="exit 0 this long after the job finished (a coordinator run as one of the job's roles, "
                         "as the TorchX component does); default: serve until stopped")
    args = ap.parse_args(argv)
    logs.setup()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve(args.host, args.port, stop=stop, exit_after_finish=args.exit_after_finish)
    except (OSError, RuntimeError, dist.DistError) as e:
        say_error(f"--port {args.port}: cannot listen on {args.host}:{args.port}: {first_line(e)}")
        raise SystemExit(EXIT_USAGE) from None


if __name__ == "__main__":
    main()
