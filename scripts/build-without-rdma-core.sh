#!/usr/bin/env bash
# The README's first command on a machine with no rdma-core: builds softverbs from a cold
# target directory and runs `cargo run --release --bin softverbs -- demo` in a mount namespace
# where every rdma-core file is hidden (issue 36, "Builds anywhere"). Hidden: the headers
# (/usr/include/infiniband, /usr/include/rdma), the provider and config directories, every
# libibverbs*/librdmacm* file, and every file a package built from the rdma-core source
# (libibverbs1, libibverbs-dev, librdmacm1, ibverbs-providers, python3-pyverbs, ...) installed.
# Directories are emptied (a tmpfs over each); a file is replaced by one that breaks whatever
# reads it (an `#error` line and a bare word: not a header, not an ELF object, not a linker
# script - ld reads `#` as a comment and stops at the word), so a build that used one would fail, not quietly fall back. Before building,
# the script proves the hiding worked: linking with -libverbs and including
# <infiniband/verbs.h> both fail.
#
# Runs as root (CI) or as a user through a user namespace. Its own PID and network namespaces:
# the daemons the demo starts end with the script, and nothing else on the host is touched.
# The target directory is target/no-rdma-core (emptied first); crates are fetched before the
# network is cut off. Prints how long the cold build took.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" != --inside ]; then
  # Crates the build needs, while there is a network (the namespace below has none).
  cargo fetch --locked --quiet
  userns=()
  [ "$(id -u)" = 0 ] || userns=(--user --map-root-user)
  exec unshare "${userns[@]}" --mount --net --pid --fork --mount-proc -- "$0" --inside
fi

# --- inside the namespaces ---
# Nothing mounted here propagates back to the host.
mount --make-rprivate /
ip link set lo up
# Scratch space of this namespace's own.
mkdir -p target/no-rdma-core-scratch
scratch=$PWD/target/no-rdma-core-scratch
mount -t tmpfs -o mode=700 none "$scratch"
printf '#error this rdma-core file is hidden\nhidden-by-scripts/build-without-rdma-core.sh\n' \
  >"$scratch/hidden"

# Directories of rdma-core's: an empty tmpfs over each.
shopt -s nullglob
dirs=(/usr/include/infiniband /usr/include/rdma /etc/libibverbs.d /etc/rdma
  /usr/lib/*/libibverbs /usr/lib/libibverbs /usr/lib/*/rdma-core /usr/local/include/infiniband
  /usr/local/include/rdma /usr/local/lib/libibverbs /usr/local/etc/libibverbs.d)
hidden_dirs=()
for d in "${dirs[@]}"; do
  if [ -d "$d" ]; then
    mount -t tmpfs -o ro,mode=755 none "$d"
    hidden_dirs+=("$d")
  fi
done
# Files: the broken stand-in bound over each.
files=(/usr/lib/*/libibverbs* /usr/lib/*/librdmacm* /usr/lib/libibverbs* /usr/lib/librdmacm*
  /usr/local/lib/libibverbs* /usr/local/lib/librdmacm* /usr/lib/*/pkgconfig/libibverbs.pc
  /usr/lib/*/pkgconfig/librdmacm.pc /usr/share/pkgconfig/libibverbs.pc)
if command -v dpkg-query >/dev/null; then
  while read -r pkg src; do
    [ "${src:-$pkg}" = rdma-core ] || continue
    while read -r f; do files+=("$f"); done < <(dpkg -L "$pkg" 2>/dev/null)
  done < <(dpkg-query -W -f '${Package} ${source:Package}\n' 2>/dev/null)
fi
n=0
for f in "${files[@]}"; do
  [ -f "$f" ] || continue # regular files and links to them; directories are handled above
  for d in "${hidden_dirs[@]}"; do
    case "$f" in "$d"/*) continue 2 ;; esac
  done
  mount --bind -o ro "$scratch/hidden" "$f"
  n=$((n + 1))
done
echo "hidden: ${#hidden_dirs[@]} directories, $n files of rdma-core"

# The hiding works: nothing to link -libverbs against, no headers.
probe=$scratch
echo 'int main(void) { return 0; }' >"$probe/p.c"
if cc "$probe/p.c" -o "$probe/p" -libverbs 2>/dev/null ||
  cc "$probe/p.c" -o "$probe/p" -l:libibverbs.so.1 2>/dev/null; then
  echo "FAIL: -libverbs still links: an rdma-core library is visible" >&2
  exit 1
fi
if echo '#include <infiniband/verbs.h>' | cc -E -x c - >/dev/null 2>&1; then
  echo "FAIL: <infiniband/verbs.h> is still visible" >&2
  exit 1
fi

# A fresh runtime directory for the demo's daemons (root's would be /run/softverbs).
mount -t tmpfs -o mode=755 none /run
unset XDG_RUNTIME_DIR SOFTVERBS_SOCKET

export CARGO_TARGET_DIR="$PWD/target/no-rdma-core" CARGO_NET_OFFLINE=true
rm -rf "$CARGO_TARGET_DIR"
start=$(date +%s)
cargo build --release --bin softverbs
echo "cold release build: $(($(date +%s) - start)) s"
cargo run --release --bin softverbs -- demo

# The drop-ins were built too (left in deps/ by a build of the CLI, where `softverbs run` finds
# them), and librdmacm.so.1 still names libibverbs.so.1 (resolved at run time, from the
# drop-in under `softverbs run` or rdma-core's).
deps=$CARGO_TARGET_DIR/release/deps
for lib in libibverbs.so librdmacm.so; do
  [ -f "$deps/$lib" ] || {
    echo "FAIL: $lib was not built" >&2
    exit 1
  }
done
if command -v readelf >/dev/null; then
  readelf -d "$deps/librdmacm.so" | grep -q 'NEEDED.*\[libibverbs\.so\.1\]' || {
    echo "FAIL: librdmacm.so has no DT_NEEDED on libibverbs.so.1" >&2
    exit 1
  }
fi
echo "built and ran the demo with no rdma-core file visible"
