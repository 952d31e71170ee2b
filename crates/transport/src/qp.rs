//! The shared QP types (as rxe's `rxe_loc.h`/`rxe_verbs.h`): a QP with its send and
//! receive queues and the state of its three roles, the per-call environment, and the
//! helpers every role uses (`flush`, `fail_qp`, `go_back`, `transport_of`). The engine,
//! requester, responder and completer build on this module; it builds on none of them, so
//! the transport's modules form a DAG: engine → {requester → completer, responder} → qp.

use std::collections::VecDeque;

use foldhash::HashMap;

use softverbs_core::attr::QpAttr;
use softverbs_core::datapath::MemKeys;
use softverbs_core::datapath::PdRef;
use softverbs_core::device::Gid;
use softverbs_core::ids::{CtxId, Handle};
use softverbs_core::types::{EventType, QpState, QpType};
use softverbs_wire::psn::{psn_add, psn_diff, PSN_MASK};
use softverbs_wire::{Syndrome, Transport};

use crate::memory::Memory;
use crate::time::Instant;
use crate::wr::{RecvWr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion};

/// A completion queue, named as the shell likes (the daemon packs (context, CQ handle)).
pub type CqId = u64;

/// The [`CqId`] of a core CQ handle: the context in the high 32 bits, the handle in the low
/// (how the daemon and the simulator name CQs, so each context's handles stay apart).
pub fn cq_id(ctx: CtxId, cq: Handle) -> CqId {
    (ctx.0 << 32) | u64::from(cq.0)
}

/// An SRQ: its owning context and handle (the same names the core's XRC resolution returns).
pub type SrqKey = (CtxId, Handle);

/// The largest number of request packets a QP keeps unacknowledged.
pub const WINDOW: u32 = 128;

/// Creation-time facts of a QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpConfig {
    /// QP number.
    pub qpn: u32,
    /// Type.
    pub qp_type: QpType,
    /// The PD (owned QPs; an XRC receive QP has none: its SRQs' PDs apply).
    pub pd: Option<PdRef>,
    /// Send CQ.
    pub send_cq: Option<CqId>,
    /// Receive CQ (unused with an SRQ's own CQ, i.e. XRC).
    pub recv_cq: Option<CqId>,
    /// The SRQ replacing the receive queue, if any.
    pub srq: Option<SrqKey>,
    /// Every send WR is signaled.
    pub sq_sig_all: bool,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Gather entries per send WR.
    pub max_send_sge: u32,
    /// Scatter entries per receive WR.
    pub max_recv_sge: u32,
    /// Largest inline payload.
    pub max_inline: u32,
    /// The port's active MTU: the message limit of a UD QP, which has no path MTU.
    pub port_mtu: softverbs_core::types::Mtu,
}

/// Where an SRQ's receives come from when the engine holds none: the shell's queue that
/// others take from too (the same-host direct path's libraries, docs/design/direct-path.md,
/// "SRQs"), so the engine takes one only when a message needs it instead of holding a
/// stock of them. The feed also decides the SRQ's limit event for what it hands out.
pub trait SrqFeed {
    /// The next receive of `key`, if one is posted (oldest first).
    fn next_recv(&mut self, key: SrqKey) -> Option<softverbs_core::wr::RecvWr>;
}

/// No feed: an SRQ holds only what [`Engine::post_srq_recv`](crate::Engine::post_srq_recv)
/// put in.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoFeed;

impl SrqFeed for NoFeed {
    fn next_recv(&mut self, _key: SrqKey) -> Option<softverbs_core::wr::RecvWr> {
        None
    }
}

/// Creation-time facts of an SRQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqConfig {
    /// Owner and handle.
    pub key: SrqKey,
    /// PD of its receive buffers (and, for an XRC SRQ, of RDMA aimed at it).
    pub pd: PdRef,
    /// The XRC SRQ's own CQ (basic SRQs complete on the QP's receive CQ).
    pub cq: Option<CqId>,
    /// Depth.
    pub max_wr: u32,
    /// Scatter entries per WR.
    pub max_sge: u32,
}

pub(crate) struct Srq {
    pub(crate) cfg: SrqConfig,
    pub(crate) queue: VecDeque<RecvWr>,
    /// Armed limit (`IBV_SRQ_LIMIT`); 0 = disarmed.
    pub(crate) limit: u32,
}

