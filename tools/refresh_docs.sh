#!/usr/bin/env bash
# Rewrites the output that README.md and docs/ show, from real runs, so that what they show is
# what the code prints today.
#
# Without options it builds the programs it runs (in build/, or --build DIR) and rewrites:
#   - every region of README.md and docs/*.md between `<!-- refresh_docs: NAME -->` and
#     `<!-- /refresh_docs: NAME -->` (tools/refresh_docs.py) with the output of the run NAME
#     stands for (the recipes below: the samples, duet-run, ONNX Runtime on the exported model).
#     Output with timings gets a caption line naming the machine (lscpu's model name, the CPU
#     count and the load average when the script started), the date and the commit;
#   - docs/ops.md, the op reference, from duet_op_docs (the test op_docs_current only checks it);
#   - docs/fashion_mnist_loss.svg, the loss curves the main demo draws.
# It runs no benchmark. With --bench it runs duet_bench --runs times (default 3) and rewrites the
# README's CPU table (region bench_cpu) from the medians, with the range over the runs; with
# --peers it also runs bench/peers/peers.py (PyTorch and JAX beside duet; a venv of about 5 GB)
# and rewrites the block of its table (region bench_peers). Run those on a quiet machine: every
# figure is a time. --bench-json FILE,... builds the table from saved `duet_bench --json` runs
# instead of running the bench; --bench-where 'MACHINE, DATE' then says where and when they ran.
#
# Usage: tools/refresh_docs.sh [--build DIR] [--jobs N] [--only NAME,...] [--list]
#                              [--bench [--runs N] [--reps N] [--peers]]
#                              [--bench-json F,... --bench-where 'MACHINE, DATE']
#   --only NAME,...  refresh only these (ops, fashion_mnist, demo, seeds, deploy, deploy_run,
#                    deploy_onnx, ddp, debugging, debugging_stderr, char_gru, transformer;
#                    bench_cpu, bench_peers)
#   --list           print the regions of README.md and docs/*.md, and exit
#   --jobs N         parallel build jobs (default: nproc)
# Exit status: 0 when every region asked for was rewritten; 1 on an error; 3 when some could not
# run here (a missing data set, no mpirun, no ONNX Runtime venv): the script names them and
# leaves them as they were.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
build=build
jobs="$(nproc)"
only=""
bench=0
peers=0
runs=3
reps=7
bench_json=""
bench_where=""
list=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift ;;
    --jobs) jobs="$2"; shift ;;
    --only) only="$2"; shift ;;
    --list) list=1 ;;
    --bench) bench=1 ;;
    --peers) peers=1; bench=1 ;;
    --runs) runs="$2"; shift ;;
    --reps) reps="$2"; shift ;;
    --bench-json) bench_json="$2"; bench=1; shift ;;
    --bench-where) bench_where="$2"; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "refresh_docs: unknown argument $1 (--help)" >&2; exit 1 ;;
  esac
  shift
