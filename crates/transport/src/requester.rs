//! The requester (IBA 9.7.1–9.7.4): segments send work requests into request packets of
//! the path MTU, numbers them with PSNs, keeps at most [`WINDOW`](crate::qp::WINDOW)
//! unacknowledged, asks for ACKs, and goes back to retransmit on a timeout, a sequence NAK
//! or an RNR NAK. Unreliable QPs (UC, UD) complete a request once it has been sent.

use softverbs_core::mcast::MULTICAST_QPN;
use std::collections::VecDeque;

use softverbs_core::types::{QpState, QpType};
use softverbs_wire::psn::{psn_add, psn_diff};
use softverbs_wire::{
    emit_packet_with, AtomicEthRepr, BthRepr, DethRepr, Headers, IethRepr, ImmDtRepr, Opcode,
    Operation, RethRepr, Transport, XrcethRepr,
};

use crate::completer::{complete_error_at, oldest_unacked};
use crate::memory::Memory;
use crate::qp::{fail_qp, go_back, transport_of, Env, Output, Qp, Transmit, WINDOW};
use crate::time::{ack_timeout, past_budget_timer, retries_spent, Instant};
use crate::wr::{Payload, SendOp, WcStatus, WorkCompletion};

/// PSN stride between ACK requests in a stream of packets nobody waits for.
///
/// IBA 9.7.5.1.2 lets a requester ask for acknowledgement (BTH AckReq) only where it needs
/// one and lets the responder coalesce: every 16th PSN keeps the 128-packet window moving,
/// and the end of a signaled request or of the queued work asks at once (see `wants_ack`).
const ACK_EVERY: u32 = 16;

/// Whether the packet at `psn`, of the request at send-queue index `idx`, asks for an ACK.
///
/// Someone waits for the acknowledgement of the last packet of a READ or atomic (its
/// response), of a signaled request (its completion), and of the last queued request (nothing
/// later would carry the request, so only the retry timer would). Unsignaled requests in the
/// middle of a burst free their send-queue slots at the next acknowledged PSN instead, which
/// halves the packets of a stream of small unsignaled messages on UDP.
///
/// The requester also waits when the window is full after this request: the next one may not
/// start before the oldest completes, which takes an acknowledgement of the oldest's last PSN.
/// The periodic requests need not reach that last PSN (a request as long as the window, 512 KiB
/// at a 4 KiB MTU, ends between two of them), and then only the retry timer would move the
/// queue; ask here instead.
fn wants_ack(qp: &Qp, idx: usize, last: bool, psn: u32) -> bool {
    let w = &qp.sq[idx];
    (psn % ACK_EVERY == ACK_EVERY - 1)
        || (last
            && (w.wr.op.is_read_or_atomic()
                || qp.signaled(&w.wr)
                || idx + 1 == qp.sq.len()
                || psn_diff(qp.req.next_psn, una(qp)) >= WINDOW as i32))
}

/// The first PSN not yet acknowledged as far as the window goes: the oldest request's first
/// (requests complete whole), or the next PSN when none is out.
fn una(qp: &Qp) -> u32 {
    qp.sq
        .front()
        .filter(|w| w.started)
        .map_or(qp.req.next_psn, |w| w.first_psn)
}

/// PSNs a message occupies: its request packets, or for a READ its response packets.
fn packets_for(len: u32, mtu: u32, op: SendOp) -> u32 {
    if op.is_atomic() {
        1
    } else {
        len.div_ceil(mtu).max(1)
    }
}

