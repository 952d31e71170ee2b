//! A deterministic network of softverbs hosts for tests and benchmarks.
//!
//! Each [`Host`] is what one daemon holds — a [`Core`], an [`Engine`] and client memory —
//! addressed by one RoCE v2 GID. The [`Network`] wraps every packet in IPv4/IPv6 + UDP with a
//! real ICRC, and injects the faults of a seeded [`Faults`] profile (through the
//! [`FaultInjector`](crate::faults::FaultInjector) the daemon's UDP devices use too) (loss, duplication,
//! reordering, delay, corruption); the receiver checks the ICRC as a NIC does, so corrupted
//! packets are dropped there. Time is simulated: the network jumps to the next delivery or
//! timer, so a run with seconds of retransmission timeouts takes milliseconds.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::IpAddr;
use std::time::Duration;

use softverbs_core::attr::{AhAttr, QpAttr, QpInitAttr, SrqAttr};
use softverbs_core::datapath::PdRef;
use softverbs_core::device::{Device, Gid};
use softverbs_core::errno::O_CREAT;
use softverbs_core::ids::{CtxId, FileId, Handle};
use softverbs_core::types::{Access, AttrMask as M, EventType, Mtu, QpState, QpType};
use softverbs_core::{ContextInfo, Core};
use softverbs_wire::ip::{
    emit_ip_udp, split_ip_udp, IpRepr, Ipv4Repr, Ipv6Repr, UdpRepr, ROCE_V2_UDP_PORT,
};
use softverbs_wire::{icrc, Packet};

use crate::cq::{CompChannel, CompletionQueue, Delivery};
use crate::engine::{cq_id, CqId, Engine, Output, QpConfig, RxMeta, SrqConfig, SrqKey, MAX_PACKET};
use crate::faults::FaultInjector;
pub use crate::faults::{Faults, NetStats, Rng};
use crate::memory::VecMemory;
use crate::time::Instant;
use crate::wr::WorkCompletion;

/// One simulated daemon.
pub struct Host {
    /// Its object model.
    pub core: Core,
    /// Its transport.
    pub engine: Engine,
    /// Its clients' memory.
    pub mem: VecMemory,
    /// Its GID.
    pub gid: Gid,
    /// Completions, in order: the host's CQ "rings" (never full), which its CQs
    /// ([`cqs`](Host::cqs)) store into.
    pub completions: Vec<(CqId, WorkCompletion)>,
    /// The CQ semantics of each CQ made by [`cq`](Host::cq) (crates/transport/src/cq.rs),
    /// run as the daemon runs them: arming and notification over the simulated network.
    pub cqs: HashMap<CqId, CompletionQueue>,
    /// The host's one completion channel (every CQ of [`cq`](Host::cq) reports to it).
    pub channel: CompChannel<CqId>,
    /// QPs the engine failed, with the async event raised.
    pub failures: Vec<(u32, Option<EventType>)>,
    /// SRQ limit events.
    pub srq_limits: Vec<SrqKey>,
}

/// The channel handle of a host's one completion channel.
const SIM_CHANNEL: u32 = 1;

impl Host {
    /// A host with one RoCE device on `ip` (path MTU `mtu`).
    pub fn new(ip: IpAddr, mtu: Mtu) -> Host {
        let dev = Device::roce("sim0", 1, &[ip], mtu);
        Host {
            core: Core::new(vec![dev]),
            engine: Engine::new(),
            mem: VecMemory::default(),
            gid: Gid::from_ip(ip),
            completions: Vec::new(),
            cqs: HashMap::new(),
            channel: CompChannel::new(),
            failures: Vec::new(),
            srq_limits: Vec::new(),
        }
    }

    /// A client context with `mem` bytes of address space.
    pub fn context(&mut self, pid: u32, mem: usize) -> CtxId {
        let c = self
            .core
            .open_context(
                0,
                ContextInfo {
                    pid,
                    uid: 0,
                    comm: "sim".into(),
                },
            )
            .expect("device 0");
        self.mem.add(c, mem);
        c
    }