done
py() { python3 "$root/tools/refresh_docs.py" "$@"; }
docs=(README.md docs/*.md)
if [ "$list" = 1 ]; then
  py regions "${docs[@]}"
  exit 0
fi

# What a run stands on: the machine, its load, the date, the commit.
machine="$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1)"
load="$(cut -d' ' -f1 /proc/loadavg)"
machine="${machine:-an unknown CPU} ($(nproc) CPUs, load average $load at the start"
# A load above the CPU count means other work shared the CPUs: every time is slower for it.
if awk -v l="$load" -v n="$(nproc)" 'BEGIN { exit !(l >= n) }'; then
  machine="$machine: busy, so its times are slower than a quiet machine's"
fi
machine="$machine)"
today="$(date -u +%Y-%m-%d)"
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git status --porcelain --untracked-files=no -- ':!README.md' ':!docs' 2>/dev/null)" ]; then
  commit="$commit with uncommitted changes"
fi
caption() { echo "Printed on $today on $machine, at commit $commit, by \`tools/refresh_docs.sh\`$1:"; }

# The regions asked for: --only, else every region, less the benchmark ones without --bench.
mapfile -t present < <(py regions "${docs[@]}" | awk '{ print $2 }' | sort -u)
wanted=()
if [ -n "$only" ]; then
  IFS=, read -r -a wanted <<<"$only"
else
  wanted=(ops "${present[@]}")
  if [ "$bench" = 0 ]; then
    mapfile -t wanted < <(printf '%s\n' "${wanted[@]}" | grep -v '^bench_')
  elif [ "$peers" = 0 ]; then
    mapfile -t wanted < <(printf '%s\n' "${wanted[@]}" | grep -v '^bench_peers$')
  fi
fi
want() { printf '%s\n' "${wanted[@]}" | grep -x "$1" >/dev/null; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
skipped=()
skip() { skipped+=("$1: $2"); echo "refresh_docs: not refreshed: $1: $2" >&2; }

# Runs a program, its stdout into $tmp/NAME.out and its stderr into $tmp/NAME.err (the blocks
# show stdout; a region of its own shows stderr where a doc shows it); fails with both shown.
run() {
  local name="$1"
  shift
  "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" ||
    { echo "refresh_docs: $name failed: $*" >&2; cat "$tmp/$name.out" "$tmp/$name.err" >&2; exit 1; }
}

# Writes stdin into every region NAME of README.md and docs/*.md.
put() {
  local name="$1" f hit=0
  cat >"$tmp/$name.txt"
  for f in "${docs[@]}"; do
    if py regions "$f" | awk '{ print $2 }' | grep -x "$name" >/dev/null; then
      py replace "$f" "$name" "$tmp/$name.txt"
      echo "refresh_docs: $f: $name"
      hit=1
    fi
  done
  [ "$hit" = 1 ] || echo "refresh_docs: no region named $name in README.md or docs/" >&2
}
fence() { echo '```'"${1:-}"; cat; echo '```'; }

# ---- building what the recipes run ----
targets=()
want ops && targets+=(duet_op_docs)
want fashion_mnist && targets+=(fashion_mnist)
want demo && targets+=(demo)
want seeds && targets+=(seeds)
{ want deploy || want deploy_run || want deploy_onnx; } && targets+=(deploy duet-run)
want ddp && targets+=(ddp)
{ want debugging || want debugging_stderr; } && targets+=(debugging)
want char_gru && targets+=(char_gru)
want transformer && targets+=(transformer)
[ "$bench" = 1 ] && [ -z "$bench_json" ] && targets+=(duet_bench)
if [ ${#targets[@]} -gt 0 ]; then
  if [ ! -f "$build/CMakeCache.txt" ]; then
    flags=(-DCMAKE_BUILD_TYPE=Release -DDUET_BUILD_SAMPLES=ON)
    [ "$bench" = 1 ] && flags+=(-DDUET_BUILD_BENCH=ON)
    cmake -S . -B "$build" -G Ninja "${flags[@]}" >/dev/null
  fi
  echo "refresh_docs: building ${targets[*]}"
  cmake --build "$build" -j "$jobs" --target "${targets[@]}" >"$tmp/build.log" 2>&1 ||
    { tail -30 "$tmp/build.log" >&2; exit 1; }
fi
b="$root/$build"
shown="./${build#./}"  # the build folder as the docs show commands: ./build/samples/demo
# Generated kernels of these runs go to a cache of their own, empty: the figures are cold starts.
export DUET_CACHE_DIR="$tmp/kernel-cache"
export OMP_WAIT_POLICY=passive

# ---- the recipes ----
if want ops; then
  "$b/tools/duet_op_docs" >"$tmp/ops.md"
  mv "$tmp/ops.md" docs/ops.md
  echo "refresh_docs: docs/ops.md"
fi

if want fashion_mnist; then
  if [ -d "${DUET_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" ]; then
    mkdir -p "$tmp/fm"
    (cd "$tmp/fm" && run fm "$b/samples/fashion_mnist")
    cp "$tmp/fm/fashion_mnist_loss.svg" docs/fashion_mnist_loss.svg
    { caption ", with the kernel cache empty"; echo; fence <"$tmp/fm.out"; } | put fashion_mnist
  else
    skip fashion_mnist "the data set is not installed (apt install dataset-fashion-mnist)"
  fi
fi

for s in demo seeds; do
  if want "$s"; then
    run "$s" "$b/samples/$s"
    fence <"$tmp/$s.out" | put "$s"
  fi
done
# docs/debugging.md shows the sample's stdout, then the one warning it writes on stderr.
if want debugging || want debugging_stderr; then
  run debugging "$b/samples/debugging"
  want debugging && fence text <"$tmp/debugging.out" | put debugging
  want debugging_stderr && fence text <"$tmp/debugging.err" | put debugging_stderr
fi

for s in char_gru transformer; do
  if want "$s"; then
    run "$s" "$b/samples/$s"
    { caption ""; echo; fence text <"$tmp/$s.out"; } | put "$s"
  fi
done

# samples/deploy, then duet-run on what it saved, then ONNX Runtime on what it exported: one run
# in one folder, shown as the commands a user types from the repository root.
if want deploy || want deploy_run || want deploy_onnx; then
  d="$tmp/deploy"
  mkdir -p "$d"
  run_cmd="$shown/tools/duet-run mlp.duet --input x.npy --bench 1000"
  ort_cmd=".venv-onnx/bin/python -c \"import onnxruntime as ort, numpy as np; s = ort.InferenceSession('mlp.onnx'); \\
    y = s.run(None, {'arg0': np.load('x.npy')})[0]; print(s.get_inputs()[0].shape, np.abs(y - np.load('out.npy')).max())\""
  (cd "$d" && run deploy "$b/samples/deploy")
  (cd "$d" && run duet_run "$b/tools/duet-run" mlp.duet --input x.npy --bench 1000)
  ort=0
  if [ -x .venv-onnx/bin/python ] && [ -f "$d/mlp.onnx" ]; then
    (cd "$d" && ln -s "$root/.venv-onnx" .venv-onnx && run ort bash -c "$ort_cmd")
    ort=1
  fi
  part_deploy() { echo "\$ $shown/samples/deploy"; cat "$tmp/deploy.out"; }
  part_run() { echo "\$ $run_cmd"; cat "$tmp/duet_run.out"; }
  part_ort() { echo "\$ $ort_cmd"; cat "$tmp/ort.out"; }
  if want deploy_run; then
    { caption ""; echo; { part_deploy; part_run; } | fence text; } | put deploy_run
  fi
  if [ "$ort" = 1 ]; then
    if want deploy; then
      { caption ""; echo; { part_deploy; part_run; part_ort; } | fence; } | put deploy
    fi
    want deploy_onnx && { part_deploy; part_ort; } | fence text | put deploy_onnx
  else
    for r in deploy deploy_onnx; do
      want "$r" && skip "$r" "no ONNX Runtime venv (.venv-onnx, made by tools/setup_deps.sh) or no ONNX export in this build"
    done
  fi
fi

# Two ranks under mpirun, with the flags the tests use (DUET_MPIRUN in CMakeLists.txt: several
# ranks per core, as root, without the shared-memory copy that containers refuse).
if want ddp; then
  if command -v mpirun >/dev/null && ldd "$b/samples/ddp" 2>/dev/null | grep libmpi >/dev/null; then
    OMP_NUM_THREADS=1 run ddp mpirun -np 2 --oversubscribe --allow-run-as-root \
      --mca btl_vader_single_copy_mechanism none -x OMP_NUM_THREADS "$b/samples/ddp"
    { echo "\$ OMP_NUM_THREADS=1 mpirun -np 2 -x OMP_NUM_THREADS $shown/samples/ddp"
      cat "$tmp/ddp.out"; } | fence | put ddp
  else
    skip ddp "no mpirun, or this build has no MPI transport"
  fi
fi

# ---- benchmarks: only with --bench ----
if [ "$bench" = 1 ] && want bench_cpu; then
  jsons=()
  if [ -n "$bench_json" ]; then
    IFS=, read -r -a jsons <<<"$bench_json"
    if [ -z "$bench_where" ]; then
      echo "refresh_docs: --bench-json needs --bench-where 'MACHINE, DATE' (the runs' own)" >&2
      exit 1
    fi
    what="${#jsons[@]} saved runs of \`duet_bench --json\` on $bench_where"
  else
    for i in $(seq 1 "$runs"); do
      echo "refresh_docs: duet_bench run $i of $runs"
      "$b/bench/duet_bench" --only W1,W2,W3,W4,W5,W6,W8,C1,TT --reps "$reps" --json \
        >"$tmp/bench$i.json" 2>"$tmp/bench$i.log" || { tail -20 "$tmp/bench$i.log" >&2; exit 1; }
      jsons+=("$tmp/bench$i.json")
    done
    what="$runs runs of \`duet_bench --reps $reps\` on $machine, $today, at commit $commit"
  fi
  py bench-table "Medians of $what (\`tools/refresh_docs.sh --bench\`), with the range over the runs:" \
    "${jsons[@]}" | put bench_cpu
fi
if [ "$peers" = 1 ] && want bench_peers; then
  echo "refresh_docs: bench/peers/peers.py (PyTorch and JAX beside duet)"
  python3 bench/peers/peers.py --reps 5 --duet-threads 2 --duet "$b/bench/duet_bench" \
    --json "$tmp/peers.json" >"$tmp/peers.out" 2>"$tmp/peers.log" ||
    { tail -20 "$tmp/peers.log" >&2; exit 1; }
  { echo "Printed by \`python3 bench/peers/peers.py --reps 5 --duet-threads 2\` (run by \`tools/refresh_docs.sh --peers\`) on $machine, at commit $commit; $(grep -m1 '^duet vs peers' "$tmp/peers.out" | sed 's/^duet vs peers, //'):"
    echo; py peers-table "$tmp/peers.out" | fence; } | put bench_peers
  echo "refresh_docs: README.md: the paragraph after the peers block reads a past run's figures; update it" >&2
fi

if [ ${#skipped[@]} -gt 0 ]; then
  echo "refresh_docs: ${#skipped[@]} region(s) not refreshed:" >&2
  printf '  %s\n' "${skipped[@]}" >&2
  exit 3
fi
echo "refresh_docs: done; review with git diff"
