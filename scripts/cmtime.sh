#!/usr/bin/env bash
# Connection setup rate with rdmacm-utils' cmtime, unmodified, through `softverbs run`
# (docs/performance.md, "Connection setup rate"). Run as root (it makes network namespaces).
#
#   scripts/cmtime.sh one [N]   N connections (default 100) to one listener on one daemon
#   scripts/cmtime.sh two [N]   the same between two daemons in namespaces sv11x / sv11y
#                               joined by a veth pair (10.112.0.1 / .2, RoCE v2 over UDP)
#
# Uses target/release (cargo build --release -p softverbs-cli -p softverbs-librdmacm
# -p softverbs-libibverbs); PROFILE=debug for the debug build. cmtime's server never exits:
# it is stopped once the client has printed its table.
set -euo pipefail
mode=${1:-one}
n=${2:-100}
root=$(cd "$(dirname "$0")/.." && pwd)
p=$root/target/${PROFILE:-release}
bin=$p/softverbs
if [ "$mode" = one ]; then
    # A private network namespace: nothing else's 127.0.0.1, no UDP port needed.
    exec unshare -n bash -c "ip link set lo up && PROFILE=${PROFILE:-release} $0 one-inside $n"
fi
work=$(mktemp -d)
mkdir "$work/lib"
ln -s "$p/libibverbs.so" "$work/lib/libibverbs.so.1"
ln -s "$p/librdmacm.so" "$work/lib/librdmacm.so.1"
export SOFTVERBS_LIBIBVERBS=$work/lib/libibverbs.so.1 SOFTVERBS_AUTOSTART=0
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ "$mode" = two ]; then
        ip netns del sv11x 2>/dev/null || true
        ip netns del sv11y 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
wait_up() {
    for _ in $(seq 100); do
        "$bin" --socket "$1" status >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    echo "daemon at $1 did not start" >&2
    exit 1
}
case $mode in
one-inside)
    s=$work/one.sock
    "$bin" daemon --socket "$s" --no-network 2>"$work/daemon.log" & pids+=($!)
    wait_up "$s"
    "$bin" --socket "$s" run -- cmtime -b 127.0.0.1 -c "$n" >/dev/null 2>&1 & pids+=($!)
    sleep 1
    "$bin" --socket "$s" run -- cmtime -s 127.0.0.1 -c "$n"
    ;;
two)
    ip netns del sv11x 2>/dev/null || true
    ip netns del sv11y 2>/dev/null || true
    ip netns add sv11x
    ip netns add sv11y
    ip link add sv11x0 netns sv11x type veth peer name sv11y0 netns sv11y
    ip -n sv11x addr add 10.112.0.1/24 dev sv11x0
    ip -n sv11y addr add 10.112.0.2/24 dev sv11y0
    for ns in sv11x sv11y; do
        ip -n $ns link set ${ns}0 up
        ip -n $ns link set lo up
    done
    ip netns exec sv11x "$bin" daemon --socket "$work/x.sock" --device softverbs0=10.112.0.1 \
        2>"$work/x.log" & pids+=($!)
    ip netns exec sv11y "$bin" daemon --socket "$work/y.sock" --device softverbs0=10.112.0.2 \
        2>"$work/y.log" & pids+=($!)
    wait_up "$work/x.sock"
    wait_up "$work/y.sock"
    ip netns exec sv11x "$bin" --socket "$work/x.sock" run -- cmtime -b 10.112.0.1 -c "$n" \
        >/dev/null 2>&1 & pids+=($!)
    sleep 1
    ip netns exec sv11y "$bin" --socket "$work/y.sock" run -- \
        cmtime -s 10.112.0.1 -b 10.112.0.2 -c "$n"
    ;;
*)
    echo "usage: $0 one|two [connections]" >&2
    exit 2
    ;;
esac
