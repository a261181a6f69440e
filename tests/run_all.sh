#!/usr/bin/env bash
# Builds duet and runs every test: the formatting check (tests/check_format.sh), the size budgets
# (tools/check_budgets.sh), the Release build (with the CUDA backend when nvcc is present; CUDA
# tests skip without a GPU), the CPU-only suite under ASan + UBSan, then the thread tests under
# ThreadSanitizer (only those: a TSan build of the whole suite would not fit the time budget), its
# library built file by file without CUDA (what a machine without nvcc builds), then
# 60 s of libFuzzer on the program loader (tests/fuzz) beside 60 s of mutated ONNX models through
# import_onnx (tests/fuzz/fuzz_onnx_import.cpp, built with the Release build). The sanitizer and
# fuzz builds use clang ($DUET_SANITIZER_CXX, clang++-16): it compiles them about twice as fast
# as GCC.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup_deps.sh
jobs=$(nproc)
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
san_cxx="${DUET_SANITIZER_CXX:-clang++-16}"
# Each stage's heading says when it started, in seconds since the script did.
stage() { echo "== $1 (at $((SECONDS / 60)) min $((SECONDS % 60)) s)"; }

stage "Formatting"
bash tests/check_format.sh

stage "Budgets (files within 900 lines, functions within 150)"
bash tools/check_budgets.sh

# Each sanitizer build starts in the background, at the lowest priority, while the tests before
# it run: it takes only the CPU they leave idle (a test waiting on a timeout, on a child process or
# on one slow case), and the foreground build that follows finishes it (and reports its errors).
# It runs in a process group of its own (set -m), so that a failing stage stops all of it, but in
# this session: a session of its own (setsid) would get a scheduling group of its own under the
# kernel's autogroup, where nice 19 no longer yields to the tests (the Release ctest took 310 s
# instead of 181 s so).
early_pid=""
early_build() {  # early_build <log> <shell command>
  set -m
  nice -n 19 bash -c "$2" >"$1" 2>&1 &
  early_pid=$!
  set +m
}
finish_early_build() {
  if [ -n "$early_pid" ]; then
    wait "$early_pid" || true  # a failure shows in the foreground build that follows
    early_pid=""
  fi
}
trap 'if [ -n "$early_pid" ]; then kill -- "-$early_pid" 2>/dev/null || true; fi' EXIT

stage "Release build"
# Unity batches here too: on a fresh clone every build is cold. Configure a folder of your own
# without DUET_UNITY_BUILD for quick one-file rebuilds.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDUET_BUILD_TESTS=ON -DDUET_UNITY_BUILD=ON >/dev/null
cmake --build build -j "$jobs"
cmake -S . -B build-asan -G Ninja -DCMAKE_CXX_COMPILER="$san_cxx" -DCMAKE_BUILD_TYPE=Debug -DDUET_SANITIZE=ON -DDUET_UNITY_BUILD=ON \
  -DDUET_BUILD_TESTS=ON -DDUET_BUILD_BENCH=OFF -DDUET_BUILD_SAMPLES=OFF >/dev/null
early_build build-asan/early-build.log "cmake --build build-asan -j $jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

stage "ASan + UBSan build (CPU only)"
finish_early_build
cmake --build build-asan -j "$jobs"
# The TSan build compiles the library one file at a time, without CUDA: the unity batches above
# let a file use what another file of its batch included, and a machine without nvcc (the README's
# first command on a fresh Debian) builds file by file. clang and GCC read the same libstdc++
# headers, so a missing include fails here as it would there. In ninja's logs (ccache cold, the
# jobs niced beside the tests) its compile jobs summed to 1,022 s, against 1,514 s for the TSan unity
# build and the separate GCC -O0 file-by-file build that this replaces.
cmake -S . -B build-tsan -G Ninja -DCMAKE_CXX_COMPILER="$san_cxx" -DCMAKE_BUILD_TYPE=Debug -DDUET_TSAN=ON -DDUET_CUDA=OFF -DDUET_UNITY_BUILD=OFF \
  -DDUET_BUILD_TESTS=ON -DDUET_BUILD_BENCH=OFF -DDUET_BUILD_SAMPLES=OFF >/dev/null
cmake -S tests/fuzz -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER="$san_cxx" \
  -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
early_build build-tsan/early-build.log \
  "cmake --build build-tsan -j $jobs --target test_threads && cmake --build build-fuzz -j $jobs"
ctest --test-dir build-asan --output-on-failure -j "$jobs"

stage "ThreadSanitizer build (CPU only, the thread tests; the library file by file)"
finish_early_build
cmake --build build-tsan -j "$jobs" --target test_threads
ctest --test-dir build-tsan --output-on-failure -R '^test_threads$'

stage "Fuzzing, 60 s each, side by side (one core each): the program loader and ONNX import"
cmake --build build-fuzz -j "$jobs"
# ONNX import (tests/fuzz/fuzz_onnx_import.cpp, from the Release build), in the background.
onnx_pid=""
if [ -x build/tests/fuzz_onnx_import ]; then
  ./build/tests/fuzz_onnx_import --seconds 60 --artifacts build/fuzz-onnx-artifacts \
    tests/data/onnx-node /usr/share/libonnx-testdata/data/node tests/data/onnx_malformed \
    >build/fuzz-onnx.log 2>&1 &
  onnx_pid=$!
else
  echo "ONNX import: skipped, this build has no ONNX import (libonnx-dev not found)"
fi
# The loader (tests/fuzz). New inputs go to the first corpus directory (the build's); the seeds
# in the tree stay as they are.
mkdir -p build-fuzz/corpus
load_status=0
./build-fuzz/fuzz_load build-fuzz/corpus tests/fuzz/corpus -max_total_time=60 \
  -rss_limit_mb=4096 -artifact_prefix=build-fuzz/ -print_final_stats=1 >build-fuzz/fuzz.log 2>&1 ||
  load_status=$?
echo "-- the program loader (exit status $load_status)"
tail -n 12 build-fuzz/fuzz.log
onnx_status=0
if [ -n "$onnx_pid" ]; then
  wait "$onnx_pid" || onnx_status=$?
  echo "-- ONNX import (exit status $onnx_status)"
  tail -n 12 build/fuzz-onnx.log
fi
if [ "$load_status" -ne 0 ] || [ "$onnx_status" -ne 0 ]; then
  echo "run_all: a fuzz target failed (the loader: $load_status, ONNX import: $onnx_status)" >&2
  exit 1
fi
stage "Done"
