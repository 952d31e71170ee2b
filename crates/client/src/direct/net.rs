//! The engine in the library (docs/design/net-path.md): an RC QP connected to a QP of another host
//! is run by this process itself — the transport engine of `crates/transport`, over a private
//! UDP socket of the context that it sends from and the daemon forwards the QP's packets to
//! (docs/design/net-path.md, "Receiving") — so a message costs one `sendmsg` in the sender and one `recvmsg` in the receiver,
//! as UCX over TCP does, instead of a turn of both daemons (docs/performance.md, "Issue 16:
//! what the engine in the client library would reach"). The daemon keeps the control path:
//! creation, connection, the QP's state as `ibv_query_qp` shows it, async events, cleanup.
//!
//! Keys are checked against the context's MR table, which the daemon keeps in shared memory
//! (`crates/abi/src/direct.rs`, [`super::lookup`]), with the core's rules
//! (`crates/core/src/datapath.rs`, `check_mem`); bytes move with plain copies into this
//! process's registered memory (`softverbs_memaccess::{read_own, write_own}`), or through
//! `/proc/self/mem` for on-demand-paging MRs, whose pages the program may have unmapped.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::time::Duration;

use foldhash::HashMap;
use softverbs_abi::direct::{
    MrEntry, NS_CAPACITY, NS_COUNTERS, NS_COUNTER_WORDS, NS_LEN, NS_LEN_COUNTERS, NS_RETIRED,
    NS_SLOT, NS_SLOTS, NS_VALID,
};
use softverbs_abi::msg::PostRecvReq;
use softverbs_core::attr::QpAttr;
use softverbs_core::datapath::{
    MemError, MemKeys, MemTarget, PdRef, XrcDeliveryError, XrcSrqTarget,
};
use softverbs_core::device::Gid;
use softverbs_core::ids::{CtxId, Handle};
use softverbs_core::memory::{AtomicOp, Fault, Memory};
use softverbs_core::types::{Access, EventType};
use softverbs_core::wr::{Payload, RecvWr, SendWr, Sge};
use softverbs_shm::Region;
use softverbs_transport::Counters;
use softverbs_transport::{Engine, Instant, Output, PostError, QpConfig, RxMeta};

use super::CqQueues;
use crate::error::errno;

/// The context every key and address of the library's engine belongs to: its own.
pub(super) const OWN: CtxId = CtxId(1);

/// `IBV_ACCESS_ON_DEMAND` (verbs.h).
const ON_DEMAND: u32 = 1 << 6;

/// Whether this process runs the engine for its QPs connected to another host: unless
/// `SOFTVERBS_NET=0` (the same-host direct path must be on too, `SOFTVERBS_DIRECT`).
pub(crate) fn wanted() -> bool {
    std::env::var_os("SOFTVERBS_NET").is_none_or(|v| v != "0")
}

/// The context's MR table as the engine's key checks see it.
struct OwnKeys<'a>(&'a Region);

impl MemKeys for OwnKeys<'_> {
    fn check_mem(
        &self,
        pd: PdRef,
        key: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<MemTarget, MemError> {
        let e: MrEntry = super::lookup(self.0, key).ok_or(MemError::UnknownKey)?;
        // The core's order: key, PD, bounds, access.
        if pd.ctx != OWN || e.pd != pd.pd.0 {
            return Err(MemError::WrongPd);
        }
        let addr = e.translate(va, len).ok_or(MemError::OutOfBounds)?;
        if !Access(e.access).contains(need) {
            return Err(MemError::AccessDenied);
        }
        Ok(MemTarget {
            ctx: OWN,
            mr: Handle(key),
            addr,
            len,
            on_demand: e.access & ON_DEMAND != 0,
        })
    }

    /// Memory windows are bound by the daemon's engine only: a bind posted on a QP of this
    /// path fails (`MW_BIND_ERR`), as for an MR the core does not know.
    fn mr_for_bind(&self, _lkey: u32) -> Option<softverbs_core::mw::MrForBind> {
        None
    }

    fn resolve_xrc_srq(&self, _qpn: u32, _srqn: u32) -> Result<XrcSrqTarget, XrcDeliveryError> {
        Err(XrcDeliveryError::NotXrcRecv)
    }
}

/// This process's registered memory.
struct OwnMem {
    /// `/proc/self/mem`, for on-demand-paging MRs (a fault there is an error, not SIGSEGV).
    mem: Option<std::fs::File>,
}

impl OwnMem {
    fn mem(&mut self, addr: u64) -> Result<&std::fs::File, Fault> {
        if self.mem.is_none() {
            self.mem = softverbs_memaccess::open_own_memory()
                .ok()
                .map(std::fs::File::from);
        }
        self.mem.as_ref().ok_or(Fault { ctx: OWN, addr })
    }
}

