//! The engine: every QP and SRQ of one device, fed with work requests, received packets and
//! the time, producing packets, completions and QP events. It owns no socket, thread or
//! clock; the daemon (or a test's network simulator) moves its packets.
//!
//! Per QP it runs the three IBA roles (IBA 9.7): the requester turns send work requests into
//! request packets ([`crate::requester`]), the responder executes incoming requests and
//! answers them ([`crate::responder`]), and the completer matches responses to outstanding
//! requests and completes them in order ([`crate::completer`]).

use std::collections::VecDeque;

use foldhash::{HashMap, HashSet};

use softverbs_core::attr::QpAttr;
use softverbs_core::datapath::MemKeys;
use softverbs_core::device::Gid;
use softverbs_core::ids::CtxId;
use softverbs_core::mcast::MULTICAST_QPN;
use softverbs_core::types::{QpState, QpType};
use softverbs_wire::{Direction, Packet, PacketRef, Transport};

use crate::counters::Reject;
use crate::memory::Memory;
pub use crate::qp::{cq_id, CqId, Output, QpConfig, RxMeta, SrqConfig, SrqKey, Transmit, WINDOW};
use crate::qp::{flush, Env, Qp, ReqState, RespState, SendWqe, Srq};
use crate::time::Instant;
use crate::wr::{Payload, RecvWr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion};

/// Received packets the engine dropped because of who sent them or what PSN they carry
/// (packets that fail to parse or find no QP are not counted here).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropStats {
    /// Packets for a connected QP (RC, UC, XRC) from an address other than its peer's.
    pub foreign_source: u64,
    /// Responses outside the window of outstanding PSNs: duplicates and ghosts.
    pub outside_window: u64,
}

/// The local GID a QP with path `sgid_index` uses towards `peer`: that slot of `gids`
/// unless it is of the other IP family (or empty), then the first GID of `peer`'s family;
/// the daemon picks the source of what the QP sends the same way.
fn local_gid(gids: &[Gid], sgid_index: u8, peer: Gid) -> Option<Gid> {
    let v4 = |g: &Gid| g.to_ip().is_ipv4();
    gids.get(usize::from(sgid_index))
        .filter(|g| v4(g) == v4(&peer))
        .or_else(|| gids.iter().find(|g| v4(g) == v4(&peer)))
        .copied()
}

/// Why a work request was refused at post time (`ibv_post_send`/`ibv_post_recv` errno).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// No such QP or SRQ.
    #[error("no such queue")]
    NoQueue,
    /// The QP's state does not accept this queue's work (`EINVAL`).
    #[error("QP state does not accept work requests")]
    BadState,
    /// The operation or its parameters do not fit the QP (`EINVAL`).
    #[error("invalid work request")]
    Invalid,
    /// The queue is full (`ENOMEM`).
    #[error("queue full")]
    Full,
}

/// All QPs and SRQs of one device.
pub struct Engine {
    pub(crate) qps: HashMap<u32, Qp>,
    pub(crate) srqs: HashMap<SrqKey, Srq>,
    pending: VecDeque<u32>,
    /// QPs whose requester has a timer running (ACK timeout or RNR wait): the timers are
    /// looked for only here, so an engine holding thousands of idle QPs spends nothing on
    /// them per turn (`poll_timeout`, `handle_timeout`).
    timed: HashSet<u32>,
    out: VecDeque<Output>,
    scratch: Vec<u8>,
    drops: DropStats,
    /// Received packets dropped, by reason (`crate::counters::Reject`): the port's.
    rejects: crate::counters::Rejects,
    /// The port's GIDs (its addresses), for the destination check of connected QPs; empty
    /// where the caller does not say (then that check is skipped).
    gids: Vec<Gid>,
    /// Multicast groups of this device's QPs (`crate::mcast`).
    mcast: crate::mcast::Groups,
    windows: crate::mw::Windows,
    /// The counters of the QPs destroyed so far (`counters`).
    retired: crate::counters::Counters,
    /// [`crate::time::RETRY_FLOOR`] or what the shell set for its device.
    retry_floor: std::time::Duration,
}

impl Default for Engine {
    fn default() -> Engine {
        Engine {
            qps: HashMap::default(),
            srqs: HashMap::default(),
            pending: VecDeque::new(),
            timed: HashSet::default(),
            out: VecDeque::new(),
            scratch: Vec::new(),
            drops: DropStats::default(),
            rejects: Default::default(),
            gids: Vec::new(),
            mcast: crate::mcast::Groups::default(),
            windows: crate::mw::Windows::default(),
            retired: crate::counters::Counters::default(),
            retry_floor: crate::time::RETRY_FLOOR,
        }
    }
}

