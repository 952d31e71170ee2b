#!/usr/bin/env bash
# Compares softverbs' RC SEND latency and bandwidth with what a user of this machine would
# pick instead: libfabric's fi_pingpong (shm and tcp providers) and UCX's ucx_perftest
# (tag_lat / tag_bw over UCX_TLS=sm and UCX_TLS=tcp). Everything runs on loopback, every run
# is bounded by `timeout`, and one table with the ratios softverbs / peer is printed.
#
#   scripts/compare.sh                # sizes 8 4096 65536
#   SIZES="8 65536" ITERS=2000 scripts/compare.sh
#
# Environment: SOFTVERBS_BIN (default: build with cargo --release), SIZES, ITERS (softverbs
# latency iterations; bandwidth uses twice as many), PEER_ITERS (fi_pingpong/ucx iterations),
# RUN_TIMEOUT (seconds per run, default 90).
#
# Root and a missing tool: installs Debian's libfabric-bin (fi_pingpong) and ucx-utils
# (ucx_perftest). Without them the columns say "n/a".
set -u
cd "$(dirname "$0")/.."

SIZES=${SIZES:-"8 4096 65536"}
ITERS=${ITERS:-1000}
PEER_ITERS=${PEER_ITERS:-20000}
RUN_TIMEOUT=${RUN_TIMEOUT:-90}
WORK=$(mktemp -d /tmp/softverbs-compare.XXXXXX)
DAEMON_PID=
cleanup() {
    [ -n "$DAEMON_PID" ] && kill "$DAEMON_PID" 2>/dev/null && wait "$DAEMON_PID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT

say() { echo "compare: $*" >&2; }

# ---- tools ------------------------------------------------------------------------------
if [ "$(id -u)" = 0 ] && { ! command -v fi_pingpong >/dev/null || ! command -v ucx_perftest >/dev/null; }; then
    say "installing libfabric-bin and ucx-utils"
    export DEBIAN_FRONTEND=noninteractive
    timeout 300 apt-get install -y -qq libfabric-bin ucx-utils >/dev/null 2>&1 ||
        { timeout 300 apt-get update -qq >/dev/null 2>&1 &&
          timeout 300 apt-get install -y -qq libfabric-bin ucx-utils >/dev/null 2>&1; } ||
        say "could not install them; their columns will say n/a"
fi

if [ -z "${SOFTVERBS_BIN:-}" ]; then
    say "building softverbs (release)"
    cargo build --release -q -p softverbs-cli >&2 || exit 1
    SOFTVERBS_BIN="${CARGO_TARGET_DIR:-target}/release/softverbs"
fi

# A private daemon (no network: the bench's two contexts meet inside it).
SOCK="$WORK/sv.sock"
"$SOFTVERBS_BIN" daemon --socket "$SOCK" --no-network 2>"$WORK/daemon.log" &
DAEMON_PID=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.05; done

PORT=$((20000 + $$ % 20000))
next_port() { PORT=$((PORT + 1)); }

# ---- runs -------------------------------------------------------------------------------
# Every result goes to $WORK/results as "tool metric size value" (metric: lat_us, mb_s, msg_s).
RES="$WORK/results"
: >"$RES"

csv_sizes=$(echo $SIZES | tr ' ' ',')
for mode in lat bw; do
    iters=$ITERS
    [ $mode = bw ] && iters=$((ITERS * 2))
    say "softverbs bench $mode --op send --transport rc --sizes $csv_sizes --iters $iters"
    if timeout "$RUN_TIMEOUT" "$SOFTVERBS_BIN" --socket "$SOCK" bench $mode --op send --transport rc \
        --sizes "$csv_sizes" --iters $iters --json >"$WORK/sv-$mode.json"; then
        python3 - "$WORK/sv-$mode.json" "$mode" >>"$RES" <<'EOF'
import json, sys
v = json.load(open(sys.argv[1]))
for r in v["rows"]:
    if sys.argv[2] == "lat":
        print("softverbs lat_us", r["size"], r["median_us"])
    else:
        print("softverbs mb_s", r["size"], r["mb_s"])
        print("softverbs msg_s", r["size"], r["msg_s"])
EOF
    else
        say "softverbs $mode failed"
    fi
done

peer_iters() { # fewer iterations for big messages
    if [ "$1" -ge 65536 ]; then echo $((PEER_ITERS / 10)); else echo "$PEER_ITERS"; fi
}

fi_run() { # provider endpoint size
    local prov=$1 ep=$2 size=$3 n dev=()
    n=$(peer_iters "$size")
    [ "$prov" = tcp ] && dev=(-d lo)
    next_port
    timeout "$RUN_TIMEOUT" fi_pingpong -p "$prov" -e "$ep" "${dev[@]}" -B $PORT -S "$size" -I "$n" \
        >"$WORK/fi-srv.out" 2>&1 &
    local srv=$!
    sleep 0.3
    local out
    out=$(timeout "$RUN_TIMEOUT" fi_pingpong -p "$prov" -e "$ep" "${dev[@]}" -P $PORT -S "$size" -I "$n" 127.0.0.1 2>&1)
    wait $srv 2>/dev/null
    # bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec — usec/xfer is half a round trip.
    local us
    # (sizes print as 8, 4k, 64k: take the last data line)
    us=$(echo "$out" | awk 'NF >= 8 && $7 ~ /^[0-9.]+$/ { print $7 }' | tail -1)
    if [ -n "$us" ]; then
        echo "fi_$prov lat_us $size $us" >>"$RES"
        # fi_pingpong has no bandwidth test: size / one-way time, as in the reference baselines.
        echo "fi_$prov mb_s $size $(python3 -c "print($size / $us)")" >>"$RES"
    else
        say "fi_pingpong -p $prov -S $size failed: $(echo "$out" | tail -2 | tr '\n' ' ')"
    fi
}

ucx_run() { # tls test size
    local tls=$1 test=$2 size=$3 n
    n=$(peer_iters "$size")
    [ "$test" = tag_bw ] && n=$((n * 2))
    next_port
    UCX_TLS=$tls UCX_NET_DEVICES=lo timeout "$RUN_TIMEOUT" ucx_perftest -p $PORT >"$WORK/ucx-srv.out" 2>&1 &
    local srv=$!
    sleep 0.5
    local out
    out=$(UCX_TLS=$tls UCX_NET_DEVICES=lo timeout "$RUN_TIMEOUT" ucx_perftest 127.0.0.1 -p $PORT -t "$test" -s "$size" -n "$n" 2>&1)
    wait $srv 2>/dev/null
    # Final: iters lat50 lat_avg lat_overall bw_avg bw_overall rate_avg rate_overall
    local line
    line=$(echo "$out" | awk '$1 == "Final:"' | tail -1)
    if [ -z "$line" ]; then
        say "ucx_perftest $tls $test -s $size failed: $(echo "$out" | tail -2 | tr '\n' ' ')"
        return
    fi
    if [ "$test" = tag_lat ]; then
        echo "ucx_$tls lat_us $size $(echo "$line" | awk '{ print $3 }')" >>"$RES"
    else
        # ucx_perftest's "MB/s" is MiB/s.
        echo "ucx_$tls mb_s $size $(echo "$line" | awk '{ printf "%.1f", $7 * 1.048576 }')" >>"$RES"
        echo "ucx_$tls msg_s $size $(echo "$line" | awk '{ print $9 }')" >>"$RES"
    fi
}

for size in $SIZES; do
    if command -v fi_pingpong >/dev/null; then
        say "fi_pingpong shm/tcp, $size B"
        fi_run shm rdm "$size"
        fi_run tcp msg "$size"
    fi
    if command -v ucx_perftest >/dev/null; then
        say "ucx_perftest sm/tcp, $size B"
        for tls in sm tcp; do
            ucx_run $tls tag_lat "$size"
            ucx_run $tls tag_bw "$size"
        done
    fi
done

# ---- table ------------------------------------------------------------------------------
echo "load average before the table: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
python3 - "$RES" "$SIZES" <<'EOF'
import sys
res = {}
for line in open(sys.argv[1]):
    tool, metric, size, value = line.split()
    res[(tool, metric, int(size))] = float(value)
sizes = [int(s) for s in sys.argv[2].split()]
peers = [("fi_shm", "fi_pingpong shm"), ("fi_tcp", "fi_pingpong tcp"),
         ("ucx_sm", "ucx_perftest sm"), ("ucx_tcp", "ucx_perftest tcp")]
metrics = [("lat_us", "one-way latency µs (median)"), ("mb_s", "bandwidth MB/s"),
           ("msg_s", "messages/s (bw run)")]
def fmt(v):
    if v is None: return "n/a"
    return f"{v:.2f}" if v < 100 else f"{v:,.0f}"
def hsize(s):
    return f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB" if s >= 1024 else f"{s} B"
print("| metric | size | softverbs | " + " | ".join(p[1] for p in peers) + " |")
print("|---|---|---|" + "---|" * len(peers))
for m, mname in metrics:
    for s in sizes:
        sv = res.get(("softverbs", m, s))
        cells = []
        for key, _ in peers:
            p = res.get((key, m, s))
            if p is None:
                cells.append("n/a")
            elif sv is None or p == 0:
                cells.append(fmt(p))
            else:
                cells.append(f"{fmt(p)} (×{sv / p:.3g})")
        if sv is None and all(c == "n/a" for c in cells):
            continue
        print(f"| {mname} | {hsize(s)} | {fmt(sv)} | " + " | ".join(cells) + " |")
print()
print("(×r) = softverbs / peer: above 1 softverbs is slower for latency; below 1 it is slower "
      "for bandwidth and message rate.")
print("fi_pingpong has no bandwidth test: its MB/s is size / one-way latency; it has no "
      "messages/s either.")
EOF