    fn port_mtu(&self) -> Mtu {
        self.core.devices()[0].ports[0].active_mtu
    }

    /// A PD.
    pub fn pd(&mut self, ctx: CtxId) -> PdRef {
        PdRef {
            ctx,
            pd: self.core.alloc_pd(ctx).expect("pd"),
        }
    }

    /// Registers `[addr, addr+len)` of `ctx`; returns the key (lkey = rkey).
    pub fn mr(&mut self, pd: PdRef, addr: u64, len: u64, access: Access) -> u32 {
        self.core
            .reg_mr(pd.ctx, pd.pd, addr, len, addr, access)
            .expect("mr")
            .lkey
    }

    /// A memory window of `mw_type` on `pd`, mirrored into the engine; returns its R_Key.
    pub fn mw(&mut self, pd: PdRef, mw_type: softverbs_core::mw::MwType) -> (Handle, u32) {
        let a = self.core.alloc_mw(pd.ctx, pd.pd, mw_type).expect("mw");
        self.engine.add_window(&softverbs_core::mw::MwInfo {
            pd,
            mw_type,
            rkey: a.rkey,
        });
        (a.handle, a.rkey)
    }

    /// Deallocates a window in the core and the engine.
    pub fn dealloc_mw(&mut self, pd: PdRef, mw: Handle, rkey: u32) {
        self.core.dealloc_mw(pd.ctx, mw).expect("dealloc_mw");
        self.engine.remove_window(rkey);
        self.pump();
    }

    /// A CQ.
    pub fn cq(&mut self, ctx: CtxId) -> CqId {
        let (h, cqe) = self.core.create_cq(ctx, 4096, 0).expect("cq");
        let id = cq_id(ctx, h);
        self.cqs
            .insert(id, CompletionQueue::new(cqe, Some(SIM_CHANNEL)));
        id
    }

    /// `ibv_req_notify_cq` on `cq`: its next completion (with `solicited_only`, the next
    /// solicited or failed one) raises an event on [`channel`](Host::channel).
    pub fn req_notify(&mut self, cq: CqId, solicited_only: bool) {
        if let Some(c) = self.cqs.get_mut(&cq) {
            c.arm(solicited_only);
        }
    }

    fn cq_handle(cq: CqId) -> Handle {
        Handle(cq as u32)
    }

    /// A QP of `t` (not XRC_RECV) on `pd` completing into `cq`, optionally on an SRQ.
    pub fn qp(&mut self, t: QpType, pd: PdRef, cq: CqId, srq: Option<SrqKey>) -> u32 {
        let mut init = QpInitAttr::new(t);
        init.pd = Some(pd.pd);
        init.send_cq = Some(Self::cq_handle(cq));
        if t != QpType::XrcSend {
            init.recv_cq = Some(Self::cq_handle(cq));
        }
        init.srq = srq.map(|s| s.1);
        init.cap.max_send_wr = 4096;
        init.cap.max_recv_wr = if srq.is_some() || t == QpType::XrcSend {
            0
        } else {
            4096
        };
        init.cap.max_send_sge = 4;
        init.cap.max_recv_sge = 4;
        // The most the type allows (an XRC send QP 16 bytes less, crates/core/src/qp.rs).
        init.cap.max_inline_data = softverbs_core::qp::max_inline_data(256, t);
        let made = self.core.create_qp(pd.ctx, &init).expect("create_qp");
        self.engine.create_qp(QpConfig {
            qpn: made.qpn,
            qp_type: t,
            pd: Some(pd),
            send_cq: Some(cq),
            recv_cq: (t != QpType::XrcSend).then_some(cq),
            srq,
            sq_sig_all: false,
            max_send_wr: made.cap.max_send_wr,
            max_recv_wr: made.cap.max_recv_wr,
            max_send_sge: made.cap.max_send_sge,
            max_recv_sge: made.cap.max_recv_sge,
            max_inline: made.cap.max_inline_data,
            port_mtu: self.port_mtu(),
        });
        made.qpn
    }