/// Where a connected QP sends and where its sequence numbers are, for `softverbs resources`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpWire {
    /// The peer's QP number (`dest_qp_num`; 0 before RTR and for UD).
    pub dest_qpn: u32,
    /// The peer's GID (`ah_attr.dgid`).
    pub dgid: Gid,
    /// The PSN the requester gives its next new packet (the send PSN, IBA 9.7.4.1.2).
    pub sq_psn: u32,
    /// The PSN the responder expects next (the receive PSN, IBA 9.7.5.1.1).
    pub rq_psn: u32,
}

impl Engine {
    /// An engine with no QPs, retrying by [`crate::time::RETRY_FLOOR`].
    pub fn new() -> Engine {
        Engine::default()
    }

    /// Sets the device's retry floor ([`crate::time::RETRY_FLOOR`]) for every QP, present
    /// and future: `RETRY_EXC_ERR` needs `retry_cnt` retries spent and at least `floor`
    /// without progress. `Duration::ZERO`: IBA 9.7.6.1.3's plain count (what the transport
    /// tests of exact IBA timing use).
    pub fn set_retry_floor(&mut self, floor: std::time::Duration) {
        self.retry_floor = floor;
        for qp in self.qps.values_mut() {
            qp.retry_floor = floor;
        }
    }

    /// The retry floor in force ([`set_retry_floor`](Self::set_retry_floor)).
    pub fn retry_floor(&self) -> std::time::Duration {
        self.retry_floor
    }

    /// Adds a QP (in RESET, as the core created it).
    pub fn create_qp(&mut self, cfg: QpConfig) {
        self.qps.insert(
            cfg.qpn,
            Qp {
                cfg,
                attr: QpAttr::default(),
                sq: VecDeque::new(),
                rq: VecDeque::new(),
                req: ReqState::default(),
                resp: RespState::default(),
                scheduled: false,
                cnt: crate::counters::Counters::default(),
                retry_floor: self.retry_floor,
            },
        );
    }

    /// Removes a QP; its outstanding work is dropped without completions (the owner
    /// destroyed it, so nobody polls its CQs for it any more). The type 2 memory windows
    /// bound to it are invalidated (IBA 10.6.7.2.2).
    pub fn destroy_qp(&mut self, qpn: u32) {
        if let Some(qp) = self.qps.remove(&qpn) {
            // The port's totals keep what its destroyed QPs did (as a NIC's port counters).
            self.retired.add(&qp.cnt);
        }
        self.timed.remove(&qpn);
        self.mcast.forget_qp(qpn);
        self.windows.qp_destroyed(qpn);
    }

    /// Mirrors a memory window the core allocated on this device (unbound).
    pub fn add_window(&mut self, info: &softverbs_core::mw::MwInfo) {
        self.windows.add(info);
    }

    /// A memory window was deallocated: its key stops resolving.
    pub fn remove_window(&mut self, rkey: u32) {
        self.windows.remove(rkey);
    }

    /// The oldest change of which MR a window is bound to that the core has not heard of:
    /// the shell passes each to [`Core::note_window_binding`] before its next command.
    pub fn poll_window_note(&mut self) -> Option<crate::mw::WindowNote> {
        self.windows.poll_note()
    }

    /// For the same-host direct path (docs/design/direct-path.md), whose libraries run a QP's work
    /// themselves but leave windows to the engine: checks a remote access with R_Key `rkey`
    /// arriving on QP `qpn` of PD `pd` as the responder does (through a window if the key
    /// names one, IBA 10.6.7.3; else through the MR).
    pub fn check_remote_key(
        &self,
        core: &dyn MemKeys,
        qpn: u32,
        pd: softverbs_core::datapath::PdRef,
        rkey: u32,
        range: (u64, u64),
        need: softverbs_core::types::Access,
    ) -> Result<softverbs_core::datapath::MemTarget, softverbs_core::datapath::MemError> {
        self.windows.check_remote(core, qpn, pd, rkey, range, need)
    }

