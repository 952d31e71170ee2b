//! The responder (IBA 9.7.5.2): checks each request's PSN, executes SENDs into receive
//! work requests, RDMA WRITEs/READs and atomics against registered memory with the access
//! checks of IBA 9.7.5.2.4 (R_Key, bounds, access flags, PD), detects duplicates (READs
//! re-executed, atomics answered from a replay cache and never re-applied), refuses with
//! RNR when no receive work request is posted, and produces ACKs, NAKs and READ responses.
//!
//! UC delivers whole messages only: a gap drops the message in progress and its receive
//! work request is reused (IBA 9.8.3). UD checks the Q_Key and puts the GRH in the first 40
//! bytes of the receive buffer, as rdma-core programs expect.

use std::net::Ipv6Addr;

use softverbs_core::datapath::PdRef;
use softverbs_core::types::{Access, EventType, QpState, QpType};
use softverbs_wire::ip::{Ipv4Repr, Ipv6Repr, IPV4_HEADER_LEN, UDP_HEADER_LEN};
use softverbs_wire::psn::{psn_add, psn_diff, PSN_MASK};
use softverbs_wire::{
    emit_packet, AethRepr, AtomicAckEthRepr, BthRepr, Headers, NakCode, Opcode, Operation,
    PacketRef, Position, RethRepr, Syndrome, Transport,
};

use crate::counters::Reject;
use crate::memory::{AtomicOp, Memory};
use crate::qp::{
    fail_qp, transport_of, CqId, Env, InMsg, Output, Qp, RecvSource, RespOut, RespState, RxMeta,
    Transmit,
};
use crate::wr::{RecvWr, WcOpcode, WcStatus, WorkCompletion, WC_GRH, WC_WITH_IMM, WC_WITH_INV};

/// Atomic results kept for duplicate detection (IBA 9.7.5.2.3 requires at least the number of
/// responder resources).
const REPLAY_DEPTH: usize = 64;

impl RespState {
    fn queue_ack(&mut self, psn: u32) {
        // Coalesce: a newer ACK covers an older one still waiting (ACKs are cumulative).
        if let Some(RespOut::Ack {
            psn: p,
            syndrome: Syndrome::Ack { .. },
        }) = self.out.back_mut()
        {
            *p = psn;
            return;
        }
        self.out.push_back(RespOut::Ack {
            psn,
            syndrome: Syndrome::Ack {
                credits: Syndrome::UNLIMITED_CREDITS,
            },
        });
    }

    fn queue_nak(&mut self, psn: u32, code: NakCode) {
        self.out.push_back(RespOut::Ack {
            psn,
            syndrome: Syndrome::Nak { code },
        });
    }

    fn outstanding_reads(&self) -> usize {
        self.out
            .iter()
            // Replays of duplicates re-send answers already counted once; they hold no new
            // responder resource.
            .filter(|o| {
                matches!(
                    o,
                    RespOut::Read { replay: false, .. } | RespOut::AtomicAck { replay: false, .. }
                )
            })
            .count()
    }
}

/// Where received SENDs land and complete.
struct Target {
    source: RecvSource,
    cq: Option<CqId>,
    pd: PdRef,
}

enum Refusal {
    /// Drop silently (bad packet, wrong state).
    Drop,
    /// NAK and move the QP to ERR with this completion status on the receive side (if a WQE
    /// was involved) and this async event.
    Fatal(NakCode, Option<EventType>),
    /// Receiver not ready.
    Rnr,
}

impl Refusal {
    /// A request the responder cannot execute as sent: out of sequence, too long, beyond
    /// its resources (NAK Invalid Request, `QP_REQ_ERR`; IBA 9.7.5.2.2, 9.7.5.2.3).
    fn invalid_request() -> Refusal {
        Refusal::Fatal(NakCode::InvalidRequest, Some(EventType::QpReqErr))
    }

    /// An R_Key, range, access-flag or XRC-domain check failed (NAK Remote Access Error,
    /// `QP_ACCESS_ERR`; IBA 9.7.5.2.4).
    fn access_error() -> Refusal {
        Refusal::Fatal(NakCode::RemoteAccessError, Some(EventType::QpAccessErr))
    }

    /// Checked memory could not be reached (NAK Remote Operational Error, `QP_FATAL`).
    fn operational_error() -> Refusal {
        Refusal::Fatal(NakCode::RemoteOperationalError, Some(EventType::QpFatal))
    }

    /// This refusal on a reliable QP; an unreliable one (UC) drops the packet instead.
    fn unless_unreliable(self, qp: &Qp) -> Refusal {
        if qp.is_reliable() {
            self
        } else {
            Refusal::Drop
        }
    }
}

pub(crate) fn receive<M: Memory>(
    qp: &mut Qp,
    env: &mut Env<'_, M>,
    meta: RxMeta,
    pkt: &PacketRef<'_>,
    scratch: &mut Vec<u8>,
) -> Option<Reject> {
    if !matches!(
        qp.attr.qp_state,
        QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
    ) {
        return Some(Reject::QpState);
    }
    if pkt.info.transport != transport_of(qp.cfg.qp_type) || qp.cfg.qp_type == QpType::XrcSend {
        return Some(Reject::BadOpcode);
    }
    if qp.cfg.qp_type == QpType::Ud {
        return receive_ud(qp, env, meta, pkt, scratch);
    }
    receive_connected(qp, env, pkt);
    None
}

