#!/usr/bin/env bash
# Everything a GPU machine should run, in one command (device time is short): build (or unpack
# a bundle built elsewhere), run the CUDA tests (ctest -L cuda) and the CUDA benchmarks (W7:
# W2cuda, W3cuda, W4cuda, W6cuda), and the PyTorch and JAX peers of W4 and W6 on the same GPU
# (bench/peers/peers.py) when the machine's python3 has torch, then compute-sanitizer (memcheck
# and racecheck) over the CUDA tests. Logs go to $OUT (or build-gpu/): gpu.txt,
# ctest.log, sanitizer.log, bench.json, bench.log, peers.json, peers.log.
#
# Without --bundle it configures and builds build-gpu (with the bundled packages of
# tools/bundle_deps.sh when .deps/prefix exists, for machines without a package mirror). With
# --bundle FILE it unpacks FILE, made by tools/gpu_bundle.sh on another x86-64 machine, into
# build-gpu and builds nothing.
#
# Where nvidia-smi lists a GPU, DUET_REQUIRE_GPU=1 makes a test fail, not skip, when duet cannot
# use it (a driver older than the CUDA runtime, say): a GPU run must not pass by testing nothing.
# Each stage runs under a time limit (seconds; GPU_RUN_TESTS_S, GPU_RUN_SANITIZE_S per sanitizer
# run, GPU_RUN_BENCH_S, GPU_RUN_PEERS_S), cut to what is left of GPU_RUN_TOTAL_S (all stages
# together, from the script's start; default no limit) so that a short lease runs every stage
# it can and still returns its logs; a stage with under 20 s left is skipped, and says so,
# so that a hang leaves the later stages their time and the logs come back.
# Usage: tests/gpu_run.sh [--bundle FILE] [--no-bench] [--no-peers] [--no-sanitize] [--reps N]
#                         [--only W2cuda,...] [--test-timeout S]
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bench=1
peers=1
sanitize=1
reps=7
bundle=""
only="W2cuda,W3cuda,W4cuda,W6cuda"
test_timeout=300
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle="$2"; shift ;;
    --no-bench) bench=0 ;;
    --no-peers) peers=0 ;;
    --no-sanitize) sanitize=0 ;;
    --reps) reps="$2"; shift ;;
    --only) only="$2"; shift ;;
    --test-timeout) test_timeout="$2"; shift ;;
    *) echo "gpu_run: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
out="${OUT:-$root/build-gpu}"
started=$SECONDS
# The limit of a stage: its own ($1), or what is left of GPU_RUN_TOTAL_S when that is less;
# 0 when under 20 s are left.
limit() {
  local own="$1" left
  [ -z "${GPU_RUN_TOTAL_S:-}" ] && { echo "$own"; return; }
  left=$((GPU_RUN_TOTAL_S - (SECONDS - started)))
  [ "$left" -lt 20 ] && { echo 0; return; }
  [ "$left" -lt "$own" ] && own="$left"
  echo "$own"
}
# Runs "$@" under `timeout $1`, or says the stage ($2) was skipped when its limit is 0.
staged() {
  local t="$1" name="$2"
  shift 2
  if [ "$t" = 0 ]; then
    echo "gpu_run: $name skipped: GPU_RUN_TOTAL_S is spent" >&2
    return 124
  fi
  timeout "$t" "$@"
}
mkdir -p "$out"
{
  date -u
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  fi
} 2>&1 | tee "$out/gpu.txt"
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  export DUET_REQUIRE_GPU=1
fi
if [ -n "$bundle" ]; then
  rm -rf build-gpu && mkdir -p build-gpu
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    "$bundle" build-gpu || exit 1
  sed -i "s#@BUILD@#$root/build-gpu#g" build-gpu/tests/CTestTestfile.cmake \
    build-gpu/samples/CTestTestfile.cmake
  # The CUDA libraries are this machine's: its toolkit's, or the pip wheels' of its PyTorch.
  libs="$root/build-gpu/lib"
  for need in libcublasLt.so.13 libnvrtc.so.13 libcudart.so.13 libnccl.so.2; do
    if ! ldconfig -p | grep -q "$need"; then
      hit="$(find /usr/local/cuda*/lib* /usr/local/cuda*/targets /opt /usr/lib -name "$need" \
             2>/dev/null | head -1)"
      [ -n "$hit" ] && libs="$libs:$(dirname "$hit")"
    fi
  done
  export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" | tee -a "$out/gpu.txt"
  ldd build-gpu/tests/test_cuda_ops | grep -E "not found|cublas|nvrtc|cudart|nccl" | tee -a "$out/gpu.txt"