/// Where a received packet came from and arrived at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxMeta {
    /// The sender's GID (its IP address).
    pub sgid: Gid,
    /// The local GID it was sent to.
    pub dgid: Gid,
}

/// A packet [`Engine::poll_transmit`](crate::Engine::poll_transmit) wrote into the caller's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Bytes written: BTH through ICRC (the ICRC slot is zero; the shell computes it over
    /// the IP/UDP headers it adds).
    pub len: usize,
    /// Destination GID.
    pub dgid: Gid,
    /// Index of the local source GID.
    pub sgid_index: u8,
    /// UDP source port: fixed per QP, so one QP's packets are never reordered by ECMP.
    pub udp_sport: u16,
}

/// Something the shell must act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// A work completion for CQ `cq`.
    Completion {
        /// The CQ.
        cq: CqId,
        /// The completion.
        wc: WorkCompletion,
    },
    /// The engine moved QP `qpn` to the error state; the shell mirrors it in the core and, if
    /// `event` is set, raises that async event (to every holder of a receive QP).
    QpError {
        /// The QP.
        qpn: u32,
        /// The affiliated async event, if the error has one.
        event: Option<EventType>,
    },
    /// An armed SRQ fell below its limit (`SRQ_LIMIT_REACHED`, IBA 10.2.9.3).
    SrqLimitReached {
        /// The SRQ.
        srq: SrqKey,
    },
}

/// A send work request with the transport's bookkeeping.
#[derive(Debug)]
pub(crate) struct SendWqe {
    pub(crate) wr: SendWr,
    pub(crate) len: u32,
    /// PSN of the first packet (valid once `started`).
    pub(crate) first_psn: u32,
    /// PSNs the message occupies (request packets, or response packets for a READ).
    pub(crate) npkts: u32,
    pub(crate) started: bool,
    /// All request packets sent at least once.
    pub(crate) sent: bool,
    /// READ: response packets placed so far; atomics: 1 once the ACK arrived.
    pub(crate) resp_pkts: u32,
    pub(crate) done: bool,
}

pub(crate) struct Qp {
    pub(crate) cfg: QpConfig,
    pub(crate) attr: QpAttr,
    pub(crate) sq: VecDeque<SendWqe>,
    pub(crate) rq: VecDeque<RecvWr>,
    pub(crate) req: ReqState,
    pub(crate) resp: RespState,
    pub(crate) scheduled: bool,
    /// What happened to this QP (`crate::counters`).
    pub(crate) cnt: crate::counters::Counters,
    /// The device's [`RETRY_FLOOR`](crate::time::RETRY_FLOOR) (`Engine::set_retry_floor`).
    pub(crate) retry_floor: std::time::Duration,
}

impl Qp {
    pub(crate) fn mtu(&self) -> u32 {
        if self.cfg.qp_type == QpType::Ud {
            self.cfg.port_mtu.bytes()
        } else {
            self.attr.path_mtu.bytes()
        }
    }

    pub(crate) fn udp_sport(&self) -> u16 {
        // RoCE v2 source-port entropy, fixed per QP (0xC000 + 14 bits of a QPN hash).
        let h = self.cfg.qpn.wrapping_mul(0x9E37_79B1) >> 18;
        0xC000 | (h as u16 & 0x3FFF)
    }

    pub(crate) fn signaled(&self, wr: &SendWr) -> bool {
        wr.signaled || self.cfg.sq_sig_all
    }

    /// Whether a packet from `sgid` may be for this QP. A connected QP (RC, UC, XRC INI and
    /// TGT) talks only to the node of the path it was connected with (`ah_attr.dgid` at RTR:
    /// where it sends, so where its peer is); UD takes datagrams from anyone and checks their
    /// Q_Key instead (IBA 10.2.5). Comparing IP addresses, not raw GIDs, keeps an IPv4 peer
    /// equal to itself however its GID was spelled (RoCE v2 GIDs of IPv4 addresses are
    /// IPv4-mapped IPv6, IBA Annex A17).
    pub(crate) fn accepts_from(&self, sgid: Gid) -> bool {
        self.cfg.qp_type == QpType::Ud || sgid.to_ip() == self.attr.ah_attr.dgid.to_ip()
    }