impl Memory for OwnMem {
    fn read(&mut self, _ctx: CtxId, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        softverbs_memaccess::read_own(addr, buf);
        Ok(())
    }

    fn write(&mut self, _ctx: CtxId, addr: u64, data: &[u8]) -> Result<(), Fault> {
        softverbs_memaccess::write_own(addr, data);
        Ok(())
    }

    fn atomic(&mut self, ctx: CtxId, addr: u64, op: AtomicOp) -> Result<u64, Fault> {
        softverbs_memaccess::atomic_own(addr, op).ok_or(Fault { ctx, addr })
    }

    fn read_mapped(&mut self, _ctx: CtxId, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        self.mem(addr)?
            .read_exact_at(buf, addr)
            .map_err(|_| Fault { ctx: OWN, addr })
    }

    fn write_mapped(&mut self, _ctx: CtxId, addr: u64, data: &[u8]) -> Result<(), Fault> {
        self.mem(addr)?
            .write_all_at(data, addr)
            .map_err(|_| Fault { ctx: OWN, addr })
    }

    fn atomic_mapped(&mut self, ctx: CtxId, addr: u64, op: AtomicOp) -> Result<u64, Fault> {
        // Read, apply, write through the descriptor: atomic with respect to this engine's
        // other atomics (one thread holds it), as the daemon's engine is with its own.
        let mut b = [0u8; 8];
        self.read_mapped(ctx, addr, &mut b)?;
        let old = u64::from_ne_bytes(b);
        self.write_mapped(ctx, addr, &op.apply(old).to_ne_bytes())?;
        Ok(old)
    }
}

/// An SRQ of the context as the engine takes from it: its shared ring, which the daemon's
/// engine and the program's posts share (docs/design/direct-path.md, "SRQs").
pub(super) struct OwnSrq {
    ring: super::PeerSrq,
    /// The QPs of the net path on it, by handle: `DirectSrqLimit` names the SRQ by one.
    qps: Vec<u32>,
    /// A receive taken left it below its armed limit, which the take disarmed: the daemon
    /// raises the event ([`tell_errors`]).
    limit_due: std::cell::Cell<bool>,
}

impl OwnSrq {
    fn from_resp(
        r: &softverbs_abi::msg::DirectAttachResp,
        fd: Option<OwnedFd>,
        qp: u32,
    ) -> Option<OwnSrq> {
        Some(OwnSrq {
            ring: super::PeerSrq::from_resp(r, fd?)?,
            qps: vec![qp],
            limit_due: std::cell::Cell::new(false),
        })
    }
}

/// The engine's view of the SRQs: a receive is taken from the ring when a message needs one.
struct Feed<'a>(&'a HashMap<u32, OwnSrq>);

impl softverbs_transport::SrqFeed for Feed<'_> {
    fn next_recv(&mut self, key: softverbs_transport::SrqKey) -> Option<RecvWr> {
        let s = self.0.get(&key.1 .0)?;
        let mut r = PostRecvReq::default();
        // A corrupt ring (the program's own memory) holds nothing to take.
        if !super::pop_srq(&s.ring, &mut r).ok()? {
            return None;
        }
        if s.ring.crossed_limit() {
            s.limit_due.set(true);
        }
        Some(recv_wr(&r))
    }
}

/// The engine of one context's QPs on this path, with their socket.
pub(super) struct Net {
    engine: Engine,
    udp: super::udp::Udp,
    gid: Gid,
    epoch: std::time::Instant,
    mem: OwnMem,
    /// ACKs of one round, their ICRC slots unwritten, sent after its requests
    /// (docs/design/net-path.md, "Order").
    acks: Vec<u8>,
    ack_ends: Vec<(usize, SocketAddr)>,
    /// QP numbers this engine runs, with their handles.
    qps: HashMap<u32, u32>,
    /// Each QP's path peer (the daemon forwards only what came from it).
    peers: HashMap<u32, Gid>,
    /// SRQs its QPs receive through, by handle (`OwnSrq`).
    srqs: HashMap<u32, OwnSrq>,
    /// QPs the engine moved to ERR, with their event, for the daemon to learn
    /// ([`Net::take_errors`]).
    errors: Vec<(u32, Option<EventType>)>,
    /// Packets dropped here: not forwarded by the daemon (another sender), or for a QP this
    /// engine does not run.
    pub(super) rejected: u64,
    /// Shared with the progress thread: whether something waits for a later round.
    act: std::sync::Arc<super::progress::Activity>,
    /// The drops last reported to the daemon ([`tell_drops`]).
    reported: softverbs_transport::DropStats,
    /// Since when (engine time) ACKs have been kept for the program's next post by the rule
    /// for WRITEs ([`Round::Poll`]); `None` if they are not.
    held_since: Option<Instant>,
    /// Each QP's slot in the net status region, with the responder state last written
    /// there ([`Net::publish`]).
    slots: HashMap<u32, (usize, u64)>,
    /// Each QP's counters as last written to its slot's counter block
    /// ([`Net::publish_counters`]).
    published: HashMap<u32, Counters>,
}