    /// A basic SRQ.
    pub fn srq(&mut self, pd: PdRef, max_wr: u32) -> SrqKey {
        let s = self
            .core
            .create_srq(
                pd.ctx,
                pd.pd,
                SrqAttr {
                    max_wr,
                    max_sge: 4,
                    srq_limit: 0,
                },
            )
            .expect("srq");
        let key = (pd.ctx, s.handle);
        self.engine.create_srq(SrqConfig {
            key,
            pd,
            cq: None,
            max_wr: s.attr.max_wr,
            max_sge: s.attr.max_sge,
        });
        key
    }

    /// Opens the XRC domain of file `ino` in `ctx`.
    pub fn xrcd(&mut self, ctx: CtxId, ino: u64) -> Handle {
        self.core
            .open_xrcd(ctx, Some(FileId { dev: 1, ino }), O_CREAT)
            .expect("xrcd")
            .handle
    }

    /// An XRC SRQ; returns its key and SRQ number.
    pub fn xrc_srq(&mut self, pd: PdRef, xrcd: Handle, cq: CqId, max_wr: u32) -> (SrqKey, u32) {
        let s = self
            .core
            .create_xrc_srq(
                pd.ctx,
                Some(pd.pd),
                Some(xrcd),
                Some(Self::cq_handle(cq)),
                SrqAttr {
                    max_wr,
                    max_sge: 4,
                    srq_limit: 0,
                },
            )
            .expect("xrc srq");
        let key = (pd.ctx, s.handle);
        self.engine.create_srq(SrqConfig {
            key,
            pd,
            cq: Some(cq),
            max_wr: s.attr.max_wr,
            max_sge: s.attr.max_sge,
        });
        (key, s.srqn.expect("XRC SRQs have numbers"))
    }

    /// An XRC receive QP created through the upstream face; returns the creator's handle and
    /// the QP number.
    pub fn xrc_recv_qp(&mut self, ctx: CtxId, xrcd: Handle) -> (Handle, u32) {
        let mut init = QpInitAttr::new(QpType::XrcRecv);
        init.xrcd = Some(xrcd);
        let made = self.core.create_qp(ctx, &init).expect("xrc recv qp");
        self.engine.create_qp(QpConfig {
            qpn: made.qpn,
            qp_type: QpType::XrcRecv,
            pd: None,
            send_cq: None,
            recv_cq: None,
            srq: None,
            sq_sig_all: false,
            max_send_wr: 0,
            max_recv_wr: 0,
            max_send_sge: 0,
            max_recv_sge: 0,
            max_inline: 0,
            port_mtu: self.port_mtu(),
        });
        (made.handle, made.qpn)
    }

    fn owner_of(&self, qpn: u32) -> Option<(CtxId, Handle)> {
        match self.core.qp_target(qpn)? {
            softverbs_core::datapath::QpTarget::Owned { ctx, handle, .. } => Some((ctx, handle)),
            softverbs_core::datapath::QpTarget::XrcRecv => {
                let h = self.core.xrc_rcv_qp_holders(qpn).into_iter().next()?;
                match h.via {
                    softverbs_core::HolderRef::Handle(handle) => Some((h.ctx, handle)),
                    softverbs_core::HolderRef::Registration => None,
                }
            }
        }
    }

    /// `ibv_attach_mcast` through the core (validated), mirrored into the engine.
    pub fn attach_mcast(&mut self, qpn: u32, mgid: Gid) -> softverbs_core::Result<()> {
        let (ctx, h) = self
            .owner_of(qpn)
            .ok_or(softverbs_core::Error::InvalidHandle(
                softverbs_core::ObjectKind::Qp,
            ))?;
        self.core.attach_mcast(ctx, h, mgid)?;
        self.engine.attach_mcast(mgid, qpn);
        Ok(())
    }

