#!/usr/bin/env bash
# Simulate M machines x K workers on this host: one torchrun, M leaders, M*K workers.
# Started through hogwild.cli.launch: torchrun that leaves with the job's exit code, no traceback.
# The rendezvous store takes a free port unless PORT is set: a fixed default port held by another
# job (or one still closing) makes torchrun join that job's store as a client and fail with it.
#   launch/local.sh [M] [K] [hydra overrides...]
#   launch/local.sh 2 2 sync.interval=50 sync.mode=average
set -euo pipefail
M="${1:-2}"; K="${2:-1}"
shift $(( $# > 0 ? 1 : 0 )); shift $(( $# > 0 ? 1 : 0 ))
RUN_ID="${RUN_ID:-local-$(date +%Y%m%d-%H%M%S)}"
exec python -m hogwild.cli.launch --nnodes=1 --nproc-per-node="$M" \
  --rdzv-backend=c10d --rdzv-endpoint="127.0.0.1:${PORT:-0}" --rdzv-id="$RUN_ID" \
  -m hogwild.cli.train workers="$K" "$@"
