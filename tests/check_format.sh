#!/usr/bin/env bash
# Fails when a tracked C++ file differs from what clang-format makes of it (.clang-format at the
# top level; Debian's clang-format 14). core/ops.def is a hand-aligned table and is left alone.
#   bash tests/check_format.sh          check, and name the files that differ
#   bash tests/check_format.sh --fix    reformat them in place
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "check_format: clang-format is not installed (bash tools/setup_deps.sh installs it)" >&2
  exit 1
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
else
  mapfile -t files < <(find . -path ./build\* -prune -o \( -name '*.cpp' -o -name '*.h' \
    -o -name '*.cu' -o -name '*.cuh' \) -print | sed 's|^\./||' | sort)
fi
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  echo "check_format: formatted ${#files[@]} files"
  exit 0
fi
formatted() {
  echo "check_format: ${#files[@]} C++ files clang-formatted ($(clang-format --version | grep -oE 'version [0-9.]+'))"
}
# Batches of files on every core: the exit status says whether all are formatted. Only when one
# is not does the loop below find which, file by file.
if printf '%s\0' "${files[@]}" |
  xargs -0 -n 32 -P "$(nproc)" clang-format --dry-run --Werror >/dev/null 2>&1; then
  formatted
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -ne 0 ]; then
  echo "check_format: ${#bad[@]} of ${#files[@]} C++ files are not clang-formatted:" >&2
  for f in "${bad[@]}"; do
    echo "  $f" >&2
    clang-format --dry-run "$f" 2>&1 | head -6 | sed 's/^/    /' >&2
  done
  echo "check_format: run 'bash tests/check_format.sh --fix' and commit the result" >&2
  exit 1
fi
formatted