    /// `ibv_detach_mcast` through the core, mirrored into the engine.
    pub fn detach_mcast(&mut self, qpn: u32, mgid: Gid) -> softverbs_core::Result<()> {
        let (ctx, h) = self
            .owner_of(qpn)
            .ok_or(softverbs_core::Error::InvalidHandle(
                softverbs_core::ObjectKind::Qp,
            ))?;
        self.core.detach_mcast(ctx, h, mgid)?;
        self.engine.detach_mcast(mgid, qpn);
        Ok(())
    }

    /// `ibv_destroy_qp` of an owned QP: the core forgets it (and takes it out of its
    /// multicast groups), and so does the engine.
    pub fn destroy_qp(&mut self, qpn: u32) {
        if let Some((ctx, h)) = self.owner_of(qpn) {
            self.core.destroy_qp(ctx, h).expect("destroy_qp");
        }
        self.engine.destroy_qp(qpn);
    }

    /// Applies a modify through the core (validated) and mirrors it into the engine.
    pub fn modify(
        &mut self,
        qpn: u32,
        attr: &QpAttr,
        mask: M,
    ) -> Result<(), softverbs_core::Error> {
        let (ctx, h) = self.owner_of(qpn).expect("QP with a handle");
        self.core.modify_qp(ctx, h, attr, mask)?;
        let now = self.core.query_qp(ctx, h)?.attr;
        self.engine.modify_qp(qpn, &now);
        Ok(())
    }

    /// Brings a connected QP to RTS (RTR for an XRC receive QP) towards `remote_qpn` at
    /// `remote_gid`, with the given retry parameters.
    pub fn connect(&mut self, qpn: u32, remote_gid: Gid, remote_qpn: u32, p: ConnParams) {
        let t = self.qp_type(qpn);
        let access = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        let init = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: p.access.unwrap_or(access),
            qkey: p.qkey,
            ..QpAttr::default()
        };
        let init_mask = if t == QpType::Ud {
            M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY
        } else {
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS
        };
        self.modify(qpn, &init, init_mask).expect("RESET->INIT");
        let av = AhAttr {
            dgid: remote_gid,
            is_global: true,
            port_num: 1,
            hop_limit: 64,
            ..AhAttr::default()
        };
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            ah_attr: av,
            path_mtu: p.mtu,
            dest_qp_num: remote_qpn,
            rq_psn: p.rq_psn,
            max_dest_rd_atomic: p.max_dest_rd_atomic,
            min_rnr_timer: p.min_rnr_timer,
            ..init
        };
        let rtr_mask = match t {
            QpType::Ud => M::STATE,
            QpType::Uc | QpType::XrcSend => {
                M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN
            }
            _ => {
                M::STATE
                    | M::AV
                    | M::PATH_MTU
                    | M::DEST_QPN
                    | M::RQ_PSN
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER
            }
        };
        self.modify(qpn, &rtr, rtr_mask).expect("INIT->RTR");
        if t == QpType::XrcRecv {
            return;
        }
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: p.sq_psn,
            timeout: p.timeout,
            retry_cnt: p.retry_cnt,
            rnr_retry: p.rnr_retry,
            max_rd_atomic: p.max_rd_atomic,
            ..rtr
        };
        let rts_mask = match t {
            QpType::Ud | QpType::Uc => M::STATE | M::SQ_PSN,
            _ => {
                M::STATE
                    | M::SQ_PSN
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC
            }
        };
        self.modify(qpn, &rts, rts_mask).expect("RTR->RTS");
    }

    fn qp_type(&self, qpn: u32) -> QpType {
        match self.core.qp_target(qpn).expect("QP") {
            softverbs_core::datapath::QpTarget::Owned { qp_type, .. } => qp_type,
            softverbs_core::datapath::QpTarget::XrcRecv => QpType::XrcRecv,
        }
    }

    /// Moves the engine's outputs into the host's records and mirrors QP failures into the
    /// core (raising their async events there).
    pub fn pump(&mut self) {
        while let Some(n) = self.engine.poll_window_note() {
            self.core.note_window_binding(n.ctx, n.mr, n.bound);
        }
        while let Some(o) = self.engine.poll_output() {
            match o {
                Output::Completion { cq, wc } => {
                    let record = &mut self.completions;
                    let Some(c) = self.cqs.get_mut(&cq) else {
                        record.push((cq, wc));
                        continue;
                    };
                    let mut push = |w: &WorkCompletion| {
                        record.push((cq, *w));
                        true
                    };
                    if let Delivery::Stored { notify: Some(_) } = c.complete(wc, Some(&mut push)) {
                        self.channel.fire(cq);
                    }
                }
                Output::QpError { qpn, event } => {
                    match event {
                        Some(e) => {
                            self.core.fail_qp(qpn, e);
                        }
                        None => self.core.mark_qp_error(qpn),
                    }
                    self.failures.push((qpn, event));
                }
                Output::SrqLimitReached { srq } => self.srq_limits.push(srq),
            }
        }
    }

    /// Completions of `cq`, removed from the record.
    pub fn take_completions(&mut self, cq: CqId) -> Vec<WorkCompletion> {
        let (mine, rest): (Vec<_>, Vec<_>) =
            self.completions.drain(..).partition(|(c, _)| *c == cq);
        self.completions = rest;
        mine.into_iter().map(|(_, wc)| wc).collect()
    }
}

