#!/usr/bin/env bash
# The long CM flood (issue 35 item 4): COUNT REQs and COUNT SIDR_REQs from a host that is
# not a peer (127.35.2.9) at a daemon whose device is 127.35.2.1, while another client runs
# a daemon-path SEND ping-pong (`a_req_and_sidr_flood_leaves_the_cm_bounded_and_others_still_connect`
# in crates/client/tests/cm_hostile.rs, which CI runs with 20,000 and no figures). Prints the
# CM's counts after the flood (with `rate_dropped`, the requests its per-source rate
# dropped), the process's RSS (the daemon is a thread of it) before and after, and the
# ping-pong round trip in four phases: baseline; control (the same packets at the same pace
# to a closed UDP port of the daemon's address: the flooder's and the kernel's cost, none of
# the daemon's); during the REQ flood; after. As root the run gets its own network namespace.
#
#   scripts/cm-flood.sh [COUNT] [cargo test options, e.g. --release]
#
# Results go to docs/design/fuzzing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-200000}
shift || true
cmd="SOFTVERBS_CM_FLOOD=$count SOFTVERBS_CM_FLOOD_REPORT=1 cargo test $* -p softverbs \
  --test cm_hostile a_req_and_sidr_flood -- --nocapture --test-threads=1"
if [ "$(id -u)" = 0 ]; then
  exec unshare -n bash -c "ip link set lo up && $cmd"
else
  echo "note: not root, so no network namespace of its own (127.35.2.1/9 must be free)" >&2
  exec bash -c "$cmd"
fi
