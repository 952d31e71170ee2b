#!/bin/bash
# One perftest latency test through the drop-in between two processes of one daemon (the
# same-host direct path): prints perftest's result line (#bytes #iterations t_min t_max
# t_typical t_avg t_stdev 99% 99.9%). Runs itself in a private network namespace (root).
#
#   scripts/perftest-lat.sh                                   # ib_send_lat -s 8 -n 20000
#   PROG=ib_read_lat N=5000 SV=old/softverbs scripts/perftest-lat.sh
set -u
[ -z "${PT_INNER:-}" ] && exec unshare -n env PT_INNER=1 bash "$0" "$@"
ip link set lo up
SV=${SV:-target/release/softverbs}
W=$(mktemp -d)
trap 'kill $D 2>/dev/null; wait; rm -rf "$W"' EXIT
"$SV" daemon --socket "$W/p.sock" --device softverbs0=127.0.77.1 2>"$W/d.log" &
D=$!
for _ in $(seq 100); do [ -S "$W/p.sock" ] && break; sleep 0.05; done
PROG=${PROG:-ib_send_lat}; N=${N:-20000}; PORT=${PORT:-18515}
SOFTVERBS_SOCKET=$W/p.sock timeout 120 "$SV" run -- "$PROG" -d softverbs0 -x 0 -p "$PORT" -s 8 -n "$N" \
    >"$W/srv.out" 2>&1 &
S=$!
sleep 0.5
SOFTVERBS_SOCKET=$W/p.sock timeout 120 "$SV" run -- "$PROG" -d softverbs0 -x 0 -p "$PORT" -s 8 -n "$N" \
    localhost >"$W/cli.out" 2>&1
wait $S
awk 'f && $1 ~ /^[0-9]+$/ { print; exit } /#bytes/ { f = 1 }' "$W/cli.out"
