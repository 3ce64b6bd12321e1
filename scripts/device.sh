#!/usr/bin/env bash
# One run on a lent machine with a GPU and 16 cores (docs/machines.md): the suite's CUDA tests, and
# issue 46's 16-core table, hogwild 1 x W (the barrier, AdamW) against DDP on W processes on the GPT,
# W = 4, 8, 16, with peak memory. About 7 minutes; results under $OUT (default bench_results/device).
# The machine reaches no package index: carry the virtual environment (or install --no-deps).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench_results/device}"
mkdir -p "$OUT"
python - <<'PY' > "$OUT/machine.txt" 2>&1
import os, torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
print("cores", len(os.sched_getaffinity(0)))
PY
timeout 150 python -m pytest -q -p no:cacheprovider -n 4 tests/replica/test_barrier.py tests/replica/test_replica.py \
    -k "cuda or gpu" > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?" >> "$OUT/gpu_tests.txt"
for w in 4 8 16; do
  timeout 200 python scripts/lm_budget.py --width "$w" --methods hogwild_1x2 ddp_2 --budget 40 --repeats 1 \
      --out "$OUT" --name "lm_budget_gpt_w$w" > "$OUT/lm_budget_w$w.log" 2>&1
done