// Every counter has a word in a slot's counter block of the net status region.
const _: () = assert!(Counters::NAMES.len() <= NS_COUNTER_WORDS);

/// How long a poll keeps back the ACK of a WRITE for the program's next post
/// ([`Round::Poll`]): in a WRITE ping-pong the post comes within a round trip of the
/// packets; two programs that both wait for their own ACK while holding the other's are
/// released within this.
const HOLD: Duration = Duration::from_micros(20);

impl Drop for Net {
    /// ACKs a poll held back leave before the socket closes: the peer's requests were
    /// delivered, and a NIC would have acknowledged them on arrival.
    fn drop(&mut self) {
        self.send_acks();
    }
}

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Net")
            .field("local", &self.udp.local)
            .field("qps", &self.qps.len())
            .finish_non_exhaustive()
    }
}

/// `ibv_post_send`/`ibv_post_recv`'s errno for an engine refusal.
fn post_errno(e: PostError) -> i32 {
    match e {
        PostError::Full => errno::ENOMEM,
        PostError::NoQueue | PostError::BadState | PostError::Invalid => errno::EINVAL,
    }
}

/// Who drives a round of the engine ([`Net::drive`]), and so whether its ACKs wait.
///
/// An ACK sent ahead of the request the program posts next costs the peer a round: in a
/// ping-pong the peer's poll returns on the ACK, and the request it waits for then lands
/// while it is no longer polling — and only the peer's progress thread, napping, can take
/// it (docs/design/net-path.md, "Order"). A round that is likely to be followed by such a post
/// keeps its ACKs back; a round that sends requests sends them behind; the progress thread
/// sends what is held if the program makes no round within `progress::SHORT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Round {
    /// The program's `ibv_poll_cq`. A round that queued a completion keeps its ACKs for the
    /// next round (the program is about to look at it and, in a ping-pong, to post the
    /// reply). A round that took packets while a request of this engine waits for its ACK
    /// keeps them for up to [`HOLD`]: the program is polling for its own completion and
    /// posts next — `ib_write_lat`, whose peer's WRITE completes nothing here.
    Poll,
    /// The progress thread, for a program that polled lately but is not polling now (it
    /// spins on its memory for the peer's WRITE): the ACKs wait for the program's post.
    Between,
    /// The progress thread, for a program that is not using the path (asleep on a channel,
    /// a target of WRITEs doing something else), or sending what a round held.
    Alone,
}

/// Whether `pkt` ends a message that completes a receive here: the last or only packet of
/// a SEND, or of an RDMA WRITE with immediate (IBA table 38, `crates/wire/src/opcode.rs`).
fn ends_receive(pkt: &[u8]) -> bool {
    use softverbs_wire::opcode::{Opcode, Operation as O};
    pkt.first()
        .and_then(|&op| Opcode(op).info().ok())
        .is_some_and(|i| {
            matches!(
                i.operation,
                O::SendLast
                    | O::SendLastWithImmediate
                    | O::SendOnly
                    | O::SendOnlyWithImmediate
                    | O::SendLastWithInvalidate
                    | O::SendOnlyWithInvalidate
                    | O::RdmaWriteLastWithImmediate
                    | O::RdmaWriteOnlyWithImmediate
            )
        })
}

/// A receive as the ring carries it, for the engine.
pub(super) fn recv_wr(r: &PostRecvReq) -> RecvWr {
    let n = (r.num_sge.get() as usize).min(r.sg_list.len());
    RecvWr {
        wr_id: r.wr_id.get(),
        sges: r.sg_list[..n]
            .iter()
            .map(|s| Sge {
                addr: s.addr.get(),
                length: s.length.get(),
                lkey: s.lkey.get(),
            })
            .collect(),
    }
}

impl Net {
    /// The engine over `sock`, the context's private socket the daemon handed out, on a
    /// device whose port is `dev_port`.
    pub(super) fn new(
        sock: OwnedFd,
        dev_port: u16,
        act: std::sync::Arc<super::progress::Activity>,
    ) -> io::Result<Net> {
        let udp = super::udp::Udp::new(UdpSocket::from(sock), dev_port)?;
        Ok(Net {
            engine: Engine::new(),
            gid: Gid::from_ip(udp.local),
            udp,
            epoch: act.epoch,
            mem: OwnMem { mem: None },
            acks: Vec::new(),
            ack_ends: Vec::new(),
            qps: HashMap::default(),
            peers: HashMap::default(),
            srqs: HashMap::default(),
            errors: Vec::new(),
            rejected: 0,
            act,
            reported: Default::default(),
            held_since: None,
            slots: HashMap::default(),
            published: HashMap::default(),
        })
    }

