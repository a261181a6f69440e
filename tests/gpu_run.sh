#!/usr/bin/env bash
# Everything a GPU machine should run, in one command (device time is short): configure (with
# the bundled packages of tools/bundle_deps.sh when .deps/prefix exists, for machines without a
# package mirror), build, run the CUDA tests (ctest -L cuda) and the CUDA benchmarks (W7:
# W2cuda, W3cuda, W4cuda, W6cuda, and the CPU W2/W3/W4/W6 beside them for the CPU comparison).
# Logs go to $OUT (or build-gpu/) as ctest.log, bench.json and bench.log.
# Usage: tests/gpu_run.sh [--no-bench] [--reps N]
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bench=1
reps=7
while [ $# -gt 0 ]; do
  case "$1" in
    --no-bench) bench=0 ;;
    --reps) reps="$2"; shift ;;
    *) echo "gpu_run: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
out="${OUT:-$root/build-gpu}"
mkdir -p "$out"
args=(-S . -B build-gpu -DCMAKE_BUILD_TYPE=Release)
if [ -d .deps/prefix ]; then
  args+=(-DDUET_DEPS_PREFIX="$root/.deps/prefix")
  export PATH="$root/.deps/prefix/usr/bin:$PATH"
fi
command -v ninja >/dev/null && args+=(-G Ninja)
{ command -v nvidia-smi >/dev/null && nvidia-smi -L; } 2>&1 | tee "$out/gpu.txt"
cmake "${args[@]}" > "$out/configure.log" 2>&1 || { tail -40 "$out/configure.log"; exit 1; }
cmake --build build-gpu -j "$(nproc)" > "$out/build.log" 2>&1 || { grep -m 20 -A5 error "$out/build.log"; exit 1; }
# Kernels NVRTC builds go to this build's cache, kept between runs on the same machine.
export DUET_CACHE_DIR="$root/build-gpu/kernel-cache"
(cd build-gpu && ctest -L cuda --output-on-failure -j 4) > "$out/ctest.log" 2>&1
rc=$?
tail -30 "$out/ctest.log"
if [ "$bench" = 1 ]; then
  ./build-gpu/bench/duet_bench --device all --only W2,W3,W4,W6,W7 --reps "$reps" --json \
    > "$out/bench.json" 2> "$out/bench.log"
  cat "$out/bench.log"
fi
exit $rc
