#!/bin/bash
# Alternating A/B of two softverbs builds on one `--no-network` daemon (the new build's):
# `bench lat` from each client binary in turn, so both see the same minutes of this noisy
# machine (docs/performance.md, "Issue 16: a new machine kind"). Runs itself in a private
# network namespace (root). Prints "OLD|NEW <size> B <median µs> <p99 µs> ...", one per run.
#
#   OLD=old/softverbs NEW=target/release/softverbs scripts/ab-bench.sh
#   OP=write SZ=8 IT=200000 R=8 OLD=... NEW=... scripts/ab-bench.sh
set -u
[ -z "${AB_INNER:-}" ] && exec unshare -n env AB_INNER=1 bash "$0" "$@"
ip link set lo up
: "${OLD:?OLD=<softverbs binary>}"
NEW=${NEW:-target/release/softverbs}
W=$(mktemp -d)
trap 'kill $D 2>/dev/null; wait; rm -rf "$W"' EXIT
"$NEW" daemon --socket "$W/n.sock" --no-network 2>"$W/d.log" &
D=$!
for _ in $(seq 100); do [ -S "$W/n.sock" ] && break; sleep 0.05; done
OP=${OP:-send}; SZ=${SZ:-8}; IT=${IT:-200000}; R=${R:-4}
for _ in $(seq "$R"); do
    for v in OLD NEW; do
        bin=${!v}
        echo "$v $(timeout 120 "$bin" --socket "$W/n.sock" bench lat --op "$OP" --transport rc \
            --sizes "$SZ" --iters "$IT" 2>&1 | awk '$1 == "send" || $1 == "write" || $1 == "read" { print $3, $4, $5, $6 }')"
    done
done