    /// The socket, for a thread that waits on it.
    pub(super) fn socket(&self) -> io::Result<OwnedFd> {
        self.udp.sock.as_fd().try_clone_to_owned()
    }

    fn now(&self) -> Instant {
        Instant(self.epoch.elapsed().as_nanos() as u64)
    }

    /// Takes QP `qpn` (`handle`) over with `cfg`, in the state `attr` says (RTR or later:
    /// the expected PSN is loaded), and the receives posted before.
    pub(super) fn add_qp(
        &mut self,
        handle: u32,
        cfg: QpConfig,
        attr: &QpAttr,
        held: &[PostRecvReq],
    ) -> Result<(), i32> {
        let qpn = cfg.qpn;
        self.engine.create_qp(cfg);
        // From RESET to the daemon's state in one step: the engine loads what each state
        // needs (`Engine::modify_qp`).
        let rtr = QpAttr {
            qp_state: softverbs_core::types::QpState::Rtr,
            ..*attr
        };
        self.engine.modify_qp(qpn, &rtr);
        if attr.qp_state != rtr.qp_state {
            self.engine.modify_qp(qpn, attr);
        }
        self.qps.insert(qpn, handle);
        self.take_slot(qpn);
        self.peers.insert(qpn, attr.ah_attr.dgid);
        for r in held {
            self.engine.post_recv(qpn, recv_wr(r)).map_err(post_errno)?;
        }
        Ok(())
    }

    /// SRQ `handle` (its receive buffers in PD `pd`) feeds QPs of the engine from now on.
    pub(super) fn add_srq(&mut self, handle: u32, pd: u32, s: OwnSrq) {
        if let Some(known) = self.srqs.get_mut(&handle) {
            known.qps.extend(s.qps);
            return;
        }
        let cap = s.ring.taker.layout().capacity();
        self.engine.create_srq(softverbs_transport::SrqConfig {
            key: (OWN, Handle(handle)),
            pd: PdRef {
                ctx: OWN,
                pd: Handle(pd),
            },
            cq: None,
            max_wr: cap,
            max_sge: PostRecvReq::default().sg_list.len() as u32,
        });
        self.srqs.insert(handle, s);
    }

    /// The daemon's attributes of `qpn` after a modify.
    pub(super) fn modify(&mut self, qpn: u32, attr: &QpAttr) {
        self.engine.modify_qp(qpn, attr);
        if attr.ah_attr.dgid != Gid::default() {
            self.peers.insert(qpn, attr.ah_attr.dgid);
        }
    }

    /// `qpn` leaves the engine (destroyed or reset); the ACKs held back leave first.
    pub(super) fn remove(&mut self, qpn: u32) {
        self.send_acks();
        if let Some(&h) = self.qps.get(&qpn) {
            for s in self.srqs.values_mut() {
                s.qps.retain(|&q| q != h);
            }
        }
        let counters = self.engine.qp_counters(qpn);
        self.engine.destroy_qp(qpn);
        self.qps.remove(&qpn);
        self.peers.remove(&qpn);
        self.published.remove(&qpn);
        if let (Some((i, _)), Some(r)) = (self.slots.remove(&qpn), self.act.status.get()) {
            r.atomic_u64s(NS_SLOTS + i * NS_SLOT, 1)[0].store(0, Ordering::Release);
            // The slot is free first, then its counts join the retired sums: a daemon
            // reading meanwhile misses them for a moment rather than counting them twice.
            if let (Some(c), true) = (counters, r.len() >= NS_LEN_COUNTERS) {
                let words = r.atomic_u64s(NS_RETIRED, NS_COUNTER_WORDS);
                for ((_, v), w) in c.fields().zip(words) {
                    w.fetch_add(v, Ordering::Release);
                }
            }
        }
    }

    /// Writes each QP's counters where the daemon reads them for `softverbs stat`
    /// (docs/guide/counters.md): only those that changed since the last write.
    fn publish_counters(&mut self) {
        let Some(r) = self.act.status.get() else {
            return;
        };
        if r.len() < NS_LEN_COUNTERS {
            return;
        }
        for (&qpn, &(i, _)) in &self.slots {
            let Some(c) = self.engine.qp_counters(qpn) else {
                continue;
            };
            if self.published.get(&qpn) == Some(&c) {
                continue;
            }
            let words = r.atomic_u64s(NS_COUNTERS + i * NS_COUNTER_WORDS * 8, NS_COUNTER_WORDS);
            for ((_, v), w) in c.fields().zip(words) {
                w.store(v, Ordering::Release);
            }
            self.published.insert(qpn, c);
        }
    }

