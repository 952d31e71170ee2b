#!/usr/bin/env bash
# The Debian package on a clean Debian bookworm (issue 36 item 2; docs/guide/install.md):
# builds it (scripts/deb.sh), installs it with `dpkg -i` in a fresh root made by mmdebstrap
# (cached as a tarball, scripts/lib/clean-root.sh, so only the first run downloads), runs an
# unmodified ibv_rc_pingpong pair and rping (rdma-core's, from ibverbs-utils and rdmacm-utils
# in the root) through the installed files with `softverbs run`, checks the man pages, the
# completions, the pkg-config file and the separate debug info, purges the package and checks
# that the root's file list is as it was before the install (logs and caches aside).
# Needs root (chroot, mounts, namespaces); prints how long each phase took.
# Extra arguments go to `cargo build` (e.g. --offline).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "deb-test: skipped (needs root: chroot, mounts and namespaces)" >&2
  exit 0
fi
t0=$(date +%s)
phase() { echo "== deb-test: $1 ($(($(date +%s) - t0)) s)"; }

# shellcheck source=scripts/lib/clean-root.sh
. scripts/lib/clean-root.sh

phase "build the package"
deb=$(clean_root_deb "$@")
echo "$deb"
dpkg-deb --info "$deb" | sed -n '/Package:/,$p'
# The package brings its own libibverbs.so.1 and librdmacm.so.1: depending on rdma-core's would
# install them along with it, and purging softverbs would leave them behind.
if dpkg-deb --field "$deb" Depends | grep -qE 'libibverbs|librdmacm|rdma-core'; then
  echo "deb-test: the package depends on rdma-core's libraries: $(dpkg-deb --field "$deb" Depends)" >&2
  exit 1
fi

target=${CARGO_TARGET_DIR:-target}
dir=$(readlink -f "$target")/deb-test
mkdir -p "$dir"
root=$dir/root
clean_root_extract "$root"

# Everything in the root but logs, caches, apt's lists and dpkg's backups of its own database:
# path, type, mode, owner; regular files also their checksum.
listing() {
  (cd "$root" && find . -xdev \
    \( -path ./var/log -o -path ./var/cache -o -path ./var/lib/apt/lists -o -path ./tmp \
       -o -path ./proc -o -path ./sys -o -path ./dev -o -path ./run \) -prune -o \
    \( -path ./var/lib/dpkg/status-old -o -path ./var/lib/dpkg/available-old \
       -o -path ./var/lib/dpkg/diversions-old -o -path ./var/lib/dpkg/statoverride-old \) -prune -o \
    -printf '%p %y %m %u:%g\n' | sort)
  (cd "$root" && find . -xdev \
    \( -path ./var/log -o -path ./var/cache -o -path ./var/lib/apt/lists -o -path ./tmp \
       -o -path ./proc -o -path ./sys -o -path ./dev -o -path ./run -o -name '*-old' \) -prune -o \
    -type f -print0 | sort -z | xargs -0 sha256sum)
}
phase "list the root's files"
listing > "$dir/before.txt"

# The programs run in namespaces of their own: a network (loopback only: the daemon's UDP
# 4791 and ibv_rc_pingpong's TCP port are this test's), a PID namespace (the daemon the first
# `softverbs run` starts dies with it), and mounts that vanish with it, the root made the
# namespace's root (CLEAN_ROOT_ENTER, scripts/lib/clean-root.sh).
in_root() {
  unshare --mount --net --pid --fork --mount-proc=/proc -- \
    sh -euc "$CLEAN_ROOT_ENTER" in_root "$root" -- "$@"
}

phase "install with dpkg -i"
clean_root_install "$root" "$deb"

