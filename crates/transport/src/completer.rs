//! The completer (IBA 9.7.5.1, C9-x): matches ACKs, NAKs, READ responses and atomic ACKs to
//! outstanding requests, places response data, and completes send work requests strictly in
//! order. A NAK ends the QP with the completion status a NIC reports for it.

use softverbs_core::types::{QpState, QpType};
use softverbs_wire::psn::{psn_add, psn_diff};
use softverbs_wire::{NakCode, Operation, PacketRef, Syndrome};

use crate::engine::{Env, Qp};
use crate::memory::Memory;
use crate::requester::{complete_error_at, complete_front_error, go_back, index_of_psn};
use crate::time::{ack_timeout, rnr_delay};
use crate::wr::{Payload, SendOp, WcStatus, WorkCompletion};

/// Handles one response packet arriving at a requester.
pub(crate) fn receive<M: Memory>(qp: &mut Qp, env: &mut Env<'_, M>, pkt: &PacketRef<'_>) {
    if !matches!(qp.cfg.qp_type, QpType::Rc | QpType::XrcSend)
        || !matches!(qp.attr.qp_state, QpState::Rts | QpState::Sqd)
    {
        return;
    }
    let psn = pkt.headers.bth.psn;
    match pkt.info.operation {
        Operation::Acknowledge => {
            let Some(aeth) = pkt.headers.aeth else { return };
            match aeth.syndrome {
                Syndrome::Ack { .. } => ack_through(qp, env, psn),
                Syndrome::RnrNak { timer } => {
                    ack_through(qp, env, psn_add(psn, 0xFF_FFFF));
                    if qp.req.rnr_left == 0 {
                        let i = index_of_psn(qp, psn);
                        return complete_error_at(qp, env, i, WcStatus::RnrRetryExcErr);
                    }
                    if qp.req.rnr_left != 7 {
                        qp.req.rnr_left -= 1;
                    }
                    go_back(qp, psn);
                    qp.req.timer = None;
                    qp.req.rnr_until = Some(env.now.after(rnr_delay(timer)));
                }
                Syndrome::Nak { code } => {
                    ack_through(qp, env, psn_add(psn, 0xFF_FFFF));
                    let status = match code {
                        NakCode::PsnSeqErr => {
                            if qp.req.retry_left == 0 {
                                return complete_front_error(qp, env, WcStatus::RetryExcErr);
                            }
                            qp.req.retry_left -= 1;
                            go_back(qp, psn);
                            return;
                        }
                        NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                        NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                        NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                        NakCode::InvalidRdRequest | NakCode::Reserved(_) => WcStatus::BadRespErr,
                    };
                    let i = index_of_psn(qp, psn);
                    complete_error_at(qp, env, i, status);
                }
            }
        }
        Operation::RdmaReadResponseFirst
        | Operation::RdmaReadResponseMiddle
        | Operation::RdmaReadResponseLast
        | Operation::RdmaReadResponseOnly => read_response(qp, env, pkt),
        Operation::AtomicAcknowledge => {
            let Some(ack) = pkt.headers.atomic_ack_eth else {
                return;
            };
            let is_it = |w: &crate::engine::SendWqe| {
                w.started && !w.done && w.wr.op.is_atomic() && w.first_psn == psn
            };
            if !qp.sq.iter().any(is_it) {
                return;
            }
            // Everything before it has been executed (responses come in order).
            ack_through(qp, env, psn_add(psn, 0xFF_FFFF));
            let Some(i) = qp.sq.iter().position(is_it) else {
                return;
            };
            if let Err(status) = place(qp, env, i, 0, &ack.orig.to_ne_bytes()) {
                return complete_error_at(qp, env, i, status);
            }
            qp.sq[i].done = true;
            progress(qp, env);
        }
        _ => {}
    }
}

/// A positive ACK of every PSN up to and including `psn` (ACKs are cumulative, IBA 9.7.5.1.2).
fn ack_through<M: Memory>(qp: &mut Qp, env: &mut Env<'_, M>, psn: u32) {
    // Any advance of the acknowledged PSN is progress, even inside a message: the retry
    // budget counts consecutive failures, not failures per message (IBA C9-140).
    let mut any = psn_diff(psn, qp.req.acked_psn) > 0 && psn_diff(psn, qp.req.next_psn) < 0;
    if any {
        qp.req.acked_psn = psn;
    }
    let mut retry_read = None;
    for w in qp.sq.iter_mut() {
        if !w.started || w.done {
            if w.done {
                continue;
            }
            break;
        }
        let last = psn_add(w.first_psn, w.npkts - 1);
        if psn_diff(psn, last) < 0 {
            break;
        }
        if w.wr.op.is_read_or_atomic() {
            // An ACK beyond a READ or atomic whose response never came: the response was
            // lost; ask again (IBA 9.7.5.1.5, implied NAK).
            retry_read = Some(psn_add(
                w.first_psn,
                if w.wr.op.is_atomic() { 0 } else { w.resp_pkts },
            ));
            break;
        }
        w.done = true;
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