    /// Gives QP `qpn` a free slot of the net status region, if there is a region and a
    /// free slot (docs/design/net-path.md, "Stalls").
    fn take_slot(&mut self, qpn: u32) {
        let Some(r) = self.act.status.get() else {
            return;
        };
        let used: std::collections::HashSet<usize> = self.slots.values().map(|s| s.0).collect();
        let Some(i) = (0..NS_CAPACITY).find(|i| !used.contains(i)) else {
            return;
        };
        let w = r.atomic_u64s(NS_SLOTS + i * NS_SLOT, 2);
        w[1].store(u64::MAX, Ordering::Relaxed);
        if r.len() >= NS_LEN_COUNTERS {
            // A slot used before holds its last QP's counts: zero before it names this QP.
            for c in r.atomic_u64s(NS_COUNTERS + i * NS_COUNTER_WORDS * 8, NS_COUNTER_WORDS) {
                c.store(0, Ordering::Relaxed);
            }
        }
        w[0].store(u64::from(qpn) | NS_VALID, Ordering::Release);
        self.slots.insert(qpn, (i, u64::MAX));
        self.publish();
    }

    /// Writes each QP's responder state (expected PSN, MSN) where the daemon reads it when
    /// it answers for this process (docs/design/net-path.md, "Stalls"); only what changed.
    fn publish(&mut self) {
        let Some(r) = self.act.status.get() else {
            return;
        };
        for (&qpn, slot) in self.slots.iter_mut() {
            let Some((epsn, msn)) = self.engine.responder_psn(qpn) else {
                continue;
            };
            let v = (u64::from(epsn) << 32) | u64::from(msn);
            if slot.1 != v {
                slot.1 = v;
                r.atomic_u64s(NS_SLOTS + slot.0 * NS_SLOT + 8, 1)[0].store(v, Ordering::Release);
            }
        }
    }

