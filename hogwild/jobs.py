"""The shell commands of a job's roles, as a scheduler starts them: one command per role, run
by ``bash -c`` on each of its replicas. hogwild/components.py hands them to TorchX; they need no
TorchX themselves, so they are tested as plain processes.

Two shapes, as docs/machines.md describes them:

- **torchrun**: one role of R replicas, each ``hogwild.cli.launch`` (torchrun) with a c10d
  rendezvous on the first replica's host. A replica that dies restarts every replica (torchrun's
  rule), at most ``max_restarts`` times.
- **elastic**: a ``coordinator`` role of one replica, first (a scheduler names the host of its
  first role's first replica in ``rank0_env``, so the replicas find it there), then a ``replica``
  role of R, each in its own restart loop (launch/elastic.sh's): a replica that dies comes back
  alone and rejoins the running job. The coordinator leaves ``grace_s`` after the job finished,
  so the job ends when training does.

The scheduler's own names for the first host's variable and the replica's index come in as
``rank0_env`` and ``replica_id`` (TorchX's macros, or plain values).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from hogwild.errors import UserError


@dataclass(frozen=True)
class RoleCommand:
    """One role: its name, how many replicas run it, and the command each runs under ``bash -c``."""

    name: str
    replicas: int
    command: str
    port: int


def _host(rank0_env: str) -> str:
    # A scheduler that leaves the variable unset on the first host itself (AWS Batch), or runs
    # everything on one host (TorchX's local schedulers), means this host.
    return f"${{{rank0_env}:-localhost}}"


def _check(replicas: int, port: int, max_restarts: int) -> None:
    if replicas < 1:
        raise UserError(f"replicas: must be at least 1, got {replicas}")
    if not 0 < port < 65536:
        raise UserError(f"port: must be in 1..65535, got {port}")
    if max_restarts < 0:
        raise UserError(f"max_restarts: must be 0 or more, got {max_restarts}")


def torchrun_roles(overrides: list[str], replicas: int, run_dir: str, rank0_env: str, port: int = 29500,
                   max_restarts: int = 3, python: str = "python") -> list[RoleCommand]:
    """One role of ``replicas`` leaders under torchrun, meeting at the first one's host."""
    _check(replicas, port, max_restarts)
    launch = [python, "-m", "hogwild.cli.launch", f"--nnodes={replicas}", "--nproc-per-node=1",
              "--rdzv-backend=c10d", f"--max-restarts={max_restarts}", "-m", "hogwild.cli.train",
              f"run_dir={run_dir}", *overrides]
    endpoint = f"--rdzv-endpoint={_host(rank0_env)}:{port}"
    # The endpoint stays unquoted: bash expands the host variable on each replica.
    command = " ".join([*map(shlex.quote, launch[:6]), endpoint, *map(shlex.quote, launch[6:])])
    return [RoleCommand("hogwild", replicas, f"exec {command}", port)]


def elastic_roles(overrides: list[str], replicas: int, run_dir: str, rank0_env: str, replica_id: str,
                  port: int = 29400, max_restarts: int = 10, grace_s: float = 60.0,
                  python: str = "python") -> list[RoleCommand]:
    """A coordinator, then ``replicas`` elastic leaders, each restarted on its own."""
    _check(replicas, port, max_restarts)
    if grace_s < 0:
        raise UserError(f"grace_s: must be 0 or more, got {grace_s}")
    coordinator = (f"while :; do {shlex.quote(python)} -m hogwild.cli.coordinator --port {port} "
                   f"--exit-after-finish {grace_s:g} && exit 0; sleep 1; done")
    train = " ".join([shlex.quote(python), "-m", "hogwild.cli.train",
                      f"elastic.coordinator={_host(rank0_env)}:{port}", f"elastic.replicas={replicas}",
                      f"elastic.slot={replica_id}", *map(shlex.quote, [f"run_dir={run_dir}", *overrides])])
    # 0 (done) and 2 (a bad setting) end the loop; anything else is a death worth a restart.
    replica = (f"for attempt in $(seq 0 {max_restarts}); do {train}; code=$?; "
               f'if [ "$code" -eq 0 ] || [ "$code" -eq 2 ]; then exit "$code"; fi; '
               f'echo "slot {replica_id} exited with $code; restarting" >&2; sleep 2; done; exit "$code"')
    return [RoleCommand("coordinator", 1, coordinator, port), RoleCommand("replica", replicas, replica, port)]
