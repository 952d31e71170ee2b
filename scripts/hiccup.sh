#!/usr/bin/env bash
# What this machine steals from a spinning CPU: one busy loop per CPU reads the clock for
# 2 s and counts the gaps longer than 2, 8 and 20 µs (interrupts, timer ticks, preemption,
# the hypervisor). The floor under any ping-pong's tail percentiles here: a gap that hits one
# of the two parties lands in that round trip (docs/performance.md, "Issue 16: sharing by
# default, and what the latency tails are made of").
set -euo pipefail
cd "$(dirname "$0")"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
gcc -O2 -o "$out/hiccup" hiccup.c
for cpu in $(seq 0 $(($(nproc) - 1))); do
    taskset -c "$cpu" "$out/hiccup" | sed "s/^/cpu $cpu: /" &
done
wait
