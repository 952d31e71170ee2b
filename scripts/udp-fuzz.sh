#!/usr/bin/env bash
# The long UDP fuzz: COUNT random, mutated, noise and bad-ICRC RoCE v2 packets of every
# opcode at two daemons' UDP port 4791 while they run an RC transfer whose every byte is
# checked (`udp_fuzz_during_a_transfer` in crates/client/tests/spoofing.rs, which CI runs
# with 20,000). The daemons bind 127.102.2.1 and 127.102.2.2; as root the run gets its own
# network namespace, so it cannot meet other daemons on loopback addresses.
#
#   scripts/udp-fuzz.sh [COUNT] [cargo test options, e.g. --release]
#
# Results go to docs/design/fuzzing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-1000000}
shift || true
cmd="SOFTVERBS_UDP_FUZZ_PACKETS=$count cargo test $* -p softverbs --test spoofing \
  udp_fuzz_during_a_transfer -- --nocapture --test-threads=1"
if [ "$(id -u)" = 0 ]; then
  exec unshare -n bash -c "ip link set lo up && $cmd"
else
  echo "note: not root, so no network namespace of its own (127.102.2.1/2 must be free)" >&2
  exec bash -c "$cmd"
fi
