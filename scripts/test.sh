#!/usr/bin/env bash
# Runs every softverbs test on a fresh Debian machine: installs what the tests need, checks
# formatting and lints, builds the fuzz targets, and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages the tests use. Installed only when missing (and only as root, as on CI).
# tshark decodes captures; ibverbs-utils, perftest and python3-pyverbs (+ rdma-core for the
# test suite it ships in /usr/share/doc/rdma-core/tests) are the unmodified programs the
# drop-in libibverbs.so.1 must run; libibverbs-dev, gcc and binutils build the C examples and
# check the layout and symbol table; iproute2 (`ip`) builds the namespaces and bridges of the
# multicast, cluster and GSO capture tests, and ethtool turns that capture's offload off;
# ucx-utils, openmpi-bin, libopenmpi-dev, mpich, libfabric-bin and python3-mpi4py are the
# cluster and MPI tests' (crates/e2e/tests/cluster.rs, ucx.rs); rdmacm-utils and librdmacm-dev
# (rdma_cma.h) run and check the drop-in librdmacm.so.1; python3-dev, python3-pip,
# python3-setuptools and python3-wheel build mpi4py for MPICH (scripts/mpi4py-mpich.sh);
# systemd ships systemd-socket-activate, which plays the socket unit in the service test
# (crates/cli/tests/service.rs; no running systemd is needed).
# mmdebstrap makes the clean root the Debian package is installed in, dpkg-dev's
# dpkg-shlibdeps gives it its dependencies (scripts/deb-test.sh).
# mount (with util-linux's unshare) hides rdma-core for scripts/build-without-rdma-core.sh.
# util-linux (unshare, nsenter) and iproute2 also build the three hosts of scripts/deploy-test.sh.
# qemu-system-x86 boots the kernel-rxe VM of scripts/rxe-interop.sh; kmod's depmod, cpio and
# binutils' readelf build its initramfs; tshark's dumpcap captures its tap.
packages=(procps util-linux mount tshark ibverbs-utils perftest python3-pyverbs rdma-core
  libibverbs-dev gcc binutils iproute2 ucx-utils openmpi-bin libopenmpi-dev mpich
  libfabric-bin python3-mpi4py ethtool rdmacm-utils librdmacm-dev python3-dev python3-pip
  python3-setuptools python3-wheel systemd mmdebstrap dpkg-dev qemu-system-x86 kmod cpio)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
  else
    echo "note: missing packages ${missing[*]} (run as root to install them)" >&2
  fi
fi

# First: the README's demo from a cold target directory with every rdma-core file hidden
# (the packages above included), so a build that needs rdma-core fails here, early.
echo "== build and demo without rdma-core"
scripts/build-without-rdma-core.sh
# cargo-deb builds the Debian package (scripts/deb.sh), once.
command -v cargo-deb >/dev/null 2>&1 || cargo install cargo-deb --locked

# mpi4py built against MPICH for the cluster test, once (cached under target/).
scripts/mpi4py-mpich.sh

export CARGO_TERM_COLOR=never
echo "== format"
cargo fmt --all -- --check
echo "== lints"
cargo clippy --workspace --all-targets -- -D warnings
echo "== fuzz targets build"
for f in crates/*/fuzz/Cargo.toml; do
  cargo check --quiet --manifest-path "$f"
done
echo "== tests"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace 2>&1 | tee "$log"
# One summary line for CI, summed over every test binary.
awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "%d passed, %d failed, %d skipped\n", p, f, i }' "$log"
echo "== the Debian package (build, install in a clean bookworm root, run, purge)"
# Built in the release target directory the cold build above made (the same build, not a
# second one).
CARGO_TARGET_DIR=$PWD/target/no-rdma-core scripts/deb-test.sh
echo "== deploying on three hosts (the installed package's daemon from its config file)"
# The package deb-test.sh just built (cargo-deb writes one file per version and architecture,
# so the newest is it), installed once more in the same cached clean root.
SOFTVERBS_DEB=$(ls -t target/no-rdma-core/debian/softverbs_*.deb 2>/dev/null | head -n 1) \
  CARGO_TARGET_DIR=$PWD/target/no-rdma-core scripts/deploy-test.sh
echo "== against the Linux kernel's rxe (QEMU; the reduced matrix, docs/guide/rxe-interop.md)"
# The full matrix (124 cases) is the opt-in `scripts/rxe-interop.sh`; its results go to
# target/rxe-interop/, failing cases with both sides' captures.
if [ "$(id -u)" = 0 ]; then
  # The release build of the first step (the same binaries, not a second build).
  CARGO_TARGET_DIR=$PWD/target/no-rdma-core scripts/rxe-interop.sh --quick
else
  echo "skipped: needs root (a network namespace and a tap)"
fi