fn operation(op: SendOp, pkt: u32, npkts: u32) -> Operation {
    use Operation as O;
    let (first, last) = (pkt == 0, pkt + 1 == npkts);
    match op {
        SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_) => match (first, last, op) {
            (true, true, SendOp::SendWithImm(_)) => O::SendOnlyWithImmediate,
            (true, true, SendOp::SendWithInv(_)) => O::SendOnlyWithInvalidate,
            (true, true, _) => O::SendOnly,
            (true, false, _) => O::SendFirst,
            (false, true, SendOp::SendWithImm(_)) => O::SendLastWithImmediate,
            (false, true, SendOp::SendWithInv(_)) => O::SendLastWithInvalidate,
            (false, true, _) => O::SendLast,
            (false, false, _) => O::SendMiddle,
        },
        SendOp::Write { .. } | SendOp::WriteWithImm { .. } => {
            let imm = matches!(op, SendOp::WriteWithImm { .. });
            match (first, last) {
                (true, true) if imm => O::RdmaWriteOnlyWithImmediate,
                (true, true) => O::RdmaWriteOnly,
                (true, false) => O::RdmaWriteFirst,
                (false, true) if imm => O::RdmaWriteLastWithImmediate,
                (false, true) => O::RdmaWriteLast,
                (false, false) => O::RdmaWriteMiddle,
            }
        }
        SendOp::Read { .. } => O::RdmaReadRequest,
        SendOp::CompareSwap { .. } => O::CompareSwap,
        SendOp::FetchAdd { .. } => O::FetchAdd,
        SendOp::BindMw(_) | SendOp::LocalInv(_) => unreachable!("local work sends nothing"),
    }
}

/// Copies `out.len()` bytes at `offset` of a send payload into `out`.
pub(crate) fn gather<M: Memory>(
    qp: &Qp,
    env: &mut Env<'_, M>,
    payload: &Payload,
    offset: u32,
    out: &mut [u8],
) -> Result<(), WcStatus> {
    match payload {
        Payload::Inline(b) => {
            out.copy_from_slice(&b[offset as usize..offset as usize + out.len()]);
            Ok(())
        }
        Payload::Sges(sges) => crate::sge::gather(
            env,
            qp.cfg.pd.ok_or(WcStatus::LocQpOpErr)?,
            sges,
            offset,
            out,
        ),
    }
}

/// The headers of packet `pkt` (at `psn`) of the request at send-queue index `idx`: the BTH
/// and, as the operation and position ask (IBA 9.2–9.4), XRCETH, DETH, RETH, AtomicETH,
/// ImmDt or IETH.
fn request_headers(qp: &Qp, idx: usize, pkt: u32, psn: u32) -> Option<Headers> {
    let w = &qp.sq[idx];
    let (op, npkts, mtu) = (w.wr.op, w.npkts, qp.mtu());
    let transport = transport_of(qp.cfg.qp_type);
    let operation = operation(
        op,
        if op.is_read_or_atomic() { 0 } else { pkt },
        if op.is_read_or_atomic() { 1 } else { npkts },
    );
    let last = op.is_read_or_atomic() || pkt + 1 == npkts;
    // A datagram to a multicast GID carries the multicast DQPN 0xFFFFFF, whatever the work
    // request named (rxe sets it from the address vector the same way).
    let dest_qp = w.wr.ud.map_or(qp.attr.dest_qp_num, |u| {
        if u.dgid.is_multicast() {
            MULTICAST_QPN
        } else {
            u.dest_qpn
        }
    });
    let mut bth = BthRepr::new(Opcode::new(transport, operation).ok()?, dest_qp, psn);
    bth.solicited = last && w.wr.solicited;
    bth.ack_req = qp.is_reliable() && wants_ack(qp, idx, last, psn);
    let mut h = Headers::new(bth);
    if transport == Transport::Xrc {
        h.xrceth = Some(XrcethRepr {
            xrc_srq: w.wr.remote_srqn & 0xFF_FFFF,
        });
    }
    if let Some(ud) = w.wr.ud {
        // IBA 10.2.5: a WR Q_Key with the high bit set means "use the QP's Q_Key".
        let qkey = if ud.qkey & 0x8000_0000 != 0 {
            qp.attr.qkey
        } else {
            ud.qkey
        };
        h.deth = Some(DethRepr {
            qkey,
            src_qp: qp.cfg.qpn,
        });
    }
    match op {
        SendOp::Write { remote_addr, rkey }
        | SendOp::WriteWithImm {
            remote_addr, rkey, ..
        } if pkt == 0 => {
            h.reth = Some(RethRepr {
                va: remote_addr,
                rkey,
                dma_len: w.len,
            });
        }
        SendOp::Read { remote_addr, rkey } => {
            // A retried READ asks only for what has not arrived (IBA 9.7.5.1.5).
            let done = (pkt * mtu).min(w.len);
            h.reth = Some(RethRepr {
                va: remote_addr + u64::from(done),
                rkey,
                dma_len: w.len - done,
            });
        }
        SendOp::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            h.atomic_eth = Some(AtomicEthRepr {
                va: remote_addr,
                rkey,
                swap_add: swap,
                compare,
            });
        }
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            h.atomic_eth = Some(AtomicEthRepr {
                va: remote_addr,
                rkey,
                swap_add: add,
                compare: 0,
            });
        }
        _ => {}
    }
    if last {
        match op {
            SendOp::SendWithImm(imm) | SendOp::WriteWithImm { imm, .. } => {
                h.imm_dt = Some(ImmDtRepr { imm })
            }
            SendOp::SendWithInv(rkey) => h.ieth = Some(IethRepr { rkey }),
            _ => {}
        }
    }
    Some(h)
}

