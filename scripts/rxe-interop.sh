#!/usr/bin/env bash
# softverbs against the Linux kernel's own RoCE v2 (rdma_rxe), unmodified programs on both
# sides (issue 37; docs/guide/rxe-interop.md).
#
#   scripts/rxe-interop.sh [--quick] [--case PATTERN]... [--keep] [--out DIR] [--list]
#
# Boots Debian bookworm's kernel in QEMU (1 vCPU, 768 MiB; KVM when it boots, TCG otherwise)
# from an initramfs built from Debian packages (scripts/rxe-interop/initramfs.sh), adds rxe0
# on the VM's eth0, connects that NIC by a tap to a network namespace this script creates,
# runs a softverbs daemon there, and runs each case of the matrix: program × which side serves
# (sv: softverbs serves, rxe is the client; rxe: the reverse) × path MTU (1024: links of 1500
# bytes, 4096: 9000) × GID family (v4: IPv4-mapped GIDs, v6: ULA GIDs), 124 cases. A case is
# PROGRAM:SERVER:MTU:FAMILY, e.g. `ibv_rc_pingpong:sv:1024:v4`.
#
#   --quick        the reduced matrix scripts/test.sh runs (14 cases)
#   --case PATTERN only the cases matching the shell pattern (repeatable): --case 'rping:*'
#   --keep         leave the VM, the namespace and the daemon up at the end (prints how to
#                  reach them; `ip netns del NAME` and killing the printed pids remove them)
#   --out DIR      where results go (default target/rxe-interop/<UTC time>)
#   --list         print the selected case names and exit
#
# Environment: SOFTVERBS_RXE_CACHE (downloaded .debs, kernel and initramfs; default
# /var/cache/softverbs-ci/rxe), SOFTVERBS_RXE_ACCEL (auto, kvm or tcg; default auto),
# SOFTVERBS_RXE_TIMEOUT (seconds per case, default 60), SOFTVERBS_RXE_KEEP_CAPTURES (1: keep
# the captures of passing cases too), SOFTVERBS_BIN (the softverbs binary; default: built
# here with cargo build --release).
#
# Exit status: 0 when every case passed, 1 when one failed, 2 when the harness itself could not
# start. Runs as root (netns, tap, apt-get).
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD

quick= keep= list= out=
patterns=()
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --keep) keep=1 ;;
    --list) list=1 ;;
    --case) patterns+=("$2"); shift ;;
    --out) out=$2; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "rxe-interop: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
  shift
done

# ---- the matrix -----------------------------------------------------------------------------
progs=(ibv_rc_pingpong ibv_uc_pingpong ibv_ud_pingpong ibv_srq_pingpong ib_send_bw ib_write_bw
  ib_read_bw ib_atomic_bw ib_send_lat ib_write_lat ib_read_lat ib_atomic_lat rping ucmatose
  udaddy ib_send_bw-R)
# The reduced matrix: RC, UD, SRQ, perftest, rping, ucmatose, udaddy and -R, both directions,
# one MTU 4096 case and one IPv6 case (issue 37, "Tests").
quick_cases=(ibv_rc_pingpong:sv:1024:v4 ibv_rc_pingpong:rxe:1024:v4 ibv_ud_pingpong:sv:1024:v4
  ibv_ud_pingpong:rxe:1024:v4 ibv_srq_pingpong:rxe:1024:v4 ib_write_bw:sv:1024:v4
  ib_read_lat:rxe:1024:v4 rping:sv:1024:v4 rping:rxe:1024:v4 ucmatose:rxe:1024:v4
  udaddy:sv:1024:v4 ib_send_bw-R:sv:1024:v4 ibv_rc_pingpong:rxe:4096:v4
  ibv_rc_pingpong:sv:1024:v6)
all_cases=()
for mtu in 1024 4096; do
  for fam in v4 v6; do
    for p in "${progs[@]}"; do
      # perftest 4.5-0.17 (bookworm) resolves an rdma_cm server as IPv4 only ("Address
      # family for hostname not supported" for an IPv6 one, --ipv6 or not): no -R over IPv6.
      [ "$p:$fam" = ib_send_bw-R:v6 ] && continue
      for srv in sv rxe; do
        all_cases+=("$p:$srv:$mtu:$fam")
      done
    done
  done
