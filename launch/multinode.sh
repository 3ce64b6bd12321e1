#!/usr/bin/env bash
# One command per machine; every machine runs the same line.
#   ENDPOINT=node0:29400 NNODES=2 RUN_ID=exp1 launch/multinode.sh [hydra overrides...]
# The run id names the shared output folder (outputs/$RUN_ID): put it on a shared filesystem,
# or pass run_dir=/shared/path, so resume after a restart finds the checkpoints.
set -euo pipefail
: "${ENDPOINT:?set ENDPOINT=host:port of the rendezvous (any one of the machines)}"
: "${NNODES:?set NNODES=number of machines}"
: "${RUN_ID:?set RUN_ID=a name shared by all machines of this job}"
exec python -m hogwild.cli.launch --nnodes="$NNODES" --nproc-per-node="${NPROC_PER_NODE:-1}" \
  --max-restarts="${MAX_RESTARTS:-3}" \
  --rdzv-backend=c10d --rdzv-endpoint="$ENDPOINT" --rdzv-id="$RUN_ID" \
  -m hogwild.cli.train "$@"
