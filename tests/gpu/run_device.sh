#!/usr/bin/env bash
# One device call: GPU test tier, compute-sanitizer memcheck sweep, anchor benchmark.
# Usage (repo root on the GPU machine, libnattn.so already in nattn/_cuda/):
#   bash tests/gpu/run_device.sh [tests|sanitize|bench|all] ...
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/nattn_out}; mkdir -p "$OUT"
what=${1:-all}
python3 -c "import nattn.build_info as b; print(b.build_config())" 2>&1 | tee "$OUT/build_info.txt"
if [[ $what == all || $what == *tests* ]]; then
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest -m gpu tests/gpu -q --maxfail=25 -p no:cacheprovider \
    ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
fi
if [[ $what == all || $what == *sanitize* ]]; then
  timeout ${SAN_TIMEOUT:-90} compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 \
    python3 tests/gpu/sanitize_sweep.py > "$OUT/sanitizer.log" 2>&1
  echo "compute-sanitizer rc=$?"; tail -5 "$OUT/sanitizer.log"
fi
if [[ $what == all || $what == *bench* ]]; then
  timeout ${BENCH_TIMEOUT:-150} python3 benchmarks/simt_anchors.py ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.md"
fi
