#!/usr/bin/env bash
# Deploying on N hosts, as docs/guide/deploy.md describes it (issue 36 item 7): three hosts,
# each a network, mount, PID and UTS namespace on a bridge, run the *installed* Debian
# package's system daemon from their own /etc/softverbs/softverbs.toml, which names the
# device by the host's interface (`softverbs0 = "eth0"`). The package is installed once with
# `dpkg -i` into the clean bookworm root of scripts/deb-test.sh (the same cached tarball,
# scripts/lib/clean-root.sh); every host runs from that root with its own /etc (a copy, with
# the administrator's one-line edit of the config file), its own /run, /tmp and /dev/shm.
# Each daemon is started with the command line of the installed softverbs.service
# (ExecStart=), in the environment systemd gives it. Then, across hosts, through `softverbs
# run` from the installed files, with the environment of a login session (XDG_RUNTIME_DIR
# set, as ssh gives an MPI launcher's ranks) and autostart off, so only the system daemon can
# serve them: rdma-core's unmodified ibv_rc_pingpong host1<->host2 and host2<->host3, and
# rping host1<->host3, each checking its data; and `softverbs status` on each host names the
# system daemon's socket and the host's address with the active MTU its 9000-byte link gives.
# Last, an ibv_rc_pingpong pair host1<->host3 started with nothing but the drop-ins'
# directory on LD_LIBRARY_PATH, as an MPI launcher's `-x LD_LIBRARY_PATH=...` starts ranks:
# the drop-in finds the system daemon by itself.
#
# MPI across these hosts is not run here: Open MPI and UCX (about 35 MB installed, some 20
# packages) plus a program for them (Python and mpi4py, or a compiler for mpi_check.c) would
# about double the clean root that deb-test.sh lists file by file, and a new include list
# means a new mmdebstrap run; the MPI stacks run across `softverbs cluster` hosts, the same
# network shape, in crates/e2e/tests/cluster.rs (docs/guide/mpi.md).
#
# Needs root (namespaces, mounts, chroot); skipped otherwise. The bridge and the hosts' links
# live in a network namespace of the script's own, so nothing appears on the machine's
# network; the hosts die with the script (unshare --kill-child). Prints how long each phase
# took. The package: $SOFTVERBS_DEB, or what scripts/deb.sh builds (extra arguments go to
# `cargo build`, e.g. --offline).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "deploy-test: skipped (needs root: namespaces, mounts and chroot)" >&2
  exit 0
fi
if [ "${1:-}" != --inside ]; then
  exec unshare --net -- "$0" --inside "$@"
fi
shift
t0=$(date +%s)
phase() { echo "== deploy-test: $1 ($(($(date +%s) - t0)) s)"; }
fail() {
  echo "deploy-test: FAILED: $*" >&2
  exit 1
}

# shellcheck source=scripts/lib/clean-root.sh
. scripts/lib/clean-root.sh

phase "the package"
deb=$(clean_root_deb "$@")
echo "$deb"
target=${CARGO_TARGET_DIR:-target}
dir=$(readlink -f "$target")/deploy-test
root=$dir/root
clean_root_extract "$root"
phase "install with dpkg -i (once: the hosts share the root)"
clean_root_install "$root" "$deb"

# The hosts: h1..h3 at 198.18.36.1..3/24 (RFC 2544's benchmarking range, never routed; the
# script's own network namespace holds the bridge, so it cannot clash with another's).
net=198.18.36
hosts=(h1 h2 h3)
br=svdeploy-br
declare -A upid init
cleanup() {
  local rc=$?
  if [ "$rc" != 0 ]; then
    for h in "${hosts[@]}"; do
      [ -f "$dir/$h-daemon.log" ] && { echo "--- $h's daemon:"; cat "$dir/$h-daemon.log"; }
    done
  fi
  # Each host's init dies with its unshare (--kill-child), and with it the host's PID
  # namespace: its daemon and programs.
  for p in "${upid[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip link del "$br" 2>/dev/null || true
  rm -rf "$dir"
  exit "$rc"
}
trap cleanup EXIT

