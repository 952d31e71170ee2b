//! The completer (IBA 9.7.5.1, C9-x): matches ACKs, NAKs, READ responses and atomic ACKs to
//! outstanding requests, places response data, and completes send work requests strictly in
//! order. A NAK ends the QP with the completion status a NIC reports for it.
//!
//! Only responses inside the window of outstanding PSNs act (IBA 9.7.5.1): one for a PSN
//! already acknowledged is a duplicate, one for a PSN never sent is a ghost, and both are
//! dropped, whatever they say. RoCE has no authentication, so this is what keeps a stray or
//! forged ACK, NAK or RNR NAK from completing, failing or rewinding a connection.

use softverbs_core::types::{QpState, QpType};
use softverbs_wire::psn::{psn_add, psn_diff, PSN_MASK};
use softverbs_wire::{NakCode, Operation, PacketRef, Syndrome};

use crate::memory::Memory;
use crate::qp::{fail_qp, go_back, Env, Qp, SendWqe};
use crate::time::{ack_timeout, retries_spent, rnr_delay};
use crate::wr::{Payload, SendOp, WcStatus, WorkCompletion};

/// The oldest PSN a response may still carry (the oldest unacknowledged PSN): the one after
/// the highest PSN acknowledged, and never one of a request that has completed (the first
/// PSN of the oldest outstanding request, or for a READ whose first responses arrived, its
/// first missing response). With nothing outstanding it is
/// [`sent_psn`](crate::qp::ReqState::sent_psn), and the window is empty.
pub(crate) fn oldest_unacked(qp: &Qp) -> u32 {
    let sent = qp.req.sent_psn;
    let front = match qp.sq.front() {
        Some(w) if w.started && !w.done => {
            if matches!(w.wr.op, SendOp::Read { .. }) {
                psn_add(w.first_psn, w.resp_pkts)
            } else {
                w.first_psn
            }
        }
        _ => return sent,
    };
    // A multi-packet request may be acknowledged part of the way.
    let next = psn_add(qp.req.acked_psn, 1);
    let len = sent.wrapping_sub(front) & PSN_MASK;
    if next.wrapping_sub(front) & PSN_MASK <= len {
        next
    } else {
        front
    }
}

/// Whether a response for `psn` lies in the window IBA 9.7.5.1 allows: from the oldest
/// unacknowledged PSN through the newest PSN sent. Distances are taken modulo 2^24, so the
/// window may straddle the wrap from 0xFFFFFF to 0 and may be as long as a READ's responses.
pub(crate) fn in_window(qp: &Qp, psn: u32) -> bool {
    let lo = oldest_unacked(qp);
    let off = psn.wrapping_sub(lo) & PSN_MASK;
    let len = qp.req.sent_psn.wrapping_sub(lo) & PSN_MASK;
    off < len
}

