#!/usr/bin/env bash
# One run on a lent machine with a GPU and 16 cores (docs/machines.md): the suite's CUDA tests, the
# conductor's tests (leader/, faults, the worker loop) on 16 cores, and the 16-core table of
# issue 48, hogwild 1 x W against DDP on W processes with sparse gradients on the clicks DLRM at 10M
# rows (scripts/tables.py), each pinned to W cores, with the machine-wide peak memory.
# WIDTHS (default "16 8 4") and REPEATS (default 1) choose the table's runs. About 7 minutes with the
# defaults; results under $OUT (default bench_results/device).
# The machine reaches no package index: Hydra, OmegaConf and ANTLR travel in .whl/site (copied from
# this host's virtual environment; `carry: [".whl"]`), the project is installed without its deps.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-bench_results/device}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/.whl/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.txt" 2>&1 || echo "install failed" >> "$OUT/install.txt"
python3 - <<'PY' > "$OUT/machine.txt" 2>&1
import os, torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
print("cores", len(os.sched_getaffinity(0)), "memory GiB", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
PY
timeout 90 python3 -m pytest -q -p no:cacheprovider -n 4 tests/replica/test_barrier.py tests/replica/test_replica.py \
    -k "cuda or gpu" > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?" >> "$OUT/gpu_tests.txt"
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 4 tests/leader/test_leader.py tests/replica/test_worker.py \
    tests/replica/test_recipe.py tests/leader/test_faults.py -k "not sigkill" > "$OUT/conductor_tests.txt" 2>&1
echo "conductor tests rc=$?" >> "$OUT/conductor_tests.txt"
for w in ${WIDTHS:-16 8 4}; do
  timeout $((150 * ${REPEATS:-1})) python3 scripts/tables.py --workers "$w" --rows 10000000 --tables 1 --target 0.586 \
      --repeats "${REPEATS:-1}" --methods hogwild,ddp_sparse --out "$OUT" --name "tables_w$w" > "$OUT/tables_w$w.log" 2>&1
  echo "w=$w rc=$?" >> "$OUT/tables_w$w.log"
done
