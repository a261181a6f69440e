#!/usr/bin/env bash
# Proves that the README's two commands work on a machine that has nothing installed.
#
# Makes a minimal Debian 12 (bookworm) root with debootstrap in build-fresh/, clones this
# repository into it, and runs the first two ```sh blocks of README.md inside a chroot, word for
# word, taken from the README itself. After the first, it installs that build and builds a project
# against the install with find_package(duet) (tests/install_consumer/run.sh). Prints how long
# each step took. Needs root (debootstrap, mount, chroot) and this machine's Debian mirror; the
# root is remade on every run.
#
#   bash tests/fresh_machine.sh               both README commands, CPU only
#   bash tests/fresh_machine.sh --with-cuda   the host's CUDA toolkit is bind-mounted read-only at
#                                             /usr/local/cuda, so the CUDA backend builds too
#   bash tests/fresh_machine.sh --first-only  only the first command (set-up, build, demo) and the
#                                             install check
#   bash tests/fresh_machine.sh --keep        leave the root in place afterwards (it is unmounted)
#
# What is cloned is the repository's committed HEAD: commit before running it.
set -euo pipefail

with_cuda=0
first_only=0
keep=0
for arg in "$@"; do
  case "$arg" in
    --with-cuda) with_cuda=1 ;;
    --first-only) first_only=1 ;;
    --keep) keep=1 ;;
    -h | --help)
      sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "fresh_machine: unknown option '$arg' (see --help)" >&2
      exit 2
      ;;
  esac
done

repo="$(cd "$(dirname "$0")/.." && pwd)"
area="$repo/build-fresh"
root="$area/root"

if [ "$(id -u)" -ne 0 ]; then
  echo "fresh_machine: needs root (debootstrap, mount and chroot); run it with sudo" >&2
  exit 2
fi

say() { printf '== fresh_machine: %s\n' "$*"; }
elapsed() {
  local s=$(($(date +%s) - $1))
  printf '%d min %02d s' $((s / 60)) $((s % 60))
}

# The first two ```sh blocks of the README, one command each.
readme_block() {
  awk -v want="$1" '
    /^```sh[[:space:]]*$/ { n++; inside = (n == want); next }
    /^```/ { inside = 0; next }
    inside { print }
  ' "$repo/README.md"
}
cmd1="$(readme_block 1)"
cmd2="$(readme_block 2)"
for c in "$cmd1" "$cmd2"; do
  if [ -z "$c" ] || [ "$(printf '%s\n' "$c" | wc -l)" -ne 1 ]; then
    echo "fresh_machine: README.md must start with two \`\`\`sh blocks of one command each" >&2
    exit 1
  fi
done

# This machine's Debian mirror (deb822 or one-line format), so the root is made from the same
# archive the host installs from.
mirror=""
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  mirror="$(awk '/^URIs:/ && $2 !~ /security/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources)"
fi
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
  mirror="$(awk '$1 == "deb" && $0 ~ / bookworm / { print $2; exit }' /etc/apt/sources.list)"
fi
if [ -z "$mirror" ]; then
  echo "fresh_machine: no Debian mirror found in /etc/apt/sources.list{,.d/debian.sources}" >&2
  exit 1
fi

mounts=()
cleanup() {
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount -R "${mounts[$i]}" 2>/dev/null || umount -R -l "${mounts[$i]}" 2>/dev/null || true
  done
  mounts=()
  if [ "$keep" -eq 0 ] && [ -d "$root" ]; then
    # Only once nothing is mounted inside it.
    if ! grep -q " $root/" /proc/mounts; then rm -rf "$root"; fi
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A root left by an earlier, interrupted run.
if [ -d "$root" ]; then
  grep " $root/" /proc/mounts | awk '{ print $2 }' | sort -r | while read -r m; do
    umount -R -l "$m" || true
  done
  rm -rf "$root"
fi
mkdir -p "$area"

start_all=$(date +%s)
if ! command -v debootstrap >/dev/null; then
  say "installing debootstrap on the host"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
fi

say "debootstrap --variant=minbase bookworm"
t=$(date +%s)
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$area/debootstrap.log" 2>&1 || {
  tail -20 "$area/debootstrap.log" >&2
  exit 1
}
t_boot="$(elapsed "$t")"
say "root made in $t_boot ($(du -sh "$root" | cut -f1))"

