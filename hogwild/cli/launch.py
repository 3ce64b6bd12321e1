"""``python -m hogwild.cli.launch [torchrun options] -m hogwild.cli.train [overrides]``: torchrun that
leaves with the job's own exit code and its ranks' one-line errors, without a traceback of its own.

torchrun ends a job whose ranks failed with its ``ChildFailedError`` traceback and exit 1, and a
job it was asked to stop (SIGTERM, SIGINT) with a ``SignalException`` traceback and exit 1, after
every rank already said what happened in one line and chose its exit code (the table in
docs/design.md). The scripts in ``launch/`` start jobs through this module instead.
"""

from __future__ import annotations

import logging
import sys
from typing import Optional

logger = logging.getLogger(__name__)


def job_exit_code(argv: list[str]) -> int:
    """Run torchrun with ``argv``; the exit code the job's ranks chose."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(argv))
    except ChildFailedError as e:
        _, failure = e.get_first_failure()
        code = failure.exitcode
        # A rank killed by a signal reports it negated; a shell reports it as 128 + the signal.
        return 128 - code if code < 0 else code
    except SignalException as e:
        return 128 + int(e.sigval)
    return 0


def main(argv: Optional[list[str]] = None) -> None:
    raise SystemExit(job_exit_code(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
