//! The daemon's side of the net path (docs/design/net-path.md): which QPs a client library runs
//! itself over a private socket, and each context's socket. The daemon's engine keeps its
//! copy of such a QP (its state mirrors the core's) but never sees its packets: the device
//! forwards them to the library's socket (`crate::netdev`, `NetDev::forward_qp`).

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use softverbs_abi::direct::{
    NS_CAPACITY, NS_DAEMON_LOST, NS_FLOOR_SET, NS_RAN, NS_RETRY_FLOOR, NS_SLOT, NS_SLOTS, NS_VALID,
};
use softverbs_shm::Region;
use softverbs_wire::bth::dest_qp_of;
use softverbs_wire::opcode::Opcode;
use softverbs_wire::Direction;

use softverbs_core::device::Gid;
use softverbs_core::errno::{EINVAL, ENOMEM};
use softverbs_core::ids::CtxId;
use softverbs_transport::DropStats;

use super::DataPath;

/// The net path's bookkeeping.
#[derive(Debug, Default)]
pub(super) struct NetPaths {
    /// Each context's private socket on a device, by (context, device): the daemon's copy
    /// (the port stays the context's until it closes) and its address.
    pub(super) sockets: HashMap<(CtxId, usize), (UdpSocket, SocketAddr)>,
    /// QPs on the path, with their device.
    qps: HashMap<u32, usize>,
    /// What each context's library engine reported it dropped (`NetDrops`: totals).
    reported: HashMap<CtxId, DropStats>,
    /// The last reports of contexts that are gone.
    closed: DropStats,
    /// The counters the libraries of closed contexts last published, by device.
    pub(super) closed_counters: HashMap<usize, softverbs_transport::Counters>,
    /// Each QP on the path's context.
    pub(super) owners: HashMap<u32, CtxId>,
    /// Each context's net status region, which its library writes (docs/design/net-path.md,
    /// "Stalls").
    pub(super) status: HashMap<CtxId, Status>,
    /// RNR NAKs sent for libraries that did not run ([`DataPath::net_answer`]).
    answered: u64,
    /// Contexts whose QPs' packets the daemon takes while their library does not run
    /// ([`DataPath::net_watch`]).
    taken: std::collections::HashSet<CtxId>,
    /// When [`DataPath::net_watch`] last looked (`CLOCK_MONOTONIC` ns).
    watched: u64,
}

/// How often the daemon looks whether the libraries with a net status region run, while
/// any has one: a stopped library is answered for within this, far inside the retry budget
/// of any peer (IBA timeout code 14, `ibv_rc_pingpong`'s: seven retries of 67 ms).
pub const WATCH: Duration = Duration::from_millis(10);

impl NetPaths {
    /// Whether packet `pkt` (BTH first) is for a QP whose library runs its engine: the
    /// daemon's copy of that QP has no responder state of its own to answer with.
    pub(super) fn runs(&self, pkt: &[u8]) -> bool {
        !self.owners.is_empty() && self.owners.contains_key(&dest_qp_of(pkt))
    }
}

/// A context's net status region (`softverbs_abi::direct::NS_LEN` bytes, written by its
/// library: untrusted) and the pid of the process that opened the context.
#[derive(Debug)]
pub(super) struct Status {
    /// Shared with the device forwarders of the context's sockets, which read its stamp
    /// at forward time (`NetDev::stamp_from`).
    pub(super) region: Arc<Region>,
    pid: u32,
}

/// A library whose stamp is older than this is held (`DataPath::net_watch`): its peers'
/// requests are answered by the daemon as well as forwarded. Shorter than the retry budget
/// of a short ACK timeout (IBA code 10, 4 ms, eight tries: 33 ms) with [`WATCH`]; an idle
/// library's stamp may be older (its progress thread sleeps up to 20 ms), and the request
/// that finds it held wakes it, after which the next look releases it.
pub const STALE: Duration = Duration::from_millis(10);