/// Builds the next request packet of `qp` into `buf`, if one may go now.
pub(crate) fn next_packet<M: Memory>(
    qp: &mut Qp,
    env: &mut Env<'_, M>,
    buf: &mut [u8],
    scratch: &mut Vec<u8>,
) -> Option<Transmit> {
    if qp.attr.qp_state != QpState::Rts || qp.cfg.qp_type == QpType::XrcRecv {
        return None;
    }
    if let Some(t) = qp.req.rnr_until {
        if env.now < t {
            return None;
        }
        qp.req.rnr_until = None;
    }
    let mtu = qp.mtu();
    let idx = qp.req.send_idx;
    let una = una(qp);
    let outstanding_rd = qp
        .sq
        .iter()
        .take(idx)
        .filter(|w| w.wr.op.is_read_or_atomic() && !w.done)
        .count() as u32;
    let wqe = qp.sq.get(idx)?;
    if wqe.wr.op.is_local() {
        return local_op(qp, env, buf, scratch);
    }
    if !wqe.started {
        if psn_diff(qp.req.next_psn, una) >= WINDOW as i32 {
            return None;
        }
        if wqe.wr.op.is_read_or_atomic()
            && outstanding_rd >= u32::from(qp.attr.max_rd_atomic.max(1))
        {
            return None;
        }
        if qp.cfg.qp_type == QpType::Ud && wqe.len > mtu {
            // IBA C10-93.1.1: a UD message longer than the port MTU emits no packet and
            // raises no error; the request completes as if sent.
            let w = qp.sq.pop_front().expect("the request at the head");
            if qp.signaled(&w.wr) {
                let wc = WorkCompletion::new(
                    w.wr.wr_id,
                    WcStatus::Success,
                    w.wr.op.wc_opcode(),
                    qp.cfg.qpn,
                );
                env.complete(qp.cfg.send_cq, wc);
            }
            return next_packet(qp, env, buf, scratch);
        }
        let npkts = packets_for(wqe.len, mtu, wqe.wr.op);
        let first = qp.req.next_psn;
        let w = qp.sq.get_mut(idx).expect("present");
        w.first_psn = first;
        w.npkts = npkts;
        w.started = true;
        qp.req.next_psn = psn_add(first, npkts);
        // The whole payload is read from here on, packet by packet: say so once, so that a
        // memory paying per system call can fetch it in a few large pieces.
        if let (Payload::Sges(sges), false, Some(pd)) =
            (&w.wr.payload, w.wr.op.is_read_or_atomic(), qp.cfg.pd)
        {
            let len = w.len as usize;
            crate::sge::will_gather(env, pd, sges, len);
        }
    }
    let w = &qp.sq[idx];
    let pkt = qp.req.send_pkt;
    if pkt >= w.npkts {
        // Everything of this request has been sent (a go-back landed past its end).
        qp.sq[idx].sent = true;
        qp.req.send_idx += 1;
        qp.req.send_pkt = 0;
        return next_packet(qp, env, buf, scratch);
    }
    let psn = psn_add(w.first_psn, pkt);
    let op = w.wr.op;
    let npkts = w.npkts;
    let offset = pkt * mtu;
    let last = op.is_read_or_atomic() || pkt + 1 == npkts;
    let h = request_headers(qp, idx, pkt, psn)?;
    let plen = if op.is_read_or_atomic() {
        0
    } else {
        (w.len.saturating_sub(offset)).min(mtu) as usize
    };
    // The payload is gathered from memory straight into the packet.
    let written = emit_packet_with(&h, plen, buf, |out| {
        if op.is_read_or_atomic() {
            return Ok(());
        }
        gather(qp, env, &qp.sq[idx].wr.payload, offset, out)
    })
    .ok()?;
    let len = match written {
        Ok(len) => len,
        Err(status) => {
            complete_error_at(qp, env, idx, status);
            return None;
        }
    };
    let tx = Transmit {
        len,
        dgid: w.wr.ud.map_or(qp.attr.ah_attr.dgid, |u| u.dgid),
        sgid_index: qp.attr.ah_attr.sgid_index,
        udp_sport: qp.udp_sport(),
    };

    // The responses this packet may draw: a READ's whole range, otherwise its own PSN.
    let sent_end = if matches!(op, SendOp::Read { .. }) {
        psn_add(w.first_psn, npkts)
    } else {
        psn_add(psn, 1)
    };
    if psn_diff(sent_end, qp.req.sent_psn) > 0 {
        qp.req.sent_psn = sent_end;
        if last {
            qp.cnt.rdma_sends += 1;
        }
    } else {
        // A PSN sent before: go-back-N is sending it again.
        qp.cnt.retransmitted_pkts += 1;
    }

    // Advance.
    if last {
        qp.sq[idx].sent = true;
        qp.req.send_idx += 1;
        qp.req.send_pkt = 0;
    } else {
        qp.req.send_pkt += 1;
    }
    if qp.is_reliable() {
        if qp.req.timer.is_none() {
            qp.req.timer = ack_timeout(qp.attr.timeout).map(|d| env.now.after(d));
            // A wait for the peer starts (or restarts after an RNR wait's resend).
            if qp.req.rnr_until.is_none() {
                qp.req.quiet_since = env.now;
            }
        }
    } else if last {
        // UC and UD: sent is done (IBA 9.8: no acknowledgements).
        let w = qp.sq.pop_front().expect("the request just sent");
        qp.req.send_idx -= 1;
        if qp.signaled(&w.wr) {
            let mut wc =
                WorkCompletion::new(w.wr.wr_id, WcStatus::Success, op.wc_opcode(), qp.cfg.qpn);
            wc.byte_len = w.len;
            env.complete(qp.cfg.send_cq, wc);
        }
    }
    Some(tx)
}