    pub(super) fn post_send(
        &mut self,
        table: &Region,
        qpn: u32,
        wr: &crate::datapath::SendRequest<'_>,
        cqs: &mut CqQueues,
    ) -> Result<(), i32> {
        let payload = match wr.inline {
            Some(b) => Payload::Inline(b.to_vec()),
            None => Payload::Sges(wr.sges.to_vec()),
        };
        let w = SendWr {
            wr_id: wr.wr_id,
            op: wr.op,
            payload,
            signaled: wr.signaled,
            solicited: wr.solicited,
            ud: None,
            remote_srqn: 0,
        };
        // With two earlier requests of the QP still outstanding, this one leaves at the next
        // round (the program's next poll, or the progress thread once their ACK or timer
        // comes): a burst of posts then goes out in GSO batches with one ACK request,
        // instead of one datagram and one ACK each (docs/design/net-path.md, "Batching"). A
        // ping-pong has one at most — the last request, whose ACK may still be on its way
        // behind the reply — and its requests leave at once.
        // A program that is not polling makes no next round: its requests leave now.
        let busy = self.engine.send_queued(qpn) > 1 && self.act.polling();
        self.engine.post_send(qpn, w).map_err(post_errno)?;
        self.act.posted(self.now().0);
        if !busy {
            self.transmit(table, Round::Alone, false, false);
        } else {
            self.act
                .pending
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        self.outputs(cqs);
        Ok(())
    }

    pub(super) fn post_recv(&mut self, qpn: u32, r: &PostRecvReq) -> Result<(), i32> {
        self.engine.post_recv(qpn, recv_wr(r)).map_err(post_errno)
    }

    /// One round: takes every datagram waiting, runs the timers that are due, sends what
    /// is ready and queues the completions. True if a packet came in. `round` says who
    /// drives it, which decides whether the round's ACKs wait for the next one.
    pub(super) fn drive(&mut self, table: &Region, cqs: &mut CqQueues, round: Round) -> bool {
        let got = self.receive(table, round == Round::Poll);
        let now = self.now();
        // Time this process could not run is not the peer's silence: the timers move by it
        // before they run (docs/design/net-path.md, "Stalls").
        let lost = self.act.take_lost(now.0);
        self.engine.stalled(lost);
        // The daemon's retry floor for the device (issue 35, item 7).
        if let Some(f) = self.act.retry_floor() {
            if f != self.engine.retry_floor() {
                self.engine.set_retry_floor(f);
            }
        }
        if round == Round::Poll {
            self.act.polled(now.0);
        }
        self.publish();
        if self.engine.poll_timeout().is_some_and(|t| t <= now) {
            self.engine.handle_timeout(now);
        }
        let queued = self.outputs(cqs);
        self.transmit(table, round, got, queued);
        self.outputs(cqs);
        self.publish_counters();
        got
    }

    /// Whether a QP of the engine waits for the ACK of a request of its own.
    fn awaiting_acks(&self) -> bool {
        self.qps.keys().any(|&q| self.engine.send_queued(q) > 0)
    }

    /// How long until the engine's next timer, if it has one.
    pub(super) fn next_timeout(&self) -> Option<Duration> {
        let t = self.engine.poll_timeout()?;
        Some(Duration::from_nanos(t.0.saturating_sub(self.now().0)))
    }

    /// QPs the engine moved to ERR since the last call, by handle, with their event.
    pub(super) fn take_errors(&mut self) -> Vec<(u32, Option<EventType>)> {
        std::mem::take(&mut self.errors)
    }

    /// Takes the datagrams waiting; with `poll`, up to the first that ends a message the
    /// program receives (a SEND, a WRITE with immediate): its completion goes to the
    /// program without the look at the socket that would follow, which the program's next
    /// poll makes. Every other datagram is taken in the same round — in `ib_write_lat` the
    /// ACK that completes the program's WRITE comes just ahead of the peer's WRITE, which
    /// left behind would land while the program watches its memory instead of polling.
    fn receive(&mut self, table: &Region, poll: bool) -> bool {
        let keys = OwnKeys(table);
        let (engine, mem, peers, rejected) = (
            &mut self.engine,
            &mut self.mem,
            &self.peers,
            &mut self.rejected,
        );
        let mut feed = Feed(&self.srqs);
        let (gid, epoch) = (self.gid, self.epoch);
        // Only the daemon holds the device's address and port (its socket shares them with
        // no other), so a datagram from there is one it forwarded: its ICRC and its source
        // (the QP's peer) were checked where the real headers were seen
        // (`crates/daemon/src/netdev/forward.rs`). Anything else — another local process
        // that found this socket's port — is dropped.
        let daemon = SocketAddr::new(self.udp.local, self.udp.dev_port);
        self.udp.receive(poll, |pkt, from, _index| {
            if from != daemon {
                *rejected += 1;
                return false;
            }
            // A QP this engine no longer runs (destroyed while its packets were on their
            // way): dropped; a live requester retransmits.
            let Some(&peer) = peers.get(&super::udp::dest_qp(pkt)) else {
                *rejected += 1;
                return false;
            };
            let meta = RxMeta {
                sgid: peer,
                dgid: gid,
            };
            let now = Instant(epoch.elapsed().as_nanos() as u64);
            engine.handle_packet_fed(now, &keys, mem, &mut feed, meta, pkt);
            ends_receive(pkt)
        })
    }

    /// Sends what the engine has ready: requests in GSO batches per destination QP
    /// (`udp`), then the round's ACKs, which is what a ping-pong's peer waits for
    /// (`crates/transport/examples/udp_pingpong.rs`), unless the round keeps them back
    /// ([`Round`]).
    fn transmit(&mut self, table: &Region, round: Round, got: bool, queued: bool) {
        let keys = OwnKeys(table);
        let now = self.now();
        let mut requests = false;
        while let Some(tx) = self
            .engine
            .poll_transmit(now, &keys, &mut self.mem, self.udp.stage())
        {
            // Every device of a deployment listens on the port this one is bound to (4791
            // outside tests), as the daemon's devices send; the source port is this
            // socket's own (RoCE v2 lets it vary, IBA A17.4).
            let to = SocketAddr::new(tx.dgid.to_ip(), self.udp.dev_port);
            let pkt = self.udp.staged(tx.len);
            // BTH opcode 0x11: RC Acknowledge (IBA table 38), its AETH right behind the
            // 12-byte BTH. A NAK (RNR, sequence error, a remote error: IBA 9.7.5.2) is the
            // peer's cue to retransmit or fail and leaves at once with the requests; only
            // positive ACKs wait for a later round.
            let positive = || {
                pkt.get(12).is_some_and(|&s| {
                    matches!(
                        softverbs_wire::aeth::Syndrome::decode(s),
                        Ok(softverbs_wire::aeth::Syndrome::Ack { .. })
                    )
                })
            };
            if pkt[0] == 0x11 && positive() {
                self.acks.extend_from_slice(pkt);
                self.ack_ends.push((self.acks.len(), to));
                continue;
            }
            self.udp.send_staged(tx.len, to);
            requests = true;
        }
        self.udp.flush();
        // ACKs go behind requests of the same round; otherwise `round` decides.
        let hold = !requests
            && !self.acks.is_empty()
            && match round {
                Round::Poll if queued => true,
                Round::Poll if got && self.awaiting_acks() => {
                    self.held_since.get_or_insert(now);
                    true
                }
                Round::Poll => self
                    .held_since
                    .is_some_and(|t| now.0.saturating_sub(t.0) < HOLD.as_nanos() as u64),
                Round::Between => true,
                Round::Alone => false,
            };
        self.act
            .pending
            .store(hold, std::sync::atomic::Ordering::Relaxed);
        if !hold {
            self.send_acks();
        }
    }

    /// The ACKs held for a later round leave now (`super::at_exit`).
    pub(super) fn send_held_acks(&mut self) {
        self.send_acks();
        self.act
            .pending
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }

    fn send_acks(&mut self) {
        self.held_since = None;
        let mut start = 0;
        for &(end, to) in &self.ack_ends {
            self.udp.send_one(&mut self.acks[start..end], to);
            start = end;
        }
        self.acks.clear();
        self.ack_ends.clear();
    }

    /// Hands the engine's outputs on; true if a completion was among them.
    fn outputs(&mut self, cqs: &mut CqQueues) -> bool {
        let mut completed = false;
        while let Some(o) = self.engine.poll_output() {
            match o {
                Output::Completion { cq, wc } => {
                    cqs.push_own(cq as u32, wc);
                    completed = true;
                }
                Output::QpError { qpn, event } => {
                    if let Some(&h) = self.qps.get(&qpn) {
                        self.errors.push((h, event));
                    }
                }
                Output::SrqLimitReached { .. } => {}
            }
        }
        completed
    }
}

impl Net {
    /// Every QP of the engine goes to ERR (the daemon is gone): their work requests flush.
    pub(super) fn fail_all(&mut self, cqs: &mut CqQueues) {
        let err = QpAttr {
            qp_state: softverbs_core::types::QpState::Err,
            ..QpAttr::default()
        };
        for &qpn in self.qps.keys() {
            self.engine.modify_qp(qpn, &err);
        }
        self.outputs(cqs);
    }
}

/// Reports the engine's transport drops to the daemon if they changed since the last
/// report (`NetDrops`, ABI 18), for `softverbs status`.
pub(super) fn tell_drops(conn: &crate::conn::Conn, net: &mut Net) {
    let now = net.engine.drop_stats();
    if now == net.reported || conn.abi < 18 {
        return;
    }
    let req = softverbs_abi::msg::NetDropsReq {
        foreign_source: zerocopy::little_endian::U64::new(now.foreign_source),
        outside_window: zerocopy::little_endian::U64::new(now.outside_window),
    };
    if conn
        .call::<softverbs_abi::msg::cmd::NetDrops>("net_drops", 0, &req)
        .is_ok()
    {
        net.reported = now;
    }
}

/// Tells the daemon what the engine's last round did that it must act on: SRQs a take left
/// below their armed limit (`DirectSrqLimit`, the daemon raises `SRQ_LIMIT_REACHED`), and
/// QPs the engine moved to ERR (`NetQpError`: the daemon moves them there too, so
/// `ibv_query_qp` shows it, and raises their async event).
pub(super) fn tell_errors(conn: &crate::conn::Conn, net: &mut Net) {
    for s in net.srqs.values() {
        let Some(&qp) = s.qps.first() else {
            continue;
        };
        if s.limit_due.replace(false) {
            let req = softverbs_abi::msg::HandleReq {
                handle: zerocopy::little_endian::U32::new(qp),
            };
            let _ =
                conn.call::<softverbs_abi::msg::cmd::DirectSrqLimit>("direct_srq_limit", 0, &req);
        }
    }
    for (handle, event) in net.take_errors() {
        let req = softverbs_abi::msg::DirectPeerErrorReq {
            qp: zerocopy::little_endian::U32::new(handle),
            event: zerocopy::little_endian::U32::new(
                event.map_or(softverbs_abi::direct::NO_EVENT, |e| e as u32),
            ),
        };
        let _ = conn.call::<softverbs_abi::msg::cmd::NetQpError>("net_qp_error", 0, &req);
    }
}

impl super::DirectCtx {
    /// The daemon put QP `handle` on the net path and handed over the context's private
    /// socket (the first time): the engine takes it over with the receives held since before RTR. If that
    /// cannot be done, the QP fails (its packets reach no one else now).
    pub(super) fn take_net(
        &self,
        ctx: &crate::Context,
        inner: &mut super::Inner,
        handle: u32,
        r: &softverbs_abi::msg::DirectAttachResp,
        fds: Vec<OwnedFd>,
    ) -> Option<super::Fallback> {
        let taken = self.try_take_net(ctx, inner, handle, r, fds);
        let q = inner.qps.get_mut(&handle)?;
        match taken {
            Ok(()) => {
                q.held.clear();
                q.path = super::Path::Net;
                self.start_progress(ctx, inner);
            }
            Err(_) => {
                super::fail(ctx, handle, q, &mut inner.cqs, None, true);
                ops::notify_own(ctx, inner);
            }
        }
        None
    }

