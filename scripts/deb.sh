#!/usr/bin/env bash
# Builds the Debian package with cargo-deb (docs/guide/install.md) and prints its path:
# target/debian/softverbs_VERSION-1_ARCH.deb. The binary and both drop-ins are built in the
# release profile; `softverbs generate package` stages the files whose paths hold the
# multiarch triplet (the drop-ins, the pkg-config file) and the man pages and completions
# generated from the clap definitions; cargo-deb adds the binary, the header, the systemd units
# and the config file (crates/cli/Cargo.toml, [package.metadata.deb]), strips every ELF file and
# keeps its debug info in /usr/lib/debug/.build-id/ (separate-debug-symbols).
# Extra arguments go to `cargo build` (e.g. --offline).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo-deb >/dev/null 2>&1; then
  cargo install cargo-deb --locked
fi
cargo build --release "$@" -p softverbs-cli -p softverbs-libibverbs -p softverbs-librdmacm >&2
target=${CARGO_TARGET_DIR:-target}
stage=$target/release/deb-stage
rm -rf "$stage"
"$target/release/softverbs" generate package "$stage" >/dev/null
# Debian policy 12.1: man pages compressed (cargo-deb compresses only files outside target/).
gzip -9n "$stage"/usr/share/man/man1/*.1
# --no-build: cargo-deb would build the CLI's package only (not the drop-ins' cdylibs).
cargo deb -p softverbs-cli --no-build --output "$target/debian/" 2>&1 | tail -n 1