/// A request for an RC, UC or XRC receive QP: its PSN, then its execution. What the PSN
/// check turns away is counted as sequence handling (`duplicate_request`,
/// `out_of_seq_request`), not as a rejected packet: IBA 9.7.5 answers it.
fn receive_connected<M: Memory>(qp: &mut Qp, env: &mut Env<'_, M>, pkt: &PacketRef<'_>) {
    let psn = pkt.headers.bth.psn;
    let d = psn_diff(psn, qp.resp.epsn);
    let reliable = qp.is_reliable();
    if d != 0 {
        if !reliable && d < 0 {
            // UC: a packet from the past is a duplicate; drop it, or a message could be
            // delivered twice.
            qp.cnt.duplicate_request += 1;
            return;
        }
        if d > 0 {
            qp.cnt.out_of_seq_request += 1;
        }
        if !reliable {
            // UC: a gap loses the message in progress (IBA 9.8.3); resynchronize on a FIRST/ONLY.
            abort_uc(qp, env);
            qp.resp.epsn = psn;
            if !matches!(pkt.info.position, Position::First | Position::Only) {
                qp.resp.dropping = true;
                qp.resp.epsn = psn_add(psn, 1);
                return;
            }
        } else if d > 0 {
            if !qp.resp.nak_sent {
                qp.resp.nak_sent = true;
                qp.cnt.send_seq_nak += 1;
                let e = qp.resp.epsn;
                qp.resp.queue_nak(e, NakCode::PsnSeqErr);
            }
            return;
        } else {
            qp.cnt.duplicate_request += 1;
            return duplicate(qp, env, pkt);
        }
    }
    qp.resp.nak_sent = false;
    match execute(qp, env, pkt) {
        Ok(()) => count_executed(qp, pkt),
        Err(Refusal::Drop) => {}
        Err(Refusal::Rnr) => {
            if reliable {
                qp.cnt.send_rnr_err += 1;
                // The packets behind this one are in the same gap: no sequence NAK for them
                // (the requester retransmits from here after the RNR wait).
                qp.resp.nak_sent = true;
                let timer = qp.attr.min_rnr_timer;
                qp.resp.out.push_back(RespOut::Ack {
                    psn,
                    syndrome: Syndrome::RnrNak { timer },
                });
            } else {
                qp.resp.dropping = true;
                qp.resp.epsn = psn_add(psn, 1);
            }
        }
        Err(Refusal::Fatal(code, event)) => {
            if code == NakCode::RemoteAccessError {
                qp.cnt.resp_remote_access_errors += 1;
            }
            if reliable {
                qp.resp.queue_nak(psn, code);
                // The NAK must still go out after the QP enters ERR.
                let out = std::mem::take(&mut qp.resp.out);
                fail_qp(qp, env.out, event);
                qp.resp.out = out;
            } else {
                qp.resp.dropping = true;
                qp.resp.epsn = psn_add(psn, 1);
            }
        }
    }
}

fn abort_uc<M: Memory>(qp: &mut Qp, env: &mut Env<'_, M>) {
    qp.resp.dropping = false;
    if let Some(InMsg::Send { wqe, source, .. }) = qp.resp.cur.take() {
        match source {
            RecvSource::Own => qp.rq.push_front(wqe),
            RecvSource::Srq(k) => {
                if let Some(s) = env.srqs.get_mut(&k) {
                    s.queue.push_front(wqe);
                }
            }
        }
    }
}

/// Finds where SENDs for this packet land: the QP's RQ, its SRQ, or (XRC) the SRQ the
/// XRCETH names, which must be in the receive QP's domain (docs/design/xrc-semantics.md §5).
fn target<M: Memory>(qp: &Qp, env: &Env<'_, M>, pkt: &PacketRef<'_>) -> Result<Target, Refusal> {
    if qp.cfg.qp_type == QpType::XrcRecv {
        let srqn = pkt.headers.xrceth.map(|x| x.xrc_srq).ok_or(Refusal::Drop)?;
        let t = env
            .core
            .resolve_xrc_srq(qp.cfg.qpn, srqn)
            .map_err(|_| Refusal::access_error())?;
        let key = (t.ctx, t.srq);
        let cq = env.srqs.get(&key).and_then(|s| s.cfg.cq);
        return Ok(Target {
            source: RecvSource::Srq(key),
            cq,
            pd: t.pd,
        });
    }
    let pd = qp.cfg.pd.ok_or(Refusal::Drop)?;
    Ok(match qp.cfg.srq {
        Some(k) => Target {
            source: RecvSource::Srq(k),
            cq: qp.cfg.recv_cq,
            pd: env.srqs.get(&k).map_or(pd, |s| s.cfg.pd),
        },
        None => Target {
            source: RecvSource::Own,
            cq: qp.cfg.recv_cq,
            pd,
        },
    })
}

