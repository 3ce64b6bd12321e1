# No ``from __future__ import annotations`` here: TorchX reads each component's annotations at
# run time to build its command line, and it needs them as types, not strings.
"""TorchX components: ``torchx run`` starts a hogwild job on any scheduler TorchX knows (local,
Slurm, Kubernetes, Ray, AWS Batch). ``pip install 'hogwild[torchx]'``; docs/machines.md, "TorchX".

    torchx run -s local_cwd hogwild/components.py:train --replicas 2 -- sync.interval=50
    torchx run -s kubernetes -cfg queue=default hogwild/components.py:train --elastic \\
        --replicas 8 --image registry/hogwild:1 --run_dir /shared/exp1 -- +experiment=gpt

(From an installed wheel, the file is ``python -c "import hogwild.components as c; print(c.__file__)"``.)
The commands each replica runs are hogwild/jobs.py's.
"""

from typing import Dict, List, Optional

try:
    import torchx.specs as specs
except ImportError as e:  # pragma: no cover - the optional extra
    raise ImportError("hogwild.components needs TorchX: pip install 'hogwild[torchx]'") from e

from hogwild.jobs import RoleCommand, elastic_roles, torchrun_roles


def _roles(commands: List[RoleCommand], image: str, cpu: int, gpu: int, memMB: int, h: Optional[str],
           env: Optional[Dict[str, str]], mounts: Optional[List[str]]) -> List[specs.Role]:
    resource = specs.resource(cpu=cpu, gpu=gpu, memMB=memMB, h=h)
    small = specs.Resource(cpu=1, gpu=0, memMB=1024)  # the coordinator: a store, almost no CPU
    return [specs.Role(name=c.name, image=image, entrypoint="bash", args=["-c", c.command], num_replicas=c.replicas,
                       resource=small if c.name == "coordinator" else resource,
                       env={"PYTHONUNBUFFERED": "1", **(env or {})}, port_map={c.name: c.port},
                       mounts=specs.parse_mounts(mounts) if mounts else [])
            for c in commands]


def train(
    *overrides: str,
    replicas: int = 2,
    elastic: bool = False,
    run_dir: str = "outputs/torchx",
    image: str = "hogwild:latest",
    name: str = "hogwild",
    cpu: int = 4,
    gpu: int = 0,
    memMB: int = 8192,
    h: Optional[str] = None,
    port: int = 0,
    max_restarts: int = -1,
    grace_s: int = 60,
    env: Optional[Dict[str, str]] = None,
    mounts: Optional[List[str]] = None,
) -> specs.AppDef:
    """A hogwild job of ``replicas`` machines: one leader each (its workers on that machine's
    cores), meeting every few steps in sync rounds.

    Args:
        overrides: Hydra overrides for every replica, as hogwild-train takes them (after ``--``)
        replicas: machines, one replica (leader and its workers) each
        elastic: elastic mode: a coordinator role, and each replica restarted on its own (else torchrun)
        run_dir: the job's output folder, on a filesystem every replica shares
        image: the container image with hogwild installed
        name: the job's name
        cpu: cores per replica
        gpu: GPUs per replica
        memMB: memory per replica in MB
        h: a named resource (takes precedence over cpu, gpu and memMB)
        port: the coordinator's port (elastic; 0: 29400) or torchrun's rendezvous port (0: 29500)
        max_restarts: restarts of each replica (elastic, 0 or more; -1: 10) or of the whole job (torchrun; -1: 3)
        grace_s: elastic: seconds the coordinator stays up after the job finished
        env: environment variables for every replica (for instance HOGWILD_COORDINATOR_TOKEN)
        mounts: mounts into each replica's container (type=<bind/volume>,src=/host,dst=/job[,readonly])
    """
    if elastic:
        commands = elastic_roles(list(overrides), replicas, run_dir, specs.macros.rank0_env, specs.macros.replica_id,
                                 port=port or 29400, max_restarts=10 if max_restarts < 0 else max_restarts,
                                 grace_s=grace_s)
    else:
        commands = torchrun_roles(list(overrides), replicas, run_dir, specs.macros.rank0_env, port=port or 29500,
                                  max_restarts=3 if max_restarts < 0 else max_restarts)
    return specs.AppDef(name=name, roles=_roles(commands, image, cpu, gpu, memMB, h, env, mounts))
