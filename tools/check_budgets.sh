#!/usr/bin/env bash
# The size budgets of the library (docs/contributing.md): no file over 900 lines and no function
# over 150 lines in core, eager, trace, kernels, cuda and nn. tests/run_all.sh runs it; a breach
# names the file or the function and exits 1. Split along a seam (a stage, a concern), never into
# numbered parts.
#   bash tools/check_budgets.sh
set -euo pipefail
cd "$(dirname "$0")/.."
max_file_lines=900
max_fn_lines=150
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files core eager trace kernels cuda nn)
else
  mapfile -t files < <(find core eager trace kernels cuda nn -type f | sort)
fi
status=0
code=()
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  lines=$(wc -l <"$f")
  if [ "$lines" -gt "$max_file_lines" ]; then
    echo "check_budgets: $f has $lines lines (limit $max_file_lines)" >&2
    status=1
  fi
  case "$f" in *.cpp | *.h | *.cu | *.cuh) code+=("$f") ;; esac
done
python3 tools/fn_lengths.py -n "$max_fn_lines" "${code[@]}" || status=1
if [ "$status" -eq 0 ]; then
  echo "check_budgets: ${#files[@]} library files within $max_file_lines lines, every function within $max_fn_lines"
fi
exit "$status"
