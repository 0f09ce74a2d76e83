#!/usr/bin/env bash
# One device call: GPU test tier, compute-sanitizer memcheck sweep, anchor benchmark.
# Usage (repo root on the GPU machine, libnattn.so already in nattn/_cuda/):
#   bash tests/gpu/run_device.sh [quick|backward|tests|sanitize|initcheck|bench|flex|anchors|all|split|host|models|compile|variants|varcheck|ab|crossover|familyab|strips|stripcheck|striptime|stripbwd|stripnat|stripverify|dispatchcheck|sweep|optimize|qkav|norm|ncu|squarebox|squarerun|dqrun|dkvrun|pdl] ...
# flex: the flex backend's GPU tests (compiled autograd first); anchors: the full bench with
# the cuda and flex backends side by side (docs/dev/PERF.md records its tables); models:
# python -m nattn.bench --suite models; compile: benchmarks/compile_profile.py; split, host:
# benchmarks/{kernel_split,host_overhead}.py (host: cuda_host_costs.cu too); variants: the tuning builds in variants/*.so
# (benchmarks/build_variants.sh); varcheck: the random sweep on each of them; ab: libraries side by side; crossover: sm90 tile pairs
# against the default choice; familyab: the default against NATTN_FAMILY=sm90, fwd and f+b;
# strips, stripcheck, striptime, stripbwd: the strip pairs' GPU tests, sanitizers, and timings
# against sm90's default and tc; stripnat: NAT / DiNAT models with and without NATTN_SM90_STRIPS=1.
set -uo pipefail
# pytest runs with -n 0: one process for the one GPU (pyproject's addopts ask pytest-xdist for
# one worker per core; the device image has pytest-xdist, so -p no:xdist would fail on -n).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/nattn_out}; mkdir -p "$OUT"
what=${1:-all}
# The built library (~100 MiB) with the tree exceeds the device tool's 64 MiB carry limit:
# carry it compressed (python's lzma preset 1, ~20 MB) as .dev/libnattn.so.xz or the file
# LIB_XZ names (e.g. LIB_XZ=.dev/tip.so.xz); unpacked here over nattn/_cuda/libnattn.so.
xz=${LIB_XZ:-.dev/libnattn.so.xz}
if [[ -f $xz && ( -n ${LIB_XZ:-} || ! -f nattn/_cuda/libnattn.so ) ]]; then
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open('nattn/_cuda/libnattn.so', 'wb'))" "$xz"
fi
# Tuning builds travel compressed too (benchmarks/build_variants.sh writes .dev/var/NAME.so.xz;
# ~10 MiB each uncompressed): unpacked into variants/ for the variants / varcheck / ab modes.
for f in .dev/var/*.so.xz; do
  [[ -f $f ]] || continue
  mkdir -p variants
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
    "$f" "variants/$(basename "$f" .xz)"
done
python3 -c "import nattn.build_info as b; print(b.build_config())" 2>&1 | tee "$OUT/build_info.txt"
# An uninstalled source tree has no nattn.models (setup.py maps models/ there): link it
# before any test or benchmark imports it.
python3 -c "import nattn.models" 2>/dev/null || ln -sfn ../models nattn/models
if [[ $what == all || $what == *tests* ]]; then  # TEST_LIBS: libraries to test (default: the package's)
  for lib in ${TEST_LIBS:-nattn/_cuda/libnattn.so}; do
    echo "== GPU tests with $lib"
    NATTN_LIBRARY=$PWD/$lib timeout ${TEST_TIMEOUT:-420} python3 -m pytest -m gpu tests/gpu -q -n 0 \
      --maxfail=25 -p no:cacheprovider ${PYTEST_ARGS:-} 2>&1 | tee -a "$OUT/gpu_tests.log" | tail -15
    # the Hopper family's forward on cases it must take (a compute capability 9.0 GPU)
    echo "== GPU sm90 sweep with $lib, NATTN_FAMILY=sm90"
    NATTN_FAMILY=sm90 NATTN_LIBRARY=$PWD/$lib timeout ${TEST_TIMEOUT:-240} python3 -m pytest -m gpu \
      tests/gpu/test_sm90_forward.py -q -n 0 --maxfail=25 -p no:cacheprovider 2>&1 | tee -a "$OUT/gpu_tests.log" | tail -3
    echo "== GPU sm90 backward sweep with $lib, NATTN_FAMILY=sm90"
    NATTN_FAMILY=sm90 NATTN_LIBRARY=$PWD/$lib timeout ${SM90_BWD_TIMEOUT:-300} python3 -m pytest -m gpu \
      tests/gpu/test_sm90_backward.py -q -n 0 --maxfail=25 -p no:cacheprovider 2>&1 | tee -a "$OUT/gpu_tests.log" | tail -8
    # 16-bit problems run the tensor-core family by default: the sweep again on SIMT alone
    echo "== GPU sweep with $lib, NATTN_FAMILY=simt"
    NATTN_FAMILY=simt NATTN_LIBRARY=$PWD/$lib timeout ${TEST_TIMEOUT:-240} python3 -m pytest -m gpu \
      tests/gpu/test_cuda_vs_reference.py -q -n 0 --maxfail=25 -p no:cacheprovider 2>&1 | tee -a "$OUT/gpu_tests.log" | tail -5
  done
fi
# quick: the checks a tc / dispatch change needs in ~3 minutes: the tier without the flex and
# sm90 sweep files (1955 cases in the fifteenth session) and the tc memcheck sweep.
if [[ $what == *quick* ]]; then
  for lib in ${TEST_LIBS:-nattn/_cuda/libnattn.so}; do
    echo "== GPU tier without the flex / sm90 sweep files, $lib"
    NATTN_LIBRARY=$PWD/$lib timeout ${TEST_TIMEOUT:-300} python3 -m pytest -m gpu tests/gpu -q -n 0 --maxfail=25 \
      -p no:cacheprovider --ignore=tests/gpu/test_flex_gpu.py --ignore=tests/gpu/test_sm90_forward.py \
      --ignore=tests/gpu/test_sm90_backward.py 2>&1 | tee -a "$OUT/quick.log" | tail -3
    NATTN_LIBRARY=$PWD/$lib timeout ${SAN_TIMEOUT:-100} compute-sanitizer --tool memcheck --leak-check no \
      --error-exitcode 9 python3 tests/gpu/sanitize_sweep.py > "$OUT/sanitizer_quick.log" 2>&1
    echo "compute-sanitizer memcheck (tc sweep) rc=$?"; tail -2 "$OUT/sanitizer_quick.log"
  done
fi
# backward: after a change to the backward passes of every family (~5 minutes with quick): the
# Hopper backward sweep (and its determinism tests) and the sweep on SIMT alone.
if [[ $what == *backward* ]]; then
  echo "== GPU sm90 backward sweep, NATTN_FAMILY=sm90"
  NATTN_FAMILY=sm90 timeout ${SM90_BWD_TIMEOUT:-300} python3 -m pytest -m gpu tests/gpu/test_sm90_backward.py -q -n 0 \
    --maxfail=25 -p no:cacheprovider 2>&1 | tee -a "$OUT/backward.log" | tail -5
  echo "== GPU sweep, NATTN_FAMILY=simt"
  NATTN_FAMILY=simt timeout ${TEST_TIMEOUT:-240} python3 -m pytest -m gpu tests/gpu/test_cuda_vs_reference.py -q -n 0 \
    --maxfail=25 -p no:cacheprovider 2>&1 | tee -a "$OUT/backward.log" | tail -3
fi
if [[ $what == all || $what == *sanitize* ]]; then
  timeout ${SAN_TIMEOUT:-90} compute-sanitizer --tool memcheck --leak-check no --error-exitcode 9 \
    python3 tests/gpu/sanitize_sweep.py > "$OUT/sanitizer.log" 2>&1
  echo "compute-sanitizer rc=$?"; tail -5 "$OUT/sanitizer.log"
  for tool in memcheck racecheck; do  # the SIMT family (its dQ pass counts threads with shared atomics)
    NATTN_FAMILY=simt NATTN_SANITIZE_CASES=12 timeout ${SAN_TIMEOUT:-90} compute-sanitizer --tool $tool \
      --error-exitcode 9 python3 tests/gpu/sanitize_sweep.py > "$OUT/sanitizer_simt_$tool.log" 2>&1
    echo "compute-sanitizer $tool (simt) rc=$?"; tail -2 "$OUT/sanitizer_simt_$tool.log"
  done
  for tool in memcheck racecheck synccheck; do  # the Hopper family (TMA, mbarriers, wgmma)
    NATTN_FAMILY=sm90 timeout ${SAN_TIMEOUT:-90} compute-sanitizer --tool $tool --error-exitcode 9 \
      python3 tests/gpu/sanitize_sm90.py > "$OUT/sanitizer_sm90_$tool.log" 2>&1
    echo "compute-sanitizer $tool (sm90) rc=$?"; tail -3 "$OUT/sanitizer_sm90_$tool.log"
  done
fi
# initcheck: reads of device memory nothing wrote since its allocation (the kernels' outputs
# and stream-ordered workspaces), on the default dispatch's sweep and on the Hopper family's;
# the scripts' NaN filling is off (NATTN_POISON_WORKSPACES=0): a fill counts as a write.
# The Hopper kernels store per lane (NATTN_SM90_OUT_STORES=lanes): initcheck does not count
# the TMA engine's bulk tensor stores as writes, so every later read of a bulk-stored output
# reports (fifty-first session: the same heads-first case, bulk stores 100+ reports, per-lane
# 0; the NaN-filled GPU tier shows those rows written). The bulk stores' rows are checked by
# that tier instead. The Hopper sections together take several minutes under initcheck
# (SAN_TIMEOUT_SM90, 400 s by default).
if [[ $what == *initcheck* ]]; then
  export NATTN_SM90_OUT_STORES=lanes
  NATTN_POISON_WORKSPACES=0 NATTN_SANITIZE_CASES=${INIT_CASES:-12} timeout ${SAN_TIMEOUT:-120} compute-sanitizer \
    --tool initcheck --error-exitcode 9 python3 tests/gpu/sanitize_sweep.py > "$OUT/initcheck.log" 2>&1
  echo "compute-sanitizer initcheck rc=$?"; tail -3 "$OUT/initcheck.log"
  NATTN_POISON_WORKSPACES=0 NATTN_FAMILY=sm90 NATTN_SANITIZE_CASES=${INIT_CASES:-12} timeout ${SAN_TIMEOUT_SM90:-400} \
    compute-sanitizer --tool initcheck --error-exitcode 9 python3 tests/gpu/sanitize_sm90.py \
    > "$OUT/initcheck_sm90.log" 2>&1
  echo "compute-sanitizer initcheck (sm90) rc=$?"; tail -3 "$OUT/initcheck_sm90.log"
  unset NATTN_SM90_OUT_STORES
fi
if [[ $what == all || $what == *bench* ]]; then
  timeout ${BENCH_TIMEOUT:-150} python3 benchmarks/cuda_anchors.py ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.md"
fi
if [[ $what == all || $what == *flex* ]]; then
  timeout ${FLEX_TIMEOUT:-400} python3 -m pytest -q -n 0 -m gpu tests/gpu/test_flex_gpu.py tests/test_reference_gpu.py \
    -p no:cacheprovider -W ignore 2>&1 | tee "$OUT/flex_tests.log" | tail -8
fi
if [[ $what == all || $what == *anchors* ]]; then
  # ANCHORS_ONLY=name,name: a subset (the whole suite with flex's peers takes ~7 minutes; the
  # GNA rows come last and need their own call)
  timeout ${ANCHORS_TIMEOUT:-420} python3 -m nattn.bench --suite anchors ${ANCHORS_ONLY:+--only $ANCHORS_ONLY} --backprop --backend flex --markdown --no-progress --time-budget ${ANCHORS_BUDGET:-360} \
    --json "$OUT/anchors.json" 2>&1 | tee "$OUT/anchors.txt" | tail -30
fi
if [[ $what == *optimize* ]]; then  # every configuration per tuning-suite problem, GPU time (nattn.bench --optimize)
  timeout ${OPTIMIZE_TIMEOUT:-300} python3 -m nattn.bench --suite tuning --optimize --cuda-graphs 2>&1 \
    | tee "$OUT/optimize.txt" | tail -25
fi
# NCU_FAMILY (default sm90; tc for the tensor-core family), NCU_ARGS (e.g. --rpb), NCU_ONCE (the
# launch's warp count: ncu_stalls.py --once splits per-warp setup from the loops).
if [[ $what == *ncu* ]]; then  # where the sm90 kernels' warps wait (NCU_PROBLEM, default flux GNA)
  prob=${NCU_PROBLEM:-flux-2d-w80-s16}
  for k in ${NCU_KERNELS:-forward_kernel backward_dq_kernel backward_dkv_kernel}; do
    NATTN_FAMILY=${NCU_FAMILY:-sm90} timeout ${NCU_TIMEOUT:-200} ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
      --section SourceCounters -k regex:$k -c 1 -f -o "$OUT/$k" python3 benchmarks/sm90_profile.py --backward ${NCU_ARGS:-} "$prob" \
      > "$OUT/${k}_ncu.log" 2>&1
    ncu -i "$OUT/$k.ncu-rep" --page source --csv --print-source sass > "$OUT/${k}_source.csv" 2>&1
    ncu -i "$OUT/$k.ncu-rep" --page details > "$OUT/${k}_details.txt" 2>&1
    rm -f "$OUT/$k.ncu-rep"  # the device tool returns a limited number of files: keep the text
    python3 benchmarks/ncu_stalls.py "$OUT/${k}_source.csv" --top 12 ${NCU_ONCE:+--once $NCU_ONCE} 2>&1 | head -40
  done
fi
if [[ $what == *norm* ]]; then  # the models' inference LayerNorm kernel: its tests and beside torch's
  timeout 200 python3 -m pytest -m gpu tests/gpu/test_layer_norm_gpu.py -q -n 0 -p no:cacheprovider 2>&1 \
    | tee "$OUT/norm_tests.log" | tail -3
  timeout 150 python3 benchmarks/layer_norm.py 2>&1 | tee "$OUT/norm_bench.md"
fi
if [[ $what == *qkav* ]]; then  # the unfused ops: window kernels vs plain PyTorch vs the fused op
  timeout 120 python3 benchmarks/qk_av_gpu.py 2>&1 | tee "$OUT/qkav.txt"
fi
if [[ $what == *split* ]]; then  # per-kernel times of one forward+backward (SPLIT_ARGS: e.g. "--only dinat-s1-2d --rpb")
  (cd benchmarks && timeout 120 python3 kernel_split.py ${SPLIT_ARGS:-} 2>&1 | tee -a "$OUT/split.txt" | grep -v vectorized)
fi
if [[ $what == *sweep* ]]; then  # the default family against each family forced, random problems (SWEEP_ARGS)
  timeout ${SWEEP_TIMEOUT:-500} python3 benchmarks/dispatch_sweep.py ${SWEEP_ARGS:-} 2>&1 | tee "$OUT/sweep.txt" | tail -25
fi
if [[ $what == *host* ]]; then  # host time per call (kernels negligible)
  timeout 60 python3 benchmarks/host_overhead.py 2>&1 | tee "$OUT/host.txt" | tail -2
  # the CUDA runtime calls (launches, memsets) and aten ops one call makes, host us each
  timeout 60 python3 benchmarks/host_overhead.py --torch-profile 2>&1 | tee -a "$OUT/host.txt" | tail -31
  # the backend's own calls, and torch's cost per node on either backward thread (the yardstick)
  timeout 30 python3 benchmarks/host_overhead.py --backend-calls 2>&1 | tee -a "$OUT/host.txt" | tail -1
  timeout 30 python3 benchmarks/host_overhead.py --autograd-control 2>&1 | tee -a "$OUT/host.txt" | tail -2
  # what the C side's CUDA calls cost (device selection, tensor-map encodes, launches)
  nvcc -O2 -arch=sm_90 benchmarks/cuda_host_costs.cu -o /tmp/cuda_host_costs -lcuda \
    && timeout 30 /tmp/cuda_host_costs 2>&1 | tee -a "$OUT/host.txt"
fi
if [[ $what == *compile* ]]; then  # eager vs torch.compile step of a NAT model, graph breaks
  # stderr apart: inductor's autotuning logs thousands of lines there (they once pushed the
  # profile out of the call's returned tail)
  timeout ${COMPILE_TIMEOUT:-400} python3 benchmarks/compile_profile.py ${COMPILE_ARGS:-} 2> "$OUT/compile.err" \
    | tee "$OUT/compile.txt" | tail -50
fi
if [[ $what == *models* ]]; then  # timm models end to end beside Swin-T / ConvNeXt-T, eager and compiled
  timeout ${MODELS_TIMEOUT:-560} python3 -m nattn.bench --suite models ${MODELS_ARGS:-} 2> "$OUT/models.err" \
    | tee "$OUT/models.md" | tail -16  # stderr apart, as for compile
fi
# Libraries side by side (benchmarks/library_ab.py, bf16, fwd and fwd + bwd), two rounds
# alternating between them. ab: AB_LIBS="tag=path ..." (a path ending in .xz is unpacked:
# the 100 MiB libraries travel compressed), AB_PROBLEMS, AB_ARGS=graphs (GPU time: small
# problems' wall times are host-bound); variants: every variants/*.so.
ab_rounds() {  # ab_rounds PROBLEMS tag=path ...
  local problems=$1; shift
  local libs=()
  for spec in "$@"; do  # unpacked once, before the rounds
    local tag=${spec%%=*} lib=${spec#*=}
    if [[ $lib == *.xz ]]; then
      python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
        "$lib" "/tmp/ab_$tag.so" && lib=/tmp/ab_$tag.so
    fi
    libs+=("$tag=$(realpath "$lib")")
  done
  for round in 1 2; do
    for spec in "${libs[@]}"; do
      NATTN_LIBRARY=${spec#*=} timeout 200 python3 benchmarks/library_ab.py "${spec%%=*}" "$problems" bwd ${AB_ARGS:-} 2>&1 \
        | grep -v "^ \|^Traceback" | tee -a "$OUT/ab.txt"
    done
  done
}
AB_DEFAULT=flux-2d-w80,flux-2d-w80-s16,hunyuan-3d,hunyuan-3d-s16,1d-32k-w2048,dinat-s1-2d,mid-2d-k13,video-3d
if [[ $what =~ (^|[^a-z])ab([^a-z]|$) ]]; then
  ab_rounds "${AB_PROBLEMS:-$AB_DEFAULT}" ${AB_LIBS:-lib=nattn/_cuda/libnattn.so}
fi
if [[ $what == *varcheck* ]]; then  # the tuning builds' correctness: the random sweep on each variants/*.so
  for lib in ${VARCHECK_LIBS:-variants/*.so}; do
    echo "== random sweep with $lib"
    NATTN_LIBRARY=$PWD/$lib timeout ${VARCHECK_TIMEOUT:-150} python3 -m pytest -m gpu -q -n 0 -p no:cacheprovider \
      --maxfail=10 tests/gpu/test_cuda_vs_reference.py tests/gpu/test_packed_qkv_gpu.py 2>&1 \
      | tee -a "$OUT/varcheck.log" | tail -2
  done
fi
if [[ $what == *variants* ]]; then  # tuning builds carried in variants/*.so
  specs=()
  for lib in variants/*.so; do specs+=("$(basename "$lib" .so)=$lib"); done
  ab_rounds "${AB_PROBLEMS:-dinat-s1-2d,mid-2d-k13,video-3d,video-b1-k7}" "${specs[@]}"
fi
# The default choice against NATTN_FAMILY=sm90 (its default pair), forward and forward +
# backward, for moving the dispatch thresholds (src/sm90_dispatch.cu: kSm90MinWindow*). AB_ARGS as
# for ab (graphs, rpb); FB_FAMILIES (default "default sm90"; e.g. "default sm90 tc"); FB_PROBLEMS:
# bench names or ad-hoc shapes (benchmarks/library_ab.py: SPATIAL-kKERNEL-bB-hH-dD[-dilDIL]).
# The strip pairs (sm90/forward_strips.cuh, backward_dq_strips.cuh, backward_dkv_strips.cuh;
# named only until measured), in calls of under ten minutes each. strips: their GPU tests,
# forward and backward (STRIP_CASES / STRIP_BWD_CASES random cases a sweep); stripcheck:
# memcheck and racecheck on the sanitizer section; striptime: the strip pairs, the default sm90
# choice and the tc family forced in turn on small 2-D and 3-D windows, with and without an
# RPB, two rounds (GPU ms, forward); stripbwd: forward + backward (also the strips with tc's
# dK/dV pass) and the per-kernel split with and without the strips.
# stripverify: after a change to the strip passes, in one call of ~4 minutes: the strips and
# stripcheck steps with fewer cases (100 a sweep, 6 sanitized), then the default dispatch on
# the issue rows (GPU ms, forward + backward) and the per-kernel split. STRIP_BASE=path.so (a
# library built before the change: e.g. benchmarks/build_variants.sh in a worktree) times it
# in the same call.
if [[ $what == *stripverify* ]]; then
  STRIP_CASES=${STRIP_CASES:-100} STRIP_BWD_CASES=${STRIP_BWD_CASES:-100} SAN_STRIP_CASES=${SAN_STRIP_CASES:-6}
fi
if [[ $what == *strips* || $what == *stripverify* ]]; then
  NATTN_SM90_STRIP_CASES=${STRIP_CASES:-300} NATTN_SM90_STRIP_BWD_CASES=${STRIP_BWD_CASES:-160} NATTN_FAMILY=sm90 \
    timeout 540 python3 -m pytest -q -n 0 -m gpu tests/gpu/test_sm90_forward.py tests/gpu/test_sm90_backward.py \
    -k "strip" 2>&1 | tail -15 | tee "$OUT/strips_tests.txt"
fi
if [[ $what == *stripcheck* || $what == *stripverify* ]]; then
  for tool in memcheck racecheck; do
    NATTN_FAMILY=sm90 NATTN_SANITIZE_SECTIONS=strips NATTN_SANITIZE_CASES=${SAN_STRIP_CASES:-12} timeout 280 \
      compute-sanitizer --tool $tool python3 tests/gpu/sanitize_sm90.py 2>&1 | tail -3 | tee "$OUT/strips_$tool.txt"
  done
fi
if [[ $what == *stripverify* ]]; then
  probs=${SV_PROBLEMS:-dinat-s1-2d,mid-2d-k13,video-3d,16x32x32-k5x7x7-b2-h8-d32,8x64x64-k3x7x7-b1-h8-d64}
  for spec in ${STRIP_BASE:+base=$STRIP_BASE} new=$PWD/nattn/_cuda/libnattn.so; do
    NATTN_LIBRARY=${spec#*=} timeout 90 python3 benchmarks/library_ab.py "${spec%%=*}" "$probs" graphs bwd 2>&1 \
      | grep -v "^ \|^Traceback" | tee -a "$OUT/stripverify_bench.txt"
    (cd benchmarks && NATTN_LIBRARY=${spec#*=} timeout 60 python3 kernel_split.py --only dinat-s1-2d,video-3d 2>&1 \
      | grep "ms" | sed "s/^/${spec%%=*} /" | tee -a "$OUT/stripverify_bench.txt")
  done
fi
# small 2-D and 3-D windows for striptime / stripbwd (ad-hoc shapes: benchmarks/library_ab.py)
probs2=${ST_PROBLEMS_2D:-dinat-s1-2d,dinat-s2-dil4,28x28-k7x7-b128-h4-d32,14x14-k7x7-b128-h8-d32,7x7-k7x7-b128-h16-d32,56x56-k5x5-b32-h4-d32,56x56-k3x3-b32-h4-d32,56x56-k7x7-b32-h4-d64,28x28-k7x7-b32-h8-d64-dil4x4,112x112-k7x9-b8-h4-d64}
probs3=${ST_PROBLEMS_3D:-video-3d,16x32x32-k3x5x5-b2-h8-d64,16x32x32-k5x7x7-b2-h8-d32,8x64x64-k3x7x7-b1-h8-d64,16x32x32-k7x7x7-b2-h8-d64}
if [[ $what == *striptime* ]]; then
  for args in graphs "graphs rpb"; do
    for round in 1 2; do
      NATTN_FAMILY=sm90 NATTN_SM90_TILE=q8x8_k14x16 timeout 120 python3 benchmarks/library_ab.py strips "$probs2" $args
      NATTN_FAMILY=sm90 NATTN_SM90_TILE=q2x4x8_k8x10x16 timeout 120 python3 benchmarks/library_ab.py strips "$probs3" $args
      NATTN_FAMILY=sm90 timeout 120 python3 benchmarks/library_ab.py sm90 "$probs2,$probs3" $args
      NATTN_FAMILY=tc timeout 120 python3 benchmarks/library_ab.py tc "$probs2,$probs3" $args
    done 2>&1 | grep -v "^ \|^Traceback" | tee -a "$OUT/strips_bench.txt"
  done
fi
if [[ $what == *stripbwd* ]]; then
  for args in "graphs bwd" "graphs rpb bwd"; do
    NATTN_FAMILY=sm90 NATTN_SM90_TILE=q8x8_k14x16 timeout 120 python3 benchmarks/library_ab.py strips "$probs2" $args
    NATTN_FAMILY=sm90 NATTN_SM90_TILE=q2x4x8_k8x10x16 timeout 120 python3 benchmarks/library_ab.py strips "$probs3" $args
    NATTN_FAMILY=sm90 NATTN_SM90_STRIP_DKV=tc NATTN_SM90_TILE=q8x8_k14x16 timeout 120 \
      python3 benchmarks/library_ab.py strips-tcdkv "$probs2" $args
    NATTN_FAMILY=sm90 NATTN_SM90_STRIP_DKV=tc NATTN_SM90_TILE=q2x4x8_k8x10x16 timeout 120 \
      python3 benchmarks/library_ab.py strips-tcdkv "$probs3" $args
    timeout 120 python3 benchmarks/library_ab.py default "$probs2,$probs3" $args
    NATTN_FAMILY=tc timeout 120 python3 benchmarks/library_ab.py tc "$probs2,$probs3" $args
  done 2>&1 | grep -v "^ \|^Traceback" | tee -a "$OUT/strips_bench.txt"
  # the per-kernel split (delta, dQ, dK/dV) of dinat-s1 and video-3d with the strips and without
  for switch in 1 0; do
    (cd benchmarks && NATTN_SM90_STRIPS=$switch timeout 100 python3 kernel_split.py --only dinat-s1-2d,video-3d 2>&1 \
      | grep -v vectorized | sed "s/^/strips=$switch /" | tee -a "$OUT/strips_split.txt")
  done
fi
# The strip pairs inside the models (NATTN_SM90_STRIPS=1 makes them the default where they take a
# layer, forward and backward): the NAT / DiNAT / video models' train and inference img/s, eager
# and CUDA graphs, without and with the switch, in one process each (STRIP_MODELS to change the set).
if [[ $what == *stripnat* ]]; then
  sm=${STRIP_MODELS:-nat_mini,nat_tiny,dinat_tiny,dinat_s_tiny}
  for switch in 0 1; do
    echo "== NATTN_SM90_STRIPS=$switch"
    NATTN_SM90_STRIPS=$switch timeout 240 python3 -m nattn.bench --suite models --models "$sm" --modes eager,cudagraphs \
      2>&1 | grep -v Warning | tail -12
  done 2>&1 | tee "$OUT/strip_models.md"
fi
if [[ $what == *familyab* ]]; then
  probs=${FB_PROBLEMS:-56x56-k7x7-b32-h4-d64,28x28-k7x7-b32-h8-d64-dil4x4,28x28-k7x7-b32-h8-d64-dil2x2,56x56-k9x9-b32-h4-d64,16x32x32-k3x7x7-b2-h8-d64}
  for fam in ${FB_FAMILIES:-default sm90}; do  # default: the library's choice; else NATTN_FAMILY=<fam>
    NATTN_FAMILY=$([[ $fam != default ]] && echo $fam) timeout 200 python3 benchmarks/library_ab.py $fam "$probs" bwd ${AB_ARGS:-} 2>&1 \
      | grep -v "^ \|^Traceback" | tee -a "$OUT/familyab.txt"
  done
fi
# The default family rules against the clock (benchmarks/dispatch_check.py): sm90 and tc
# forced on each problem, the rules' pick, MISMATCH where it is the slower one.
if [[ $what == *dispatchcheck* ]]; then
  probs=${DC_PROBLEMS:-dinat-s1-2d,dinat-s2-dil4,mid-2d-k13,video-3d,28x28-k7x7-b128-h4-d32,16x32x32-k3x7x7-b2-h8-d64,16384-k65-b2-h8-d64}
  timeout 300 python3 benchmarks/dispatch_check.py "$probs" bwd ${DC_ARGS:-} 2>&1 | tee -a "$OUT/dispatch_check.txt"
fi
# sm90 against the default choice on small and mid windows: each tile pair forced
# (NATTN_FAMILY=sm90 NATTN_SM90_TILE; pairs of another NA dim or head dim are declined and
# say so), for moving the forward's sm90 thresholds (src/sm90_dispatch.cu, kSm90MinWindow).
if [[ $what == *crossover* ]]; then
  probs=${CROSS_PROBLEMS:-dinat-s1-2d,mid-2d-k13,2d-64-k33-d32,video-3d,video-b1-k7,3d-causal-t}
  timeout 120 python3 benchmarks/library_ab.py default "$probs" 2>&1 | tee -a "$OUT/crossover.txt"
  for t in $(python3 -c "from nattn._cuda.kernel_table import SM90_TILES, Instance
print(' '.join(Instance('sm90', 'bfloat16', n, 64, t).tile_name for n, t in SM90_TILES if n > 1))"); do
    NATTN_FAMILY=sm90 NATTN_SM90_TILE=$t timeout 120 python3 benchmarks/library_ab.py "$t" "$probs" 2>&1 \
      | grep -v declined | tee -a "$OUT/crossover.txt"
  done
fi
# squarerun: the persistent square forward (forward_squares_persistent.cuh) as tuning builds
# variants/run.so (and run4.so: 4-byte output stores; either may be absent) against the
# loaded library: its forward tests (also with runs of 2 boxes), the squares section under
# memcheck and racecheck (run.so), then forward times side by side (two rounds, with an RPB,
# run lengths). SQ_CASES (default 120) sizes the square sweep: 60 keeps the call near 6 minutes.
if [[ $what == *squarerun* ]]; then
  for v in run run4; do
    [[ -f variants/$v.so ]] || continue
    NATTN_SM90_SQUARE_CASES=${SQ_CASES:-120} NATTN_FAMILY=sm90 NATTN_LIBRARY=variants/$v.so timeout 200 python3 -m pytest \
      -q -n 0 -m gpu -p no:cacheprovider --maxfail=25 tests/gpu/test_sm90_forward.py -k "square or (growing and not 2048)" \
      2>&1 | tee -a "$OUT/squarerun.log" | tail -3
    NATTN_SM90_SQUARE_RUN=2 NATTN_SM90_SQUARE_CASES=40 NATTN_FAMILY=sm90 NATTN_LIBRARY=variants/$v.so timeout 100 \
      python3 -m pytest -q -n 0 -m gpu -p no:cacheprovider tests/gpu/test_sm90_forward.py -k "square and bulk" \
      2>&1 | tee -a "$OUT/squarerun.log" | tail -2
    NATTN_LIBRARY=variants/$v.so timeout 100 python3 -m pytest -q -n 0 -m gpu -p no:cacheprovider \
      tests/gpu/test_query_range_gpu.py -k square 2>&1 | tee -a "$OUT/squarerun.log" | tail -2
    [[ $v == run ]] || continue  # (run4 differs in its output stores only: no sanitizer runs)
    for tool in memcheck racecheck; do
      NATTN_LIBRARY=variants/$v.so NATTN_FAMILY=sm90 NATTN_SANITIZE_SECTIONS=squares timeout 150 compute-sanitizer \
        --tool $tool --error-exitcode 9 python3 tests/gpu/sanitize_sm90.py > "$OUT/squarerun_${v}_$tool.log" 2>&1
      echo "compute-sanitizer $tool (squares, $v) rc=$?"; tail -2 "$OUT/squarerun_${v}_$tool.log"
    done
  done
  probs=${SQ_PROBLEMS:-mid-2d-k13,128x128-k11x11-b4-h8-d64,56x56-k9x9-b32-h4-d64,64x64-k13x13-b8-h8-d64}
  for args in "graphs" "graphs" "graphs rpb"; do
    timeout 100 python3 benchmarks/library_ab.py tip "$probs" $args
    for v in run run4; do
      [[ -f variants/$v.so ]] && NATTN_LIBRARY=variants/$v.so timeout 100 python3 benchmarks/library_ab.py $v "$probs" $args
    done
  done 2>&1 | grep -v "^ \|^Traceback" | tee -a "$OUT/squarerun_bench.txt"
  for n in 2 4 8; do
    [[ -f variants/run.so ]] && NATTN_SM90_SQUARE_RUN=$n NATTN_LIBRARY=variants/run.so timeout 100 \
      python3 benchmarks/library_ab.py run$n "$probs" graphs
  done 2>&1 | grep -v "^ \|^Traceback" | tee -a "$OUT/squarerun_bench.txt"
fi
# dqrun: the persistent square dQ pass (backward_dq_squares_persistent.cuh) as the tuning build
# variants/dqrun.so against the loaded library: its square backward tests (also with runs of
# 2 boxes), the squares section under memcheck and racecheck, then forward + backward times
# side by side (two rounds, one with an RPB) and run lengths 2 / 4 / 8.
if [[ $what == *dqrun* && -f variants/dqrun.so ]]; then
  NATTN_SM90_SQUARE_BWD_CASES=${SQ_BWD_CASES:-60} NATTN_FAMILY=sm90 NATTN_LIBRARY=variants/dqrun.so timeout 200 \
    python3 -m pytest -q -n 0 -m gpu -p no:cacheprovider --maxfail=25 tests/gpu/test_sm90_backward.py -k square \
    2>&1 | tee -a "$OUT/dqrun.log" | tail -3
  NATTN_SM90_SQUARE_RUN=2 NATTN_SM90_SQUARE_BWD_CASES=20 NATTN_FAMILY=sm90 NATTN_LIBRARY=variants/dqrun.so timeout 100 \
    python3 -m pytest -q -n 0 -m gpu -p no:cacheprovider tests/gpu/test_sm90_backward.py -k square \
    2>&1 | tee -a "$OUT/dqrun.log" | tail -2
  NATTN_LIBRARY=variants/dqrun.so timeout 100 python3 -m pytest -q -n 0 -m gpu -p no:cacheprovider \
    tests/gpu/test_query_range_gpu.py -k square 2>&1 | tee -a "$OUT/dqrun.log" | tail -2
  for tool in memcheck racecheck; do
    NATTN_LIBRARY=variants/dqrun.so NATTN_FAMILY=sm90 NATTN_SANITIZE_SECTIONS=squares timeout 150 compute-sanitizer \
      --tool $tool --error-exitcode 9 python3 tests/gpu/sanitize_sm90.py > "$OUT/dqrun_$tool.log" 2>&1
    echo "compute-sanitizer $tool (squares, dqrun) rc=$?"; tail -2 "$OUT/dqrun_$tool.log"
  done
  probs=${SQ_PROBLEMS:-mid-2d-k13,128x128-k11x11-b4-h8-d64,56x56-k9x9-b32-h4-d64,64x64-k13x13-b8-h8-d64}
  for args in "bwd graphs" "bwd graphs" "bwd graphs rpb"; do
    timeout 100 python3 benchmarks/library_ab.py tip "$probs" $args
    NATTN_LIBRARY=variants/dqrun.so timeout 100 python3 benchmarks/library_ab.py dqrun "$probs" $args
  done 2>&1 | grep -v "^ \|^Traceback" | tee -a "$OUT/dqrun_bench.txt"
  for n in 2 4 8; do
    NATTN_SM90_SQUARE_RUN=$n NATTN_LIBRARY=variants/dqrun.so timeout 100 python3 benchmarks/library_ab.py dq$n "$probs" bwd graphs
  done 2>&1 | grep -v "^ \|^Traceback" | tee -a "$OUT/dqrun_bench.txt"
fi
# dkvrun: the persistent square dK/dV pass (backward_dkv_squares_persistent.cuh) as the tuning
# build variants/dkvrun.so against the loaded library, its own dK/dV pass named (the
# persistent form runs where the call has no query range): the square backward tests (also
# with runs of 2 boxes), memcheck and racecheck on the squares section, then forward +
# backward times side by side (two rounds, one with an RPB) and run lengths 2 / 4 / 8.
if [[ $what == *dkvrun* && -f variants/dkvrun.so ]]; then
  NATTN_SM90_SQUARE_DKV=own NATTN_SM90_SQUARE_BWD_CASES=${SQ_BWD_CASES:-60} NATTN_FAMILY=sm90 \
    NATTN_LIBRARY=variants/dkvrun.so timeout 200 python3 -m pytest -q -n 0 -m gpu -p no:cacheprovider --maxfail=25 \
    tests/gpu/test_sm90_backward.py -k square 2>&1 | tee -a "$OUT/dkvrun.log" | tail -3
  NATTN_SM90_SQUARE_DKV=own NATTN_SM90_SQUARE_RUN=2 NATTN_SM90_SQUARE_BWD_CASES=20 NATTN_FAMILY=sm90 \
    NATTN_LIBRARY=variants/dkvrun.so timeout 100 python3 -m pytest -q -n 0 -m gpu -p no:cacheprovider \
    tests/gpu/test_sm90_backward.py -k square 2>&1 | tee -a "$OUT/dkvrun.log" | tail -2
  for tool in memcheck racecheck; do
    NATTN_SM90_SQUARE_DKV=own NATTN_LIBRARY=variants/dkvrun.so NATTN_FAMILY=sm90 NATTN_SANITIZE_SECTIONS=squares \
      timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 python3 tests/gpu/sanitize_sm90.py \
      > "$OUT/dkvrun_$tool.log" 2>&1
    echo "compute-sanitizer $tool (squares, dkvrun) rc=$?"; tail -2 "$OUT/dkvrun_$tool.log"
  done
  probs=${SQ_PROBLEMS:-mid-2d-k13,128x128-k11x11-b4-h8-d64,56x56-k9x9-b32-h4-d64,64x64-k13x13-b8-h8-d32}
  for args in "bwd graphs" "bwd graphs" "bwd graphs rpb"; do
    NATTN_SM90_SQUARE_DKV=own timeout 100 python3 benchmarks/library_ab.py tip "$probs" $args
    NATTN_SM90_SQUARE_DKV=own NATTN_LIBRARY=variants/dkvrun.so timeout 100 python3 benchmarks/library_ab.py dkvrun "$probs" $args
  done 2>&1 | grep -v "^ \|^Traceback" | tee -a "$OUT/dkvrun_bench.txt"
  for n in 2 4 8; do
    NATTN_SM90_SQUARE_DKV=own NATTN_SM90_SQUARE_RUN=$n NATTN_LIBRARY=variants/dkvrun.so timeout 100 \
      python3 benchmarks/library_ab.py dkv$n "$probs" bwd graphs
  done 2>&1 | grep -v "^ \|^Traceback" | tee -a "$OUT/dkvrun_bench.txt"
fi
# pdl: programmatic dependent launch of the square and strip dK/dV passes after their dQ
# passes (tuning build variants/pdl.so, -DNATTN_SM90_PDL=1; 2-D and 3-D) against the loaded
# library: the square and strip backward tests (the dK/dV pass reads delta and the largest
# |dS| only after its griddep_wait), query ranges, memcheck on both sections, then forward +
# backward times side by side (two rounds, one with an RPB).
if [[ $what == *pdl* && -f variants/pdl.so ]]; then
  NATTN_SM90_SQUARE_BWD_CASES=${SQ_BWD_CASES:-60} NATTN_SM90_STRIP_BWD_CASES=${STRIP_BWD_CASES:-60} NATTN_FAMILY=sm90 \
    NATTN_LIBRARY=variants/pdl.so timeout 240 python3 -m pytest -q -n 0 -m gpu -p no:cacheprovider --maxfail=25 \
    tests/gpu/test_sm90_backward.py -k "square or strip" 2>&1 | tee -a "$OUT/pdl.log" | tail -3
  NATTN_QRANGE_CASES=60 NATTN_LIBRARY=variants/pdl.so timeout 120 python3 -m pytest -q -n 0 -m gpu -p no:cacheprovider \
    tests/gpu/test_query_range_gpu.py 2>&1 | tee -a "$OUT/pdl.log" | tail -2
  NATTN_LIBRARY=variants/pdl.so NATTN_FAMILY=sm90 NATTN_SANITIZE_SECTIONS=squares,strips timeout 150 compute-sanitizer \
    --tool memcheck --error-exitcode 9 python3 tests/gpu/sanitize_sm90.py > "$OUT/pdl_memcheck.log" 2>&1
  echo "compute-sanitizer memcheck (squares, strips; pdl) rc=$?"; tail -2 "$OUT/pdl_memcheck.log"
  probs=${PDL_PROBLEMS:-dinat-s1-2d,mid-2d-k13,video-3d,56x56-k9x9-b32-h4-d64,28x28-k7x7-b128-h4-d32}
  for args in "bwd graphs" "bwd graphs" "bwd graphs rpb"; do
    timeout 100 python3 benchmarks/library_ab.py tip "$probs" $args
    NATTN_LIBRARY=variants/pdl.so timeout 100 python3 benchmarks/library_ab.py pdl "$probs" $args
  done 2>&1 | grep -v "^ \|^Traceback" | tee -a "$OUT/pdl_bench.txt"
fi
# The square dK/dV pass's two key boxes (NATTN_SM90_SQUARE_DKV_BOX=8x8|4x16, sm90/kernels.cuh
# square_dkv_wide), ~5 minutes: the square backward tests (the 4 x 16 box's sweep, both boxes
# against float64 and for determinism; SQ_BWD_CASES a sweep), memcheck and racecheck on the
# squares section (which names the 4 x 16 box on every second backward pair), then both boxes
# timed alternately with the own pass named (GPU ms, forward + backward, two rounds without an
# RPB, one with).
if [[ $what == *squarebox* ]]; then
  NATTN_SM90_SQUARE_BWD_CASES=${SQ_BWD_CASES:-100} NATTN_FAMILY=sm90 timeout 240 python3 -m pytest -q -n 0 -m gpu \
    -p no:cacheprovider --maxfail=25 tests/gpu/test_sm90_backward.py -k square 2>&1 | tee -a "$OUT/squarebox.log" | tail -4
  for tool in memcheck racecheck; do
    NATTN_FAMILY=sm90 NATTN_SANITIZE_SECTIONS=squares timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 \
      python3 tests/gpu/sanitize_sm90.py > "$OUT/squarebox_$tool.log" 2>&1
    echo "compute-sanitizer $tool (squares) rc=$?"; tail -2 "$OUT/squarebox_$tool.log"
  done
  probs=${SQ_PROBLEMS:-mid-2d-k13,128x128-k11x11-b4-h8-d64,56x56-k9x9-b32-h4-d64,64x64-k13x13-b8-h8-d64,32x32-k13x13-b32-h8-d64,64x64-k13x13-b8-h8-d32,56x56-k11x11-b32-h4-d32,96x96-k13x13-b4-h8-d32}
  for args in "bwd graphs" "bwd graphs" "bwd graphs rpb"; do
    for box in 8x8 4x16; do
      NATTN_SM90_SQUARE_DKV=own NATTN_SM90_SQUARE_DKV_BOX=$box timeout 150 python3 benchmarks/library_ab.py "box$box" "$probs" $args
    done 2>&1 | grep -v "^ \|^Traceback" | tee -a "$OUT/squarebox_bench.txt"
  done
fi
