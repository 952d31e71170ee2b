#!/usr/bin/env bash
# Builds the kernel-rxe VM of scripts/rxe-interop.sh from Debian bookworm's own packages:
# the kernel (linux-image-amd64's 6.1 image) and an initramfs holding busybox, iproute2's `ip`
# and `rdma`, ibverbs-utils, rdmacm-utils, perftest, libibverbs' rxe provider (librxe) and the
# shared-library closure of all of them, the rdma_rxe and virtio modules with a modules.dep
# made by depmod, and scripts/rxe-interop/init as /init.
#
#   scripts/rxe-interop/initramfs.sh CACHE_DIR
#
# prints two lines: the kernel image's path and the initramfs's path, both under CACHE_DIR.
# The .debs are downloaded once (apt-get download, into CACHE_DIR/debs); the initramfs is
# rebuilt only when its inputs change (its name holds a hash of the package files and of the
# guest scripts), so a second run downloads and builds nothing. Runs as root (apt-get).
set -euo pipefail
cache=$1
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$cache/debs"
chmod 0700 "$cache"
cd "$cache/debs"

# The userspace the guest runs. Their Depends closure is downloaded (apt-cache depends
# --recurse), then only the files the programs load are copied (their NEEDED closure below):
# the closure drags in debconf, PAM and the like, which the guest never runs.
progs_pkgs=(busybox-static iproute2 ibverbs-utils rdmacm-utils perftest ibverbs-providers
  libibverbs1 librdmacm1)
# The kernel: the one linux-image-amd64 depends on today (bookworm's 6.1).
kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ { print $2; exit }')
[ -n "$kpkg" ] || { echo "initramfs: no linux-image-amd64 in apt's lists (apt-get update?)" >&2; exit 1; }

want=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
  --no-replaces --no-enhances "${progs_pkgs[@]}" | grep -v -e '^ ' -e '^<' | sort -u)
missing=()
for p in $kpkg $want; do
  ls "${p}"_*.deb >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "initramfs: downloading ${#missing[@]} packages into $cache/debs" >&2
  # apt-get download as root warns that _apt cannot write here; the download itself works.
  apt-get download -q "${missing[@]}" 2>&1 | grep -v -e '^W: Download is performed unsandboxed' >&2 || true
  for p in "${missing[@]}"; do
    ls "${p}"_*.deb >/dev/null 2>&1 || { echo "initramfs: could not download $p" >&2; exit 1; }
  done
fi

debs=()
for p in $kpkg $want; do
  # the newest when several versions were cached
  debs+=("$(ls -t "${p}"_*.deb | head -n 1)")
done
key=$({ sha256sum "${debs[@]}"; sha256sum "$here/init" "$here/initramfs.sh"; } | sha256sum | cut -c1-16)
out=$cache/initramfs-$key.cpio.gz
kver=${kpkg#linux-image-}
kernel=$cache/vmlinuz-$kver
if [ -f "$out" ] && [ -f "$kernel" ]; then
  echo "$kernel"
  echo "$out"
  exit 0
fi

echo "initramfs: building $out" >&2
stage=$(mktemp -d "$cache/stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
for d in "${debs[@]}"; do
  dpkg-deb -x "$d" "$stage/x"
done
x=$stage/x
root=$stage/root
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,run,etc,root,lib64}
mkdir -p "$root/usr/lib/x86_64-linux-gnu" "$root/lib/x86_64-linux-gnu"
cp "$x/boot/vmlinuz-$kver" "$kernel.new"

# copy FILE (a path inside the extracted packages, symlinks followed) to the same path in root
put() {
  local rel=$1
  mkdir -p "$root/$(dirname "$rel")"
  cp -L "$x/$rel" "$root/$rel"
}
# the programs: iproute2's ip and rdma, and every program of the three rdma-core packages
bins=(bin/ip usr/bin/rdma)
for p in ibverbs-utils rdmacm-utils perftest; do
  while read -r f; do
    case $f in /usr/bin/?*) bins+=("${f#/}") ;; esac
  done < <(dpkg-deb -c "$(ls -t "${p}"_*.deb | head -n 1)" | awk '{ print $6 }' | sed 's|^\.||')
