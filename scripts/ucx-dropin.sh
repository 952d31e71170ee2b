#!/bin/bash
# ucx_perftest through the drop-in: both processes on one daemon (ONE=1, the default) or on
# two daemons on two loopback addresses (ONE=0); prints "<size> <lat50 µs> <lat_avg µs>" per
# size (docs/performance.md, "UCX on one host does not get the direct path"). Runs itself in
# a private network namespace (root).
#
#   scripts/ucx-dropin.sh
#   ONE=0 SIZES="8 1024 4096" TLS=rc_verbs,ud_verbs scripts/ucx-dropin.sh
set -u
[ -z "${U_INNER:-}" ] && exec unshare -n env U_INNER=1 bash "$0" "$@"
ip link set lo up
SV=${SV:-target/release/softverbs}
W=$(mktemp -d)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null; wait; rm -rf "$W"' EXIT
"$SV" daemon --socket "$W/a.sock" --device softverbs0=127.0.77.1 2>"$W/da.log" &
PIDS+=($!)
B=$W/a.sock
if [ "${ONE:-1}" = 0 ]; then
    "$SV" daemon --socket "$W/b.sock" --device softverbs0=127.0.77.2 2>"$W/db.log" &
    PIDS+=($!)
    B=$W/b.sock
fi
for _ in $(seq 100); do [ -S "$W/a.sock" ] && [ -S "$B" ] && break; sleep 0.05; done
export UCX_NET_DEVICES=softverbs0:1 UCX_TLS=${TLS:-rc_verbs,ud_verbs}
T=${T:-tag_lat}; N=${N:-20000}; P=${PORT:-13470}
for s in ${SIZES:-8 1024}; do
    P=$((P + 1))
    SOFTVERBS_SOCKET=$W/a.sock timeout 120 "$SV" run -- ucx_perftest -p "$P" >"$W/srv.out" 2>&1 &
    S=$!
    sleep 0.7
    echo "$s $(SOFTVERBS_SOCKET=$B timeout 120 "$SV" run -- ucx_perftest 127.0.77.1 -p "$P" -t "$T" -s "$s" \
        -n "$N" 2>&1 | awk '$1 == "Final:" { print $3, $4 }')"
    wait $S
done