# A command on a host: in its namespaces and under its root, with the environment systemd
# gives a service (PATH, HOME).
in_host() {
  local h=$1
  shift
  nsenter --target "${init[$h]}" --mount --net --pid --uts --root --wd -- \
    /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"
}
# A user's command on a host, as a login session (ssh, an MPI launcher's rank) runs it:
# XDG_RUNTIME_DIR set (clients must use the system daemon whatever it says), and no autostart,
# so that nothing but the system daemon can serve it. `timeout` only stops a hung program
# from hanging CI; no figure depends on it.
as_user() {
  local h=$1
  shift
  in_host "$h" XDG_RUNTIME_DIR=/run/user/0 SOFTVERBS_AUTOSTART=0 timeout 300 "$@"
}

phase "three hosts on a bridge, each with its own /etc and config file"
ip link set lo up
ip link add "$br" type bridge
ip link set "$br" up
for i in 1 2 3; do
  h=h$i
  mkdir -p "$dir/$h"
  cp -a "$root/etc" "$dir/$h/etc"
  # The administrator's edit (docs/guide/deploy.md): the example's device line, uncommented.
  conf=$dir/$h/etc/softverbs/softverbs.toml
  sed -i 's/^# softverbs0 = "eth0"$/softverbs0 = "eth0"/' "$conf"
  grep -q '^softverbs0 = "eth0"$' "$conf" || fail "the installed config has no '# softverbs0 = \"eth0\"' line"
  echo "$h" >"$dir/$h/etc/hostname"
  printf '127.0.0.1 localhost\n%s.1 h1\n%s.2 h2\n%s.3 h3\n' "$net" "$net" "$net" >"$dir/$h/etc/hosts"
  unshare --mount --net --pid --uts --fork --kill-child --mount-proc=/proc -- \
    sh -euc "$CLEAN_ROOT_ENTER" "$h" "$root" "$dir/$h/etc=/etc" -- sleep infinity &
  upid[$h]=$!
  # The host's init: unshare's child, once it has entered the root (it execs sleep).
  for _ in $(seq 600); do
    c=$(cat "/proc/${upid[$h]}/task/${upid[$h]}/children" 2>/dev/null || true)
    c=${c%% *}
    [ -n "$c" ] && [ "$(cat "/proc/$c/comm" 2>/dev/null)" = sleep ] && break
    kill -0 "${upid[$h]}" 2>/dev/null || fail "host $h did not start"
    sleep 0.1
  done
  [ "$(cat "/proc/$c/comm" 2>/dev/null)" = sleep ] || fail "host $h did not start"
  init[$h]=$c
  nsenter --target "$c" --uts hostname "$h"
  # Jumbo frames on every link of the path: the devices report IB's largest MTU, 4096.
  ip link add "svdeploy-$h" mtu 9000 type veth peer name eth0 mtu 9000 netns "$c"
  ip link set "svdeploy-$h" master "$br" up
  nsenter --target "$c" --net ip addr add "$net.$i/24" dev eth0
  nsenter --target "$c" --net ip link set eth0 up
  # A login session's runtime directory, as logind makes it.
  in_host "$h" install -d -m 0700 /run/user/0
done

phase "start each host's system daemon as softverbs.service does"
unit=$root/lib/systemd/system/softverbs.service
execstart=$(sed -n 's/^ExecStart=//p' "$unit")
echo "ExecStart=$execstart"
case "$execstart" in *"--config /etc/softverbs/softverbs.toml"*) ;; *) fail "ExecStart names no config file" ;; esac
declare -A dpid
for h in "${hosts[@]}"; do
  # shellcheck disable=SC2086 # the unit's command line, split into words as systemd does
  in_host "$h" $execstart >"$dir/$h-daemon.log" 2>&1 &
  dpid[$h]=$!
done
for h in "${hosts[@]}"; do
  until as_user "$h" softverbs status >/dev/null 2>&1; do
    kill -0 "${dpid[$h]}" 2>/dev/null || fail "$h's daemon exited"
    sleep 0.1
  done
done