done
for b in "${bins[@]}"; do
  put "$b"
done
# busybox's applets where no real program is (after the programs: cp follows a link)
put bin/busybox
for a in $("$x/bin/busybox" --list); do
  for d in bin sbin usr/bin usr/sbin; do
    [ -e "$root/$d/$a" ] && continue 2
  done
  ln -s busybox "$root/bin/$a"
done
# librxe and libibverbs' driver file naming it (libibverbs reads /etc/libibverbs.d/*.driver)
prov=usr/lib/x86_64-linux-gnu/libibverbs
put "$(cd "$x" && ls $prov/librxe-rdmav*.so)"
put etc/libibverbs.d/rxe.driver
put lib64/ld-linux-x86-64.so.2

# The shared-library closure: NEEDED entries, found in the multiarch directories the loader
# searches (LD_LIBRARY_PATH in /init names both), plus what glibc dlopens itself:
# libgcc_s.so.1 for pthread_exit/pthread_cancel's unwinding (rping's threads exit so; without
# it rping aborts with "libgcc_s.so.1 must be installed for pthread_exit to work").
declare -A seen=()
queue=()
while read -r f; do queue+=("$f"); done < <(cd "$root" && find . -type f -perm -u+x -o -type f -name '*.so*' | sed 's|^\./||')
first=1
while [ ${#queue[@]} -gt 0 ]; do
  f=${queue[0]}
  queue=("${queue[@]:1}")
  extra=
  [ -n "$first" ] && extra=libgcc_s.so.1 first=
  for lib in $extra $(readelf -d "$root/$f" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    [ -n "${seen[$lib]:-}" ] && continue
    seen[$lib]=1
    found=
    for d in lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu; do
      if [ -e "$x/$d/$lib" ]; then
        put "$d/$lib"
        queue+=("$d/$lib")
        found=1
        break
      fi
    done
    [ -n "$found" ] || { echo "initramfs: $f needs $lib, in no package" >&2; exit 1; }
  done
done

# Kernel modules: rdma_rxe (its device), ib_uverbs (/dev/infiniband/uverbs0), rdma_ucm
# (/dev/infiniband/rdma_cm for librdmacm), crc32_generic (rxe's ICRC through the crypto API:
# the TCG CPU has no PCLMUL), virtio_pci + virtio_net (the NICs), and what they depend on, as
# depmod computes it over the whole module tree.
mods=(virtio_pci virtio_net crc32_generic rdma_rxe ib_uverbs rdma_ucm)
mdir=lib/modules/$kver
depmod -b "$x" "$kver"
declare -A mseen=()
mq=()
for m in "${mods[@]}"; do
  mq+=("$(grep -E "/${m}\.ko(\.xz|\.zst)?:" "$x/$mdir/modules.dep" | cut -d: -f1)")
done
while [ ${#mq[@]} -gt 0 ]; do
  m=${mq[0]}
  mq=("${mq[@]:1}")
  [ -z "$m" ] && { echo "initramfs: a module is missing from $kpkg" >&2; exit 1; }
  [ -n "${mseen[$m]:-}" ] && continue
  mseen[$m]=1
  put "$mdir/$m"
  for d in $(grep -E "^${m}:" "$x/$mdir/modules.dep" | cut -d: -f2); do
    mq+=("$d")
  done
done
cp "$x/$mdir/modules.builtin" "$x/$mdir/modules.builtin.modinfo" "$x/$mdir/modules.order" "$root/$mdir/"
depmod -b "$root" "$kver"

install -m 0755 "$here/init" "$root/init"
echo "$kver" >"$root/etc/kernel-version"
(cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 >"$out.new"
mv "$kernel.new" "$kernel"
mv "$out.new" "$out"
# older initramfs files (other inputs) are stale
find "$cache" -maxdepth 1 -name 'initramfs-*.cpio.gz' ! -name "${out##*/}" -delete
find "$cache" -maxdepth 1 -name 'vmlinuz-*' ! -name "${kernel##*/}" -delete
echo "$kernel"
echo "$out"
