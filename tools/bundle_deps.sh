#!/usr/bin/env bash
# Bundles the Debian packages duet builds with, for a machine that cannot reach a package
# mirror (a GPU machine): downloads the .debs with `apt-get download` (no root needed) into
# .deps/debs and extracts them with `dpkg -x` into .deps/prefix. Then configure with
#   cmake -S . -B build -DDUET_DEPS_PREFIX=$PWD/.deps/prefix
# which finds Eigen3, fmt, dnnl, doctest and ZLIB there and puts .deps/prefix's library folder
# on the binaries' RPATH. The compiler, CMake, OpenMP (libgomp) and the CUDA toolkit are not
# bundled: the target machine must have them. Usage: tools/bundle_deps.sh [DEST] (default .deps)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${1:-$root/.deps}"
# -dev packages and the runtime libraries their .so links point to (libfmt9, libdnnl2, zlib1g);
# Debian's dnnl is built with its OpenCL GPU runtime, so its CMake config looks for OpenCL and
# libdnnl.so.2 loads libOpenCL.so.1 (the ocl-icd and headers packages, 150 kB together).
# ninja-build is small and lets the build use -G Ninja.
pkgs=(libeigen3-dev libfmt-dev libfmt9 doctest-dev libdnnl-dev libdnnl2 zlib1g-dev zlib1g
      ocl-icd-libopencl1 ocl-icd-opencl-dev opencl-c-headers opencl-clhpp-headers ninja-build)
mkdir -p "$dest/debs" "$dest/prefix"
cd "$dest/debs"
missing=()
for p in "${pkgs[@]}"; do
  if ! ls "${p}"_*.deb >/dev/null 2>&1; then missing+=("$p"); fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bundle_deps: downloading ${missing[*]}"
  apt-get download -q "${missing[@]}"
fi
# Extracting needs no apt: dpkg -x, or ar and tar where dpkg is absent. A machine without a
# mirror can take only .deps/debs (about 10 MB) and run this script to extract them.
for deb in *.deb; do
  if command -v dpkg >/dev/null; then
    dpkg -x "$deb" "$dest/prefix"
  else
    tmp="$(mktemp -d)"
    (cd "$tmp" && ar x "$dest/debs/$deb" && tar -xf data.tar.* -C "$dest/prefix")
    rm -rf "$tmp"
  fi
done
# Documentation is not needed to build.
rm -rf "$dest/prefix/usr/share/doc" "$dest/prefix/usr/share/man" "$dest/prefix/usr/share/lintian"
echo "bundle_deps: $(du -sh "$dest/debs" | cut -f1) of .debs, $(du -sh "$dest/prefix" | cut -f1)" \
  "extracted in $dest/prefix"
echo "bundle_deps: configure with -DDUET_DEPS_PREFIX=$dest/prefix"