/// Connection parameters for [`Host::connect`].
#[derive(Clone, Copy, Debug)]
pub struct ConnParams {
    /// Path MTU.
    pub mtu: Mtu,
    /// ACK timeout code.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7 = unlimited).
    pub rnr_retry: u8,
    /// RNR timer code the responder advertises.
    pub min_rnr_timer: u8,
    /// Initiator depth.
    pub max_rd_atomic: u8,
    /// Responder resources.
    pub max_dest_rd_atomic: u8,
    /// Initial send PSN.
    pub sq_psn: u32,
    /// Initial expected PSN.
    pub rq_psn: u32,
    /// QP access flags (default: everything).
    pub access: Option<Access>,
    /// Q_Key (UD).
    pub qkey: u32,
}

impl Default for ConnParams {
    fn default() -> Self {
        ConnParams {
            mtu: Mtu::M1024,
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            sq_psn: 0,
            rq_psn: 0,
            access: None,
            qkey: 0x1111_1111,
        }
    }
}

struct InFlight {
    at: Instant,
    seq: u64,
    corrupted: bool,
    to: usize,
    /// The source address, as the receiver's socket reports it.
    src: Gid,
    /// The destination address: the receiver's, or a multicast group's.
    dst: Gid,
    bytes: Vec<u8>,
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// A test's rule for losing particular datagrams (see [`Network::lose`]).
pub type LoseIf = Box<dyn FnMut(&[u8]) -> bool>;

/// Hosts joined by a faulty wire.
pub struct Network {
    /// The hosts.
    pub hosts: Vec<Host>,
    /// Simulated time.
    pub now: Instant,
    /// What happened.
    pub stats: NetStats,
    /// Every datagram as sent (before faults), with its time, when capturing.
    pub capture: Option<Vec<(Instant, Vec<u8>)>>,
    /// Every datagram the wire delivered (after faults, ICRC good): receiving host and IB
    /// bytes, when `Some` — what a receiver may be checked against.
    pub deliveries: Option<Vec<(usize, Vec<u8>)>>,
    /// Loses, besides the fault profile, each datagram (IP header through ICRC) for which it
    /// returns true: for tests that need one particular packet lost.
    pub lose: Option<LoseIf>,
    faults: FaultInjector,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
}

impl Network {
    /// A network of `hosts` with `faults`, seeded.
    pub fn new(hosts: Vec<Host>, faults: Faults, seed: u64) -> Network {
        Network {
            hosts,
            now: Instant(0),
            stats: NetStats::default(),
            capture: None,
            deliveries: None,
            lose: None,
            faults: FaultInjector::new(faults, seed),
            queue: BinaryHeap::new(),
            seq: 0,
        }
    }