# The host's Debian sources (updates and security too), and name resolution.
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/debian.sources"
  : >"$root/etc/apt/sources.list"
fi
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
# The network's TLS trust, where it has one of its own: a network that intercepts TLS (a proxy
# with its own CA) gives pip that CA in /etc/pip.conf; the root gets the same, so that the ONNX
# Runtime venv installs from PyPI as on any machine of that network.
if [ -f /etc/pip.conf ]; then
  cert="$(sed -n 's/^[[:space:]]*cert[[:space:]]*=[[:space:]]*//p' /etc/pip.conf | head -1)"
  if [ -n "$cert" ] && [ -f "$cert" ]; then
    cp -L "$cert" "$root/etc/network-ca.crt"
    printf '[global]\ncert = /etc/network-ca.crt\n' >"$root/etc/pip.conf"
  fi
fi

say "cloning $(git -C "$repo" rev-parse --short HEAD) into /work/duet"
mkdir -p "$root/work"
git clone -q "$repo" "$root/work/duet"

for d in proc sys dev; do
  mount --rbind "/$d" "$root/$d"
  mount --make-rslave "$root/$d"
  mounts+=("$root/$d")
done
if [ "$with_cuda" -eq 1 ]; then
  cuda="$(readlink -f /usr/local/cuda)"
  if [ ! -x "$cuda/bin/nvcc" ]; then
    echo "fresh_machine: --with-cuda needs the CUDA toolkit at /usr/local/cuda" >&2
    exit 1
  fi
  mkdir -p "$root/usr/local/cuda"
  mount --bind "$cuda" "$root/usr/local/cuda"
  mounts+=("$root/usr/local/cuda")
  mount -o remount,bind,ro "$root/usr/local/cuda"
  say "CUDA toolkit $cuda bind-mounted read-only at /usr/local/cuda"
fi

# A clean login environment: nothing of the host's leaks in.
in_root() {
  chroot "$root" /usr/bin/env -i HOME=/root USER=root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -c "cd /work/duet && $1"
}

say "first README command: $cmd1"
t=$(date +%s)
in_root "$cmd1" 2>&1 | tee "$area/first.log"
t_first="$(elapsed "$t")"
say "first README command passed in $t_first"

# The install, as a user's own project gets it: the first command's build installed into a fresh
# prefix, and a project that only calls find_package(duet) and links duet::duet configured, built
# and run against it (the ctest test_install_consumer). The first command built the sample and
# the library; `cmake --install` also installs duet-run.
# run_logged WHAT COMMAND LOG: runs COMMAND in the root with its output in LOG, from t=now; on a
# failure prints the log's end and exits 1.
run_logged() {
  t=$(date +%s)
  in_root "$2" >"$3" 2>&1 || {
    tail -60 "$3" >&2
    say "$1 FAILED after $(elapsed "$t") (log: $3)"
    exit 1
  }
}

consumer_cmd="cmake --build build --target duet-run && bash tests/install_consumer/run.sh build"
say "installed duet: $consumer_cmd"
run_logged "installed duet" "$consumer_cmd" "$area/install.log"
t_install="$(elapsed "$t")"
say "installed duet passed in $t_install"

t_second="(not run: --first-only)"
if [ "$first_only" -eq 0 ]; then
  say "second README command: $cmd2"
  run_logged "second README command" "$cmd2" "$area/second.log"
  grep -E '^(== |[0-9]+% tests passed|Total Test time)' "$area/second.log" || true
  t_second="$(elapsed "$t")"
  say "second README command passed in $t_second"
fi

say "summary (logs in $area):"
printf '  debootstrap (minbase bookworm)   %s\n' "$t_boot"
printf '  first command (set-up, demo)     %s\n' "$t_first"
printf '  install, find_package consumer   %s\n' "$t_install"
printf '  second command (every test)      %s\n' "$t_second"
printf '  in all                           %s\n' "$(elapsed "$start_all")"
[ "$with_cuda" -eq 1 ] && printf '  CUDA toolkit                     bind-mounted (%s)\n' "$cuda"
exit 0
