#!/usr/bin/env bash
# Installs a duet build into a fresh prefix, then configures, builds and runs the project beside
# this script against it: a project that does nothing but find_package(duet REQUIRED) and link
# duet::duet, as docs/quickstart.md tells users (main.cpp runs an eager op, a compiled function
# and a backward, CPU only, and checks them). The exit status is the verdict: ctest runs this as
# test_install_consumer, and tests/fresh_machine.sh in its fresh Debian root.
#
#   bash tests/install_consumer/run.sh BUILD_DIR [WORK_DIR]
#
# WORK_DIR is emptied first, then holds prefix/ (the install), build/ (the consumer's build) and
# the logs; without it a temporary folder is used and removed afterwards. The consumer builds
# with the compiler, generator and build type of BUILD_DIR, through ccache when there is one.
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: bash tests/install_consumer/run.sh BUILD_DIR [WORK_DIR]" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
build="$(cd "$1" && pwd)"
if [ ! -f "$build/CMakeCache.txt" ] || [ ! -f "$build/cmake_install.cmake" ]; then
  echo "install_consumer: $build is not a configured duet build" >&2
  exit 2
fi
if [ $# -eq 2 ]; then
  work="$2"
  rm -rf "$work"
  mkdir -p "$work"
  work="$(cd "$work" && pwd)"
else
  work="$(mktemp -d "${TMPDIR:-/tmp}/duet-install-consumer.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
fi
prefix="$work/prefix"

say() { printf 'install_consumer: %s\n' "$*"; }
# Runs a step with its output in WORK_DIR/NAME.log, shown when it fails.
step() {
  local name="$1"
  shift
  if ! "$@" >"$work/$name.log" 2>&1; then
    tail -40 "$work/$name.log" >&2
    say "$name FAILED: $*"
    exit 1
  fi
}
cache_get() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" | head -1; }

say "installing $build into $prefix"
step install cmake --install "$build" --prefix "$prefix"

# Every header the install has must find the headers it includes in the install: a quoted
# include resolves against include/duet (duet::duet's include directory) or the header's own
# folder. A header left out of install(DIRECTORY), or one generated into the build folder, is
# a missing file here.
missing=0
while IFS= read -r -d '' h; do
  dir="$(dirname "$h")"
  while IFS= read -r inc; do
    if [ ! -f "$prefix/include/duet/$inc" ] && [ ! -f "$dir/$inc" ]; then
      echo "install_consumer: ${h#"$prefix"/} includes \"$inc\", which is not installed" >&2
      missing=1
    fi
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$h")
done < <(find "$prefix/include/duet" -type f \( -name '*.h' -o -name '*.def' \) -print0)
if [ "$missing" -ne 0 ]; then
  say "installed headers incomplete"
  exit 1
fi

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
say "configuring the consumer against $prefix"
step configure cmake -S "$here" -B "$work/build" -G "$(cache_get CMAKE_GENERATOR)" \
  -DCMAKE_BUILD_TYPE="$(cache_get CMAKE_BUILD_TYPE)" \
  -DCMAKE_CXX_COMPILER="$(cache_get CMAKE_CXX_COMPILER)" "${launcher[@]}" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON
# The duet it found must be the one just installed.
found="$(sed -n 's/^duet_DIR:PATH=//p' "$work/build/CMakeCache.txt")"
case "$found" in
  "$prefix"/*) ;;
  *)
    say "find_package(duet) found '$found', not the install in $prefix"
    exit 1
    ;;
esac

say "building the consumer"
step build cmake --build "$work/build"

# CPU only, also on a machine with a GPU; the interpreter runs fused groups (generated kernels
# are test_codegen's), with a kernel cache of its own.
say "running it"
if ! env CUDA_VISIBLE_DEVICES=-1 DUET_CODEGEN=0 DUET_CACHE_DIR="$work/kernel-cache" \
  "$work/build/app"; then
  say "the consumer FAILED"
  exit 1
fi
say "passed"
