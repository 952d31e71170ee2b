#!/usr/bin/env bash
# The three two-daemon rows of issue 16 for two builds, alternating, with their peers measured
# in the same rounds (docs/performance.md "Issue 16: two daemons"):
#   8 B one-way SEND and WRITE (bench lat --two-daemons) vs UCX tcp tag_lat,
#   4 KiB WRITE bandwidth (bench bw --two-daemons) vs iperf3 UDP with 4 KiB datagrams,
#   64 KiB WRITE bandwidth vs UCX tcp tag_bw.
#
#   scripts/two-daemons-ab.sh OLD_SOFTVERBS NEW_SOFTVERBS [ROUNDS]
#
# As root it re-runs itself in a private network namespace (the daemons bind UDP 4791).
# Every run is bounded by `timeout`. On a shared machine single runs move by 2× and more:
# compare builds within a round, and read the load average printed with each round.
set -u
if [ $# -lt 2 ]; then
    echo "usage: $0 OLD_SOFTVERBS NEW_SOFTVERBS [ROUNDS]" >&2
    exit 2
fi
if [ "$(id -u)" = 0 ] && [ -z "${AB_IN_NETNS:-}" ] && command -v unshare >/dev/null; then
    exec env AB_IN_NETNS=1 unshare -n bash -c 'ip link set lo up && exec "$0" "$@"' "$0" "$@"
fi
OLD=$1 NEW=$2 ROUNDS=${3:-3} T=90
WORK=$(mktemp -d /tmp/softverbs-ab.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
PORT=$((20000 + $$ % 20000))
field() { # json-file python-expression
    python3 -c "import json,sys; v=json.load(open(sys.argv[1])); print($2)" "$1" 2>/dev/null || echo n/a
}
for r in $(seq "$ROUNDS"); do
    echo "round $r, load average $(cut -d' ' -f1-3 /proc/loadavg)"
    for b in old new; do
        bin=$OLD
        [ $b = new ] && bin=$NEW
        for op in send write; do
            timeout $T "$bin" bench lat --op $op --transport rc --sizes 8 --iters 2000 --two-daemons --json >"$WORK/l.json" 2>/dev/null
            echo "  $b 8 B one-way $op: $(field "$WORK/l.json" "round(v['rows'][0]['median_us'], 2)") µs"
        done
        timeout $T "$bin" bench bw --op write --transport rc --sizes 4096,65536 --iters 4000 --two-daemons --json >"$WORK/b.json" 2>/dev/null
        echo "  $b WRITE 4 KiB / 64 KiB: $(field "$WORK/b.json" "' / '.join(str(round(x['mb_s'])) for x in v['rows'])") MB/s"
    done
    if command -v ucx_perftest >/dev/null; then
        for t in "tag_lat 8 20000" "tag_bw 65536 2000"; do
            set -- $t
            PORT=$((PORT + 1))
            UCX_TLS=tcp UCX_NET_DEVICES=lo timeout $T ucx_perftest -p $PORT >/dev/null 2>&1 &
            srv=$!
            sleep 0.5
            UCX_TLS=tcp UCX_NET_DEVICES=lo timeout $T ucx_perftest 127.0.0.1 -p $PORT -t "$1" -s "$2" -n "$3" 2>&1 |
                awk -v t="$1" '$1 == "Final:" { if (t == "tag_lat") print "  UCX tcp 8 B one-way: " $3 " µs";
                                               else printf "  UCX tcp 64 KiB: %.0f MB/s\n", $7 * 1.048576 }'
            wait $srv 2>/dev/null
        done
    fi
    if command -v iperf3 >/dev/null; then
        PORT=$((PORT + 1))
        timeout $T iperf3 -s -1 -B 127.0.0.1 -p $PORT >/dev/null 2>&1 &
        srv=$!
        sleep 0.5
        timeout $T iperf3 -c 127.0.0.1 -p $PORT -u -b 0 -l 4096 -t 3 -J >"$WORK/i.json" 2>/dev/null
        echo "  iperf3 UDP 4 KiB: $(field "$WORK/i.json" "round(v['end']['sum']['bits_per_second'] / 8e6 * (1 - v['end']['sum'].get('lost_percent', 0) / 100))") MB/s"
        wait $srv 2>/dev/null
    fi
done