phase "softverbs status on each host"
for i in 1 2 3; do
  h=h$i
  st=$(as_user "$h" softverbs status)
  first=${st%%$'\n'*}
  dev=$(grep '^device softverbs0 port 1: active MTU' <<<"$st" || true)
  echo "$h: $first"
  echo "$h: $dev"
  case "$first" in *" on /run/softverbs/softverbs.sock (softverbs "*) ;;
    *) fail "$h: status does not name the system daemon" ;;
  esac
  # eth0's address and nothing else (its link-local IPv6 address is left out); a 9000-byte
  # link gives IB's largest MTU.
  [ "$dev" = "device softverbs0 port 1: active MTU 4096 (max 4096), $net.$i" ] ||
    fail "$h: status does not show softverbs0 on eth0's $net.$i with active MTU 4096"
done

# ibv_rc_pingpong: the server on $1, the client on $2, each started by the command $4...
# (`softverbs run --` by default). The server is up when its TCP port (18515, 0x4853) listens
# in its host's network namespace; each side checks the data (-c) and exits non-zero on a
# failure; the client names the server's GID.
pingpong() {
  local srv=$1 cli=$2 srv_ip=$3 p
  shift 3
  local launch=("$@")
  [ ${#launch[@]} -gt 0 ] || launch=(softverbs run --)
  as_user "$srv" "${launch[@]}" ibv_rc_pingpong -g 0 -n 100 -c >"$dir/pp-srv.txt" 2>&1 &
  p=$!
  until nsenter --target "${init[$srv]}" --net \
    grep -q ":4853 00000000:0000 0A" /proc/net/tcp /proc/net/tcp6 2>/dev/null; do
    kill -0 "$p" 2>/dev/null || { cat "$dir/pp-srv.txt"; fail "the server on $srv exited"; }
    sleep 0.1
  done
  as_user "$cli" "${launch[@]}" ibv_rc_pingpong -g 0 -n 100 -c "$srv_ip" >"$dir/pp-cli.txt" 2>&1 ||
    { cat "$dir/pp-cli.txt"; fail "the client on $cli failed"; }
  wait "$p" || { cat "$dir/pp-srv.txt"; fail "the server on $srv failed"; }
  sed "s/^/$cli: /" "$dir/pp-cli.txt"
  grep -q "remote address: .*GID ::ffff:$srv_ip$" "$dir/pp-cli.txt" ||
    fail "the client on $cli did not reach $srv_ip"
}
phase "ibv_rc_pingpong h2 (server) <-> h1 (client)"
pingpong h2 h1 "$net.2"
phase "ibv_rc_pingpong h3 (server) <-> h2 (client)"
pingpong h3 h2 "$net.3"

phase "rping h1 (server) <-> h3 (client)"
as_user h1 softverbs run -- rping -s -v -a "$net.1" -C 10 >"$dir/rping-srv.txt" 2>&1 &
p=$!
# (The JSON is read whole before grep looks at it: grep -q leaving early would end the
# writer with SIGPIPE, which pipefail counts as a failure.)
until grep -Eq '"listeners": *[1-9]' <<<"$(as_user h1 softverbs resources --json)"; do
  kill -0 "$p" 2>/dev/null || { cat "$dir/rping-srv.txt"; fail "the rping server exited"; }
  sleep 0.1
done
as_user h3 softverbs run -- rping -c -v -a "$net.1" -C 10 >"$dir/rping-cli.txt" 2>&1 ||
  { cat "$dir/rping-cli.txt"; fail "the rping client on h3 failed"; }
wait "$p" || { cat "$dir/rping-srv.txt"; fail "the rping server on h1 failed"; }
n=$(grep -c "ping data: rdma-ping-" "$dir/rping-cli.txt" || true)
echo "rping: $n of 10 pings checked"
[ "$n" = 10 ] || fail "rping checked $n of 10 pings"

# What an MPI launcher's `-x LD_LIBRARY_PATH=...` (`-genv`, `srun --export`) gives a rank:
# the drop-ins' directory first on the library path and nothing else, no `softverbs run`.
# The drop-ins' directory as the package recorded it (dpkg -L: /usr/lib/<multiarch>/softverbs).
libdir=$(chroot "$root" dpkg -L softverbs | grep '/softverbs/libibverbs.so.1$' | xargs dirname)
phase "ibv_rc_pingpong h1 (server) <-> h3 (client) with only LD_LIBRARY_PATH=$libdir"
pingpong h1 h3 "$net.1" env "LD_LIBRARY_PATH=$libdir"

phase "passed"