/// Whether a library whose last-ran stamp is `ran` has not run for [`STALE`] at `now`
/// (both `CLOCK_MONOTONIC` ns; 0 is "never stamped"): the one rule of the watcher
/// ([`DataPath::net_watch`]), the forwarder (at forward time) and [`answer_for`].
pub fn stale(ran: u64, now: u64) -> bool {
    ran != 0 && now.saturating_sub(ran) > STALE.as_nanos() as u64
}

/// What the daemon may answer for QP `qpn` of a context whose status region is `r` at
/// `now` (`CLOCK_MONOTONIC` ns): the responder state (expected PSN, MSN) the library
/// published, if the library has not run for [`STALE`] or `stopped` says its process is
/// stopped; `None` while it runs, or if it published nothing for `qpn`. Everything read is
/// the client's word: a scribble yields at most a wrong PSN in an RNR NAK for that client's
/// own QP, which its peer drops as outside its window.
pub fn answer_for(
    r: &Region,
    qpn: u32,
    now: u64,
    stopped: impl FnOnce() -> bool,
) -> Option<(u32, u32)> {
    let ran = r.atomic_u64s(NS_RAN, 1)[0].load(Ordering::Acquire);
    if !stale(ran, now) && !stopped() {
        return None;
    }
    let want = u64::from(qpn) | NS_VALID;
    (0..NS_CAPACITY).find_map(|i| {
        let w = r.atomic_u64s(NS_SLOTS + i * NS_SLOT, 2);
        if w[0].load(Ordering::Acquire) != want {
            return None;
        }
        let v = w[1].load(Ordering::Acquire);
        // Re-read: the slot may have been given to another QP meanwhile.
        if v == u64::MAX || w[0].load(Ordering::Acquire) != want {
            return None;
        }
        Some(((v >> 32) as u32 & 0xFF_FFFF, v as u32 & 0xFF_FFFF))
    })
}