fn take_recv<M: Memory>(qp: &mut Qp, env: &mut Env<'_, M>, source: RecvSource) -> Option<RecvWr> {
    match source {
        RecvSource::Own => qp.rq.pop_front(),
        RecvSource::Srq(k) => {
            let s = env.srqs.get_mut(&k)?;
            let Some(w) = s.queue.pop_front() else {
                return env.feed.next_recv(k);
            };
            if s.limit > 0 && (s.queue.len() as u32) < s.limit {
                s.limit = 0;
                env.out.push_back(Output::SrqLimitReached { srq: k });
            }
            Some(w)
        }
    }
}

/// Scatters `data` at `offset` of a receive work request.
fn scatter<M: Memory>(
    env: &mut Env<'_, M>,
    pd: PdRef,
    wqe: &RecvWr,
    offset: u32,
    data: &[u8],
) -> Result<(), WcStatus> {
    crate::sge::scatter(env, pd, &wqe.sges, offset, data)
}

fn recv_completion(
    qp_num: u32,
    wqe: &RecvWr,
    status: WcStatus,
    opcode: WcOpcode,
    byte_len: u32,
) -> WorkCompletion {
    let mut wc = WorkCompletion::new(wqe.wr_id, status, opcode, qp_num);
    wc.byte_len = byte_len;
    wc
}

/// What a request packet asks for, by its opcode (IBA 9.4).
#[derive(Clone, Copy, PartialEq, Eq)]
enum RequestKind {
    Send,
    Write,
    Read,
    Atomic,
    /// Not a request this responder executes (dropped after the checks).
    Other,
}

fn request_kind(op: Operation) -> RequestKind {
    use Operation as O;
    match op {
        O::SendFirst
        | O::SendMiddle
        | O::SendLast
        | O::SendLastWithImmediate
        | O::SendOnly
        | O::SendOnlyWithImmediate
        | O::SendLastWithInvalidate
        | O::SendOnlyWithInvalidate => RequestKind::Send,
        O::RdmaWriteFirst
        | O::RdmaWriteMiddle
        | O::RdmaWriteLast
        | O::RdmaWriteLastWithImmediate
        | O::RdmaWriteOnly
        | O::RdmaWriteOnlyWithImmediate => RequestKind::Write,
        O::RdmaReadRequest => RequestKind::Read,
        O::CompareSwap | O::FetchAdd => RequestKind::Atomic,
        _ => RequestKind::Other,
    }
}

/// Executes one in-sequence request packet (its PSN is the expected one).
fn execute<M: Memory>(
    qp: &mut Qp,
    env: &mut Env<'_, M>,
    pkt: &PacketRef<'_>,
) -> Result<(), Refusal> {
    if skips_dropped_message(qp, pkt) {
        return Ok(());
    }
    let kind = check_op_seq(qp, pkt)?;
    let t = target(qp, env, pkt)?;
    match kind {
        RequestKind::Send => execute_send(qp, env, pkt, &t)?,
        RequestKind::Write => execute_write(qp, env, pkt, &t)?,
        // A READ or atomic is answered by its response, not by an ACK.
        RequestKind::Read => return execute_read(qp, env, pkt, &t),
        RequestKind::Atomic => return execute_atomic(qp, env, pkt, &t),
        RequestKind::Other => return Err(Refusal::Drop),
    }
    let psn = pkt.headers.bth.psn;
    qp.resp.epsn = psn_add(psn, 1);
    // IBA 9.7.5.1.2: the responder may coalesce; it answers where the requester asks.
    if qp.is_reliable() && pkt.headers.bth.ack_req {
        qp.resp.queue_ack(psn);
    }
    Ok(())
}

/// UC: while the rest of a lost or refused message goes by, its packets are consumed
/// unexecuted; the next FIRST or ONLY starts over (IBA 9.8.3).
fn skips_dropped_message(qp: &mut Qp, pkt: &PacketRef<'_>) -> bool {
    if !qp.resp.dropping {
        return false;
    }
    if matches!(pkt.info.position, Position::First | Position::Only) {
        qp.resp.dropping = false;
        false
    } else {
        qp.resp.epsn = psn_add(pkt.headers.bth.psn, 1);
        true
    }
}

/// Opcode sequence (IBA 9.7.5.2.2): MIDDLE/LAST continue a message of the same kind;
/// FIRST/ONLY may not interrupt one.
fn check_op_seq(qp: &Qp, pkt: &PacketRef<'_>) -> Result<RequestKind, Refusal> {
    let kind = request_kind(pkt.info.operation);
    let continuing = matches!(pkt.info.position, Position::Middle | Position::Last);
    let seq_ok = match (&qp.resp.cur, continuing) {
        (None, false) => true,
        (Some(InMsg::Send { .. }), true) => kind == RequestKind::Send,
        (Some(InMsg::Write { .. }), true) => kind == RequestKind::Write,
        _ => false,
    };
    if seq_ok {
        Ok(kind)
    } else {
        Err(Refusal::invalid_request().unless_unreliable(qp))
    }
}