/// Handles one response packet arriving at a requester. Returns false if it was dropped as
/// a duplicate or a ghost (outside the window of outstanding PSNs).
pub(crate) fn receive<M: Memory>(qp: &mut Qp, env: &mut Env<'_, M>, pkt: &PacketRef<'_>) -> bool {
    if !matches!(qp.cfg.qp_type, QpType::Rc | QpType::XrcSend)
        || !matches!(qp.attr.qp_state, QpState::Rts | QpState::Sqd)
    {
        return true;
    }
    let psn = pkt.headers.bth.psn;
    if !in_window(qp, psn) {
        return false;
    }
    match pkt.info.operation {
        Operation::Acknowledge => {
            let Some(aeth) = pkt.headers.aeth else {
                return true;
            };
            match aeth.syndrome {
                Syndrome::Ack { .. } => ack_through(qp, env, psn),
                Syndrome::RnrNak { timer } => {
                    qp.cnt.rcvd_rnr_err += 1;
                    // The NAK acknowledges everything before the request it refuses.
                    ack_through(qp, env, psn_add(psn, PSN_MASK));
                    let Some(i) = index_of_psn(qp, psn) else {
                        return true;
                    };
                    if qp.req.rnr_left == 0 {
                        qp.cnt.retry_rnr_exceeded_err += 1;
                        complete_error_at(qp, env, i, WcStatus::RnrRetryExcErr);
                        return true;
                    }
                    if qp.req.rnr_left != 7 {
                        qp.req.rnr_left -= 1;
                    }
                    go_back(qp, psn);
                    qp.req.timer = None;
                    qp.req.rnr_until = Some(env.now.after(rnr_delay(timer)));
                }
                Syndrome::Nak { code } => {
                    ack_through(qp, env, psn_add(psn, PSN_MASK));
                    let status = match code {
                        NakCode::PsnSeqErr => {
                            qp.cnt.rcvd_seq_err += 1;
                            // The floor applies as on a timeout (`time::retries_spent`):
                            // a forwarder or progress thread that waited for a CPU may
                            // have dropped what a sequence NAK reports.
                            let (left, since) = (qp.req.retry_left, qp.req.quiet_since);
                            if retries_spent(left, since, qp.retry_floor, env.now) {
                                qp.cnt.retry_exceeded_err += 1;
                                complete_front_error(qp, env, WcStatus::RetryExcErr);
                                return true;
                            }
                            qp.req.retry_left = left.saturating_sub(1);
                            go_back(qp, psn);
                            return true;
                        }
                        NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                        NakCode::RemoteAccessError => {
                            qp.cnt.req_remote_access_errors += 1;
                            WcStatus::RemAccessErr
                        }
                        NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                        NakCode::InvalidRdRequest | NakCode::Reserved(_) => WcStatus::BadRespErr,
                    };
                    if let Some(i) = index_of_psn(qp, psn) {
                        complete_error_at(qp, env, i, status);
                    }
                }
            }
        }
        Operation::RdmaReadResponseFirst
        | Operation::RdmaReadResponseMiddle
        | Operation::RdmaReadResponseLast
        | Operation::RdmaReadResponseOnly => read_response(qp, env, pkt),
        Operation::AtomicAcknowledge => {
            let Some(ack) = pkt.headers.atomic_ack_eth else {
                return true;
            };
            let is_it =
                |w: &SendWqe| w.started && !w.done && w.wr.op.is_atomic() && w.first_psn == psn;
            if !qp.sq.iter().any(is_it) {
                return true;
            }
            // Everything before it has been executed (responses come in order).
            ack_through(qp, env, psn_add(psn, PSN_MASK));
            let Some(i) = qp.sq.iter().position(is_it) else {
                return true;
            };
            if let Err(status) = place(qp, env, i, 0, &ack.orig.to_ne_bytes()) {
                complete_error_at(qp, env, i, status);
                return true;
            }
            qp.sq[i].done = true;
            if i == 0 {
                // Nothing before it is missing (an earlier READ may still wait for a lost
                // response, whose PSNs must stay in the window).
                qp.req.acked_psn = psn;
            }
            progress(qp, env);
        }
        _ => {}
    }
    true
}

/// Completes the oldest outstanding request with `status` and moves the QP to ERR.
pub(crate) fn complete_front_error<M: Memory>(qp: &mut Qp, env: &mut Env<'_, M>, status: WcStatus) {
    complete_error_at(qp, env, 0, status);
}

/// The send-queue index of the outstanding request that PSN `psn` belongs to, if any. A NAK
/// names the request it refuses by PSN; one naming none refuses nothing (IBA 9.7.5.1).
pub(crate) fn index_of_psn(qp: &Qp, psn: u32) -> Option<usize> {
    qp.sq.iter().position(|w| {
        let off = psn.wrapping_sub(w.first_psn) & PSN_MASK;
        w.started && !w.done && off < w.npkts
    })
}

/// Completes request `i` with `status` and moves the QP to ERR. Completions keep posting
/// order (IBA 10.8.3): requests before it complete first — successfully if they finished,
/// flushed otherwise — and the QP flushes those after it.
pub(crate) fn complete_error_at<M: Memory>(
    qp: &mut Qp,
    env: &mut Env<'_, M>,
    i: usize,
    status: WcStatus,
) {
    for _ in 0..i.min(qp.sq.len()) {
        let w = qp.sq.pop_front().expect("counted");
        let st = if w.done {
            WcStatus::Success
        } else {
            WcStatus::WrFlushErr
        };
        if st != WcStatus::Success || qp.signaled(&w.wr) {
            let mut wc = WorkCompletion::new(w.wr.wr_id, st, w.wr.op.wc_opcode(), qp.cfg.qpn);
            wc.byte_len = if w.done { w.len } else { 0 };
            env.complete(qp.cfg.send_cq, wc);
        }
    }
    if let Some(w) = qp.sq.pop_front() {
        qp.cnt.local_error(status);
        let wc = WorkCompletion::new(w.wr.wr_id, status, w.wr.op.wc_opcode(), qp.cfg.qpn);
        env.complete(qp.cfg.send_cq, wc);
    }
    fail_qp(qp, env.out, None);
}

