#!/usr/bin/env bash
# MPI ping-pong sweep between two `softverbs cluster` hosts, one rank on each: Open MPI 4.1
# over softverbs (`pml ucx`, rc_verbs on softverbs0) next to Open MPI's TCP BTL (`pml ob1`,
# `btl tcp,self`) on the same two hosts, alternating per size. The ping-pong is mpi4py.bench
# ringtest with 2 ranks: one lap is a message there and back, so one-way latency is half a
# lap and bandwidth the size over that. Root only (the cluster); opt-in, not part of the suite.
#
#   sudo scripts/mpi-pingpong.sh            # release build of softverbs first
#   SIZES="1 4096" LOOPS=50 sudo scripts/mpi-pingpong.sh
#
# Prints one Markdown table (docs/performance.md, "MPI between two cluster hosts").
#
# `--bind-to none`: the cluster's hosts share this machine's CPUs, and each host's launcher
# binds its rank to "its" first core — the same core for both. Two ranks that spin (the
# TCP BTL's progress loop) then take turns by the scheduler's 4 ms slices: every TCP BTL
# message took exactly 4 ms here until the binding was dropped (softverbs, whose ranks
# yield while they wait, hid it). Real hosts have cores of their own.
set -euo pipefail
cd "$(dirname "$0")/.."
S=${S:-$PWD/target/release/softverbs}
NAME=${NAME:-svpp}
LOOPS=${LOOPS:-1000}
SIZES=${SIZES:-"1 64 1024 4096 16384 65536 262144 1048576 4194304"}
[ -x "$S" ] || { echo "build first: cargo build --release ($S missing)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "needs root (softverbs cluster)" >&2; exit 2; }
export SOFTVERBS_CLUSTER=$NAME
"$S" cluster up --hosts 2 >/dev/null
trap '"$S" cluster down >/dev/null 2>&1 || true' EXIT
D=/run/softverbs/cluster/$NAME

# Seconds per lap for SIZE bytes with the given mpirun transport options.
lap() {
    local size=$1; shift
    local out
    out=$(timeout 300 "$S" cluster exec "$NAME-1" -- mpirun --allow-run-as-root \
        --hostfile "$D/hostfile" -np 2 --map-by ppr:1:node --bind-to none \
        --mca plm_rsh_agent "$D/softverbs-rsh" \
        "$@" /usr/bin/python3 -m mpi4py.bench ringtest -n "$size" -l "$LOOPS" -s 10 2>&1) || {
        echo "job failed: $out" >&2
        echo nan
        return
    }
    # "time for N loops = T seconds (2 processes, SIZE bytes)"
    awk -v loops="$LOOPS" '/time for/ { print $6 / loops }' <<<"$out"
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| message | softverbs (pml ucx) one-way µs | MB/s | TCP BTL one-way µs | MB/s | softverbs / TCP (time) |"
echo "|---:|---:|---:|---:|---:|---:|"
for size in $SIZES; do
    sv=$(lap "$size" --mca pml ucx --mca osc ucx -x UCX_NET_DEVICES=softverbs0:1)
    tcp=$(lap "$size" --mca pml ob1 --mca btl tcp,self)
    awk -v s="$size" -v a="$sv" -v b="$tcp" 'BEGIN {
        ua = a * 1e6 / 2; ub = b * 1e6 / 2;
        printf "| %d B | %.1f | %.1f | %.1f | %.1f | %.2f× |\n", s, ua, s / ua, ub, s / ub, a / b
    }'
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
