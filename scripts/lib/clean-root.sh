# shellcheck shell=bash
# Sourced (not run) by scripts/deb-test.sh and scripts/deploy-test.sh: the clean Debian
# bookworm root both install the package into, and how a program runs inside it.
# The caller defines `phase MESSAGE` (its progress line) and runs as root, with `set -euo
# pipefail`, from the repository's top directory.

# The clean root: bookworm's apt variant plus the unmodified programs and what the checks use.
# pkgconf reads the .pc file; init-system-helpers runs the units' maintainer scripts (as on
# any installed Debian system); mount's umount detaches the old root after pivot_root.
CLEAN_ROOT_INCLUDE=ibverbs-utils,rdmacm-utils,pkgconf,init-system-helpers,mount

# clean_root_deb [CARGO BUILD ARGS...]: prints the absolute path of the package to test:
# $SOFTVERBS_DEB when set (one built already in this run: scripts/test.sh passes the one
# deb-test.sh built, so the second script does not pack it again), else what scripts/deb.sh
# builds.
clean_root_deb() {
  local deb
  if [ -n "${SOFTVERBS_DEB:-}" ]; then
    deb=$SOFTVERBS_DEB
  else
    deb=$(scripts/deb.sh "$@")
  fi
  deb=$(readlink -f "$deb")
  [ -f "$deb" ] || { echo "no package at '$deb'" >&2; return 1; }
  echo "$deb"
}

# clean_root_tarball: prints the path of the root's tarball, making it with mmdebstrap first
# when there is none. It is cached outside the clone (a CI machine keeps it between runs of a
# fresh clone, and the cold build of scripts/build-without-rdma-core.sh empties target/);
# SOFTVERBS_DEB_TEST_CACHE moves it. Its name holds a hash of the include list: roots made for
# another list are stale and deleted.
clean_root_tarball() {
  local cache tarball
  cache=${SOFTVERBS_DEB_TEST_CACHE:-/var/cache/softverbs-ci}
  mkdir -p "$cache"
  chmod 0700 "$cache"
  tarball=$cache/bookworm-$(echo "$CLEAN_ROOT_INCLUDE" | sha256sum | cut -c1-12).tar
  find "$cache" -maxdepth 1 -name 'bookworm-*.tar' ! -name "${tarball##*/}" -delete
  if [ ! -f "$tarball" ]; then
    phase "make the clean root (mmdebstrap, cached in $tarball)" >&2
    # (mmdebstrap picks the format from the name's extension: .tar)
    mmdebstrap --quiet --variant=apt --include="$CLEAN_ROOT_INCLUDE" bookworm "$tarball.new.tar" >&2
    mv "$tarball.new.tar" "$tarball"
  fi
  echo "$tarball"
}

# clean_root_extract ROOT: a fresh copy of the clean root at ROOT (emptied first).
clean_root_extract() {
  local root=$1 tarball
  tarball=$(clean_root_tarball)
  phase "extract the clean root"
  # A root left mounted by an interrupted run is unmounted before it is removed.
  umount -R "$root" 2>/dev/null || true
  rm -rf "$root"
  mkdir -p "$root"
  tar -C "$root" -xf "$tarball"
}

# clean_root_install ROOT DEB: installs the package into ROOT with dpkg -i, as an
# administrator would (its maintainer scripts run; nothing starts without systemd).
clean_root_install() {
  local root=$1 deb=$2
  cp "$deb" "$root/softverbs.deb"
  chroot "$root" dpkg -i /softverbs.deb
  rm "$root/softverbs.deb"
}

# The shell script that makes ROOT the root of the current (fresh) mount namespace and runs a
# command there: `sh -euc "$CLEAN_ROOT_ENTER" NAME ROOT [SRC=DST]... -- COMMAND [ARGS...]`,
# inside `unshare --mount --net --pid --fork --mount-proc=/proc`. It brings up the network
# namespace's loopback, mounts proc, sysfs (the namespace's own interfaces), /dev (bound from
# the machine's, with a tmpfs /dev/shm), and fresh tmpfs /run and /tmp, binds each SRC over
# ROOT/DST (a host's own /etc, say), then makes ROOT the namespace's root with pivot_root(2),
# not chroot: `softverbs run` gives a program a mount namespace of its own, and the daemon
# must see the files that program opens under the same root. COMMAND runs with a minimal
# environment (PATH, HOME); the mounts vanish with the namespace.
# shellcheck disable=SC2016 # expanded by the inner shell
CLEAN_ROOT_ENTER='
  root=$1; shift
  binds=
  while [ "$1" != -- ]; do binds="$binds $1"; shift; done
  shift
  ip link set lo up
  mount --bind "$root" "$root"
  mount -t proc proc "$root/proc"
  mount -t sysfs sysfs "$root/sys"
  mount --rbind /dev "$root/dev"
  mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
  mount -t tmpfs -o mode=755 tmpfs "$root/run"
  mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
  for b in $binds; do mount --bind "${b%%=*}" "$root/${b#*=}"; done
  cd "$root"
  pivot_root . .
  umount -l .
  exec chroot . /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"
'
