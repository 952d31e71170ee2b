#!/bin/bash
# Unmodified perftest latency tests on one host through the drop-in (their RC QPs on the
# same-host direct path, docs/direct-path.md), each test's server and client through
# `softverbs run` against one daemon. Per test and round, prints the bare shared-memory
# ping-pong's one-way median right before it (scripts/tailfloor.c, no padding: which of
# this machine's two speeds the round ran on, docs/performance.md "Issue 16: first-lap page
# faults, and a machine of two speeds") and perftest's result line:
# "<test> <ping-pong µs> #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%".
# Runs itself in a private network namespace (root). Opt-in, not part of the suite.
#
#   scripts/perftest-one-host.sh [rounds]
#   SV=/path/to/release/softverbs TESTS="ib_send_lat" SIZE=8 N=5000 scripts/perftest-one-host.sh 5
set -u
[ -z "${PT_INNER:-}" ] && exec unshare -n env PT_INNER=1 bash "$0" "$@"
ip link set lo up
cd "$(dirname "$0")/.."
SV=${SV:-target/release/softverbs}
[ -x "$SV" ] || { echo "build first: cargo build --release -p softverbs-cli -p softverbs-libibverbs ($SV missing)" >&2; exit 2; }
ROUNDS=${1:-1}
TESTS=${TESTS:-"ib_write_lat ib_send_lat ib_read_lat"}
W=$(mktemp -d)
trap 'kill $A 2>/dev/null; wait 2>/dev/null; rm -rf "$W"' EXIT
gcc -O2 -o "$W/tailfloor" scripts/tailfloor.c || exit 2
"$SV" daemon --socket "$W/a.sock" --device softverbs0=127.0.77.1 2>"$W/a.log" & A=$!
sleep 0.5
args=(-d softverbs0 -x 0 -s "${SIZE:-8}" -n "${N:-5000}")
for r in $(seq "$ROUNDS"); do
    for t in $TESTS; do
        pp=$("$W/tailfloor" 20000 0 | awk '{ print $1 }')
        SOFTVERBS_SOCKET=$W/a.sock timeout 120 "$SV" run -- "$t" "${args[@]}" >"$W/srv.out" 2>&1 &
        S=$!
        sleep 0.5
        line=$(SOFTVERBS_SOCKET=$W/a.sock timeout 120 "$SV" run -- "$t" "${args[@]}" localhost 2>&1 |
            grep -A1 "t_min" | tail -1)
        wait $S
        echo "$t $pp $line"
    done
done