    fn ip_header(src: Gid, dst: Gid) -> IpRepr {
        // Multicast leaves with TTL / hop limit 1, as the daemon's sockets send it.
        let mc = dst.is_multicast();
        match (src.to_ip(), dst.to_ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let mut ip = Ipv4Repr::new(s, d);
                if mc {
                    ip.ttl = 1;
                }
                IpRepr::V4(ip)
            }
            (s, d) => {
                let v6 = |ip: IpAddr| match ip {
                    IpAddr::V6(v) => v,
                    IpAddr::V4(v) => v.to_ipv6_mapped(),
                };
                let mut ip = Ipv6Repr::new(v6(s), v6(d));
                if mc {
                    ip.hop_limit = 1;
                }
                IpRepr::V6(ip)
            }
        }
    }

    /// Sends everything every host has ready, delivers what is due, and runs due timers.
    /// Returns false when nothing happened and nothing is pending.
    pub fn step(&mut self) -> bool {
        let mut progressed = false;
        let mut buf = vec![0u8; MAX_PACKET];
        for i in 0..self.hosts.len() {
            // Bounded per step, so a host that always has work cannot starve the others.
            for _ in 0..64 {
                let h = &mut self.hosts[i];
                let Some(tx) = h
                    .engine
                    .poll_transmit(self.now, &h.core, &mut h.mem, &mut buf)
                else {
                    break;
                };
                progressed = true;
                let ip = Self::ip_header(h.gid, tx.dgid);
                let udp = UdpRepr {
                    src_port: tx.udp_sport,
                    dst_port: ROCE_V2_UDP_PORT,
                };
                let mut dgram = vec![0u8; 40 + 8 + tx.len];
                let Ok(hl) = emit_ip_udp(&ip, &udp, tx.len, &mut dgram) else {
                    continue;
                };
                dgram.truncate(hl + tx.len);
                dgram[hl..].copy_from_slice(&buf[..tx.len]);
                let (hdr, pkt) = dgram.split_at_mut(hl);
                if icrc::write(hdr, pkt).is_err() {
                    continue;
                }
                self.stats.sent += 1;
                if let Some(c) = &mut self.capture {
                    c.push((self.now, dgram.clone()));
                }
                let src = self.hosts[i].gid;
                if tx.dgid.is_multicast() {
                    // The sender's own QPs get it without the wire (as the daemon does); every
                    // other host that joined the group gets its own copy over the wire, each
                    // copy faulted independently, as on a switched segment.
                    let meta = RxMeta {
                        sgid: src,
                        dgid: tx.dgid,
                    };
                    let h = &mut self.hosts[i];
                    h.engine.handle_own_multicast(
                        self.now,
                        &h.core,
                        &mut h.mem,
                        meta,
                        &buf[..tx.len],
                    );
                    for to in 0..self.hosts.len() {
                        if to != i && self.hosts[to].engine.in_mcast_group(tx.dgid) {
                            self.transmit(src, tx.dgid, to, dgram.clone(), tx.len);
                        }
                    }
                    continue;
                }
                let Some(to) = self.hosts.iter().position(|h| h.gid == tx.dgid) else {
                    continue;
                };
                if self.lose.as_mut().is_some_and(|lose| lose(&dgram)) {
                    self.stats.lost += 1;
                    continue;
                }
                self.transmit(src, tx.dgid, to, dgram, tx.len);
            }
        }
        while self.queue.peek().is_some_and(|Reverse(p)| p.at <= self.now) {
            let Reverse(p) = self.queue.pop().expect("peeked");
            progressed = true;
            if icrc::verify_datagram(&p.bytes).is_err() {
                self.stats.rejected += 1;
                continue;
            }
            let Ok((_, ib)) = split_ip_udp(&p.bytes) else {
                continue;
            };
            if Packet::parse(ib).is_err() {
                continue;
            }
            self.stats.delivered += 1;
            if p.corrupted {
                self.stats.corrupt_accepted += 1;
            }
            if let Some(d) = &mut self.deliveries {
                d.push((p.to, ib.to_vec()));
            }
            let meta = RxMeta {
                sgid: p.src,
                dgid: p.dst,
            };
            let h = &mut self.hosts[p.to];
            h.engine
                .handle_packet(self.now, &h.core, &mut h.mem, meta, ib);
        }
        for h in &mut self.hosts {
            h.pump();
        }
        progressed
    }

