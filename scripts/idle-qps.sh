#!/usr/bin/env bash
# ibv_rc_pingpong latency while another client holds N idle RC QPs, and how long creating
# those QPs took (docs/performance.md, "Idle QPs of another client").
#
#   scripts/idle-qps.sh                      # N = 0 1000 10000, QPs in RTS
#   COUNTS="0 2000" STATE=init scripts/idle-qps.sh
#
# Environment: SOFTVERBS_BIN (default: target/release/softverbs), HOLDER (default:
# target/release/examples/idle_qps; both built with cargo --release when missing), COUNTS,
# STATE (reset|init|rts: the idle QPs' state; every one has its work queues mapped, as
# ibv_create_qp through the drop-in gives), ITERS (pingpong iterations, default 2000),
# REPEAT (pingpong runs per count, default 3: the median is printed, then every run),
# RUN_TIMEOUT (seconds per step, default 120). Run it inside its own network namespace if
# other daemons bind UDP 4791: unshare -n bash -c 'ip link set lo up && scripts/idle-qps.sh'.
set -u
cd "$(dirname "$0")/.."

COUNTS=${COUNTS:-"0 1000 10000"}
STATE=${STATE:-rts}
ITERS=${ITERS:-2000}
REPEAT=${REPEAT:-3}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
T=${CARGO_TARGET_DIR:-target}
SOFTVERBS_BIN=${SOFTVERBS_BIN:-$T/release/softverbs}
HOLDER=${HOLDER:-$T/release/examples/idle_qps}
if [ ! -x "$SOFTVERBS_BIN" ] || [ ! -x "$HOLDER" ]; then
    cargo build --release -q -p softverbs-cli -p softverbs-libibverbs >&2 || exit 1
    cargo build --release -q -p softverbs --example idle_qps >&2 || exit 1
fi
WORK=$(mktemp -d /tmp/softverbs-idleqps.XXXXXX)
DAEMON_PID=
HOLDER_PID=
cleanup() {
    [ -n "$HOLDER_PID" ] && kill "$HOLDER_PID" 2>/dev/null
    [ -n "$DAEMON_PID" ] && kill "$DAEMON_PID" 2>/dev/null && wait "$DAEMON_PID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
export SOFTVERBS_SOCKET="$WORK/sv.sock"

printf '%-8s %-6s %-14s %-16s %-12s %s\n' "idle_qps" "state" "create_ms" "create+destroy" "usec/iter" "(runs)"
for n in $COUNTS; do
    # A fresh daemon per count, so each row starts from the same state.
    "$SOFTVERBS_BIN" daemon --no-network >"$WORK/daemon.log" 2>&1 &
    DAEMON_PID=$!
    for _ in $(seq 100); do [ -S "$SOFTVERBS_SOCKET" ] && break; sleep 0.05; done
    create_ms=-
    pair_us=-
    if [ "$n" -gt 0 ]; then
        mkfifo "$WORK/hold"
        timeout "$RUN_TIMEOUT" "$HOLDER" "$SOFTVERBS_SOCKET" "$n" "$STATE" <"$WORK/hold" >"$WORK/holder.out" &
        HOLDER_PID=$!
        exec 3>"$WORK/hold"
        for _ in $(seq $((RUN_TIMEOUT * 10))); do grep -q ready "$WORK/holder.out" && break; sleep 0.1; done
        create_ms=$(sed -n 's/^created .* in \([0-9.]*\) ms/\1/p' "$WORK/holder.out")
        pair_us=$(sed -n 's/^create+destroy at .*: \([0-9.]*\) us/\1/p' "$WORK/holder.out")
    fi
    runs=
    for _ in $(seq "$REPEAT"); do
        timeout "$RUN_TIMEOUT" "$SOFTVERBS_BIN" run -- ibv_rc_pingpong -g 0 -n "$ITERS" -s 8 >"$WORK/srv.out" 2>&1 &
        srv=$!
        sleep 0.5
        timeout "$RUN_TIMEOUT" "$SOFTVERBS_BIN" run -- ibv_rc_pingpong -g 0 -n "$ITERS" -s 8 127.0.0.1 >"$WORK/cli.out" 2>&1
        wait $srv
        u=$(sed -n 's/.*iters in .* seconds = \([0-9.]*\) usec\/iter.*/\1/p' "$WORK/cli.out")
        [ -z "$u" ] && { cat "$WORK/cli.out" "$WORK/srv.out" >&2; u=failed; }
        runs="$runs $u"
    done
    # The median of the runs (the machine is shared and noisy), then every run.
    usec=$(printf '%s\n' $runs | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    printf '%-8s %-6s %-14s %-16s %-12s %s\n' "$n" "$STATE" "${create_ms:--}" "${pair_us:--} us" "$usec" "($runs )"
    if [ -n "$HOLDER_PID" ]; then
        exec 3>&-
        wait "$HOLDER_PID" 2>/dev/null
        HOLDER_PID=
        rm -f "$WORK/hold"
    fi
    kill "$DAEMON_PID" 2>/dev/null; wait "$DAEMON_PID" 2>/dev/null
    DAEMON_PID=
    rm -f "$SOFTVERBS_SOCKET"
done
