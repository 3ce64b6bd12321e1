#!/usr/bin/env bash
# Elastic mode: one line per machine, each replica on its own, meeting at a coordinator.
#   on one host:      while :; do hogwild-coordinator --port 29400; sleep 1; done   # survives its own restart
#   on each machine:  COORDINATOR=node0:29400 REPLICAS=3 SLOT=<0..2> RUN_DIR=/shared/exp1 launch/elastic.sh [overrides...]
# A replica that dies is restarted here on its own; it rejoins the running job at the next round
# and heals from a live peer, while the other machines keep training. Exit code 2 (a bad setting)
# and 0 (done) end the loop. Under Slurm, run this script as the job step, or use `sbatch --requeue`
# with the same SLOT so a lost node's replacement takes the slot over.
set -uo pipefail
: "${COORDINATOR:?set COORDINATOR=host:port of hogwild-coordinator}"
: "${REPLICAS:?set REPLICAS=number of replica slots}"
: "${SLOT:?set SLOT=the slot of this machine, 0..REPLICAS-1}"
: "${RUN_DIR:?set RUN_DIR=an output folder on a filesystem every machine shares}"
if [ "${USE_TORCHRUN:-0}" = 1 ]; then
  # The same with torchrun as the restarter: one process per machine, restarted on its own.
  exec torchrun --standalone --nproc-per-node=1 --max-restarts="${MAX_RESTARTS:-10}" -m hogwild.cli.train \
    elastic.coordinator="$COORDINATOR" elastic.replicas="$REPLICAS" elastic.slot="$SLOT" run_dir="$RUN_DIR" "$@"
fi
for attempt in $(seq 0 "${MAX_RESTARTS:-10}"); do
  python -m hogwild.cli.train elastic.coordinator="$COORDINATOR" elastic.replicas="$REPLICAS" elastic.slot="$SLOT" \
    run_dir="$RUN_DIR" "$@"
  code=$?
  if [ "$code" -eq 0 ] || [ "$code" -eq 2 ]; then exit "$code"; fi
  echo "launch/elastic.sh: slot $SLOT exited with $code; restart $((attempt + 1))" >&2
  sleep 2
done
exit "$code"