/// A positive ACK of every PSN up to and including `psn` (ACKs are cumulative, IBA 9.7.5.1.2).
/// `psn` is inside the window or the PSN just before it.
fn ack_through<M: Memory>(qp: &mut Qp, env: &mut Env<'_, M>, psn: u32) {
    let mut acked = psn;
    let mut any = false;
    let mut retry_read = None;
    for w in qp.sq.iter_mut() {
        if w.done {
            continue;
        }
        if !w.started {
            break;
        }
        let last = psn_add(w.first_psn, w.npkts - 1);
        if w.wr.op.is_read_or_atomic() {
            // Its own responses acknowledge a READ or atomic, not an ACK: the PSNs from its
            // first missing response on stay unacknowledged.
            let missing = psn_add(
                w.first_psn,
                if w.wr.op.is_atomic() { 0 } else { w.resp_pkts },
            );
            if psn_diff(psn, missing) >= 0 {
                acked = psn_add(missing, PSN_MASK);
                if psn_diff(psn, last) >= 0 {
                    // An ACK beyond it: its response was lost; ask again (IBA 9.7.5.1.5,
                    // implied NAK).
                    retry_read = Some(missing);
                }
            }
            break;
        }
        if psn_diff(psn, last) < 0 {
            break;
        }
        w.done = true;
        any = true;
    }
    // Any advance of the acknowledged PSN is progress, even inside a message: the retry
    // budget counts consecutive failures, not failures per message (IBA C9-140).
    if psn_diff(acked, qp.req.acked_psn) > 0 {
        qp.req.acked_psn = acked;
        any = true;
    }
    if any {
        progress(qp, env);
    }
    if let Some(p) = retry_read {
        go_back(qp, p);
    }
}

/// Completes the finished requests at the front of the send queue and resets the retry
/// budget and timer after progress.
fn progress<M: Memory>(qp: &mut Qp, env: &mut Env<'_, M>) {
    qp.req.retry_left = qp.attr.retry_cnt;
    qp.req.rnr_left = qp.attr.rnr_retry;
    qp.req.quiet_since = env.now;
    qp.req.past_budget = 0;
    while qp.sq.front().is_some_and(|w| w.done) {
        let w = qp.sq.pop_front().expect("front");
        if qp.req.send_idx == 0 {
            // The request being retransmitted was acknowledged meanwhile: go on with the next.
            qp.req.send_pkt = 0;
        } else {
            qp.req.send_idx -= 1;
        }
        if qp.signaled(&w.wr) {
            let mut wc = WorkCompletion::new(
                w.wr.wr_id,
                WcStatus::Success,
                w.wr.op.wc_opcode(),
                qp.cfg.qpn,
            );
            wc.byte_len = w.len;
            env.complete(qp.cfg.send_cq, wc);
        }
    }
    let outstanding = qp.sq.front().is_some_and(|w| w.started);
    qp.req.timer = if outstanding {
        ack_timeout(qp.attr.timeout).map(|d| env.now.after(d))
    } else {
        None
    };
}

/// Writes response bytes into the local buffers of request `i` at `offset`.
fn place<M: Memory>(
    qp: &Qp,
    env: &mut Env<'_, M>,
    i: usize,
    offset: u32,
    data: &[u8],
) -> Result<(), WcStatus> {
    let Payload::Sges(sges) = &qp.sq[i].wr.payload else {
        return Err(WcStatus::LocQpOpErr);
    };
    crate::sge::scatter(
        env,
        qp.cfg.pd.ok_or(WcStatus::LocQpOpErr)?,
        sges,
        offset,
        data,
    )
}

fn read_response<M: Memory>(qp: &mut Qp, env: &mut Env<'_, M>, pkt: &PacketRef<'_>) {
    let psn = pkt.headers.bth.psn;
    let Some(i) = qp
        .sq
        .iter()
        .position(|w| !w.done && w.wr.op.is_read_or_atomic())
    else {
        return;
    };
    let w = &qp.sq[i];
    if !w.started
        || !matches!(w.wr.op, SendOp::Read { .. })
        || psn != psn_add(w.first_psn, w.resp_pkts)
    {
        // A duplicate, or one after a lost response: the retry timer recovers (IBA 9.7.5.1.5).
        return;
    }
    // Responses come in order: everything before this READ has been executed.
    for j in 0..i {
        if !qp.sq[j].done && qp.sq[j].started && !qp.sq[j].wr.op.is_read_or_atomic() {
            qp.sq[j].done = true;
        }
    }
    let mtu = qp.mtu();
    let w = &qp.sq[i];
    let offset = w.resp_pkts * mtu;
    let (len, npkts) = (w.len, w.npkts);
    if pkt.payload.len() as u64 > u64::from(len.saturating_sub(offset))
        || (pkt.payload.len() as u32) > mtu
    {
        return complete_error_at(qp, env, i, WcStatus::BadRespErr);
    }
    if !pkt.payload.is_empty() {
        if let Err(status) = place(qp, env, i, offset, pkt.payload) {
            return complete_error_at(qp, env, i, status);
        }
    }
    qp.req.acked_psn = psn;
    let w = &mut qp.sq[i];
    w.resp_pkts += 1;
    let last = matches!(
        pkt.info.operation,
        Operation::RdmaReadResponseLast | Operation::RdmaReadResponseOnly
    );
    if last || w.resp_pkts == npkts {
        if !last || w.resp_pkts != npkts {
            return complete_error_at(qp, env, i, WcStatus::BadRespErr);
        }
        w.done = true;
    }
    progress(qp, env);
}