    /// For the direct path: a bind or local invalidate at the head of direct QP `qpn`'s send
    /// queue, by the rules its send queue applies here (`requester::local_op`). `false`:
    /// refused (the request completes `MW_BIND_ERR` or `LOC_QP_OP_ERR`).
    pub fn direct_local_op(
        &mut self,
        core: &dyn MemKeys,
        qpn: u32,
        pd: softverbs_core::datapath::PdRef,
        op: SendOp,
    ) -> bool {
        match op {
            SendOp::BindMw(b) => self.windows.bind(core, qpn, pd, &b).is_ok(),
            SendOp::LocalInv(rkey) => self.windows.invalidate(qpn, pd, rkey, false).is_ok(),
            _ => false,
        }
    }

    /// For the direct path: a Send with Invalidate of `rkey` arrived on QP `qpn` of PD `pd`
    /// (the responder's rule, IBA 10.6.7.2.5). `false`: refused.
    pub fn direct_remote_invalidate(
        &mut self,
        qpn: u32,
        pd: softverbs_core::datapath::PdRef,
        rkey: u32,
    ) -> bool {
        self.windows.invalidate(qpn, pd, rkey, true).is_ok()
    }

    /// Memory windows mirrored on this engine.
    pub fn windows(&self) -> usize {
        self.windows.len()
    }

    /// Mirrors the core's `attach_mcast`: datagrams to `mgid` reach QP `qpn` from now on.
    pub fn attach_mcast(&mut self, mgid: Gid, qpn: u32) {
        self.mcast.attach(mgid, qpn);
    }

    /// Mirrors the core's `detach_mcast` (or a destroyed QP leaving its groups).
    pub fn detach_mcast(&mut self, mgid: Gid, qpn: u32) {
        self.mcast.detach(mgid, qpn);
    }

    /// Whether any QP of this device is attached to `mgid`.
    pub fn in_mcast_group(&self, mgid: Gid) -> bool {
        self.mcast.has(mgid)
    }

    /// Feeds a multicast datagram this device sent itself (no wire, no ICRC): every QP of
    /// the device attached to `meta.dgid` gets a copy except the QP that sent it
    /// (`crate::mcast`).
    pub fn handle_own_multicast<M: Memory>(
        &mut self,
        now: Instant,
        core: &dyn MemKeys,
        mem: &mut M,
        meta: RxMeta,
        bytes: &[u8],
    ) {
        self.handle_own_multicast_fed(now, core, mem, &mut crate::NoFeed, meta, bytes);
    }

    /// [`handle_own_multicast`](Self::handle_own_multicast) with SRQs fed by `feed` when
    /// they hold no receive ([`SrqFeed`](crate::SrqFeed)).
    pub fn handle_own_multicast_fed<M: Memory>(
        &mut self,
        now: Instant,
        core: &dyn MemKeys,
        mem: &mut M,
        feed: &mut dyn crate::SrqFeed,
        meta: RxMeta,
        bytes: &[u8],
    ) {
        let Ok(pkt) = Packet::parse(bytes) else {
            return;
        };
        if pkt.headers.bth.dest_qp != MULTICAST_QPN {
            return;
        }
        let sender = pkt.headers.deth.map(|d| d.src_qp);
        // The device's own datagram: whatever its copies meet is not a packet received.
        let _ = self.fan_out(now, core, mem, feed, meta, &pkt, sender);
    }

    /// Delivers a copy of multicast datagram `pkt` to every attached QP but `skip`. The
    /// datagram is rejected as a whole only when no QP can take it (not UD, or no QP of the
    /// device in the group); what one member's copy meets (its Q_Key, no receive) is that
    /// member's and is not counted, as one datagram is one packet received.
    #[allow(clippy::too_many_arguments)]
    fn fan_out<M: Memory>(
        &mut self,
        now: Instant,
        core: &dyn MemKeys,
        mem: &mut M,
        feed: &mut dyn crate::SrqFeed,
        meta: RxMeta,
        pkt: &PacketRef<'_>,
        skip: Option<u32>,
    ) -> Option<Reject> {
        // RoCE v2 multicast only exists for UD: anything else addressed to 0xFFFFFF is
        // dropped (rxe `hdr_check`).
        if pkt.info.transport != Transport::Ud {
            return Some(Reject::BadOpcode);
        }
        if self.mcast.members(meta.dgid).is_empty() {
            return Some(Reject::WrongDest);
        }
        for &qpn in self.mcast.members(meta.dgid) {
            if Some(qpn) == skip {
                continue;
            }
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            let mut env = Env {
                now,
                core,
                mem,
                out: &mut self.out,
                srqs: &mut self.srqs,
                windows: &mut self.windows,
                feed: &mut *feed,
            };
            let _ = crate::responder::receive(qp, &mut env, meta, pkt, &mut self.scratch);
        }
        None
    }

