//! Flushing the work outstanding when the daemon died: every request posted on a QP's ring
//! queues and not yet completed completes with `IBV_WC_WR_FLUSH_ERR` on the QP's CQ, once, in
//! the order posted, after the completions the daemon had already written into that CQ's
//! ring (IBA 10.3.1.9 and 11.4.1.1: a QP in error flushes all its work requests, signaled or
//! not, as the engine's own flush does).
//!
//! The client knows what is outstanding without the daemon: the ring slots still hold every
//! request it posted that the ring has not reused, and
//!
//! * on a send queue, the daemon's retired count (the ring's note, ABI 4, docs/design/shm-rings.md)
//!   says how many of them left its engine: requests `[retired, posted)` are outstanding.
//!   The daemon moves the count past a request right before it pushes the request's
//!   completion; its pending pair (ABI 8) says whether a daemon that died in between pushed
//!   it: if not, the last request counted is outstanding too;
//! * on a receive queue, receive requests complete in the order posted, and the context
//!   counts those still outstanding (posts add, polled receive completions subtract): once the
//!   CQ's ring is drained the last `count` requests posted are outstanding.
//!
//! Both are at most the queue's depth, which is less than the ring's capacity, so their slots
//! //! were not reused. Requests on SRQs are not flushed: they belong to no QP until one takes
//! them (a QP entering ERR does not flush its SRQ either), and a basic SRQ has no CQ to
//! flush them to. Posts by command (`SOFTVERBS_RINGS=0`) are not known to the client; their
//! CQs answer polls with `EIO` instead.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use softverbs_abi::msg::{PostRecvReq, SendWrWire};
use softverbs_core::wr::{SendOp, WcOpcode, WcStatus, WorkCompletion};
use zerocopy::FromBytes;

use crate::context::RqCount;
use crate::rings::QpRings;
use crate::Context;

/// A QP with ring work queues, as the context remembers it for a flush.
#[derive(Debug)]
pub(crate) struct RingQp {
    pub(crate) qpn: u32,
    pub(crate) send_cq: Option<u32>,
    pub(crate) recv_cq: Option<u32>,
    pub(crate) rings: Arc<Mutex<QpRings>>,
    pub(crate) rq_count: Option<RqCount>,
}

fn flushed(wr_id: u64, opcode: WcOpcode, qp_num: u32) -> WorkCompletion {
    WorkCompletion::new(wr_id, WcStatus::WrFlushErr, opcode, qp_num)
}

/// The flush completions CQ `cq` owes, in QP-handle order, each queue taken once. Called
/// once per CQ, after the device went; `cq_written` is how many entries the daemon wrote into
/// the CQ's ring (its producer index), if it has one.
pub(crate) fn collect(ctx: &Context, cq: u32, cq_written: Option<u32>) -> VecDeque<WorkCompletion> {
    let mut out = VecDeque::new();
    let qps = ctx.ring_qps.lock().unwrap_or_else(|e| e.into_inner());
    for (&handle, q) in qps.iter() {
        if ctx.direct.as_ref().is_some_and(|d| d.owns(handle)) {
            // The direct path holds its QPs' work and flushes it (`crate::direct`).
            continue;
        }
        let mut r = q.rings.lock().unwrap_or_else(|e| e.into_inner());
        if q.send_cq == Some(cq) && !r.sq_flushed {
            r.sq_flushed = true;
            // Without the retired count (ABI < 4) nothing says what is outstanding.
            if ctx.conn.abi >= 4 {
                let posted = r.sq.produced();
                let retired = sq_retired(r.sq.note(), r.sq.pending(), cq_written, ctx.conn.abi);
                let n = posted.wrapping_sub(retired).min(r.sq.layout().capacity());
                let mut buf = vec![0u8; r.sq.layout().entry_size()];
                for k in 0..n {
                    if r.sq
                        .read_back(posted.wrapping_sub(n).wrapping_add(k), &mut buf)
                    {
                        if let Ok((w, _)) = SendWrWire::read_from_prefix(&buf) {
                            // ibv_poll_cq(3) leaves the opcode of an error completion undefined;
                            // the engine reports the request's, and so does this.
                            let op = w.op().map_or(WcOpcode::Send, SendOp::wc_opcode);
                            out.push_back(flushed(w.wr_id.get(), op, q.qpn));
                        }
                    }
                }
            }
        }
        if q.recv_cq == Some(cq) && !r.rq_flushed {
            r.rq_flushed = true;
            if let (Some(rq), Some(count)) = (&r.rq, &q.rq_count) {
                let posted = rq.produced();
                let n = count
                    .load(std::sync::atomic::Ordering::Acquire)
                    .min(rq.layout().capacity());
                let mut buf = vec![0u8; rq.layout().entry_size()];
                for k in 0..n {
                    if rq.read_back(posted.wrapping_sub(n).wrapping_add(k), &mut buf) {
                        if let Ok((w, _)) = PostRecvReq::read_from_prefix(&buf) {
                            out.push_back(flushed(w.wr_id.get(), WcOpcode::Recv, q.qpn));
                        }
                    }
                }
            }
        }
    }
    out
}

/// How many send requests of a ring completed (or retired without a completion), from the
/// daemon's retired count `note` and pending pair `pending` (low half: a count the daemon was
/// about to publish; high half: the index in the QP's send CQ ring the completion of the last
/// request it counts would take). When the pair belongs to the count (same value) and that
/// index was never written (`cq_written`, wrapping), the daemon died between counting the
/// request and pushing its completion: that request is outstanding.
fn sq_retired(note: u32, pending: u64, cq_written: Option<u32>, abi: u32) -> u32 {
    let (count, cq_index) = (pending as u32, (pending >> 32) as u32);
    let landed = |written: u32| (written.wrapping_sub(cq_index) as i32) > 0;
    if abi >= 8 && count == note && cq_written.is_some_and(|w| !landed(w)) {
        note.wrapping_sub(1)
    } else {
        note
    }
}

#[cfg(test)]
mod tests {
    use super::sq_retired;

    #[test]
    fn a_count_whose_completion_never_landed_leaves_its_request_outstanding() {
        // Counted 5 (request 4), its completion was to take CQ index 9: 9 entries written.
        assert_eq!(sq_retired(5, 5 | 9 << 32, Some(9), 8), 4);
        // Written: the count stands.
        assert_eq!(sq_retired(5, 5 | 9 << 32, Some(10), 8), 5);
        // A pair of an older count (or one not yet published): the count stands.
        assert_eq!(sq_retired(6, 5 | 9 << 32, Some(9), 8), 6);
        assert_eq!(sq_retired(4, 5 | 9 << 32, Some(9), 8), 4);
        // No CQ ring (the completion went to the daemon's queue), or an older daemon.
        assert_eq!(sq_retired(5, 5 | 9 << 32, None, 8), 5);
        assert_eq!(sq_retired(5, 5 | 9 << 32, Some(9), 7), 5);
        // Indices wrap.
        assert_eq!(sq_retired(5, 5 | u64::from(u32::MAX) << 32, Some(0), 8), 5);
        assert_eq!(
            sq_retired(5, 5 | u64::from(u32::MAX) << 32, Some(u32::MAX), 8),
            4
        );
    }
}
