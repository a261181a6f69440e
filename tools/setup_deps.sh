#!/usr/bin/env bash
# Installs the Debian packages duet builds with, when any is missing (apt; needs root or sudo).
# The CUDA toolkit is not installed here: the CUDA backend builds when nvcc is already present.
set -euo pipefail
# ocl-icd-opencl-dev: libdnnl-dev only recommends it, but dnnl's CMake config requires OpenCL.
# clang-format: the test command checks the tree's formatting.
# clang-16, libclang-rt-16-dev and libomp-16-dev: the sanitizer builds and the loader's fuzz
# target (libFuzzer; clang 14 has no std::source_location), with clang's OpenMP runtime.
# libopenmpi-dev and openmpi-bin: the MPI transport of CPU collectives and mpirun for its tests.
# libonnx-dev and libprotobuf-dev: ONNX export and import; libonnx-testdata: ONNX 1.12's node
# tests (conformance); python3-venv: the ONNX Runtime environment below.
pkgs=(g++ cmake ninja-build ccache git libeigen3-dev libfmt-dev doctest-dev
      libdnnl-dev ocl-icd-opencl-dev libopenblas-openmp-dev zlib1g-dev clang-format
      clang-16 libclang-rt-16-dev libomp-16-dev libopenmpi-dev openmpi-bin dataset-fashion-mnist
      libonnx-dev libprotobuf-dev libonnx-testdata python3-venv)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -ne 0 ]; then
  echo "setup_deps: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ONNX Runtime from PyPI, pinned, in a virtual environment beside the sources (.venv-onnx): the
# tests run exported models in it. DUET_SKIP_ORT=1 skips it (the tests then report skipped).
venv="$(cd "$(dirname "$0")/.." && pwd)/.venv-onnx"
if [ "${DUET_SKIP_ORT:-0}" != 1 ] && ! "$venv/bin/python" -c "import onnxruntime" 2>/dev/null; then
  echo "setup_deps: creating $venv (onnxruntime, numpy)"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check onnxruntime==1.20.1 numpy==2.2.6
fi