else
  args=(-S . -B build-gpu -DCMAKE_BUILD_TYPE=Release)
  if [ -d .deps/prefix ]; then
    args+=(-DDUET_DEPS_PREFIX="$root/.deps/prefix")
    export PATH="$root/.deps/prefix/usr/bin:$PATH"
  fi
  command -v ninja >/dev/null && args+=(-G Ninja)
  cmake "${args[@]}" > "$out/configure.log" 2>&1 || { tail -40 "$out/configure.log"; exit 1; }
  cmake --build build-gpu -j "$(nproc)" > "$out/build.log" 2>&1 ||
    { grep -m 20 -A5 error "$out/build.log"; exit 1; }
fi
# Kernels NVRTC builds go to this build's cache, kept between runs on the same machine.
export DUET_CACHE_DIR="$root/build-gpu/kernel-cache"
(cd build-gpu && staged "$(limit "${GPU_RUN_TESTS_S:-420}")" tests \
   ctest -L cuda --output-on-failure -j 4 --timeout "$test_timeout") > "$out/ctest.log" 2>&1
rc=$?
tail -30 "$out/ctest.log"
# A saved program (samples/deploy) on the GPU with duet-run, against its CPU result.
if [ -x build-gpu/tools/duet-run ] && [ -f build-gpu/samples/mlp.duet ]; then
  (cd build-gpu/samples &&
   ../tools/duet-run mlp.duet --input x.npy --output out_cpu.npy &&
   ../tools/duet-run mlp.duet --input x.npy --output out_cuda.npy --device cuda --bench 200 &&
   python3 -c 'import numpy as n; a=n.load("out_cpu.npy"); b=n.load("out_cuda.npy"); print("duet-run cuda vs cpu: shape", b.shape, b.dtype, "max abs diff", float(abs(a-b).max()))') \
    2>&1 | tee "$out/duet_run.log"
fi
if [ "$bench" = 1 ]; then
  # A cache of its own, empty: the first-call figures are cold starts.
  DUET_CACHE_DIR="$(mktemp -d)" staged "$(limit "${GPU_RUN_BENCH_S:-300}")" bench \
    ./build-gpu/bench/duet_bench --device cuda --only "$only" --reps "$reps" --json \
    > "$out/bench.json" 2> "$out/bench.log"
  cat "$out/bench.log"
fi
if [ "$peers" = 1 ] && python3 -c 'import torch' 2>/dev/null; then
  # W4 and W6 in PyTorch (eager, torch.compile reduce-overhead) and JAX (jit) where python3 has
  # it, beside duet's rows of bench.json (or a duet_bench run of its own without them).
  peer_list=torch
  if python3 -c 'import jax' 2>/dev/null; then peer_list=torch,jax; fi
  duet_rows=(--duet build-gpu/bench/duet_bench)
  if [ -s "$out/bench.json" ]; then duet_rows=(--duet-json "$out/bench.json"); fi
  PYTHONUNBUFFERED=1 staged "$(limit "${GPU_RUN_PEERS_S:-300}")" peers python3 bench/peers/peers.py --device cuda \
    --only W4,W6 --peers "$peer_list" --reps "$reps" "${duet_rows[@]}" --json "$out/peers.json" \
    > "$out/peers.log" 2>&1
  cat "$out/peers.log"
fi
# Last (its runs are the slowest, and a time limit there costs nothing else), compute-sanitizer
# over the CUDA tests: memcheck over the op sweep (every kernel) and the compiled face's fused
# and reduction kernels, racecheck over the fused and reduction kernels (shared memory). A
# report, or no compute-sanitizer, fails the run. Each run under its own limit.
if [ "$sanitize" = 1 ]; then
  cs="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
  if [ -z "$cs" ]; then
    echo "gpu_run: compute-sanitizer not found; the sanitizer stage did not run" | tee "$out/sanitizer.log"
    rc=1
  else
    : > "$out/sanitizer.log"
    fused='-tc=*fused chains*,*fused reductions*,*random programs*'
    for run in "memcheck|test_cuda_ops|" "memcheck|test_cuda_compile|$fused" \
               "racecheck|test_cuda_compile|$fused" "racecheck|test_cuda_ops|-tc=*reduc*"; do
      IFS='|' read -r tool bin filter <<< "$run"
      echo "== compute-sanitizer --tool $tool $bin $filter" >> "$out/sanitizer.log"
      (cd build-gpu/tests && staged "$(limit "${GPU_RUN_SANITIZE_S:-150}")" sanitizer "$cs" --tool "$tool" \
         --error-exitcode 99 --print-limit 20 ./"$bin" ${filter:+"$filter"}) >> "$out/sanitizer.log" 2>&1
      s=$?
      echo "== exit status $s" >> "$out/sanitizer.log"
      # 77: the binary skipped (no usable GPU); anything else but 0 is a report, a failure or
      # the time limit.
      [ "$s" = 0 ] || [ "$s" = 77 ] || rc=1
    done
    grep -E "^== |ERROR SUMMARY|RACECHECK SUMMARY" "$out/sanitizer.log"
  fi
fi
exit $rc