    pub(crate) fn is_reliable(&self) -> bool {
        matches!(
            self.cfg.qp_type,
            QpType::Rc | QpType::XrcSend | QpType::XrcRecv
        )
    }
}

/// Borrowed environment of one engine call.
pub(crate) struct Env<'a, M: Memory> {
    pub(crate) now: Instant,
    pub(crate) core: &'a dyn MemKeys,
    pub(crate) mem: &'a mut M,
    pub(crate) out: &'a mut VecDeque<Output>,
    pub(crate) srqs: &'a mut HashMap<SrqKey, Srq>,
    pub(crate) windows: &'a mut crate::mw::Windows,
    pub(crate) feed: &'a mut dyn SrqFeed,
}

impl<M: Memory> Env<'_, M> {
    pub(crate) fn complete(&mut self, cq: Option<CqId>, wc: WorkCompletion) {
        if let Some(cq) = cq {
            self.out.push_back(Output::Completion { cq, wc });
        }
    }
}

/// Requester progress of one QP.
#[derive(Debug, Default)]
pub(crate) struct ReqState {
    /// PSN after the highest PSN ever assigned.
    pub(crate) next_psn: u32,
    /// Index in the send queue of the request being (re)sent.
    pub(crate) send_idx: usize,
    /// Packet index within it.
    pub(crate) send_pkt: u32,
    /// Retries left after a timeout or sequence NAK (reset on progress).
    pub(crate) retry_left: u8,
    /// RNR retries left (7 = unlimited, IBA 9.7.5.2.8).
    pub(crate) rnr_left: u8,
    /// When to retransmit if nothing is acknowledged.
    pub(crate) timer: Option<Instant>,
    /// Until when an RNR NAK holds transmission.
    pub(crate) rnr_until: Option<Instant>,
    /// Since when the requester has waited without progress: the last acknowledgement that
    /// advanced, the RNR wait's end, or the send that started a wait (the floor of
    /// `time::retries_spent` counts from here; local stalls move it like the timers).
    pub(crate) quiet_since: Instant,
    /// Retransmissions after the retry budget was spent, the floor not yet reached
    /// (`time::past_budget_timer`); reset with the budget.
    pub(crate) past_budget: u8,
    /// The highest PSN the responder has acknowledged (explicitly, or implicitly by a NAK).
    pub(crate) acked_psn: u32,
    /// PSN after the newest PSN sent: the end of the window of PSNs a response may carry
    /// (see `completer::in_window`). A READ request counts its whole response range as sent.
    pub(crate) sent_psn: u32,
}

impl ReqState {
    pub(crate) fn reset_psn(&mut self, sq_psn: u32, attr: &QpAttr) {
        *self = ReqState {
            next_psn: sq_psn,
            sent_psn: sq_psn,
            acked_psn: psn_add(sq_psn, PSN_MASK),
            retry_left: attr.retry_cnt,
            rnr_left: attr.rnr_retry,
            ..ReqState::default()
        };
    }