/// Executes the bind or local invalidate at `send_idx` once every request before it has
/// completed (so it takes effect, and completes, in send-queue order; IBA 10.6.7.2), then
/// goes on with the next request. A refused one completes with `MW_BIND_ERR` (bind) or
/// `LOC_QP_OP_ERR` (local invalidate) and the QP goes to error, as rxe does.
fn local_op<M: Memory>(
    qp: &mut Qp,
    env: &mut Env<'_, M>,
    buf: &mut [u8],
    scratch: &mut Vec<u8>,
) -> Option<Transmit> {
    if qp.req.send_idx != 0 {
        return None;
    }
    let op = qp.sq[0].wr.op;
    let qpn = qp.cfg.qpn;
    let res = match (qp.cfg.pd, op) {
        (Some(pd), SendOp::BindMw(b)) => env.windows.bind(env.core, qpn, pd, &b),
        (Some(pd), SendOp::LocalInv(rkey)) => env.windows.invalidate(qpn, pd, rkey, false),
        _ => Err(crate::mw::Refused),
    };
    if res.is_err() {
        let status = if matches!(op, SendOp::BindMw(_)) {
            WcStatus::MwBindErr
        } else {
            WcStatus::LocQpOpErr
        };
        complete_error_at(qp, env, 0, status);
        return None;
    }
    let w = qp.sq.pop_front().expect("the request at the head");
    qp.req.send_pkt = 0;
    if qp.signaled(&w.wr) {
        let wc = WorkCompletion::new(w.wr.wr_id, WcStatus::Success, op.wc_opcode(), qpn);
        env.complete(qp.cfg.send_cq, wc);
    }
    next_packet(qp, env, buf, scratch)
}

