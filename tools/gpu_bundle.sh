#!/usr/bin/env bash
# Packs what a GPU machine needs to run the CUDA tests and benchmarks without building there:
# the CUDA test binaries and duet_bench of a Release build, the shared libraries they load that a
# machine with only the CUDA toolkit lacks (fmt, oneDNN, OpenBLAS and what those load), and a
# CTestTestfile for `ctest -L cuda`. The CUDA libraries (cudart, cuBLAS, NVRTC) and the C and C++
# runtimes are the target machine's own, and so is NCCL (over 200 MB). Writes DEST (default .gpu/bundle.tar.xz); unpack and run
# it with `tests/gpu_run.sh --bundle DEST`. The target must be x86-64 with a glibc at least as new
# as the building machine's.
# Usage: tools/gpu_bundle.sh [BUILD_DIR] [DEST]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
dest="${2:-$root/.gpu/bundle.tar.xz}"
tests=(test_cuda_runtime test_cuda_ops test_cuda_random test_cuda_compile test_cuda_nn)
# The samples that ctest also runs on the GPU (sample_<name>_cuda).
samples=(char_gru transformer)
cmake --build "$build" --target "${tests[@]}" "${samples[@]}" duet_bench duet-run deploy
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tests" "$stage/bench" "$stage/lib" "$stage/samples"
for t in "${tests[@]}"; do cp "$build/tests/$t" "$stage/tests/"; done
for t in "${samples[@]}"; do cp "$build/samples/$t" "$stage/samples/"; done
cp "$build/bench/duet_bench" "$stage/bench/"
# duet-run and a program saved by samples/deploy, with its input (gpu_run.sh runs it on the GPU).
mkdir -p "$stage/tools" "$stage/samples"
cp "$build/tools/duet-run" "$stage/tools/"
(cd "$build/samples" && ./deploy > /dev/null) && cp "$build/samples/mlp.duet" "$build/samples/x.npy" "$stage/samples/"
# Symbols stay (a backtrace on the GPU machine names functions); debug sections go.
strip --strip-debug "$stage"/tests/* "$stage"/bench/* "$stage"/tools/* \
  "${samples[@]/#/$stage/samples/}"
# Libraries outside the C/C++ runtimes and the CUDA toolkit.
for bin in "$stage"/tests/* "$stage"/bench/* "$stage"/tools/* "${samples[@]/#/$stage/samples/}"; do
  ldd "$bin" | awk '$3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libstdc++.so*|libgcc_s.so*) ;;
    libcuda*|libcublas*|libnvrtc*|libnccl*) ;;
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
# ctest's files: the CUDA tests and samples only, with the build folder's path left to fill in on
# unpacking.
echo 'subdirs("tests" "samples")' > "$stage/CTestTestfile.cmake"
grep -A1 -E "^add_test\(\[=\[($(IFS='|'; echo "${tests[*]}"))\]=\]" "$build/tests/CTestTestfile.cmake" \
  | grep -v '^--$' | sed "s#$build#@BUILD@#g" > "$stage/tests/CTestTestfile.cmake"
grep -A1 -E "^add_test\(\[=\[sample_($(IFS='|'; echo "${samples[*]}"))_cuda\]=\]" \
  "$build/samples/CTestTestfile.cmake" | grep -v '^--$' | sed "s#$build#@BUILD@#g" \
  > "$stage/samples/CTestTestfile.cmake"
mkdir -p "$(dirname "$dest")"
tar -C "$stage" -cf - . | xz -T0 -6 > "$dest"
echo "gpu_bundle: $dest, $(du -h "$dest" | cut -f1)"
