#!/usr/bin/env bash
# Builds tuning variants of libnattn (bf16 only, one arch) into variants/NAME.so (and
# .dev/var/NAME.so.xz, compressed: carry `.dev` to the device), for one device call that
# times them side by side (`bash tests/gpu/run_device.sh variants`).
# Usage: bash benchmarks/build_variants.sh NAME="-DMACRO=VALUE ..." [NAME=...] ...
# Example (the register caps of csrc/include/nattn/tc/kernels.cuh):
#   bash benchmarks/build_variants.sh base="" dkv32x4="-DNATTN_TC_DKV_BLOCKS_HD32=4" \
#        q32x5="-DNATTN_TC_QUERY_BLOCKS_HD32=5"
# Env: NATTN_CUDA_ARCH (default 9.0), NATTN_DTYPES (default bfloat16), NATTN_HEAD_DIMS and
# NATTN_NA_DIMS (default all; e.g. "32;64" and "2;3" for the DiNAT-size problems), NATTN_FAMILIES
# (default all; "tc": the tensor-core family, with simt, in a fraction of the build), NATTN_N_WORKERS.
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=${NATTN_CUDA_ARCH:-9.0}
mkdir -p variants build
for spec in "$@"; do
  name=${spec%%=*}
  flags=${spec#*=}
  dir=build/variant-$name
  echo "== $name: ${flags:-(defaults)}"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DNATTN_CUDA_ARCH="$ARCH" \
    -DNATTN_DTYPES="${NATTN_DTYPES:-bfloat16}" -DNATTN_HEAD_DIMS="${NATTN_HEAD_DIMS:-}" \
    -DNATTN_NA_DIMS="${NATTN_NA_DIMS:-}" -DNATTN_FAMILIES="${NATTN_FAMILIES:-}" -DPython3_EXECUTABLE="$(command -v python3)" \
    -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" "-DCMAKE_CUDA_FLAGS=$flags" > "$dir.configure.log" 2>&1 \
    || { cat "$dir.configure.log"; exit 1; }
  cmake --build "$dir" --parallel "${NATTN_N_WORKERS:-$(nproc)}" > "$dir.build.log" 2>&1 \
    || { tail -30 "$dir.build.log"; exit 1; }
  cp "$dir/libnattn.so" "variants/$name.so"
  # and compressed for the device tool's carry limit (carry .dev; run_device.sh unpacks it)
  mkdir -p .dev/var
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(open(sys.argv[1], 'rb'), lzma.open(sys.argv[2], 'wb', preset=1))" \
    "variants/$name.so" ".dev/var/$name.so.xz"
  ls -la "variants/$name.so" ".dev/var/$name.so.xz"
done
