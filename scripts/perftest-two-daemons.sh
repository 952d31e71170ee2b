#!/bin/bash
# Unmodified perftest latency tests between two daemons on 127.0.77.1 and 127.0.77.2 (their
# RC QPs on the net path, docs/design/net-path.md), each test's server and client through
# `softverbs run`. Prints perftest's result line per test and round:
# "<test> #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%" (µs).
# With ONE_HOST=1, both ends go to one daemon (their QPs on the same-host direct path,
# docs/design/direct-path.md), and each line has, after the test's name, the one-way median of a
# bare shared-memory ping-pong run right before it (scripts/tailfloor.c, no padding): which
# of this machine's two speeds the round ran on (docs/performance.md, "Issue 16: first-lap
# page faults, and a machine of two speeds").
# Runs itself in a private network namespace (root). Opt-in, not part of the suite
# (docs/performance.md, "Issue 16: WRITE ping-pongs on the net path").
#
#   scripts/perftest-two-daemons.sh [rounds]
#   SV=/path/to/release/softverbs TESTS="ib_write_lat" SIZE=64 N=20000 scripts/perftest-two-daemons.sh 3
#   SV=/path/to/release/softverbs ONE_HOST=1 TESTS=ib_send_lat scripts/perftest-two-daemons.sh 5
set -u
[ -z "${PT_INNER:-}" ] && exec unshare -n env PT_INNER=1 bash "$0" "$@"
ip link set lo up
cd "$(dirname "$0")/.."
SV=${SV:-target/release/softverbs}
[ -x "$SV" ] || { echo "build first: cargo build --release -p softverbs-cli -p softverbs-libibverbs ($SV missing)" >&2; exit 2; }
ROUNDS=${1:-1}
TESTS=${TESTS:-"ib_write_lat ib_send_lat ib_read_lat"}
W=$(mktemp -d)
trap 'kill $A $B 2>/dev/null; wait 2>/dev/null; rm -rf "$W"' EXIT
"$SV" daemon --socket "$W/a.sock" --device softverbs0=127.0.77.1 2>"$W/a.log" & A=$!
B=
BSOCK=$W/a.sock SERVER=localhost PP=
if [ -n "${ONE_HOST:-}" ]; then
    gcc -O2 -o "$W/tailfloor" scripts/tailfloor.c || exit 2
    PP=$W/tailfloor
else
    "$SV" daemon --socket "$W/b.sock" --device softverbs0=127.0.77.2 2>"$W/b.log" & B=$!
    BSOCK=$W/b.sock SERVER=127.0.77.1
fi
sleep 0.5
args=(-d softverbs0 -x 0 -s "${SIZE:-8}" -n "${N:-5000}")
for r in $(seq "$ROUNDS"); do
    for t in $TESTS; do
        pp=
        [ -n "$PP" ] && pp="$("$PP" 20000 0 | awk '{ print $1 }') "
        SOFTVERBS_SOCKET=$W/a.sock timeout 120 "$SV" run -- "$t" "${args[@]}" >"$W/srv.out" 2>&1 &
        S=$!
        sleep 0.7
        line=$(SOFTVERBS_SOCKET=$BSOCK timeout 120 "$SV" run -- "$t" "${args[@]}" $SERVER 2>&1 |
            grep -A1 "t_min" | tail -1)
        wait $S
        echo "$t $pp$line"
    done
done