done
cases=()
for c in "${all_cases[@]}"; do
  if [ -n "$quick" ]; then
    keep_it=
    for q in "${quick_cases[@]}"; do [ "$q" = "$c" ] && keep_it=1; done
    [ -n "$keep_it" ] || continue
  fi
  if [ ${#patterns[@]} -gt 0 ]; then
    keep_it=
    # shellcheck disable=SC2053 # a pattern on purpose
    for p in "${patterns[@]}"; do [[ $c == $p ]] && keep_it=1; done
    [ -n "$keep_it" ] || continue
  fi
  cases+=("$c")
done
if [ -n "$list" ]; then
  printf '%s\n' "${cases[@]}"
  exit 0
fi
[ ${#cases[@]} -gt 0 ] || { echo "rxe-interop: no case matches" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "rxe-interop: run as root (network namespace, tap)" >&2; exit 2; }
for t in qemu-system-x86_64 dumpcap tshark ip depmod cpio; do
  command -v "$t" >/dev/null || { echo "rxe-interop: $t missing (scripts/test.sh's packages)" >&2; exit 2; }
done

# ---- the pieces -----------------------------------------------------------------------------
cache=${SOFTVERBS_RXE_CACHE:-/var/cache/softverbs-ci/rxe}
case_timeout=${SOFTVERBS_RXE_TIMEOUT:-60}
out=${out:-target/rxe-interop/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
log() { echo "rxe-interop: $*" >&2; }

if [ -n "${SOFTVERBS_BIN:-}" ]; then
  sv=$(readlink -f "$SOFTVERBS_BIN")
else
  log "building the release binaries"
  cargo build --release --quiet -p softverbs-cli -p softverbs-libibverbs -p softverbs-librdmacm
  # (in $CARGO_TARGET_DIR when set: scripts/test.sh reuses its cold release build)
  sv=${CARGO_TARGET_DIR:-$top/target}/release/softverbs
fi
mapfile -t vmfiles < <(scripts/rxe-interop/initramfs.sh "$cache")
kernel=${vmfiles[0]} initrd=${vmfiles[1]}

# Addresses: the namespace's end of the tap (softverbs) and the VM's eth0 (rxe).
sv4=10.37.0.1 rxe4=10.37.0.2 sv6=fd00:37::1 rxe6=fd00:37::2
ns=svrxe-$$
tap=svtap0
work=$(mktemp -d /tmp/rxe-interop.XXXXXX)
chmod 0700 "$work"
qemu_pid= daemon_pid= dumpcap_pid=

inns() { ip netns exec "$ns" "$@"; }

cleanup() {
  local rc=$?
  if [ -n "$keep" ]; then
    log "kept: namespace $ns (ip netns exec $ns bash), VM pid $qemu_pid (command channel:"
    log "  ip netns exec $ns bash -c 'exec 3<>/dev/tcp/127.0.0.1/5555; echo \"rdma link\" >&3; cat <&3'),"
    log "  daemon pid $daemon_pid (socket $work/sv.sock); remove: kill $qemu_pid $daemon_pid; ip netns del $ns"
    exit "$rc"
  fi
  for p in $dumpcap_pid $daemon_pid $qemu_pid; do kill "$p" 2>/dev/null || true; done
  for p in $dumpcap_pid $daemon_pid $qemu_pid; do wait "$p" 2>/dev/null || true; done
  # anything else left in the namespace was started by this run (clients of a timed-out case)
  if ip netns list | grep -qw "$ns"; then
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$ns"
inns ip link set lo up
inns ip tuntap add dev "$tap" mode tap
inns ip link set "$tap" mtu 1500 up
inns ip addr add "$sv4/24" dev "$tap"
inns ip addr add "$sv6/64" dev "$tap" nodad

# vm COMMAND: runs one line of shell in the VM (the command channel of scripts/rxe-interop/init:
# QEMU user networking forwards the namespace's 127.0.0.1:5555 to the guest); prints its
# output, returns its status (3 when the channel gave no status: VM not up or gone).
vm() {
  local reply rc
  reply=$(inns timeout "${VM_TIMEOUT:-$((case_timeout + 30))}" bash -c \
    'exec 3<>/dev/tcp/127.0.0.1/5555 && printf "%s\n" "$1" >&3 && cat <&3' _ "$1" 2>/dev/null) || true
  rc=$(printf '%s\n' "$reply" | sed -n 's/^__rc=\([0-9]*\)$/\1/p' | tail -n 1)
  printf '%s\n' "$reply" | sed '/^__rc=[0-9]*$/d'
  return "${rc:-3}"
}

start_vm() { # start_vm ACCEL SECONDS: starts QEMU, waits up to SECONDS for the command channel
  local accel=$1 deadline=$((SECONDS + $2)) cpu=max
  [ "$accel" = kvm ] && cpu=host
  # romfile= : no iPXE option ROM, which only slows the boot.
  # (ip netns exec, not the inns function, in the background: $! is then QEMU's own pid)
  ip netns exec "$ns" qemu-system-x86_64 -accel "$accel" -cpu "$cpu" -smp 1 -m 768 -nographic -no-reboot \
    -kernel "$kernel" -initrd "$initrd" \
    -append "console=ttyS0 panic=-1 quiet sv.mac=52:54:00:37:00:02 sv.ctlmac=52:54:00:37:00:03 sv.ip4=$rxe4/24 sv.ip6=$rxe6/64 sv.mtu=1500" \
    -netdev tap,id=t0,ifname="$tap",script=no,downscript=no \
    -device virtio-net-pci,netdev=t0,mac=52:54:00:37:00:02,addr=0x4,romfile= \
    -netdev user,id=c0,restrict=on,hostfwd=tcp:127.0.0.1:5555-10.0.2.15:5555 \
    -device virtio-net-pci,netdev=c0,mac=52:54:00:37:00:03,addr=0x5,romfile= \
    </dev/null >"$out/vm-console.log" 2>&1 &
  qemu_pid=$!
  while [ $SECONDS -lt $deadline ]; do
    kill -0 "$qemu_pid" 2>/dev/null || return 1
    if VM_TIMEOUT=5 vm 'true' >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  return 1
}

accel=${SOFTVERBS_RXE_ACCEL:-auto}
t0=$(date +%s)
booted=
if [ "$accel" != tcg ] && [ -w /dev/kvm ]; then
  # A KVM guest that boots is up in seconds; on this project's machine KVM hung (or failed
  # with an MSR assertion) instead, hence the short bound.
  if start_vm kvm 30; then booted=kvm; else
    log "KVM did not boot (vm-console.log.kvm); falling back to TCG"
    kill "$qemu_pid" 2>/dev/null || true
    wait "$qemu_pid" 2>/dev/null || true
    mv "$out/vm-console.log" "$out/vm-console.log.kvm"
  fi
fi
if [ -z "$booted" ] && [ "$accel" != kvm ]; then
  # TCG boots in ~15 s on an idle machine; under load it may take minutes
  start_vm tcg 300 && booted=tcg
fi
[ -n "$booted" ] || { log "the VM did not come up (see $out/vm-console.log)"; exit 2; }
log "VM up ($booted, $(($(date +%s) - t0)) s): $(vm 'uname -r; rdma link' | tr '\n' ' ')"

# rxe against itself first: shows the VM side works before anything is blamed on softverbs.
if vm 'ibv_rc_pingpong -d rxe0 -g 1 -n 20 >/tmp/self.out 2>&1 & sleep 2; ibv_rc_pingpong -d rxe0 -g 1 -n 20 127.0.0.1 && wait $!' \
  >"$out/rxe-self.log" 2>&1; then
  log "rxe to rxe inside the VM: ok"
else
  log "rxe to rxe inside the VM failed ($out/rxe-self.log): the VM is broken, not softverbs"
  exit 2
fi

# GID indices. softverbs fills its table in the order of --device's addresses (IPv4, then the
# ULA; docs/guide/configuration.md, "[devices]"); rxe's is found by reading the VM's sysfs
# (index 0 is the link-local GID, then one per address in the order the kernel reports them).
hexgid() { # the sysfs form of an address's GID
  python3 -c 'import ipaddress,sys
a=ipaddress.ip_address(sys.argv[1])
b=(ipaddress.IPv6Address("::ffff:"+str(a)) if a.version==4 else a).packed.hex()
print(":".join(b[i:i+4] for i in range(0,32,4)))' "$1"
}
rxe_gid() {
  local want
  want=$(hexgid "$1")
  vm "cd /sys/class/infiniband/rxe0/ports/1/gids && for i in \$(seq 0 15); do [ \"\$(cat \$i 2>/dev/null)\" = $want ] && echo \$i && break; done"
}
rxe_gid4=$(rxe_gid "$rxe4")
rxe_gid6=$(rxe_gid "$rxe6")
sv_gid4=0 sv_gid6=1
log "GID indices: rxe IPv4 $rxe_gid4, IPv6 $rxe_gid6; softverbs IPv4 $sv_gid4, IPv6 $sv_gid6"
[ -n "$rxe_gid4" ] && [ -n "$rxe_gid6" ] || { log "rxe0 lacks a GID for $rxe4 or $rxe6"; exit 2; }

# set_mtu MTU: the links of path MTU MTU on both sides (rxe and softverbs derive their
# active_mtu from the link: 1500 gives 1024, 9000 gives 4096).
set_mtu() {
  local link=1500
  [ "$1" = 4096 ] && link=9000
  inns ip link set "$tap" mtu "$link"
  vm "/bin/ip link set eth0 mtu $link" >/dev/null
}

# args PROGRAM SIDE(server|client) DEV GID MTU FAMILY SERVER_ADDR: the program's arguments.
args() {
  local p=$1 side=$2 dev=$3 gid=$4 mtu=$5 fam=$6 saddr=$7 a
  case $p in
    ibv_rc_pingpong | ibv_uc_pingpong) a="-d $dev -g $gid -n 20 -m $mtu" ;;
    # UD: a message fits one packet; -s is the payload the MTU allows
    ibv_ud_pingpong) a="-d $dev -g $gid -n 20 -s $mtu" ;;
    ibv_srq_pingpong) a="-d $dev -g $gid -n 20 -m $mtu -q 4" ;;
    ib_*_bw | ib_*_lat) a="-d $dev -x $gid -n 200 -m $mtu -F" ;;
    ib_send_bw-R)
      a="-d $dev -R -n 200 -F"
      [ "$fam" = v6 ] && a="$a --ipv6"
      ;;
    rping)
      if [ "$side" = server ]; then a="-s -a $saddr -C 5 -v"; else a="-c -a $saddr -C 5 -v"; fi
      ;;
    ucmatose | udaddy)
      if [ "$side" = server ]; then a="-b $saddr -C 5"; else a="-s $saddr -C 5"; fi
      ;;
  esac
  case $p in
    ibv_*pingpong | ib_*_bw | ib_*_lat | ib_send_bw-R) [ "$side" = client ] && a="$a $saddr" ;;
  esac
  echo "$a"
}
binary() { echo "${1%-R}"; }
is_cm() { case $1 in rping | ucmatose | udaddy | ib_send_bw-R) return 0 ;; esac; return 1; }
# the TCP port a server's out-of-band exchange listens on (none for rdma_cm programs)
oob_port() { is_cm "$1" || echo 18515; }