/// A timer of `qp` fired at `now`.
pub(crate) fn on_timer(qp: &mut Qp, now: Instant, out: &mut VecDeque<Output>) {
    if qp.req.rnr_until.is_some_and(|t| t <= now) {
        qp.req.rnr_until = None;
        qp.req.timer = ack_timeout(qp.attr.timeout).map(|d| now.after(d));
        // The RNR NAK was an answer: the wait for the next one starts now.
        qp.req.quiet_since = now;
    }
    let Some(t) = qp.req.timer else { return };
    if t > now {
        return;
    }
    if !qp.sq.front().is_some_and(|w| w.started) {
        qp.req.timer = None;
        return;
    }
    if retries_spent(qp.req.retry_left, qp.req.quiet_since, qp.retry_floor, now) {
        // IBA 9.7.6.1.3 / 10.7.3.1: retries exhausted (and, a software NIC's rule, no
        // progress for the retry floor: `time::RETRY_FLOOR`); the request completes with
        // RETRY_EXC_ERR and the QP goes to ERR (no async event: the CQE reports it).
        qp.cnt.retry_exceeded_err += 1;
        let w = qp.sq.pop_front().expect("front");
        let wc = WorkCompletion::new(
            w.wr.wr_id,
            WcStatus::RetryExcErr,
            w.wr.op.wc_opcode(),
            qp.cfg.qpn,
        );
        if let Some(cq) = qp.cfg.send_cq {
            out.push_back(Output::Completion { cq, wc });
        }
        fail_qp(qp, out, None);
        return;
    }
    // Past the budget and short of the floor, it goes on resending at a doubling interval.
    let past = qp.req.retry_left == 0;
    qp.req.retry_left = qp.req.retry_left.saturating_sub(1);
    qp.cnt.completer_retry_err += 1;
    // Go-back-N resumes at the first PSN not acknowledged (IBA 9.7.4.1.4, 9.7.5.1.3), inside
    // the oldest message if the responder acknowledged part of it (a READ: its first missing
    // response). The responder continues a message it is receiving from any in-order PSN, so
    // a WRITE's middle packets need no RETH; restarting at the message's first PSN instead
    // resends what arrived, and a long message on a lossy path can run out of retries.
    let psn = oldest_unacked(qp);
    go_back(qp, psn);
    qp.req.timer = ack_timeout(qp.attr.timeout).map(|d| {
        if past {
            qp.req.past_budget = qp.req.past_budget.saturating_add(1);
            let floor_end = qp.req.quiet_since.after(qp.retry_floor);
            past_budget_timer(d, qp.req.past_budget, now, floor_end)
        } else {
            now.after(d)
        }
    });
}