phase "check the installed files"
# The drop-ins' directory as the package recorded it (dpkg -L): /usr/lib/<triplet>/softverbs,
# the triplet the root's own C library lives under (no architecture is assumed).
libdir=$(chroot "$root" dpkg -L softverbs | grep '/softverbs/libibverbs.so.1$' | xargs dirname)
ma=${libdir#/usr/lib/}
ma=${ma%/softverbs}
if [ "$libdir" != "/usr/lib/$ma/softverbs" ] || [ ! -e "$root/usr/lib/$ma/libc.so.6" ]; then
  echo "deb-test: the drop-ins are in '$libdir', not /usr/lib/<the root's triplet>/softverbs" >&2
  exit 1
fi
for f in /usr/bin/softverbs "$libdir/libibverbs.so.1" "$libdir/librdmacm.so.1" \
  /usr/include/softverbs/xrc_legacy.h /usr/share/man/man1/softverbs.1.gz \
  /usr/share/man/man1/softverbs-run.1.gz /usr/share/man/man1/softverbs-cluster-up.1.gz \
  /usr/share/bash-completion/completions/softverbs /usr/share/zsh/vendor-completions/_softverbs \
  /usr/share/fish/vendor_completions.d/softverbs.fish /etc/softverbs/softverbs.toml \
  /lib/systemd/system/softverbs.service /lib/systemd/system/softverbs.socket; do
  [ -e "$root$f" ] || [ -e "$root/usr$f" ] || { echo "deb-test: $f is not installed" >&2; exit 1; }
done
# Stripped, with the debug info beside: every ELF file's build id has a .debug file.
for f in /usr/bin/softverbs "$libdir/libibverbs.so.1" "$libdir/librdmacm.so.1"; do
  if readelf -S "$root$f" | grep -q '\.debug_info'; then
    echo "deb-test: $f is not stripped" >&2; exit 1
  fi
  id=$(readelf -n "$root$f" | sed -n 's/.*Build ID: *//p')
  [ -f "$root/usr/lib/debug/.build-id/${id:0:2}/${id:2}.debug" ] ||
    { echo "deb-test: no debug info for $f (build id $id)" >&2; exit 1; }
done
# The units' maintainer scripts ran: deb-systemd-helper keeps its state of the enabled
# socket (its links go with the purge, which the file list below checks).
[ -e "$root/var/lib/systemd/deb-systemd-helper-enabled/softverbs.socket.dsh-also" ] ||
  { echo "deb-test: the postinst did not enable softverbs.socket" >&2; exit 1; }
chroot "$root" softverbs --version
chroot "$root" softverbs --version | grep -Eq '^softverbs [0-9.]+ \(git [0-9a-z-]+\)$'
chroot "$root" pkg-config --validate softverbs
pc=$(chroot "$root" pkg-config --cflags --libs softverbs)
echo "pkg-config --cflags --libs softverbs: $pc"
case "$pc" in *"-L$libdir"*) ;; *) echo "deb-test: pkg-config does not name $libdir" >&2; exit 1 ;; esac
# A man page per subcommand, generated from the clap definitions (roff with a title line).
for page in softverbs softverbs-daemon softverbs-status softverbs-run softverbs-cluster-up; do
  zcat "$root/usr/share/man/man1/$page.1.gz" | grep -q '^\.TH' ||
    { echo "deb-test: $page.1.gz is not a man page" >&2; exit 1; }
done

phase "ibv_rc_pingpong and rping through the installed files"
# The server's listener is up when its TCP port (ibv_rc_pingpong) or its CM listener (rping,
# `softverbs resources --json`) is: then its client starts. Each program checks its data
# (ibv_rc_pingpong -c, rping -v) and exits non-zero on a failure.
in_root sh -euc '
  softverbs run -- ibv_rc_pingpong -g 0 -n 100 -c > /tmp/srv.txt 2>&1 &
  srv=$!
  until grep -q ":4853 00000000:0000 0A" /proc/net/tcp /proc/net/tcp6 2>/dev/null; do
    kill -0 $srv 2>/dev/null || { cat /tmp/srv.txt; exit 1; }
    sleep 0.1
  done
  softverbs run -- ibv_rc_pingpong -g 0 -n 100 -c 127.0.0.1
  wait $srv || { echo "ibv_rc_pingpong server failed:"; cat /tmp/srv.txt; exit 1; }
  cat /tmp/srv.txt
  softverbs status > /tmp/status.txt
  head -n 1 /tmp/status.txt
  head -n 1 /tmp/status.txt | grep -q "(softverbs [0-9.]* (git "
  softverbs run -- rping -s -v -a 127.0.0.1 -C 10 > /tmp/rping-srv.txt 2>&1 &
  srv=$!
  until softverbs resources --json | grep -Eq "\"listeners\": *[1-9]"; do
    kill -0 $srv 2>/dev/null || { cat /tmp/rping-srv.txt; exit 1; }
    sleep 0.1
  done
  softverbs run -- rping -c -v -a 127.0.0.1 -C 10 > /tmp/rping-cli.txt
  wait $srv || { echo "rping server failed:"; cat /tmp/rping-srv.txt; exit 1; }
  n=$(grep -c "ping data: rdma-ping-" /tmp/rping-cli.txt || true)
  echo "rping: $n of 10 pings checked"
  [ "$n" = 10 ]
'

phase "purge"
chroot "$root" dpkg --purge softverbs
listing > "$dir/after.txt"
if ! diff -u "$dir/before.txt" "$dir/after.txt"; then
  echo "deb-test: FAILED: the purge left the root different from before the install" >&2
  exit 1
fi
rm -rf "$root"
phase "passed"