    fn try_take_net(
        &self,
        ctx: &crate::Context,
        inner: &mut super::Inner,
        handle: u32,
        r: &softverbs_abi::msg::DirectAttachResp,
        mut fds: Vec<OwnedFd>,
    ) -> Result<(), i32> {
        let own_pd = r.own_pd.get();
        // The descriptors: the SRQ's ring when the QP has one, then the context's socket
        // the first time (`side` says so).
        // ... and, pushed last, the net status region when the daemon makes one.
        let status_len = r.status_len.get() as usize;
        let status = if r.side.get() == 1 && matches!(status_len, NS_LEN | NS_LEN_COUNTERS) {
            fds.pop()
        } else {
            None
        };
        let sock = if r.side.get() == 1 { fds.pop() } else { None };
        let q = inner.qps.get(&handle).ok_or(errno::EINVAL)?;
        let srq = match q.srq {
            Some(h) => Some((
                h,
                OwnSrq::from_resp(r, fds.pop(), handle).ok_or(errno::EINVAL)?,
            )),
            None => None,
        };
        let qq = crate::objects::query_qp(ctx, "query_qp", handle).map_err(|e| e.errno())?;
        if inner.net.is_none() {
            let sock = sock.ok_or(errno::EINVAL)?;
            let act = self.activity.clone();
            if let Some(r) = status.and_then(|fd| Region::map(fd, status_len).ok()) {
                let _ = act.status.set(r);
            }
            let port = u16::try_from(r.net_port.get())
                .ok()
                .filter(|&p| p != 0)
                .ok_or(errno::EINVAL)?;
            inner.net = Some(Box::new(
                Net::new(sock, port, act).map_err(|_| errno::EINVAL)?,
            ));
            super::at_exit::register(&self.inner);
        }
        let cap = qq.init.cap;
        let cfg = QpConfig {
            qpn: q.qpn,
            qp_type: q.qp_type,
            pd: Some(PdRef {
                ctx: OWN,
                pd: Handle(own_pd),
            }),
            send_cq: q.send_cq.map(u64::from),
            recv_cq: q.recv_cq.map(u64::from),
            srq: srq.as_ref().map(|&(h, _)| (OWN, Handle(h))),
            sq_sig_all: q.sq_sig_all,
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            max_inline: cap.max_inline_data,
            port_mtu: qq.attr.path_mtu,
        };
        let net = inner.net.as_mut().ok_or(errno::EINVAL)?;
        if let Some((h, s)) = srq {
            net.add_srq(h, r.recv_pd[0].get(), s);
        }
        net.add_qp(handle, cfg, &qq.attr, &q.held)
    }