/// A SEND packet: the first takes a receive work request, each scatters its payload, the
/// last completes it (IBA 9.7.5.2.5).
fn execute_send<M: Memory>(
    qp: &mut Qp,
    env: &mut Env<'_, M>,
    pkt: &PacketRef<'_>,
    t: &Target,
) -> Result<(), Refusal> {
    let pos = pkt.info.position;
    let payload = pkt.payload;
    if !matches!(pos, Position::Middle | Position::Last) {
        let wqe = take_recv(qp, env, t.source).ok_or(Refusal::Rnr)?;
        qp.resp.cur = Some(InMsg::Send {
            wqe,
            source: t.source,
            offset: 0,
            cq: t.cq,
            pd: t.pd,
        });
    }
    let Some(InMsg::Send {
        wqe,
        offset,
        cq,
        pd,
        ..
    }) = &mut qp.resp.cur
    else {
        unreachable!("set above")
    };
    let (cq, pd) = (*cq, *pd);
    if payload.len() as u32 > qp.attr.path_mtu.bytes() {
        return Err(Refusal::invalid_request());
    }
    if let Err(status) = scatter(env, pd, wqe, *offset, payload) {
        qp.cnt.local_error(status);
        let wqe = qp.resp.abort_message().expect("in progress");
        env.complete(
            cq,
            recv_completion(qp.cfg.qpn, &wqe, status, WcOpcode::Recv, 0),
        );
        let code = if status == WcStatus::LocLenErr {
            NakCode::InvalidRequest
        } else {
            NakCode::RemoteOperationalError
        };
        return Err(Refusal::Fatal(code, None).unless_unreliable(qp));
    }
    *offset += payload.len() as u32;
    if matches!(pos, Position::Last | Position::Only) {
        let Some(InMsg::Send { wqe, offset, .. }) = qp.resp.cur.take() else {
            unreachable!("in progress")
        };
        if let Some(ieth) = pkt.headers.ieth {
            // Send with Invalidate: the key must name a bound type 2 window of this QP
            // (IBA 10.6.7.2.5, o10-37.2.26; docs/design/memory-windows.md). Anything else — a type
            // 1 or unbound window, another QP's window, an MR's key (softverbs has no
            // fast-register MRs, the only invalidatable MRs) or an unknown key — completes
            // the receive with REM_INV_REQ_ERR, NAKs Invalid Request and puts the QP in
            // error (class J; rxe's `invalidate_rkey` failing).
            if env
                .windows
                .invalidate(qp.cfg.qpn, pd, ieth.rkey, true)
                .is_err()
            {
                env.complete(
                    cq,
                    recv_completion(qp.cfg.qpn, &wqe, WcStatus::RemInvReqErr, WcOpcode::Recv, 0),
                );
                return Err(Refusal::invalid_request());
            }
        }
        let mut wc = recv_completion(qp.cfg.qpn, &wqe, WcStatus::Success, WcOpcode::Recv, offset);
        if let Some(imm) = pkt.headers.imm_dt {
            wc.imm_data = imm.imm;
            wc.wc_flags |= WC_WITH_IMM;
        }
        if let Some(ieth) = pkt.headers.ieth {
            wc.imm_data = ieth.rkey;
            wc.wc_flags |= WC_WITH_INV;
        }
        wc.solicited = pkt.headers.bth.solicited;
        env.complete(cq, wc);
        qp.resp.msn = psn_add(qp.resp.msn, 1);
    }
    Ok(())
}