    /// Mirrors the core's attributes after a successful modify (the core validated them).
    /// Entering RTR loads the expected PSN, entering RTS the send PSN; entering ERR flushes
    /// every outstanding work request with `WR_FLUSH_ERR` (IBA 10.3.1.9); RESET empties the
    /// queues (IBA 10.3.1.1).
    pub fn modify_qp(&mut self, qpn: u32, attr: &QpAttr) {
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        let from = qp.attr.qp_state;
        let to = attr.qp_state;
        qp.attr = *attr;
        if from != to {
            match to {
                QpState::Reset => {
                    qp.sq.clear();
                    qp.rq.clear();
                    qp.req = ReqState::default();
                    qp.resp = RespState::default();
                }
                QpState::Rtr => qp.resp.reset_psn(attr.rq_psn),
                QpState::Rts if from == QpState::Rtr => qp.req.reset_psn(attr.sq_psn, attr),
                QpState::Err => {
                    flush(qp, &mut self.out);
                }
                _ => {}
            }
        }
        self.schedule(qpn);
    }

    /// Adds an SRQ.
    pub fn create_srq(&mut self, cfg: SrqConfig) {
        self.srqs.insert(
            cfg.key,
            Srq {
                cfg,
                queue: VecDeque::new(),
                limit: 0,
            },
        );
    }

    /// Arms (or disarms with 0) an SRQ's limit event.
    pub fn set_srq_limit(&mut self, key: SrqKey, limit: u32) {
        if let Some(s) = self.srqs.get_mut(&key) {
            s.limit = limit;
        }
    }

    /// Removes every SRQ of a closed context.
    pub fn forget_srqs_of(&mut self, ctx: CtxId) {
        self.srqs.retain(|k, _| k.0 != ctx);
    }

    /// Removes an SRQ; later packets naming it find nothing.
    pub fn destroy_srq(&mut self, key: SrqKey) {
        self.srqs.remove(&key);
    }

    /// How many more work requests `post_send` on `qpn` would queue (0 for no such QP): the
    /// shell leaves the rest in the client's ring, so a client posting faster than its QP
    /// drains meets a full ring (`ENOMEM`) instead of growing the daemon's queues.
    pub fn send_room(&self, qpn: u32) -> usize {
        self.qps.get(&qpn).map_or(0, |q| {
            (q.cfg.max_send_wr as usize).saturating_sub(q.sq.len())
        })
    }

    /// The QP's send and receive CQs (as configured at creation).
    pub fn qp_cqs(&self, qpn: u32) -> [Option<CqId>; 2] {
        self.qps
            .get(&qpn)
            .map_or([None, None], |q| [q.cfg.send_cq, q.cfg.recv_cq])
    }

    /// Send requests the QP holds (posted, not yet completed).
    pub fn send_queued(&self, qpn: u32) -> usize {
        self.qps.get(&qpn).map_or(0, |q| q.sq.len())
    }

    /// Like [`send_room`](Engine::send_room), for the QP's own receive queue.
    pub fn recv_room(&self, qpn: u32) -> usize {
        self.qps.get(&qpn).map_or(0, |q| {
            (q.cfg.max_recv_wr as usize).saturating_sub(q.rq.len())
        })
    }

    /// How many more work requests `post_srq_recv` on `key` would queue, or `None` if there
    /// is no such SRQ on this engine.
    pub fn srq_room(&self, key: SrqKey) -> Option<usize> {
        self.srqs
            .get(&key)
            .map(|s| (s.cfg.max_wr as usize).saturating_sub(s.queue.len()))
    }

    /// The SRQ's creation-time facts, or `None` if there is no such SRQ on this engine.
    pub fn srq_config(&self, key: SrqKey) -> Option<SrqConfig> {
        self.srqs.get(&key).map(|s| s.cfg)
    }

    /// Disarms the SRQ's limit, returning what was armed (0: nothing): its shell takes over
    /// deciding the event ([`SrqFeed`](crate::SrqFeed)).
    pub fn take_srq_limit(&mut self, key: SrqKey) -> u32 {
        self.srqs
            .get_mut(&key)
            .map_or(0, |s| std::mem::take(&mut s.limit))
    }

