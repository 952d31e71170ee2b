#!/usr/bin/env bash
# The README's first command on a fresh Ubuntu 24.04 (issue 36 item 1's second distribution):
# a noble root made by mmdebstrap with only gcc and libc6-dev (the C linker Rust needs) plus
# iproute2 and procps, no rdma-core; this user's Rust toolchain (~/.rustup, ~/.cargo) is
# mounted in, a clone of this checkout is built there from a cold target directory and
# `cargo run --release --bin softverbs -- demo` runs in private mount, PID and network
# namespaces. Opt-in (root, ~5 min and a 300 MB download the first time; the root is cached in
# SOFTVERBS_UBUNTU_CACHE, default /var/cache/softverbs-ci). Results: docs/guide/install.md.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "ubuntu-demo: needs root (chroot, mounts)" >&2; exit 1; }
cache=${SOFTVERBS_UBUNTU_CACHE:-/var/cache/softverbs-ci}
mkdir -p "$cache" && chmod 0700 "$cache"
tarball=$cache/noble.tar
kr='' root=''
trap 'rm -rf ${kr:+"$kr"} ${root:+"$root"}' EXIT
if [ ! -f "$tarball" ]; then
  # Ubuntu's archive key, from Ubuntu's own package (Debian does not ship it).
  kr=$(mktemp -d)
  curl -sfL -o "$kr/k.deb" \
    http://archive.ubuntu.com/ubuntu/pool/main/u/ubuntu-keyring/ubuntu-keyring_2023.11.28.1_all.deb
  dpkg-deb -x "$kr/k.deb" "$kr/x"
  mmdebstrap --quiet --variant=apt --components=main,universe \
    --include=gcc,libc6-dev,ca-certificates,iproute2,procps \
    --keyring="$kr/x/usr/share/keyrings/ubuntu-archive-keyring.gpg" \
    noble "$tarball.new.tar" http://archive.ubuntu.com/ubuntu
  mv "$tarball.new.tar" "$tarball"
fi
root=$(mktemp -d "$cache/noble-root.XXXXXX")
tar -C "$root" -xf "$tarball"
git clone -q "$PWD" "$root/src"
cargo fetch --locked --quiet
mkdir -p "$root/root/.cargo" "$root/root/.rustup"
unshare --mount --pid --fork --net sh -c "
  set -e
  ip link set lo up
  mount --rbind '$HOME/.rustup' '$root/root/.rustup'
  mount --rbind '$HOME/.cargo' '$root/root/.cargo'
  mount -t proc proc '$root/proc'
  mount --rbind /dev '$root/dev'
  mount -t tmpfs tmpfs '$root/run'
  mount -t tmpfs tmpfs '$root/tmp'
  chroot '$root' /usr/bin/env -i HOME=/root PATH=/root/.cargo/bin:/usr/bin:/bin \
    CARGO_NET_OFFLINE=true sh -c '
      . /etc/os-release && echo \"== \$PRETTY_NAME, rdma-core headers: \$(ls -d /usr/include/infiniband 2>/dev/null || echo none)\"
      cd /src && cargo run --release --bin softverbs -- demo'
"
echo "ubuntu-demo: passed"