    pub(crate) fn deadline(&self) -> Option<Instant> {
        match (self.timer, self.rnr_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Where a receive work request came from (so an aborted UC message can put it back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecvSource {
    Own,
    Srq(SrqKey),
}

/// A message being received over several packets.
#[derive(Debug)]
pub(crate) enum InMsg {
    Send {
        wqe: RecvWr,
        source: RecvSource,
        offset: u32,
        cq: Option<CqId>,
        pd: PdRef,
    },
    Write {
        ctx: CtxId,
        addr: u64,
        /// The MR is an on-demand-paging one (`MemTarget::on_demand`).
        on_demand: bool,
        remaining: u32,
        total: u32,
        /// The RETH's R_Key and the address the next packet lands at, checked again for
        /// every packet (`responder::execute_write`).
        rkey: u32,
        va: u64,
    },
}

/// Something the responder has to send.
#[derive(Debug)]
pub(crate) enum RespOut {
    Ack {
        psn: u32,
        syndrome: Syndrome,
    },
    AtomicAck {
        psn: u32,
        orig: u64,
        /// An answer to a duplicate, from the replay cache.
        replay: bool,
    },
    Read {
        psn: u32,
        va: u64,
        rkey: u32,
        remaining: u32,
        first: bool,
        pd: PdRef,
        /// A duplicate READ executed again.
        replay: bool,
    },
}

/// Responder progress of one QP.
#[derive(Debug, Default)]
pub(crate) struct RespState {
    /// Expected PSN.
    pub(crate) epsn: u32,
    /// Message sequence number (IBA 9.7.5.2.7).
    pub(crate) msn: u32,
    /// A sequence NAK was sent for the current gap (IBA: send it once).
    pub(crate) nak_sent: bool,
    pub(crate) cur: Option<InMsg>,
    /// UC: dropping the rest of a message whose start was lost or refused.
    pub(crate) dropping: bool,
    pub(crate) out: VecDeque<RespOut>,
    /// Atomic results by PSN, for answering duplicates (see `responder::REPLAY_DEPTH`).
    pub(crate) replay: VecDeque<(u32, u64)>,
}

impl RespState {
    pub(crate) fn reset_psn(&mut self, rq_psn: u32) {
        *self = RespState {
            epsn: rq_psn,
            ..RespState::default()
        };
    }

    /// Abandons a message in progress, returning its receive work request.
    pub(crate) fn abort_message(&mut self) -> Option<RecvWr> {
        match self.cur.take() {
            Some(InMsg::Send { wqe, .. }) => Some(wqe),
            _ => None,
        }
    }

    pub(crate) fn clear_outputs(&mut self) {
        self.out.clear();
        self.cur = None;
    }
}

/// Completes every outstanding work request of `qp` with `WR_FLUSH_ERR` (IBA 10.3.1.9).
pub(crate) fn flush(qp: &mut Qp, out: &mut VecDeque<Output>) {
    let qpn = qp.cfg.qpn;
    for w in qp.sq.drain(..) {
        if !w.done {
            let wc =
                WorkCompletion::new(w.wr.wr_id, WcStatus::WrFlushErr, w.wr.op.wc_opcode(), qpn);
            if let Some(cq) = qp.cfg.send_cq {
                out.push_back(Output::Completion { cq, wc });
            }
        }
    }
    for r in qp.rq.drain(..) {
        let wc = WorkCompletion::new(r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qpn);
        if let Some(cq) = qp.cfg.recv_cq {
            out.push_back(Output::Completion { cq, wc });
        }
    }
    if let Some(r) = qp.resp.abort_message() {
        let wc = WorkCompletion::new(r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qpn);
        if let (Some(cq), None) = (qp.cfg.recv_cq, qp.cfg.srq) {
            out.push_back(Output::Completion { cq, wc });
        }
    }
    qp.req = ReqState::default();
    qp.resp.clear_outputs();
}

/// Moves `qp` to ERR after a transport error, flushing its work, and tells the shell.
pub(crate) fn fail_qp(qp: &mut Qp, out: &mut VecDeque<Output>, event: Option<EventType>) {
    qp.attr.qp_state = QpState::Err;
    qp.attr.cur_qp_state = QpState::Err;
    flush(qp, out);
    out.push_back(Output::QpError {
        qpn: qp.cfg.qpn,
        event,
    });
}

/// Repositions the requester to retransmit from PSN `psn` (go-back-N, IBA 9.7.5.1.3).
pub(crate) fn go_back(qp: &mut Qp, psn: u32) {
    let mtu = qp.mtu();
    for (i, w) in qp.sq.iter_mut().enumerate() {
        if !w.started {
            qp.req.send_idx = i;
            qp.req.send_pkt = 0;
            return;
        }
        let off = psn_diff(psn, w.first_psn);
        if off < w.npkts as i32 && !w.done {
            qp.req.send_idx = i;
            qp.req.send_pkt = if w.wr.op.is_atomic() {
                0
            } else if matches!(w.wr.op, SendOp::Read { .. }) {
                // Ask again only for the responses that have not arrived.
                w.resp_pkts.min(w.len.div_ceil(mtu))
            } else {
                off.max(0) as u32
            };
            w.sent = false;
            return;
        }
    }
    qp.req.send_idx = qp.sq.len();
    qp.req.send_pkt = 0;
}

pub(crate) fn transport_of(t: QpType) -> Transport {
    match t {
        QpType::Rc => Transport::Rc,
        QpType::Uc => Transport::Uc,
        QpType::Ud => Transport::Ud,
        QpType::XrcSend | QpType::XrcRecv => Transport::Xrc,
    }
}
