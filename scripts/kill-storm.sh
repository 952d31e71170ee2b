#!/usr/bin/env bash
# The long kill -9 storm: the CI test `kill_storm` (crates/client/tests/kill_storm.rs) with
# many more clients. Each client opens a context, registers plain and shared MRs, creates CQs
# and loop-back RC QPs with RDMA WRITEs in flight, opens the survivor's XRC domain, creates
# and registers XRC receive QPs (the survivor's too), and is killed with SIGKILL at a random
# point, while a surviving client's RDMA WRITE/READ transfer is checked byte for byte.
# Afterwards the daemon must still serve and `resources` must show nothing of the killed.
#
#   scripts/kill-storm.sh                 # 2000 clients, 8 at a time
#   CLIENTS=5000 PARALLEL=16 scripts/kill-storm.sh
#   SEED=1234 scripts/kill-storm.sh       # replay one storm
#
# Runs in its own network namespace when root (the daemon binds nothing, but tests share
# the machine with other daemons). Prints the test's summary line; exit status is the test's.
set -u
cd "$(dirname "$0")/.."

CLIENTS=${CLIENTS:-2000}
PARALLEL=${PARALLEL:-8}
RUN_TIMEOUT=${RUN_TIMEOUT:-1800}

cargo test --release -p softverbs --test kill_storm --no-run >/dev/null || exit 1
run=(env SOFTVERBS_STORM_CLIENTS="$CLIENTS" SOFTVERBS_STORM_PARALLEL="$PARALLEL"
    ${SEED:+SOFTVERBS_STORM_SEED="$SEED"}
    timeout "$RUN_TIMEOUT" cargo test --release -p softverbs --test kill_storm -- --nocapture)
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null; then
    unshare -n bash -c 'ip link set lo up && "$@"' storm "${run[@]}"
else
    "${run[@]}"
fi