/// An RDMA WRITE packet: the first checks the RETH's R_Key and range (IBA 9.7.5.2.4), each
/// places its payload, and a last one with immediate data consumes a receive work request.
fn execute_write<M: Memory>(
    qp: &mut Qp,
    env: &mut Env<'_, M>,
    pkt: &PacketRef<'_>,
    t: &Target,
) -> Result<(), Refusal> {
    let pos = pkt.info.position;
    let payload = pkt.payload;
    if !matches!(pos, Position::Middle | Position::Last) {
        let reth = pkt.headers.reth.ok_or(Refusal::Drop)?;
        if !qp.attr.qp_access_flags.contains(Access::REMOTE_WRITE) {
            return Err(Refusal::access_error());
        }
        let (ctx, addr, on_demand) = if reth.dma_len == 0 {
            (t.pd.ctx, 0, false)
        } else {
            let m = env
                .windows
                .check_remote(
                    env.core,
                    qp.cfg.qpn,
                    t.pd,
                    reth.rkey,
                    (reth.va, u64::from(reth.dma_len)),
                    Access::REMOTE_WRITE,
                )
                .map_err(|_| Refusal::access_error())?;
            (m.ctx, m.addr, m.on_demand)
        };
        qp.resp.cur = Some(InMsg::Write {
            ctx,
            addr,
            on_demand,
            remaining: reth.dma_len,
            total: reth.dma_len,
            rkey: reth.rkey,
            va: reth.va,
        });
    } else if let Some(&InMsg::Write { rkey, va, .. }) = qp.resp.cur.as_ref() {
        // Every later packet is checked again, as a NIC checks each against the memory
        // key: the MR may have been deregistered since the first (a library that runs this
        // engine writes with plain pointers, docs/design/net-path.md), and then the rest of the
        // message is refused with an access error instead of landing in freed memory.
        if !payload.is_empty() {
            let checked = env.windows.check_remote(
                env.core,
                qp.cfg.qpn,
                t.pd,
                rkey,
                (va, payload.len() as u64),
                Access::REMOTE_WRITE,
            );
            match checked {
                Err(_) => {
                    qp.resp.cur = None;
                    return Err(Refusal::access_error());
                }
                Ok(m) => {
                    if let Some(InMsg::Write { addr, .. }) = &mut qp.resp.cur {
                        // Re-registered elsewhere (rereg_mr): the bytes go where the key
                        // says now.
                        *addr = m.addr;
                    }
                }
            }
        }
    }
    let Some(InMsg::Write {
        ctx,
        addr,
        on_demand,
        remaining,
        va,
        ..
    }) = &mut qp.resp.cur
    else {
        unreachable!("set above")
    };
    let last = matches!(pos, Position::Last | Position::Only);
    if payload.len() as u32 > *remaining || (last && payload.len() as u32 != *remaining) {
        qp.resp.cur = None;
        return Err(Refusal::invalid_request().unless_unreliable(qp));
    }
    if !payload.is_empty() {
        if env.mem.write_for(*on_demand, *ctx, *addr, payload).is_err() {
            // An ODP page fault that finds no mapping is an access violation to a NIC (rxe
            // and mlx5 NAK it as a remote access error); memory that was registered pinned
            // and then vanished is an operational failure of the responder.
            let refusal = if *on_demand {
                Refusal::access_error()
            } else {
                Refusal::operational_error()
            };
            qp.resp.cur = None;
            return Err(refusal.unless_unreliable(qp));
        }
        *addr += payload.len() as u64;
        *va += payload.len() as u64;
        *remaining -= payload.len() as u32;
    }
    if last {
        if let Some(imm) = pkt.headers.imm_dt {
            // WRITE with immediate consumes a receive work request at the end (IBA 9.4.3).
            let Some(wqe) = take_recv(qp, env, t.source) else {
                // The data is placed; the retransmitted LAST packet will find a WQE.
                if let Some(InMsg::Write {
                    remaining,
                    addr,
                    va,
                    ..
                }) = &mut qp.resp.cur
                {
                    *addr -= payload.len() as u64;
                    *va -= payload.len() as u64;
                    *remaining += payload.len() as u32;
                }
                return Err(Refusal::Rnr);
            };
            let Some(InMsg::Write { total, .. }) = qp.resp.cur.take() else {
                unreachable!("in progress")
            };
            let mut wc = recv_completion(
                qp.cfg.qpn,
                &wqe,
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                total,
            );
            wc.imm_data = imm.imm;
            wc.wc_flags |= WC_WITH_IMM;
            wc.solicited = pkt.headers.bth.solicited;
            env.complete(t.cq, wc);
        } else {
            qp.resp.cur = None;
        }
        qp.resp.msn = psn_add(qp.resp.msn, 1);
    }
    Ok(())
}

/// An RDMA READ request: checked and queued for its responses, which take the PSNs after it.
fn execute_read<M: Memory>(
    qp: &mut Qp,
    env: &mut Env<'_, M>,
    pkt: &PacketRef<'_>,
    t: &Target,
) -> Result<(), Refusal> {
    let psn = pkt.headers.bth.psn;
    let reth = pkt.headers.reth.ok_or(Refusal::Drop)?;
    read_request(qp, env, t.pd, psn, reth, false)?;
    let npkts = reth.dma_len.div_ceil(qp.attr.path_mtu.bytes()).max(1);
    qp.resp.epsn = psn_add(psn, npkts);
    qp.resp.msn = psn_add(qp.resp.msn, 1);
    Ok(())
}

/// An atomic (IBA 9.4.5): checked, applied once, its original value remembered for
/// duplicates and sent back in an atomic ACK.
fn execute_atomic<M: Memory>(
    qp: &mut Qp,
    env: &mut Env<'_, M>,
    pkt: &PacketRef<'_>,
    t: &Target,
) -> Result<(), Refusal> {
    let psn = pkt.headers.bth.psn;
    let a = pkt.headers.atomic_eth.ok_or(Refusal::Drop)?;
    if !qp.attr.qp_access_flags.contains(Access::REMOTE_ATOMIC) {
        return Err(Refusal::access_error());
    }
    if a.va % 8 != 0 {
        return Err(Refusal::invalid_request());
    }
    if qp.resp.outstanding_reads() >= usize::from(qp.attr.max_dest_rd_atomic.max(1)) {
        return Err(Refusal::invalid_request());
    }
    let m = env
        .windows
        .check_remote(
            env.core,
            qp.cfg.qpn,
            t.pd,
            a.rkey,
            (a.va, 8),
            Access::REMOTE_ATOMIC,
        )
        .map_err(|_| Refusal::access_error())?;
    let aop = if pkt.info.operation == Operation::CompareSwap {
        AtomicOp::CompareSwap {
            compare: a.compare,
            swap: a.swap_add,
        }
    } else {
        AtomicOp::FetchAdd { add: a.swap_add }
    };
    let orig = env
        .mem
        .atomic_for(m.on_demand, m.ctx, m.addr, aop)
        .map_err(|_| {
            // As for a WRITE: an ODP access that finds no mapping is an access error.
            if m.on_demand {
                Refusal::access_error()
            } else {
                Refusal::operational_error()
            }
        })?;
    qp.resp.replay.push_back((psn, orig));
    if qp.resp.replay.len() > REPLAY_DEPTH {
        qp.resp.replay.pop_front();
    }
    qp.resp.out.push_back(RespOut::AtomicAck {
        psn,
        orig,
        replay: false,
    });
    qp.resp.epsn = psn_add(psn, 1);
    qp.resp.msn = psn_add(qp.resp.msn, 1);
    Ok(())
}

