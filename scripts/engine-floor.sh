#!/bin/bash
# What "the engine in the client library" would reach between two hosts, against what the
# two daemons reach and UCX tcp, in one run (docs/performance.md, "Issue 16: what the engine
# in the client library would reach"). Each round runs, in turn: the transport engine's
# udp_pingpong example (two processes, each its own engine and UDP socket: no daemon),
# `softverbs bench lat --two-daemons` (SEND 8 B) and ucx_perftest tag_lat 8 B over TCP.
# Prints one line per round: "<engine µs> <two daemons µs> <UCX tcp µs>" (medians, one-way).
# Runs itself in a private network namespace (root).
#
#   scripts/engine-floor.sh [rounds]
set -u
[ -z "${EF_INNER:-}" ] && exec unshare -n env EF_INNER=1 bash "$0" "$@"
ip link set lo up
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
T=${CARGO_TARGET_DIR:-target}
cargo build -q --release -p softverbs-transport --example udp_pingpong -p softverbs-cli || exit 1
SV=${SV:-$T/release/softverbs}
echo "# engine-in-process  two-daemons  ucx-tcp   (8 B one-way median, µs)"
for r in $(seq "$ROUNDS"); do
    e=$(timeout 120 "$T/release/examples/udp_pingpong" 100000 8 | sed -n 's/.*median \([0-9.]*\) µs.*/\1/p')
    d=$(timeout 120 "$SV" bench lat --op send --transport rc --sizes 8 --iters 20000 --two-daemons --json 2>/dev/null |
        python3 -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["rows"][0]["median_us"])' 2>/dev/null)
    P=$((13600 + r))
    UCX_TLS=tcp UCX_NET_DEVICES=lo timeout 120 ucx_perftest -p $P >/dev/null 2>&1 &
    S=$!
    sleep 0.5
    u=$(UCX_TLS=tcp UCX_NET_DEVICES=lo timeout 120 ucx_perftest 127.0.0.1 -p $P -t tag_lat -s 8 -n 100000 2>&1 |
        awk '$1 == "Final:" { print $3 }')
    wait $S
    echo "$e $d $u"
done