start_daemon() { # start_daemon CAPTURE_DIR
  mkdir -p "$1"
  chmod 0700 "$1"
  rm -f "$work/sv.sock"
  ip netns exec "$ns" env SOFTVERBS_LOG="${SOFTVERBS_LOG:-info}" "$sv" daemon --socket "$work/sv.sock" \
    --device "softverbs0=$sv4,$sv6" --capture "$1" --capture-rejected >"$1/daemon.log" 2>&1 &
  daemon_pid=$!
  local i
  for i in $(seq 100); do
    [ -S "$work/sv.sock" ] && SOFTVERBS_SOCKET=$work/sv.sock "$sv" status >/dev/null 2>&1 && return 0
    kill -0 "$daemon_pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
stop_daemon() {
  [ -n "$daemon_pid" ] || return 0
  kill "$daemon_pid" 2>/dev/null || true
  wait "$daemon_pid" 2>/dev/null || true
  daemon_pid=
}
svrun() { # svrun ARGS...: a program with softverbs' drop-ins, in the namespace
  inns env SOFTVERBS_SOCKET="$work/sv.sock" SOFTVERBS_AUTOSTART=0 "$sv" run -- "$@"
}

# wait_listening SIDE PROGRAM: until the server listens (a TCP port for the verbs programs'
# exchange; an rdma_cm ID in LISTEN for rxe's rdma_cm programs; softverbs' rdma_cm listener
# has nothing to poll, so a fixed grace). Bounded; the client then fails if it never did.
wait_listening() {
  local side=$1 p=$2 port i
  port=$(oob_port "$p")
  for i in $(seq 60); do
    if [ "$side" = rxe ]; then
      if [ -n "$port" ]; then
        vm "netstat -ltn | grep -q ':$port '" >/dev/null && return 0
      else
        vm "rdma res show cm_id | grep -q LISTEN" >/dev/null && return 0
      fi
    else
      if [ -n "$port" ]; then
        inns ss -ltnH "sport = :$port" | grep -q . && return 0
      else
        sleep 2
        return 0
      fi
    fi
    sleep 0.5
  done
}

# run_case NAME: 0 when both sides exited 0
run_case() {
  local name=$1 p srv mtu fam dir bin sargs cargs src crc saddr_sv saddr_rxe
  IFS=: read -r p srv mtu fam <<<"$name"
  dir=$out/cases/${name//:/_}
  mkdir -p "$dir"
  bin=$(binary "$p")
  if [ "$fam" = v4 ]; then saddr_sv=$sv4 saddr_rxe=$rxe4; else saddr_sv=$sv6 saddr_rxe=$rxe6; fi
  local rgid=$rxe_gid4 vgid=$sv_gid4
  [ "$fam" = v6 ] && rgid=$rxe_gid6 vgid=$sv_gid6
  # The verbs programs' out-of-band TCP exchange goes over IPv4 whatever the GID: their
  # servers listen on the first address getaddrinfo(NULL) gives, 0.0.0.0 (and perftest's on
  # IPv4 unless --ipv6). The rdma_cm programs' address is the path itself.
  local oob_sv=$saddr_sv oob_rxe=$saddr_rxe
  case $p in ibv_*pingpong | ib_*_bw | ib_*_lat) oob_sv=$sv4 oob_rxe=$rxe4 ;; esac
  start_daemon "$dir/sv" || { echo "daemon did not start" >"$dir/result"; return 1; }
  ip netns exec "$ns" dumpcap -i "$tap" -w "$dir/tap.pcapng" >"$dir/dumpcap.log" 2>&1 &
  dumpcap_pid=$!
  for _ in $(seq 100); do grep -qs 'Capturing on' "$dir/dumpcap.log" && break; sleep 0.1; done
  vm 'dmesg -c >/dev/null; rm -f /tmp/srv.*' >/dev/null || true
  local T=$case_timeout
  if [ "$srv" = sv ]; then
    sargs=$(args "$p" server softverbs0 "$vgid" "$mtu" "$fam" "$saddr_sv")
    cargs=$(args "$p" client rxe0 "$rgid" "$mtu" "$fam" "$oob_sv")
    echo "softverbs: $bin $sargs" >"$dir/commands"
    echo "rxe:       $bin $cargs" >>"$dir/commands"
    # shellcheck disable=SC2086 # word splitting of the argument string on purpose
    svrun timeout "$T" "$bin" $sargs >"$dir/server.out" 2>&1 &
    local spid=$!
    wait_listening sv "$p"
    vm "timeout $T $bin $cargs" >"$dir/client.out" 2>&1 && crc=0 || crc=$?
    wait "$spid" && src=0 || src=$?
  else
    sargs=$(args "$p" server rxe0 "$rgid" "$mtu" "$fam" "$saddr_rxe")
    cargs=$(args "$p" client softverbs0 "$vgid" "$mtu" "$fam" "$oob_rxe")
    echo "rxe:       $bin $sargs" >"$dir/commands"
    echo "softverbs: $bin $cargs" >>"$dir/commands"
    vm "(timeout $T $bin $sargs >/tmp/srv.out 2>&1; echo \$? >/tmp/srv.rc) </dev/null >/dev/null 2>&1 &" >/dev/null
    wait_listening rxe "$p"
    # shellcheck disable=SC2086
    svrun timeout "$T" "$bin" $cargs >"$dir/client.out" 2>&1 && crc=0 || crc=$?
    vm "while [ ! -f /tmp/srv.rc ]; do sleep 0.5; done; cat /tmp/srv.out; exit \$(cat /tmp/srv.rc)" \
      >"$dir/server.out" 2>&1 && src=0 || src=$?
  fi
  # a failing case: the daemon's counters (rejected packets by reason) before it stops
  if [ "$src" != 0 ] || [ "$crc" != 0 ]; then
    SOFTVERBS_SOCKET=$work/sv.sock "$sv" status >"$dir/softverbs-status.txt" 2>&1 || true
  fi
  stop_daemon
  # dumpcap writes what it has read when it stops; the last packets may still be in the
  # kernel's buffer for a moment (without this a failing case's tap capture lacked its end).
  sleep 1
  kill "$dumpcap_pid" 2>/dev/null || true
  wait "$dumpcap_pid" 2>/dev/null || true
  dumpcap_pid=
  echo "server $src client $crc" >"$dir/result"
  if [ "$src" = 0 ] && [ "$crc" = 0 ]; then
    [ -n "${SOFTVERBS_RXE_KEEP_CAPTURES:-}" ] || rm -rf "$dir/sv" "$dir/tap.pcapng" "$dir/dumpcap.log"
    return 0
  fi
  # A failure keeps both captures, rxe's view of it, and the CM MADs decoded for a diff.
  vm 'dmesg | grep -i rxe' >"$dir/vm-dmesg-rxe.txt" 2>&1 || true
  vm 'rdma statistic show link rxe0/1' >"$dir/vm-rxe-counters.txt" 2>&1 || true
  if is_cm "$p"; then
    tshark -r "$dir/tap.pcapng" -d udp.port==4791,infiniband -Y infiniband.mad -V \
      >"$dir/cm-mads-tap.txt" 2>&1 || true
    for f in "$dir"/sv/*.pcap*; do
      [ -e "$f" ] || continue
      tshark -r "$f" -d udp.port==4791,infiniband -Y infiniband.mad -V \
        >"$dir/cm-mads-softverbs-$(basename "${f%.pcap*}").txt" 2>&1 || true
    done
  fi
  return 1
}

declare -A result=()
failed=0
current_mtu=
for c in "${cases[@]}"; do
  IFS=: read -r _ _ mtu _ <<<"$c"
  if [ "$mtu" != "$current_mtu" ]; then
    set_mtu "$mtu"
    current_mtu=$mtu
  fi
  t1=$(date +%s)
  if run_case "$c"; then
    result[$c]="pass $(($(date +%s) - t1))s"
  else
    result[$c]="FAIL $(($(date +%s) - t1))s ($(cat "$out/cases/${c//:/_}/result" 2>/dev/null))"
    failed=$((failed + 1))
    log "FAILED: $c (kept in $out/cases/${c//:/_})"
  fi
  log "$c: ${result[$c]}"
done

{
  printf '%-32s %s\n' CASE RESULT
  for c in "${cases[@]}"; do printf '%-32s %s\n' "$c" "${result[$c]}"; done
  echo "$((${#cases[@]} - failed)) of ${#cases[@]} passed ($booted, $(($(date +%s) - t0)) s, kernel $(basename "$kernel"))"
} | tee "$out/summary.txt"
[ "$failed" = 0 ]