fn read_request<M: Memory>(
    qp: &mut Qp,
    env: &mut Env<'_, M>,
    pd: PdRef,
    psn: u32,
    reth: RethRepr,
    replay: bool,
) -> Result<(), Refusal> {
    let RethRepr {
        va,
        rkey,
        dma_len: len,
    } = reth;
    if !qp.attr.qp_access_flags.contains(Access::REMOTE_READ) {
        return Err(Refusal::access_error());
    }
    // Responder resources (IBA 9.7.5.2.3): at most max_dest_rd_atomic READs/atomics in hand.
    if !replay && qp.resp.outstanding_reads() >= usize::from(qp.attr.max_dest_rd_atomic.max(1)) {
        return Err(Refusal::invalid_request());
    }
    if len > 0 {
        env.windows
            .check_remote(
                env.core,
                qp.cfg.qpn,
                pd,
                rkey,
                (va, u64::from(len)),
                Access::REMOTE_READ,
            )
            .map_err(|_| Refusal::access_error())?;
    }
    qp.resp.out.push_back(RespOut::Read {
        psn,
        va,
        rkey,
        remaining: len,
        first: true,
        pd,
        replay,
    });
    Ok(())
}

/// A request whose PSN is behind the expected one (IBA 9.7.5.2.1).
/// Counts a request packet the responder executed (`crate::counters`): a message's last
/// packet completes a receive (`rdma_recvs`), a message's first packet is one WRITE, READ
/// or atomic request (mlx5's `rx_*_requests` count requests, not packets).
fn count_executed(qp: &mut Qp, pkt: &PacketRef<'_>) {
    let op = pkt.info.operation;
    let pos = pkt.info.position;
    if matches!(pos, Position::Last | Position::Only) {
        qp.cnt.rdma_recvs += 1;
    }
    if !matches!(pos, Position::First | Position::Only) {
        return;
    }
    match op {
        Operation::RdmaWriteFirst
        | Operation::RdmaWriteOnly
        | Operation::RdmaWriteOnlyWithImmediate => qp.cnt.rx_write_requests += 1,
        Operation::RdmaReadRequest => qp.cnt.rx_read_requests += 1,
        Operation::CompareSwap | Operation::FetchAdd => qp.cnt.rx_atomic_requests += 1,
        _ => {}
    }
}

fn duplicate<M: Memory>(qp: &mut Qp, env: &mut Env<'_, M>, pkt: &PacketRef<'_>) {
    let psn = pkt.headers.bth.psn;
    match pkt.info.operation {
        Operation::RdmaReadRequest => {
            // READs have no side effects: execute again from this PSN.
            let Some(reth) = pkt.headers.reth else { return };
            let Ok(t) = target(qp, env, pkt) else { return };
            // Drop any copy of the same READ still queued, so the responses are not doubled.
            qp.resp
                .out
                .retain(|o| !matches!(o, RespOut::Read { psn: p, .. } if *p == psn));
            let _ = read_request(qp, env, t.pd, psn, reth, true);
        }
        Operation::CompareSwap | Operation::FetchAdd => {
            // Never applied twice: answer from the replay cache.
            if let Some(&(_, orig)) = qp.resp.replay.iter().find(|(p, _)| *p == psn) {
                if !qp
                    .resp
                    .out
                    .iter()
                    .any(|o| matches!(o, RespOut::AtomicAck { psn: p, .. } if *p == psn))
                {
                    qp.resp.out.push_back(RespOut::AtomicAck {
                        psn,
                        orig,
                        replay: true,
                    });
                }
            }
        }
        _ => {
            if pkt.headers.bth.ack_req {
                let last = psn_add(qp.resp.epsn, 0xFF_FFFF);
                qp.resp.queue_ack(last);
            }
        }
    }
}