    /// A QP of the net path was modified (to `state`): the engine follows the daemon's
    /// attributes; at RESET the QP leaves the engine and holds its receives again until its
    /// next RTR asks anew.
    pub(super) fn net_modified(
        &self,
        ctx: &crate::Context,
        inner: &mut super::Inner,
        handle: u32,
        state: softverbs_core::types::QpState,
    ) {
        let Some(q) = inner.qps.get_mut(&handle) else {
            return;
        };
        let qpn = q.qpn;
        let Some(net) = inner.net.as_mut() else {
            return;
        };
        if state == softverbs_core::types::QpState::Reset {
            net.remove(qpn);
            q.path = super::Path::Held;
            q.held.clear();
            q.pending.clear();
            q.error = false;
            return;
        }
        match crate::objects::query_qp(ctx, "query_qp", handle) {
            Ok(qq) => net.modify(qpn, &qq.attr),
            Err(_) => {
                let err = QpAttr {
                    qp_state: softverbs_core::types::QpState::Err,
                    ..QpAttr::default()
                };
                net.modify(qpn, &err);
            }
        }
        net.drive(&self.own_table, &mut inner.cqs, Round::Alone);
        tell_errors(&ctx.conn, net);
        ops::notify_own(ctx, inner);
    }
}

use super::ops;

#[cfg(test)]
mod tests {
    /// A poll stops at the datagram whose packet completes a receive: the last or only
    /// packet of a SEND (any kind) or of a WRITE with immediate; not a WRITE without, a
    /// first or middle packet, a READ response or an ACK (which complete sends).
    #[test]
    fn the_packets_that_end_a_received_message() {
        let ends = |op: u8| super::ends_receive(&[op, 0, 0, 0]);
        for op in [0x02, 0x03, 0x04, 0x05, 0x09, 0x0B, 0x16, 0x17] {
            assert!(ends(op), "{op:#04x}");
        }
        for op in [
            0x00, 0x01, 0x06, 0x07, 0x08, 0x0A, 0x0C, 0x10, 0x11, 0x12, 0x13,
        ] {
            assert!(!ends(op), "{op:#04x}");
        }
        assert!(!super::ends_receive(&[]));
    }
}