    /// Puts a forged datagram on the wire, as a host that is not part of the network (or one
    /// spoofing a member's address) would: `ib` (BTH through the ICRC slot) from `src`, UDP
    /// source port `sport`, to host `to`, with a correct ICRC. It skips the fault profile and
    /// arrives after the one-way delay, like any packet sent now.
    pub fn inject(&mut self, src: IpAddr, sport: u16, to: usize, ib: &[u8]) {
        let (src, dst) = (Gid::from_ip(src), self.hosts[to].gid);
        let udp = UdpRepr {
            src_port: sport,
            dst_port: ROCE_V2_UDP_PORT,
        };
        let mut dgram = vec![0u8; 40 + 8 + ib.len()];
        let Ok(hl) = emit_ip_udp(&Self::ip_header(src, dst), &udp, ib.len(), &mut dgram) else {
            return;
        };
        dgram.truncate(hl + ib.len());
        dgram[hl..].copy_from_slice(ib);
        let (hdr, pkt) = dgram.split_at_mut(hl);
        if icrc::write(hdr, pkt).is_err() {
            return;
        }
        self.seq += 1;
        self.queue.push(Reverse(InFlight {
            at: self.now.after(self.faults.faults().delay),
            seq: self.seq,
            corrupted: false,
            to,
            src,
            dst,
            bytes: dgram,
        }));
    }

    fn transmit(&mut self, src: Gid, dst: Gid, to: usize, bytes: Vec<u8>, ib_len: usize) {
        let delay = self.faults.faults().delay;
        for _ in 0..self.faults.copies(&mut self.stats) {
            let mut b = bytes.clone();
            let ib_start = b.len() - ib_len;
            let corrupted = self.faults.damage(&mut b[ib_start..], &mut self.stats);
            let late = self.faults.hold(&mut self.stats).unwrap_or(0);
            self.seq += 1;
            self.queue.push(Reverse(InFlight {
                at: self.now.after(delay + delay * late),
                seq: self.seq,
                corrupted,
                to,
                src,
                dst,
                bytes: b,
            }));
        }
    }

    /// Advances time to the next delivery or timer (running due timers). Returns false when
    /// nothing is scheduled at all.
    pub fn advance(&mut self) -> bool {
        let next_pkt = self.queue.peek().map(|Reverse(p)| p.at);
        let next_timer = self
            .hosts
            .iter()
            .filter_map(|h| h.engine.poll_timeout())
            .min();
        let Some(next) = [next_pkt, next_timer].into_iter().flatten().min() else {
            return false;
        };
        self.now = self.now.max(next);
        for h in &mut self.hosts {
            h.engine.handle_timeout(self.now);
            h.pump();
        }
        true
    }

    /// Runs until `done` holds, the network is idle, or `limit` of simulated time passes.
    /// Returns whether `done` held.
    pub fn run_until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&mut Network) -> bool,
    ) -> bool {
        let end = self.now.after(limit);
        loop {
            if done(self) {
                return true;
            }
            if self.now > end {
                return false;
            }
            if !self.step() && !self.advance() {
                return done(self);
            }
        }
    }
}