    /// The SRQ's `max_wr`, or `None` if there is no such SRQ on this engine.
    pub fn srq_max_wr(&self, key: SrqKey) -> Option<u32> {
        self.srqs.get(&key).map(|s| s.cfg.max_wr)
    }

    /// `ibv_post_send`.
    pub fn post_send(&mut self, qpn: u32, wr: SendWr) -> Result<(), PostError> {
        let qp = self.qps.get_mut(&qpn).ok_or(PostError::NoQueue)?;
        let t = qp.cfg.qp_type;
        match qp.attr.qp_state {
            QpState::Rts | QpState::Sqd | QpState::Err => {}
            _ => return Err(PostError::BadState),
        }
        if t == QpType::XrcRecv {
            return Err(PostError::Invalid);
        }
        let len = wr.payload.len();
        match &wr.payload {
            Payload::Sges(s) if s.len() > qp.cfg.max_send_sge as usize => {
                return Err(PostError::Invalid)
            }
            Payload::Inline(b) if b.len() > qp.cfg.max_inline as usize => {
                return Err(PostError::Invalid)
            }
            _ => {}
        }
        let allowed = match t {
            // IBA 10.6.7.2: binds and local invalidations go on connected QPs' send queues.
            _ if wr.op.is_local() => t != QpType::Ud && len == 0,
            QpType::Ud => matches!(wr.op, SendOp::Send | SendOp::SendWithImm(_)) && wr.ud.is_some(),
            QpType::Uc => !wr.op.is_read_or_atomic() && !matches!(wr.op, SendOp::SendWithInv(_)),
            _ => true,
        };
        if !allowed || len > u64::from(u32::MAX) {
            return Err(PostError::Invalid);
        }
        if wr.op.is_atomic() && (len != 8 || matches!(wr.payload, Payload::Inline(_))) {
            return Err(PostError::Invalid);
        }
        if qp.sq.len() >= qp.cfg.max_send_wr as usize {
            return Err(PostError::Full);
        }
        let in_error = qp.attr.qp_state == QpState::Err;
        let wqe = SendWqe {
            wr,
            len: len as u32,
            first_psn: 0,
            npkts: 0,
            started: false,
            sent: false,
            resp_pkts: 0,
            done: false,
        };
        if in_error {
            // IBA 10.3.1.9 / 11.4.1.1: work posted to a QP in error completes with a flush.
            let wc = WorkCompletion::new(
                wqe.wr.wr_id,
                WcStatus::WrFlushErr,
                wqe.wr.op.wc_opcode(),
                qpn,
            );
            self.out.push_back(Output::Completion {
                cq: qp.cfg.send_cq.unwrap_or_default(),
                wc,
            });
            return Ok(());
        }
        qp.sq.push_back(wqe);
        self.schedule(qpn);
        Ok(())
    }

