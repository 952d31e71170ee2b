#!/usr/bin/env bash
# The pieces that run under Miri (no system calls, no sockets): the owning API's range,
# key and operand checks and its views of registered memory (client), and the atomic view
# of a borrowed buffer (shm). Needs a nightly toolchain with the miri component:
#   rustup toolchain install nightly --component miri
# docs/guide/safe-api.md says what is covered and what cannot be (memfd, mmap, the daemon).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo +nightly miri test -p softverbs --lib -- buffer::tests wr::tests
cargo +nightly miri test -p softverbs-shm --lib -- bytes::