fn receive_ud<M: Memory>(
    qp: &mut Qp,
    env: &mut Env<'_, M>,
    meta: RxMeta,
    pkt: &PacketRef<'_>,
    scratch: &mut Vec<u8>,
) -> Option<Reject> {
    let Some(deth) = pkt.headers.deth else {
        return Some(Reject::Malformed);
    };
    if !matches!(
        pkt.info.operation,
        Operation::SendOnly | Operation::SendOnlyWithImmediate
    ) {
        return Some(Reject::BadOpcode);
    }
    // IBA 10.2.5: a Q_Key mismatch silently drops the datagram.
    if deth.qkey != qp.attr.qkey {
        return Some(Reject::BadQkey);
    }
    // A QP without a protection domain has nowhere to put it.
    let Ok(t) = target(qp, env, pkt) else {
        return Some(Reject::NoRecv);
    };
    // No receive work request: UD drops the datagram (IBA 9.8.1).
    let Some(wqe) = take_recv(qp, env, t.source) else {
        return Some(Reject::NoRecv);
    };
    scratch.clear();
    scratch.extend_from_slice(&grh(meta, pkt.as_bytes().len()));
    scratch.extend_from_slice(pkt.payload);
    let (status, len) = match scatter(env, t.pd, &wqe, 0, scratch) {
        Ok(()) => (WcStatus::Success, scratch.len() as u32),
        Err(s) => (s, 0),
    };
    let mut wc = recv_completion(qp.cfg.qpn, &wqe, status, WcOpcode::Recv, len);
    wc.src_qp = deth.src_qp;
    wc.wc_flags |= WC_GRH;
    wc.sl = if is_ipv4(meta) {
        SL_L3_IPV4
    } else {
        SL_L3_IPV6
    };
    if let Some(imm) = pkt.headers.imm_dt {
        wc.imm_data = imm.imm;
        wc.wc_flags |= WC_WITH_IMM;
    }
    wc.solicited = pkt.headers.bth.solicited;
    env.complete(t.cq, wc);
    None
}

/// `wc.sl` of a UD receive carried over IPv4 / IPv6: mlx5's L3 header type for RoCE
/// responders, which UCX reads to locate the DGID in the GRH area (`docs/design/roce-wire.md`).
const SL_L3_IPV4: u8 = 2;
const SL_L3_IPV6: u8 = 1;

/// Whether the datagram travelled over IPv4 (both GIDs IPv4-mapped, RFC 4291 2.5.5.2).
fn is_ipv4(meta: RxMeta) -> bool {
    Ipv6Addr::from(meta.sgid.0).to_ipv4_mapped().is_some()
        && Ipv6Addr::from(meta.dgid.0).to_ipv4_mapped().is_some()
}

/// The 40 bytes rdma-core programs find before UD data: an IPv6 header for IPv6 GIDs, or for
/// IPv4 RoCE v2 twenty zero bytes followed by the IPv4 header, each as the sender's
/// defaults would have written it for this packet (`ib_len` bytes, BTH to ICRC).
fn grh(meta: RxMeta, ib_len: usize) -> [u8; 40] {
    let mut g = [0u8; 40];
    let udp_len = UDP_HEADER_LEN + ib_len;
    let (src, dst) = (Ipv6Addr::from(meta.sgid.0), Ipv6Addr::from(meta.dgid.0));
    // A length too large for the IP header's field cannot have arrived in a UDP datagram;
    // its GRH would stay zero.
    // A multicast datagram left its sender with the sockets' multicast TTL / hop limit, 1
    // (ip(7), ipv6(7): the segment).
    let hops = if meta.dgid.is_multicast() {
        Some(1)
    } else {
        None
    };
    let _ = match (src.to_ipv4_mapped(), dst.to_ipv4_mapped()) {
        (Some(s), Some(d)) => {
            let mut ip = Ipv4Repr::new(s, d);
            ip.ttl = hops.unwrap_or(ip.ttl);
            ip.emit(&mut g[40 - IPV4_HEADER_LEN..], udp_len)
        }
        _ => {
            let mut ip = Ipv6Repr::new(src, dst);
            ip.hop_limit = hops.unwrap_or(ip.hop_limit);
            ip.emit(&mut g, udp_len)
        }
    };
    g
}

/// An RNR NAK (IBA 9.7.5.2.8) for `qp`'s peer at expected PSN `epsn` with MSN `msn`, built
/// by someone answering for the responder that owns the QP's state elsewhere: the daemon,
/// for a net-path library that stopped running (docs/design/net-path.md, "Stalls"). Like every NAK
/// it acknowledges the PSNs before `epsn` (IBA 9.7.5.1.3); the requester retransmits from
/// `epsn` after the QP's RNR timer, and with `rnr_retry` 7 it never runs out. Only for an RC
/// QP at RTR or later.
pub(crate) fn rnr_nak_for(qp: &Qp, epsn: u32, msn: u32, buf: &mut [u8]) -> Option<Transmit> {
    answer_for(qp, epsn, msn, false, buf)
}

/// The ACK of everything before expected PSN `epsn` (PSN `epsn` − 1, MSN `msn`: a coalesced
/// ACK, IBA 9.7.5.1.2), sent for a responder that does not run when a duplicate request
/// arrives — one it received, whose ACK it had not sent yet. An RNR NAK at `epsn` would lie
/// outside that requester's window (it sent nothing at `epsn` yet) and be dropped there.
pub(crate) fn ack_for(qp: &Qp, epsn: u32, msn: u32, buf: &mut [u8]) -> Option<Transmit> {
    answer_for(qp, epsn, msn, true, buf)
}

