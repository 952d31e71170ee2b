//! Flushing the work outstanding when the daemon died: every request posted on a QP's ring
//! queues and not yet completed completes with `IBV_WC_WR_FLUSH_ERR` on the QP's CQ, once, in
//! the order posted, after the completions the daemon had already written into that CQ's
//! ring (IBA 10.3.1.9 and 11.4.1.1: a QP in error flushes all its work requests, signaled or
//! not, as the engine's own flush does).
//!
//! The client knows what is outstanding without the daemon: the ring slots still hold every
//! request it posted that the ring has not reused, and
//!
//! * on a send queue, the daemon's retired count (the ring's note, ABI 4, docs/shm-rings.md)
//!   says how many of them left its engine: requests `[retired, posted)` are outstanding;
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
/// once per CQ, after the device went and the CQ's ring was drained.
pub(crate) fn collect(ctx: &Context, cq: u32) -> VecDeque<WorkCompletion> {
    let mut out = VecDeque::new();
    let qps = ctx.ring_qps.lock().unwrap_or_else(|e| e.into_inner());
    for q in qps.values() {
        let mut r = q.rings.lock().unwrap_or_else(|e| e.into_inner());
        if q.send_cq == Some(cq) && !r.sq_flushed {
            r.sq_flushed = true;
            // Without the retired count (ABI < 4) nothing says what is outstanding.
            if ctx.conn.abi >= 4 {
                let posted = r.sq.produced();
                let n = posted
                    .wrapping_sub(r.sq.note())
                    .min(r.sq.layout().capacity());
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