    /// `ibv_post_recv` on a QP's own receive queue.
    pub fn post_recv(&mut self, qpn: u32, wr: RecvWr) -> Result<(), PostError> {
        let qp = self.qps.get_mut(&qpn).ok_or(PostError::NoQueue)?;
        if qp.cfg.srq.is_some() || matches!(qp.cfg.qp_type, QpType::XrcSend | QpType::XrcRecv) {
            return Err(PostError::Invalid);
        }
        if qp.attr.qp_state == QpState::Reset {
            return Err(PostError::BadState);
        }
        if wr.sges.len() > qp.cfg.max_recv_sge as usize {
            return Err(PostError::Invalid);
        }
        if qp.rq.len() >= qp.cfg.max_recv_wr as usize {
            return Err(PostError::Full);
        }
        if qp.attr.qp_state == QpState::Err {
            let wc = WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qpn);
            self.out.push_back(Output::Completion {
                cq: qp.cfg.recv_cq.unwrap_or_default(),
                wc,
            });
            return Ok(());
        }
        qp.rq.push_back(wr);
        Ok(())
    }

    /// `ibv_post_srq_recv`.
    pub fn post_srq_recv(&mut self, key: SrqKey, wr: RecvWr) -> Result<(), PostError> {
        let s = self.srqs.get_mut(&key).ok_or(PostError::NoQueue)?;
        if wr.sges.len() > s.cfg.max_sge as usize {
            return Err(PostError::Invalid);
        }
        if s.queue.len() >= s.cfg.max_wr as usize {
            return Err(PostError::Full);
        }
        s.queue.push_back(wr);
        // Receivers that were refused (RNR) retry on their own timers.
        Ok(())
    }

    /// Feeds one received packet (BTH through ICRC; the shell has verified the ICRC). Bad
    /// packets are dropped silently, as a NIC drops them (IBA 9.6: invalid packets are
    /// discarded), and so are packets for a connected QP from anyone but its peer
    /// (`meta.sgid` must be the QP's path's destination) and responses outside the window of
    /// outstanding PSNs (IBA 9.7.5.1). Each drop is counted once, by the reason returned
    /// ([`rejects`](Self::rejects)); [`drop_stats`](Self::drop_stats) counts the last two
    /// again, as `softverbs status` always showed them.
    pub fn handle_packet<M: Memory>(
        &mut self,
        now: Instant,
        core: &dyn MemKeys,
        mem: &mut M,
        meta: RxMeta,
        bytes: &[u8],
    ) -> Option<Reject> {
        self.handle_packet_fed(now, core, mem, &mut crate::NoFeed, meta, bytes)
    }

    /// [`handle_packet`](Self::handle_packet) with SRQs fed by `feed` when they hold no
    /// receive ([`SrqFeed`](crate::SrqFeed)).
    pub fn handle_packet_fed<M: Memory>(
        &mut self,
        now: Instant,
        core: &dyn MemKeys,
        mem: &mut M,
        feed: &mut dyn crate::SrqFeed,
        meta: RxMeta,
        bytes: &[u8],
    ) -> Option<Reject> {
        let r = self.receive(now, core, mem, feed, meta, bytes);
        if let Some(r) = r {
            self.rejects.count(r);
        }
        r
    }

    /// [`handle_packet_fed`](Self::handle_packet_fed) but for the counting of its verdict:
    /// the checks in IBA 9.6's order (the BTH, the destination QP, its state and type, the
    /// addresses, the P_Key; the Q_Key and what the QP's type takes in the responder), the
    /// first that fails naming the reason.
    fn receive<M: Memory>(
        &mut self,
        now: Instant,
        core: &dyn MemKeys,
        mem: &mut M,
        feed: &mut dyn crate::SrqFeed,
        meta: RxMeta,
        bytes: &[u8],
    ) -> Option<Reject> {
        let Ok(pkt) = Packet::parse(bytes) else {
            return Some(Reject::Malformed);
        };
        let qpn = pkt.headers.bth.dest_qp;
        if qpn == MULTICAST_QPN {
            return self.fan_out(now, core, mem, feed, meta, &pkt, None);
        }
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return Some(Reject::UnknownQp);
        };
        // Before RTR there is no path yet, and the QP takes no packets from anyone (IBA
        // 10.3.1); a response needs a requester (RTS or SQD).
        let receives = match pkt.info.direction {
            Direction::Request => !matches!(qp.attr.qp_state, QpState::Reset | QpState::Init),
            Direction::Response => matches!(qp.attr.qp_state, QpState::Rts | QpState::Sqd),
        };
        if !receives {
            return Some(Reject::QpState);
        }
        let takes = match pkt.info.direction {
            Direction::Request => qp.cfg.qp_type != QpType::XrcSend,
            // Responses (ACKs, READ and atomic responses) answer a reliable requester.
            Direction::Response => matches!(qp.cfg.qp_type, QpType::Rc | QpType::XrcSend),
        };
        if pkt.info.transport != crate::qp::transport_of(qp.cfg.qp_type) || !takes {
            return Some(Reject::BadOpcode);
        }
        if !qp.accepts_from(meta.sgid) {
            self.drops.foreign_source += 1;
            return Some(Reject::ForeignSource);
        }
        if qp.cfg.qp_type != QpType::Ud && !self.gids.is_empty() {
            // A connected QP is reached at its own address only (the GID its path's
            // sgid_index names, as the sender's side picks it: `local_gid`).
            let own = local_gid(&self.gids, qp.attr.ah_attr.sgid_index, meta.sgid);
            if own.is_some_and(|g| g != meta.dgid) {
                return Some(Reject::WrongDest);
            }
        }
        // IBA 10.9: the port's P_Key table holds the default key alone (full member,
        // 0xFFFF); a packet matches when the low 15 bits are equal, whichever membership
        // it claims, as one side is a full member.
        if pkt.headers.bth.pkey & 0x7FFF != softverbs_wire::bth::DEFAULT_PKEY & 0x7FFF {
            return Some(Reject::BadPkey);
        }
        qp.cnt.rcvd_pkts += 1;
        qp.cnt.rcvd_bytes += bytes.len() as u64;
        let mut env = Env {
            now,
            core,
            mem,
            out: &mut self.out,
            srqs: &mut self.srqs,
            windows: &mut self.windows,
            feed,
        };
        let r = match pkt.info.direction {
            Direction::Request => {
                crate::responder::receive(qp, &mut env, meta, &pkt, &mut self.scratch)
            }
            Direction::Response => {
                if crate::completer::receive(qp, &mut env, &pkt) {
                    None
                } else {
                    self.drops.outside_window += 1;
                    Some(Reject::PsnWindow)
                }
            }
        };
        self.schedule(qpn);
        r
    }

    /// Tells the engine the port's GIDs (its GID table's used slots, in order), so that a
    /// connected QP's packets to another of them are rejected (`Reject::WrongDest`).
    pub fn set_gids(&mut self, gids: Vec<Gid>) {
        self.gids = gids;
    }

    /// The received packets dropped so far, by reason (the port's, destroyed QPs' included).
    pub fn rejects(&self) -> crate::counters::Rejects {
        self.rejects
    }

    /// Writes the next packet to send into `buf` (which must hold a full MTU-sized packet:
    /// [`MAX_PACKET`] bytes), or returns `None` when nothing is ready now.
    pub fn poll_transmit<M: Memory>(
        &mut self,
        now: Instant,
        core: &dyn MemKeys,
        mem: &mut M,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        while let Some(qpn) = self.pending.pop_front() {
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            let mut env = Env {
                now,
                core,
                mem,
                out: &mut self.out,
                srqs: &mut self.srqs,
                windows: &mut self.windows,
                // Sending takes no receive.
                feed: &mut crate::NoFeed,
            };
            let tx = crate::responder::next_packet(qp, &mut env, buf, &mut self.scratch)
                .or_else(|| crate::requester::next_packet(qp, &mut env, buf, &mut self.scratch));
            let timed = qp.req.deadline().is_some();
            match tx {
                None => qp.scheduled = false,
                Some(tx) => {
                    qp.cnt.sent_pkts += 1;
                    qp.cnt.sent_bytes += tx.len as u64;
                }
            }
            self.note_timer(qpn, timed);
            if let Some(tx) = tx {
                self.pending.push_back(qpn);
                return Some(tx);
            }
        }
        None
    }

    /// The next completion or event, if any.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// The earliest time [`handle_timeout`](Self::handle_timeout) has work to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timed
            .iter()
            .filter_map(|n| self.qps.get(n)?.req.deadline())
            .min()
    }

    /// Runs the timers due at `now`: retransmission after an ACK timeout (IBA 9.7.6.1.3)
    /// and the end of an RNR wait (IBA 9.7.5.2.8).
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.timed.is_empty() {
            return;
        }
        let due: Vec<u32> = self
            .timed
            .iter()
            .copied()
            .filter(|n| {
                self.qps
                    .get(n)
                    .and_then(|q| q.req.deadline())
                    .is_some_and(|d| d <= now)
            })
            .collect();
        for qpn in due {
            if let Some(qp) = self.qps.get_mut(&qpn) {
                crate::requester::on_timer(qp, now, &mut self.out);
            }
            self.schedule(qpn);
        }
    }

    /// The responder's expected PSN and its MSN (IBA 9.7.5.1.1, 9.7.4.1.1) of QP `qpn`, if
    /// it is at RTR or later: what an RNR NAK sent on this responder's behalf names, so that
    /// it acknowledges exactly what was received (docs/design/net-path.md, "Stalls").
    pub fn responder_psn(&self, qpn: u32) -> Option<(u32, u32)> {
        let qp = self.qps.get(&qpn)?;
        matches!(qp.attr.qp_state, QpState::Rtr | QpState::Rts | QpState::Sqd)
            .then_some((qp.resp.epsn, qp.resp.msn))
    }

    /// Writes into `buf` an RNR NAK for RC QP `qpn`'s peer at expected PSN `epsn` with MSN
    /// `msn` (the state a responder running elsewhere published): the daemon's answer for
    /// a net-path library that does not run (docs/design/net-path.md, "Stalls";
    /// `responder::rnr_nak_for`). `None` for no such RC QP at RTR or later.
    pub fn rnr_nak_for(&self, qpn: u32, epsn: u32, msn: u32, buf: &mut [u8]) -> Option<Transmit> {
        crate::responder::rnr_nak_for(self.qps.get(&qpn)?, epsn, msn, buf)
    }

    /// Writes into `buf` the ACK of every PSN before `epsn` (MSN `msn`) for RC QP `qpn`'s
    /// peer: the daemon's answer to a duplicate request for a net-path library that does
    /// not run (`responder::ack_for`).
    pub fn ack_for(&self, qpn: u32, epsn: u32, msn: u32, buf: &mut [u8]) -> Option<Transmit> {
        crate::responder::ack_for(self.qps.get(&qpn)?, epsn, msn, buf)
    }

    /// The shell could not run for `lost` (its process was stopped, or starved of a CPU):
    /// every requester timer running — the ACK timeout (IBA 9.7.6.1.3) and the wait after an
    /// RNR NAK (IBA 9.7.5.2.8) — moves `lost` later, and no retry is counted. A timer counts
    /// how long the peer has had to answer, and while this side could not run it could not
    /// take the answer either: a local stall must not spend the peer's retries
    /// (docs/design/net-path.md, "Stalls"). The shell measures `lost` with the clock it passes as
    /// `now`, as the time by which its own rounds came later than it meant them to.
    pub fn stalled(&mut self, lost: std::time::Duration) {
        if lost.is_zero() {
            return;
        }
        for qpn in &self.timed {
            if let Some(qp) = self.qps.get_mut(qpn) {
                qp.req.timer = qp.req.timer.map(|t| t.after(lost));
                qp.req.rnr_until = qp.req.rnr_until.map(|t| t.after(lost));
                // Nor does it count towards the retry floor.
                qp.req.quiet_since = qp.req.quiet_since.after(lost);
            }
        }
    }

    /// The counters of QP `qpn` (docs/guide/counters.md).
    pub fn qp_counters(&self, qpn: u32) -> Option<crate::counters::Counters> {
        self.qps.get(&qpn).map(|q| q.cnt)
    }

    /// The port's counters: the sum over its QPs, the destroyed ones included.
    pub fn counters(&self) -> crate::counters::Counters {
        let mut c = self.retired;
        for q in self.qps.values() {
            c.add(&q.cnt);
        }
        c
    }

    /// Where QP `qpn` sends and its send and receive PSNs.
    pub fn qp_wire(&self, qpn: u32) -> Option<QpWire> {
        let q = self.qps.get(&qpn)?;
        Some(QpWire {
            dest_qpn: q.attr.dest_qp_num,
            dgid: q.attr.ah_attr.dgid,
            sq_psn: q.req.next_psn,
            rq_psn: q.resp.epsn,
        })
    }

    /// What [`handle_packet`](Self::handle_packet) dropped for its source or its PSN.
    pub fn drop_stats(&self) -> DropStats {
        self.drops
    }

    /// Outstanding send work requests of a QP.
    pub fn send_queue_len(&self, qpn: u32) -> usize {
        self.qps.get(&qpn).map_or(0, |q| q.sq.len())
    }

    /// Posted receive work requests waiting in an SRQ.
    pub fn srq_len(&self, key: SrqKey) -> usize {
        self.srqs.get(&key).map_or(0, |s| s.queue.len())
    }

    /// Puts the QP on the transmit list, and re-files its timer: every path that can start
    /// or stop a requester timer (modify, post, packet, timeout) ends here, and
    /// [`poll_transmit`](Self::poll_transmit) re-files after each packet it builds.
    fn schedule(&mut self, qpn: u32) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            let timed = qp.req.deadline().is_some();
            if !qp.scheduled {
                qp.scheduled = true;
                self.pending.push_back(qpn);
            }
            self.note_timer(qpn, timed);
        }
    }

    fn note_timer(&mut self, qpn: u32, timed: bool) {
        if timed {
            self.timed.insert(qpn);
        } else {
            self.timed.remove(&qpn);
        }
    }

    /// QPs with a requester timer running (what each turn's timer work is proportional to).
    pub fn timed_qps(&self) -> usize {
        self.timed.len()
    }
}

/// Largest packet the engine emits: BTH + the largest header set + 4096-byte payload + ICRC.
pub const MAX_PACKET: usize = 12 + 4 + 28 + 16 + 4 + 4096 + 4;