fn answer_for(qp: &Qp, epsn: u32, msn: u32, ack: bool, buf: &mut [u8]) -> Option<Transmit> {
    if qp.cfg.qp_type != QpType::Rc
        || !matches!(qp.attr.qp_state, QpState::Rtr | QpState::Rts | QpState::Sqd)
    {
        return None;
    }
    let opcode = Opcode::new(Transport::Rc, Operation::Acknowledge).ok()?;
    let psn = if ack { psn_add(epsn, PSN_MASK) } else { epsn };
    let mut h = Headers::new(BthRepr::new(opcode, qp.attr.dest_qp_num, psn & 0xFF_FFFF));
    // The QP's own RNR timer, as its responder would send. Tried: at least 10.24 ms (code
    // 20), to spare the requester and the daemon a storm of retransmissions while the
    // process is stopped: the requester then went a whole ACK timeout without an answer
    // more often (a retry each time, and RNR NAKs restore none), and failed sooner.
    let timer = qp.attr.min_rnr_timer;
    h.aeth = Some(AethRepr {
        syndrome: if ack {
            Syndrome::Ack {
                credits: Syndrome::UNLIMITED_CREDITS,
            }
        } else {
            Syndrome::RnrNak { timer }
        },
        msn: msn & 0xFF_FFFF,
    });
    let len = emit_packet(&h, &[], buf).ok()?;
    Some(Transmit {
        len,
        dgid: qp.attr.ah_attr.dgid,
        sgid_index: qp.attr.ah_attr.sgid_index,
        udp_sport: qp.udp_sport(),
    })
}

/// The next response packet of `qp` (ACK, NAK, atomic ACK or READ response), if any.
pub(crate) fn next_packet<M: Memory>(
    qp: &mut Qp,
    env: &mut Env<'_, M>,
    buf: &mut [u8],
    scratch: &mut Vec<u8>,
) -> Option<Transmit> {
    let front = qp.resp.out.front_mut()?;
    let transport = transport_of(qp.cfg.qp_type);
    let mtu = qp.attr.path_mtu.bytes();
    let msn = qp.resp.msn;
    let qpn = qp.cfg.qpn;
    let bth = |operation, psn| {
        Opcode::new(transport, operation)
            .ok()
            .map(|opcode| BthRepr::new(opcode, qp.attr.dest_qp_num, psn))
    };
    let ack = |code| AethRepr {
        syndrome: code,
        msn,
    };
    let mut h;
    let mut plen = 0;
    let mut done = true;
    match front {
        RespOut::Ack { psn, syndrome } => {
            h = Headers::new(bth(Operation::Acknowledge, *psn)?);
            h.aeth = Some(ack(*syndrome));
        }
        RespOut::AtomicAck { psn, orig, .. } => {
            h = Headers::new(bth(Operation::AtomicAcknowledge, *psn)?);
            h.aeth = Some(ack(Syndrome::Ack {
                credits: Syndrome::UNLIMITED_CREDITS,
            }));
            h.atomic_ack_eth = Some(AtomicAckEthRepr { orig: *orig });
        }
        RespOut::Read {
            psn,
            va,
            rkey,
            remaining,
            first,
            pd,
            ..
        } => {
            let n = (*remaining).min(mtu);
            let last = n == *remaining;
            let op = match (*first, last) {
                (true, true) => Operation::RdmaReadResponseOnly,
                (true, false) => Operation::RdmaReadResponseFirst,
                (false, true) => Operation::RdmaReadResponseLast,
                (false, false) => Operation::RdmaReadResponseMiddle,
            };
            scratch.resize(n as usize, 0);
            if *first {
                // The response reads the whole range packet by packet from here on (also
                // when a duplicate executes it again: the memory is read anew).
                if let Ok(m) = env.windows.check_remote(
                    env.core,
                    qpn,
                    *pd,
                    *rkey,
                    (*va, u64::from(*remaining)),
                    Access::REMOTE_READ,
                ) {
                    env.mem
                        .will_read(m.on_demand, m.ctx, m.addr, u64::from(*remaining));
                }
            }
            if n > 0 {
                let read = env
                    .windows
                    .check_remote(
                        env.core,
                        qpn,
                        *pd,
                        *rkey,
                        (*va, u64::from(n)),
                        Access::REMOTE_READ,
                    )
                    .ok()
                    .and_then(|m| {
                        env.mem
                            .read_for(m.on_demand, m.ctx, m.addr, &mut scratch[..n as usize])
                            .ok()
                    });
                if read.is_none() {
                    // The memory went away mid-READ (deregistered or unmapped).
                    let p = *psn;
                    *front = RespOut::Ack {
                        psn: p,
                        syndrome: Syndrome::Nak {
                            code: NakCode::RemoteAccessError,
                        },
                    };
                    return next_packet(qp, env, buf, scratch);
                }
            }
            h = Headers::new(bth(op, *psn)?);
            if op != Operation::RdmaReadResponseMiddle {
                h.aeth = Some(ack(Syndrome::Ack {
                    credits: Syndrome::UNLIMITED_CREDITS,
                }));
            }
            plen = n as usize;
            *psn = psn_add(*psn, 1);
            *va += u64::from(n);
            *remaining -= n;
            *first = false;
            done = last;
        }
    }
    let len = emit_packet(&h, &scratch[..plen], buf).ok()?;
    if done {
        qp.resp.out.pop_front();
    }
    Some(Transmit {
        len,
        dgid: qp.attr.ah_attr.dgid,
        sgid_index: qp.attr.ah_attr.sgid_index,
        udp_sport: qp.udp_sport(),
    })
}