/// Whether process `pid` is stopped (`T`, by a signal, or `t`, by a tracer: proc(5),
/// `/proc/<pid>/stat` field 3). A pid that no longer exists is not stopped.
pub fn stopped(pid: u32) -> bool {
    let Ok(stat) = std::fs::read(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The command name (field 2) is in parentheses and may hold anything, ')' included:
    // the state follows the last ')'.
    let Some(end) = stat.iter().rposition(|&b| b == b')') else {
        return false;
    };
    matches!(stat.get(end + 2), Some(b'T' | b't'))
}

/// `CLOCK_MONOTONIC` in ns, the clock of the libraries' stamps.
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

/// `a + b`, saturating: a report is the client's word, and any value must leave the daemon
/// standing (the protocol fuzz test sends them).
pub(super) fn add_drops(a: DropStats, b: DropStats) -> DropStats {
    DropStats {
        foreign_source: a.foreign_source.saturating_add(b.foreign_source),
        outside_window: a.outside_window.saturating_add(b.outside_window),
    }
}

impl DataPath {
    /// Whether QP `qpn`'s device may hand its traffic to a library: it is on the network
    /// with its first address, and neither injects faults nor captures (both only see what
    /// the daemon's own socket carries).
    pub fn net_capable(&self, qpn: u32) -> bool {
        let Some(&d) = self.qp_dev.get(&qpn) else {
            return false;
        };
        self.devs[d].net.as_ref().is_some_and(|n| !n.taps())
    }

    /// Whether QP `qpn`'s device writes a capture (`--capture`): its QPs then stay on the
    /// daemon's engine, off the direct path too, so the capture holds their traffic.
    pub fn captures(&self, qpn: u32) -> bool {
        self.qp_dev.get(&qpn).is_some_and(|&d| {
            self.devs[d]
                .net
                .iter()
                .chain(&self.devs[d].more_net)
                .any(crate::netdev::NetDev::captures)
        })
    }

    /// Puts QP `qpn` of `ctx`, connected to `peer`, on the net path: its packets from
    /// `peer` are forwarded to the context's private socket from now on. The socket comes
    /// back the first time the context asks (the library keeps it); `Ok(None)` after that.
    pub fn net_attach(&mut self, ctx: CtxId, qpn: u32, peer: Gid) -> Result<Option<OwnedFd>, i32> {
        let &d = self.qp_dev.get(&qpn).ok_or(EINVAL)?;
        let net = self.devs[d].net.as_mut().ok_or(EINVAL)?;
        let (to, fd) = match self.net_path.sockets.get(&(ctx, d)) {
            Some(&(_, to)) => (to, None),
            None => {
                let (sock, fd, to) = net.open_net_socket().map_err(|_| ENOMEM)?;
                self.net_path.sockets.insert((ctx, d), (sock, to));
                (to, Some(fd))
            }
        };
        net.forward_qp(qpn, peer, to);
        self.net_path.qps.insert(qpn, d);
        self.net_path.owners.insert(qpn, ctx);
        Ok(fd)
    }

    /// A net status region for `ctx`, opened by process `pid` (made with the context's
    /// socket, for a library that asks with `ABLE_NET_STATUS`): the descriptor to hand over.
    /// `len`: `NS_LEN`, or `NS_LEN_COUNTERS` for a library that publishes its counters.
    pub fn net_status_open(&mut self, ctx: CtxId, pid: u32, len: usize) -> Result<OwnedFd, i32> {
        let (region, fd) = Region::create("softverbs-net-status", len).map_err(|_| ENOMEM)?;
        // The library's engine retries by this daemon's floor (all devices share it).
        let floor = self
            .devs
            .first()
            .map_or(softverbs_transport::time::RETRY_FLOOR, |d| {
                d.engine.retry_floor()
            });
        let floor_ns = u64::try_from(floor.as_nanos()).unwrap_or(u64::MAX) & !NS_FLOOR_SET;
        region.atomic_u64s(NS_RETRY_FLOOR, 1)[0].store(floor_ns | NS_FLOOR_SET, Ordering::Release);
        let region = Arc::new(region);
        // The forwarders of the context's sockets read its stamp for every request they
        // forward: a stale library is answered for at once, not at the watcher's next look.
        for (&(c, d), &(_, to)) in &self.net_path.sockets {
            if c == ctx {
                if let Some(n) = self.devs[d].net.as_mut() {
                    n.stamp_from(to, region.clone());
                }
            }
        }
        self.net_path.status.insert(ctx, Status { region, pid });
        Ok(fd)
    }

    /// Request `pkt` (BTH first, ICRC checked) for a net-path QP reached device `d`'s
    /// socket instead of the library's: if the library does not run
    /// ([`DataPath::net_answer_for`]), the daemon answers for it with an RNR NAK at the
    /// expected PSN and MSN it published (`Engine::rnr_nak_for`, from the daemon's copy of
    /// the QP): the peer waits and retransmits without spending its retry count
    /// (docs/design/net-path.md, "Stalls"). Otherwise, and for a response, the packet is dropped
    /// (its requester retransmits; the library's engine is the only one with the QP's
    /// state). True if it answered.
    pub(super) fn net_answer(&mut self, d: usize, pkt: &[u8]) -> bool {
        let request = pkt
            .first()
            .and_then(|&op| Opcode(op).info().ok())
            .is_some_and(|i| i.direction == Direction::Request);
        if !request {
            return false;
        }
        let qpn = dest_qp_of(pkt);
        let Some((epsn, msn)) = self.net_answer_for(qpn) else {
            return false;
        };
        // Every request is answered, not only the one at the expected PSN as the responder
        // itself would (one NAK per gap): a requester whose one answered packet is lost
        // waits a whole ACK timeout and spends a retry, which no RNR NAK gives back.
        // A duplicate (before the expected PSN: received, its ACK not sent before the
        // process stopped) is acknowledged, as the responder would (IBA 9.7.5.1.1); an RNR
        // NAK at the expected PSN would be outside the requester's window if it has sent
        // nothing there yet. A READ or atomic duplicate needs its response, which only the
        // library can give: not answered.
        let Ok(parsed) = softverbs_wire::Packet::parse(pkt) else {
            return false;
        };
        let dup = softverbs_wire::psn::psn_diff(parsed.headers.bth.psn, epsn) < 0;
        let read_or_atomic = matches!(
            parsed.info.operation,
            softverbs_wire::Operation::RdmaReadRequest
                | softverbs_wire::Operation::CompareSwap
                | softverbs_wire::Operation::FetchAdd
        );
        if dup && read_or_atomic {
            return false;
        }
        let mut buf = [0u8; 64];
        let e = &self.devs[d].engine;
        let tx = if dup {
            e.ack_for(qpn, epsn, msn, &mut buf)
        } else {
            e.rnr_nak_for(qpn, epsn, msn, &mut buf)
        };
        let Some(tx) = tx else {
            return false;
        };
        let Some(n) = self.devs[d].net.as_mut() else {
            return false;
        };
        if let Err(e) = n.send(&tx, &mut buf[..tx.len]) {
            tracing::debug!(qpn, "RNR NAK for a stalled library not sent: {e}");
            return false;
        }
        self.net_path.answered += 1;
        true
    }

    /// Holds the QPs of a library that does not run — its process is stopped
    /// ([`stopped`]) or its stamp is older than [`STALE`] — in the device's forwarder:
    /// their peers' requests also reach [`Self::net_answer`], which answers them; releases
    /// them once it runs again. At most every [`WATCH`].
    pub(super) fn net_watch(&mut self) {
        if self.net_path.status.is_empty() {
            return;
        }
        let now = monotonic_ns();
        if now.saturating_sub(self.net_path.watched) < WATCH.as_nanos() as u64 {
            return;
        }
        self.net_path.watched = now;
        // A stopped process, or one whose library has not run for `STALE` (starved of a
        // CPU): its requests are forwarded all the same (a starved library takes them when
        // it runs), and only answered besides; responses go on to it alone.
        let ctxs: Vec<(CtxId, bool)> = self
            .net_path
            .status
            .iter()
            .map(|(&c, st)| {
                let ran = st.region.atomic_u64s(NS_RAN, 1)[0].load(Ordering::Acquire);
                (c, stale(ran, now) || stopped(st.pid))
            })
            .collect();
        for (ctx, idle) in ctxs {
            if idle == self.net_path.taken.contains(&ctx) {
                continue;
            }
            let qps: Vec<(u32, usize)> = self
                .net_path
                .owners
                .iter()
                .filter(|(_, &c)| c == ctx)
                .filter_map(|(&q, _)| Some((q, *self.net_path.qps.get(&q)?)))
                .collect();
            for (qpn, d) in qps {
                if let Some(n) = self.devs[d].net.as_mut() {
                    n.hold_qp(qpn, idle);
                }
            }
            if idle {
                tracing::debug!(?ctx, "library does not run: the daemon answers for it");
                self.net_path.taken.insert(ctx);
            } else {
                self.net_path.taken.remove(&ctx);
            }
        }
    }

    /// Tells the devices' forwarders this round's clock, against which they judge the
    /// stamps of the libraries they forward to (only while any library publishes one).
    pub(super) fn net_clock(&mut self) {
        if self.net_path.status.is_empty() {
            return;
        }
        let now = monotonic_ns();
        for dev in &mut self.devs {
            if let Some(n) = dev.net.as_mut() {
                n.set_clock(now);
            }
        }
    }

    /// This daemon could not run for `lost`: every library that publishes learns it
    /// (`NS_DAEMON_LOST`), since the packets of its QPs, their ACKs among them, waited in
    /// the forwarder as long, and rebases its requester timers by it as by its own stalls
    /// (docs/design/net-path.md, "Stalls").
    pub(super) fn net_status_stalled(&self, lost: Duration) {
        let ns = u64::try_from(lost.as_nanos()).unwrap_or(u64::MAX);
        for st in self.net_path.status.values() {
            st.region.atomic_u64s(NS_DAEMON_LOST, 1)[0].fetch_add(ns, Ordering::Release);
        }
    }

    /// How long until [`Self::net_watch`] looks again, while any library publishes.
    pub(super) fn net_watch_next(&self) -> Option<Duration> {
        if self.net_path.status.is_empty() {
            return None;
        }
        let since = monotonic_ns().saturating_sub(self.net_path.watched);
        Some(WATCH.saturating_sub(Duration::from_nanos(since)))
    }

    /// RNR NAKs the daemon sent for libraries that did not run.
    pub fn net_answered(&self) -> u64 {
        self.net_path.answered
    }

    /// Whether the daemon answers for net-path QP `qpn` now, and with what responder state
    /// (expected PSN, MSN): its library has not run for [`STALE`], or its process is
    /// stopped ([`answer_for`]). `None` for a QP not on the path or a library that
    /// publishes nothing.
    pub fn net_answer_for(&self, qpn: u32) -> Option<(u32, u32)> {
        let ctx = self.net_path.owners.get(&qpn)?;
        let st = self.net_path.status.get(ctx)?;
        answer_for(&st.region, qpn, monotonic_ns(), || stopped(st.pid))
    }

    /// The device port QP `qpn`'s peers send to (4791 outside tests), for the library.
    pub fn net_port(&self, qpn: u32) -> Option<u16> {
        let &d = self.qp_dev.get(&qpn)?;
        Some(self.devs[d].net.as_ref()?.port())
    }

    /// QP `qpn` leaves the net path (destroyed, or connected anew elsewhere): its packets
    /// reach the daemon's engine again.
    pub fn net_detach(&mut self, qpn: u32) {
        self.net_path.owners.remove(&qpn);
        if let Some(d) = self.net_path.qps.remove(&qpn) {
            if let Some(n) = self.devs[d].net.as_mut() {
                n.unforward_qp(qpn);
            }
        }
    }

    /// Whether QP `qpn` is on the net path.
    pub fn on_net_path(&self, qpn: u32) -> bool {
        self.net_path.qps.contains_key(&qpn)
    }

    /// How many QPs are on the net path.
    pub fn net_qps(&self) -> usize {
        self.net_path.qps.len()
    }

    /// `NetDrops`: the totals of `ctx`'s library engine, replacing its last report (a
    /// library can only report for the context it holds).
    pub fn net_drops_reported(&mut self, ctx: CtxId, totals: DropStats) {
        self.net_path.reported.insert(ctx, totals);
    }

    /// What the libraries' engines reported, those of closed contexts included.
    pub(super) fn net_reported_drops(&self) -> DropStats {
        self.net_path
            .reported
            .values()
            .fold(self.net_path.closed, |a, &b| add_drops(a, b))
    }

    /// Context `ctx` is gone: its sockets close and nothing is forwarded to them any more
    /// (its QPs were detached as they were destroyed), and its last report stays counted.
    pub(super) fn net_context_closed(&mut self, ctx: CtxId) {
        self.net_counters_closed(ctx);
        self.net_path.status.remove(&ctx);
        self.net_path.taken.remove(&ctx);
        if let Some(r) = self.net_path.reported.remove(&ctx) {
            self.net_path.closed = add_drops(self.net_path.closed, r);
        }
        let mine: Vec<usize> = self
            .net_path
            .sockets
            .keys()
            .filter(|(c, _)| *c == ctx)
            .map(|&(_, d)| d)
            .collect();
        for d in mine {
            if let Some((_sock, to)) = self.net_path.sockets.remove(&(ctx, d)) {
                if let Some(n) = self.devs[d].net.as_mut() {
                    n.unforward_to(to);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region() -> Region {
        Region::create("test-net-status", softverbs_abi::direct::NS_LEN)
            .unwrap()
            .0
    }

    fn publish(r: &Region, slot: usize, qpn: u32, epsn: u32, msn: u32) {
        let w = r.atomic_u64s(NS_SLOTS + slot * NS_SLOT, 2);
        w[0].store(u64::from(qpn) | NS_VALID, Ordering::Relaxed);
        w[1].store((u64::from(epsn) << 32) | u64::from(msn), Ordering::Relaxed);
    }

    /// The daemon answers for a QP only when its library has not run for `STALE` or its
    /// process is stopped, with what the library published for that QP; and a scribbled
    /// region yields nothing, or 24-bit values.
    #[test]
    fn the_daemon_answers_only_for_a_library_that_does_not_run() {
        let r = region();
        let ms = 1_000_000u64;
        r.atomic_u64s(NS_RAN, 1)[0].store(1_000 * ms, Ordering::Relaxed);
        publish(&r, 3, 0x11, 0x00AB_CDEF, 42);
        // Running: nothing, whatever the QP.
        assert_eq!(answer_for(&r, 0x11, 1_010 * ms, || false), None);
        // Stopped (by /proc) or stale (by its stamp): the published state.
        assert_eq!(
            answer_for(&r, 0x11, 1_010 * ms, || true),
            Some((0x00AB_CDEF, 42))
        );
        assert_eq!(
            answer_for(&r, 0x11, 1_030 * ms, || false),
            Some((0x00AB_CDEF, 42))
        );
        // Another QP of that library published nothing.
        assert_eq!(answer_for(&r, 0x12, 1_030 * ms, || true), None);
        // A slot taken but not yet written is no answer.
        let w = r.atomic_u64s(NS_SLOTS + 5 * NS_SLOT, 2);
        w[0].store(0x13 | NS_VALID, Ordering::Relaxed);
        w[1].store(u64::MAX, Ordering::Relaxed);
        assert_eq!(answer_for(&r, 0x13, 1_030 * ms, || true), None);
        // Scribbles: every value stays a 24-bit PSN and MSN.
        publish(&r, 7, 0x14, u32::MAX, 0xFFFF_FFFE);
        assert_eq!(
            answer_for(&r, 0x14, 1_030 * ms, || true),
            Some((0xFF_FFFF, 0xFF_FFFE))
        );
    }

    /// The one staleness rule: older than `STALE`, and never for a library that never
    /// stamped.
    #[test]
    fn a_stamp_is_stale_only_past_stale() {
        let ms = 1_000_000u64;
        assert!(!stale(1_000 * ms, 1_010 * ms));
        assert!(stale(1_000 * ms, 1_010 * ms + 1));
        assert!(!stale(0, 1_030 * ms));
        assert!(!stale(1_030 * ms, 1_000 * ms), "a stamp ahead of the clock");
    }

    /// `stopped` reads the state of `/proc/<pid>/stat`: a child stopped by SIGSTOP is, the
    /// same child continued is not, and neither is a pid that does not exist.
    #[test]
    fn a_process_stopped_by_a_signal_is_seen_stopped() {
        use rustix::process::{kill_process, waitpid, Pid, Signal, WaitOptions};
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = Pid::from_raw(child.id() as i32).unwrap();
        assert!(!stopped(child.id()), "running");
        kill_process(pid, Signal::STOP).unwrap();
        // Wait until the kernel reports it stopped (no sleep, no timing).
        waitpid(Some(pid), WaitOptions::UNTRACED).unwrap();
        assert!(stopped(child.id()), "stopped");
        kill_process(pid, Signal::CONT).unwrap();
        waitpid(Some(pid), WaitOptions::CONTINUED).unwrap();
        assert!(!stopped(child.id()), "continued");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!stopped(child.id()), "gone");
    }
}
