#!/usr/bin/env bash
# One run on a lent machine with a GPU and 16 cores (docs/machines.md). JOBS (default "gpu lm16 slow16")
# picks what runs, in that order:
#   gpu     the suite's CUDA tests (tests/replica: test_barrier, test_replica, -k "cuda or gpu");
#   lm16    issue 55: 4 machines of 4 cores (network namespaces at RATE, default 1gbit; loopback
#           where this kernel cannot make them), hogwild 4 x 4 against DDP on 16 processes, the
#           larger GPT under AdamW for BUDGET_LM seconds (default 75), one run each;
#   slow16  issue 56: hogwild 1 x 16 with 2 of its workers at half a core each (cgroup quota)
#           against DDP on 16 processes with 2 ranks so, the GPT of §15 for BUDGET_SLOW seconds
#           (default 60), one run each;
#   tables  issue 48's table: hogwild 1 x W against DDP on W processes, clicks DLRM at 10M rows
#           (WIDTHS, default "16 8 4"; REPEATS, default 1).
# About 8 minutes with the defaults. A lent machine returns at most 8 files: everything lands in
# $WORK (default /tmp/hogwild_device) and is packed after each job into $OUT/device.tgz (the runs'
# checkpoints left out), with the log beside it as $OUT/device.log.
# The machine reaches no package index: Hydra, OmegaConf and ANTLR travel in .whl/site (copied from
# this host's virtual environment; `carry: [".whl"]`), the project is installed without its deps.
# Its image has no iproute2: where .whl/net/bin holds this host's `ip` and `tc` (their libraries in
# .whl/net/lib, found through an RPATH set with patchelf, so nothing they start inherits them), the
# namespaces of scripts/races/link.py are made with those.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-bench_results/device}"
WORK="${WORK:-/tmp/hogwild_device}"
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD/.whl/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ -x .whl/net/bin/ip ] && ! command -v ip > /dev/null; then export PATH="$PWD/.whl/net/bin:$PATH"; fi
LOG="$OUT/device.log"
say() { echo "[device $(date +%T)] $*" | tee -a "$LOG"; }
pack() { tar -czf "$OUT/device.tgz" --exclude='runs' -C "$WORK" . 2>>"$LOG"; }

python3 -m pip install -q --no-deps --no-build-isolation -e . > "$WORK/install.txt" 2>&1 || say "install failed"
python3 - <<'PY' 2>&1 | tee "$WORK/machine.txt" >> "$LOG"
import os, torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
print("cores", len(os.sched_getaffinity(0)), "memory GiB", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
PY
# Can this kernel make the machines of scripts/races/link.py: a namespace, a veth, a bridge, tbf?
probe() {
  ip netns add hwprobe && ip link add hwprobe0 type veth peer name hwprobe1 && ip link set hwprobe1 netns hwprobe \
    && ip link add hwprobebr type bridge \
    && ip netns exec hwprobe tc qdisc add dev hwprobe1 root tbf rate 1gbit burst 256kb latency 400ms
}
if probe >> "$LOG" 2>&1; then LINK=(--rate "${RATE:-1gbit}"); else LINK=(--loopback); fi
ip link del hwprobe0 2>/dev/null; ip link del hwprobebr 2>/dev/null; ip netns del hwprobe 2>/dev/null
say "links: ${LINK[*]}; cgroup: $(cat /sys/fs/cgroup/cgroup.controllers 2>/dev/null || echo v1)"

for job in ${JOBS:-gpu lm16 slow16}; do
  say "start $job"
  case $job in
    gpu)
      timeout "${GPU_TIMEOUT:-100}" python3 -m pytest -q -p no:cacheprovider -n 4 tests/replica/test_barrier.py \
          tests/replica/test_replica.py -k "cuda or gpu" > "$WORK/gpu_tests.txt" 2>&1
      say "gpu tests rc=$? $(tail -1 "$WORK/gpu_tests.txt")" ;;
    lm16)
      timeout $(( ${BUDGET_LM:-75} * 2 + 110 )) python3 scripts/races/link.py --workload gpt_large --machines 4 --cores-per-machine 4 "${LINK[@]}" \
          --methods hogwild,ddp --lr "${LR_DDP:-0.006}" --budget "${BUDGET_LM:-75}" --eval-every-s 10 --repeats 1 --out "$WORK/lm16" \
          --run-timeout-s 200 > "$WORK/lm16.log" 2>&1
      say "lm16 rc=$?"; tail -6 "$WORK/lm16.log" >> "$LOG" ;;
    slow16)
      timeout $(( ${BUDGET_SLOW:-60} * 2 + 100 )) python3 scripts/races/straggler_race.py --workers 16 --stragglers 2 --slow throttle:0.5 \
          --lr "${LR_DDP:-0.006}" --budget "${BUDGET_SLOW:-60}" --eval-every-s 10 --repeats 1 --out "$WORK/slow16" > "$WORK/slow16.log" 2>&1
      say "slow16 rc=$?"; tail -6 "$WORK/slow16.log" >> "$LOG" ;;
    tables)
      for w in ${WIDTHS:-16 8 4}; do
        timeout $((150 * ${REPEATS:-1})) python3 scripts/races/tables.py --workers "$w" --rows 10000000 --tables 1 \
            --target 0.586 --repeats "${REPEATS:-1}" --methods hogwild,ddp_sparse --out "$WORK/tables" \
            --name "tables_w$w" > "$WORK/tables_w$w.log" 2>&1
        say "tables w=$w rc=$?"
      done ;;
    *) say "unknown job $job" ;;
  esac
  pack
done
say "done"
