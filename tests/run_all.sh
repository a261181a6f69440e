#!/usr/bin/env bash
# Builds duet and runs every test: the formatting check (tests/check_format.sh), the Release
# build (with the CUDA backend when nvcc is present; CUDA tests skip without a GPU), the
# CPU-only suite under ASan + UBSan, then the thread tests under ThreadSanitizer (only those:
# a TSan build of the whole suite would not fit the time budget).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup_deps.sh
jobs=$(nproc)
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"

echo "== Formatting"
bash tests/check_format.sh

echo "== Release build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDUET_BUILD_TESTS=ON >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

echo "== ASan + UBSan build (CPU only)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DDUET_SANITIZE=ON \
  -DDUET_BUILD_TESTS=ON -DDUET_BUILD_BENCH=OFF -DDUET_BUILD_SAMPLES=OFF >/dev/null
cmake --build build-asan -j "$jobs"
ctest --test-dir build-asan --output-on-failure -j "$jobs"

echo "== ThreadSanitizer build (CPU only, the thread tests)"
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DDUET_TSAN=ON -DDUET_CUDA=OFF \
  -DDUET_BUILD_TESTS=ON -DDUET_BUILD_BENCH=OFF -DDUET_BUILD_SAMPLES=OFF >/dev/null
cmake --build build-tsan -j "$jobs" --target test_threads
ctest --test-dir build-tsan --output-on-failure -R '^test_threads$'
