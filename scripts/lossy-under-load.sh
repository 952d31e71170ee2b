#!/usr/bin/env bash
# The net path's lossy-stream test under CPU overload (issue 35, item 7): the CI test
# `net_path::a_net_path_qp_and_a_lossy_peer_deliver_everything_once`
# (crates/client/tests/net_path.rs) run RUNS times beside HOGS busy loops per core, counting
# the runs that failed and the runs whose failure names RETRY_EXC_ERR. Results go in
# docs/design/net-path.md ("Stalls"). CI runs the test once, without hogs.
#
#   scripts/lossy-under-load.sh            # 20 runs, 2 hogs per core
#   RUNS=50 HOGS=3 scripts/lossy-under-load.sh
#   NET=0 scripts/lossy-under-load.sh      # the control: the clean side on its daemon's
#                                          # engine (SOFTVERBS_NET=0), the daemon path
#
# Runs in its own network namespace when root. The hogs are this script's children and end
# with it (killed by their pids).
set -u
cd "$(dirname "$0")/.."

RUNS=${RUNS:-20}
HOGS=${HOGS:-2}
NET=${NET:-1}
if [ "$NET" = 0 ]; then
    export SOFTVERBS_NET=0
    where="daemon path (SOFTVERBS_NET=0)"
else
    where="net path"
fi
TEST=a_net_path_qp_and_a_lossy_peer_deliver_everything_once

cargo test --offline -p softverbs --test net_path --no-run >/dev/null 2>&1 || exit 1
bin=$(cargo test --offline -p softverbs --test net_path --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*net_path[^"]*\)".*/\1/p' | tail -1)
[ -x "$bin" ] || { echo "no test binary" >&2; exit 1; }

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; }
trap cleanup EXIT
for _ in $(seq $(( $(nproc) * HOGS ))); do
    ( while :; do :; done ) &
    pids+=($!)
done

run() {
    if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null; then
        unshare -n sh -c 'ip link set lo up && "$@"' lossy "$@"
    else
        "$@"
    fi
}

failed=0 retry=0
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq "$RUNS"); do
    out=$(run "$bin" --exact "$TEST" 2>&1)
    if ! grep -q "test result: ok. 1 passed" <<<"$out"; then
        failed=$((failed + 1))
        grep -q RetryExcErr <<<"$out" && retry=$((retry + 1))
        grep -m3 -E "panicked|stream|RetryExc" <<<"$out" | sed "s/^/run $i: /"
    fi
done
echo "$where: $RUNS runs beside $(( $(nproc) * HOGS )) busy loops ($(nproc) CPUs): $failed failed, $retry with RETRY_EXC_ERR"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
[ "$failed" = 0 ]
