#!/bin/bash
# The same-host direct path against the daemon path and UCX sm, one run (docs/performance.md,
# "Issue 16: direct path speed"): softverbs bench latency and bandwidth with
# SOFTVERBS_DIRECT=0 and =1, unmodified ib_write_bw / ib_send_lat through `softverbs run`, and
# ucx_perftest over shared memory. Runs itself inside a private network namespace (root).
# Usage: scripts/direct-speed.sh   (ROUNDS=n, SOFTVERBS_BIN=path to a release softverbs)
set -u
if [ -z "${SV_DIRECT_SPEED_INNER:-}" ]; then
    exec unshare -n env SV_DIRECT_SPEED_INNER=1 bash "$0" "$@"
fi
cd "$(dirname "$0")/.."
SV=${SOFTVERBS_BIN:-target/release/softverbs}
ROUNDS=${ROUNDS:-1}
W=$(mktemp -d)
PIDS=()
cleanup() { kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
ip link set lo up
"$SV" daemon --socket "$W/n.sock" --no-network 2>"$W/d1.log" &
PIDS+=($!)
"$SV" daemon --socket "$W/p.sock" --device softverbs0=127.0.77.1 2>"$W/d2.log" &
PIDS+=($!)
for _ in $(seq 100); do [ -S "$W/n.sock" ] && [ -S "$W/p.sock" ] && break; sleep 0.05; done
echo "commit $(git rev-parse --short HEAD 2>/dev/null) load $(cat /proc/loadavg)"
b() { timeout 60 "$SV" --socket "$W/n.sock" bench "$@" 2>&1 | grep -E "^(send|write)" | awk '{print $4, $5, $6, $7}'; }
u() { # port test size iters
    UCX_TLS=sm timeout 60 ucx_perftest -p "$1" >/dev/null 2>&1 &
    sleep 0.5
    UCX_TLS=sm timeout 60 ucx_perftest 127.0.0.1 -p "$1" -t "$2" -s "$3" -n "$4" 2>&1 | awk '$1=="Final:"'
    wait $!
}
pt() { # port prog args...
    local port=$1
    shift
    SOFTVERBS_SOCKET=$W/p.sock timeout 60 "$SV" run -- "$@" -d softverbs0 -x 0 -p "$port" >"$W/pt-srv.out" 2>&1 &
    local srv=$!
    sleep 0.5
    SOFTVERBS_SOCKET=$W/p.sock timeout 60 "$SV" run -- "$@" -d softverbs0 -x 0 -p "$port" localhost >"$W/pt-cli.out" 2>&1
    awk 'f && $1 ~ /^[0-9]+$/ { print; exit } /#bytes/ { f = 1 }' "$W/pt-cli.out"
    wait $srv
}
port=15000
for round in $(seq "$ROUNDS"); do
    echo "-- round $round (ucx_perftest: Final: iters lat50 lat_avg lat_overall bw_avg(MiB/s) ...)"
    command -v ucx_perftest >/dev/null && {
        echo "ucx sm lat: $(u $((port++)) tag_lat 8 200000)"
        echo "ucx sm bw:  $(u $((port++)) tag_bw 65536 20000)"
    }
    for dir in 0 1; do
        export SOFTVERBS_DIRECT=$dir
        echo "DIRECT=$dir send8 [$(b lat --op send --transport rc --sizes 8 --iters 20000)] write8 [$(b lat --op write --transport rc --sizes 8 --iters 20000)] (median µs, p99 µs)"
        echo "DIRECT=$dir MB/s write64K shared [$(b bw --op write --transport rc --sizes 65536 --iters 4000 --memory shared)] private [$(b bw --op write --transport rc --sizes 65536 --iters 4000 --memory private)] send64K shared [$(b bw --op send --transport rc --sizes 65536 --iters 4000 --memory shared)]"
        if command -v ib_write_bw >/dev/null; then
            echo "DIRECT=$dir ib_write_bw 64K (MiB/s): $(pt $((port++)) ib_write_bw -s 65536 -n 5000)"
            echo "DIRECT=$dir ib_write_bw 64K SHARED_MR=1: $(SOFTVERBS_SHARED_MR=1 pt $((port++)) ib_write_bw -s 65536 -n 5000)"
            echo "DIRECT=$dir ib_send_lat 8: $(pt $((port++)) ib_send_lat -s 8 -n 5000)"
        fi
    done
    unset SOFTVERBS_DIRECT
    echo "load $(cat /proc/loadavg)"
done
