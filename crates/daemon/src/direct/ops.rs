//! The direct path's operations that the daemon runs for a library (ABI 15,
//! docs/design/direct-path.md, "Atomics and memory windows" and "Completion channels"): atomics and
//! window operations need the one serialization point and the windows the engines hold,
//! and an armed CQ's event is the daemon's to raise.
//!
//! Each command names the caller's direct QP; the peer is the other side of its pair. The
//! checks are the responder's (`crates/transport/src/responder.rs`): its QP's access flags
//! as they are now, then the key through the engine (`Engine::check_remote_key`), and a
//! refusal is answered with the requester's status and the responder's event, which the
//! library turns into the usual `DirectPeerError` (so the responder fails exactly as when
//! the library finds a rule broken itself).

use softverbs_abi::direct::{ATOMIC_CMP_SWP, ATOMIC_FETCH_ADD, LOCAL_BIND, LOCAL_INV, NO_EVENT};
use softverbs_abi::direct::{
    NOTIFY_OWN, NOTIFY_PEER_RECV, NOTIFY_PEER_SEND, NOTIFY_RETRY, NOTIFY_RNR,
};
use softverbs_abi::msg::{
    DirectAtomicReq, DirectLocalOpReq, DirectNotifyReq, DirectOpResp, DirectRemoteInvReq,
    DirectWindowReq,
};
use softverbs_core::datapath::{PdRef, QpTarget};
use softverbs_core::errno::EINVAL;
use softverbs_core::ids::{CtxId, Handle};
use softverbs_core::types::{Access, EventType};
use softverbs_core::wr::{BindMw, SendOp, WcStatus};
use softverbs_core::Core;
use softverbs_transport::AtomicOp;
use zerocopy::little_endian::{U32, U64};

use super::Direct;
use crate::datapath::{DataPath, RemoteRefusal};

/// The peer of a direct QP: its context, handle, number and PD.
struct Peer {
    ctx: CtxId,
    handle: Handle,
    qpn: u32,
    pd: PdRef,
}

fn resp(status: WcStatus, event: Option<EventType>, value: u64) -> DirectOpResp {
    DirectOpResp {
        status: U32::new(status as u32),
        reserved: U32::new(event.map_or(NO_EVENT, |e| e as u32)),
        value: U64::new(value),
    }
}

fn done(value: u64) -> DirectOpResp {
    resp(WcStatus::Success, None, value)
}

/// A Remote Access Error: the requester's `REM_ACCESS_ERR`, the responder's
/// `QP_ACCESS_ERR` (IBA 9.7.5.2.4, 11.6.3.1).
fn access_error() -> DirectOpResp {
    resp(WcStatus::RemAccessErr, Some(EventType::QpAccessErr), 0)
}

fn refused(r: RemoteRefusal) -> DirectOpResp {
    match r {
        RemoteRefusal::Access => access_error(),
        RemoteRefusal::Operational => resp(WcStatus::RemOpErr, Some(EventType::QpFatal), 0),
    }
}

impl Direct {
    /// The peer of `(ctx, qp)` in a direct pair (`EINVAL` if the QP is in none).
    fn peer_of(&self, core: &Core, ctx: CtxId, qp: Handle) -> Result<Peer, i32> {
        let qpn = core.qp_num(ctx, qp).map_err(|e| e.errno())?;
        let (&(a, b), _) = self
            .pairs
            .iter()
            .find(|(&(a, b), p)| (a == qpn && p.ctx[0] == ctx) || (b == qpn && p.ctx[1] == ctx))
            .ok_or(EINVAL)?;
        let pqpn = if qpn == a { b } else { a };
        let Some(QpTarget::Owned {
            ctx: pctx,
            handle: ph,
            ..
        }) = core.qp_target(pqpn)
        else {
            return Err(EINVAL);
        };
        let pd = core.qp_pd(pctx, ph).ok_or(EINVAL)?;
        Ok(Peer {
            ctx: pctx,
            handle: ph,
            qpn: pqpn,
            pd,
        })
    }

    /// The peer QP's access flags as they are now (IBA 10.2.4.3: checked before the key).
    fn peer_access(core: &Core, p: &Peer) -> Access {
        core.query_qp(p.ctx, p.handle)
            .map_or(Access::EMPTY, |q| q.attr.qp_access_flags)
    }

    /// `DirectAtomic` (the responder's `execute_atomic`, IBA 9.4.5): REMOTE_ATOMIC on the
    /// responder QP, an 8-byte aligned address (else an Invalid Request, `QP_REQ_ERR`),
    /// then the key, PD, access and bounds; the read-modify-write happens here, between the
    /// engines' rounds, so no other atomic of this daemon interleaves with it.
    pub fn atomic(
        &self,
        core: &Core,
        dp: &mut DataPath,
        ctx: CtxId,
        r: &DirectAtomicReq,
    ) -> Result<DirectOpResp, i32> {
        let p = self.peer_of(core, ctx, Handle(r.qp.get()))?;
        let op = match r.op.get() {
            ATOMIC_CMP_SWP => AtomicOp::CompareSwap {
                compare: r.compare.get(),
                swap: r.swap_add.get(),
            },
            ATOMIC_FETCH_ADD => AtomicOp::FetchAdd {
                add: r.swap_add.get(),
            },
            _ => return Err(EINVAL),
        };
        if !Self::peer_access(core, &p).contains(Access::REMOTE_ATOMIC) {
            return Ok(access_error());
        }
        let va = r.remote_addr.get();
        if va % 8 != 0 {
            return Ok(resp(WcStatus::RemInvReqErr, Some(EventType::QpReqErr), 0));
        }
        Ok(
            match dp.direct_atomic(core, p.qpn, p.pd, r.rkey.get(), va, op) {
                Ok(orig) => done(orig),
                Err(e) => refused(e),
            },
        )
    }

    /// `DirectLocalOp`: a bind or local invalidate of the caller's own direct QP, on the
    /// engine's windows (`MW_BIND_ERR` / `LOC_QP_OP_ERR` when refused).
    pub fn local_op(
        &self,
        core: &Core,
        dp: &mut DataPath,
        ctx: CtxId,
        r: &DirectLocalOpReq,
    ) -> Result<DirectOpResp, i32> {
        let qp = Handle(r.qp.get());
        // The caller's QP must be half of a pair: other QPs bind through their send queue.
        self.peer_of(core, ctx, qp)?;
        let qpn = core.qp_num(ctx, qp).map_err(|e| e.errno())?;
        let pd = core.qp_pd(ctx, qp).ok_or(EINVAL)?;
        let (op, fail) = match r.op.get() {
            LOCAL_BIND => (
                SendOp::BindMw(BindMw {
                    mw_rkey: r.mw_rkey.get(),
                    new_rkey: r.new_rkey.get(),
                    mr_lkey: r.mr_lkey.get(),
                    addr: r.addr.get(),
                    length: r.length.get(),
                    access: Access(r.access.get()),
                }),
                WcStatus::MwBindErr,
            ),
            LOCAL_INV => (SendOp::LocalInv(r.mw_rkey.get()), WcStatus::LocQpOpErr),
            _ => return Err(EINVAL),
        };
        Ok(if dp.direct_local_op(core, qpn, pd, op) {
            done(0)
        } else {
            resp(fail, None, 0)
        })
    }

    /// `DirectWindowTarget`: an RDMA WRITE or READ through a window's R_Key, checked for the
    /// peer QP as its responder checks it.
    pub fn window_target(
        &self,
        core: &Core,
        dp: &DataPath,
        ctx: CtxId,
        r: &DirectWindowReq,
    ) -> Result<DirectOpResp, i32> {
        let p = self.peer_of(core, ctx, Handle(r.qp.get()))?;
        let need = Access(r.need.get());
        if ![Access::REMOTE_WRITE, Access::REMOTE_READ].contains(&need) {
            return Err(EINVAL);
        }
        if !Self::peer_access(core, &p).contains(need) {
            return Ok(access_error());
        }
        Ok(
            match dp.direct_target(
                core,
                p.qpn,
                p.pd,
                r.rkey.get(),
                (r.va.get(), r.len.get()),
                need,
            ) {
                Ok((_, addr, _)) => done(addr),
                Err(e) => refused(e),
            },
        )
    }

    /// `DirectRemoteInv`: the peer QP invalidates `rkey` (a bound type 2 window of its PD
    /// bound to it); refused, the requester gets `REM_INV_REQ_ERR` and the responder
    /// `QP_REQ_ERR` (class J, docs/design/memory-windows.md).
    pub fn remote_inv(
        &self,
        core: &Core,
        dp: &mut DataPath,
        ctx: CtxId,
        r: &DirectRemoteInvReq,
    ) -> Result<DirectOpResp, i32> {
        let p = self.peer_of(core, ctx, Handle(r.qp.get()))?;
        Ok(if dp.direct_remote_invalidate(p.qpn, p.pd, r.rkey.get()) {
            done(0)
        } else {
            resp(WcStatus::RemInvReqErr, Some(EventType::QpReqErr), 0)
        })
    }

    /// `DirectNotify`: a completion a library keeps landed on a CQ: the caller's own, or
    /// the receive CQ of its direct peer.
    pub fn notify(
        &self,
        core: &Core,
        dp: &mut DataPath,
        ctx: CtxId,
        r: &DirectNotifyReq,
    ) -> Result<(), i32> {
        let solicited = r.solicited.get() != 0;
        match r.target.get() {
            NOTIFY_OWN => dp.direct_completed(ctx, Handle(r.cq.get()), solicited),
            NOTIFY_PEER_RECV => {
                let p = self.peer_of(core, ctx, Handle(r.qp.get()))?;
                let info = core.owned_qp_info(p.ctx, p.handle).ok_or(EINVAL)?;
                if let Some(cq) = info.recv_cq {
                    dp.direct_completed(p.ctx, cq, solicited);
                    if !dp.cq_armed(p.ctx, cq) {
                        // Fired (or never armed): the peer's completions go untold again
                        // until the owner re-arms.
                        self.recv_cq_armed(core, p.ctx, cq, false);
                    }
                }
            }
            NOTIFY_RETRY => {
                // The pair may be gone already (its peer was destroyed): any QP of the
                // caller's own context.
                let qp = Handle(r.qp.get());
                core.qp_num(ctx, qp).map_err(|e| e.errno())?;
                wake_after_retries(core, dp, ctx, qp);
            }
            NOTIFY_RNR => {
                let qp = Handle(r.qp.get());
                let p = self.peer_of(core, ctx, qp)?;
                let (Ok(q), Ok(pq), Some(info)) = (
                    core.query_qp(ctx, qp),
                    core.query_qp(p.ctx, p.handle),
                    core.owned_qp_info(ctx, qp),
                ) else {
                    return Err(EINVAL);
                };
                if q.attr.rnr_retry < 7 {
                    let each = softverbs_transport::time::rnr_delay(pq.attr.min_rnr_timer);
                    let at = std::time::Instant::now()
                        + each * u32::from(q.attr.rnr_retry)
                        + std::time::Duration::from_millis(1);
                    dp.direct_wake_at(at, ctx, info.send_cq);
                }
            }
            NOTIFY_PEER_SEND => {
                let p = self.peer_of(core, ctx, Handle(r.qp.get()))?;
                let info = core.owned_qp_info(p.ctx, p.handle).ok_or(EINVAL)?;
                dp.direct_completed(p.ctx, info.send_cq, false);
            }
            _ => return Err(EINVAL),
        }
        Ok(())
    }
}

/// Wakes the armed CQs of QP `qpn` (its send CQ and receive CQ), as completions would.
fn wake_qp(core: &Core, dp: &mut DataPath, qpn: u32, solicited: bool) {
    let Some(QpTarget::Owned { ctx, handle, .. }) = core.qp_target(qpn) else {
        return;
    };
    let Some(info) = core.owned_qp_info(ctx, handle) else {
        return;
    };
    let cqs = [
        Some(info.send_cq),
        info.recv_cq.filter(|&r| r != info.send_cq),
    ];
    for cq in cqs.into_iter().flatten() {
        dp.direct_completed(ctx, cq, solicited);
    }
}

/// QP `qpn`'s requests wait for a peer that stopped answering: its armed CQs wake when its
/// retries would have run out (the library's `retries_run_out`, which started counting
/// just before it asked), so a program blocked in `ibv_get_cq_event` polls and gets the
/// `RETRY_EXC_ERR` its engine would have given.
fn wake_after_retries(core: &Core, dp: &mut DataPath, ctx: CtxId, handle: Handle) {
    let (Some(info), Ok(q)) = (core.owned_qp_info(ctx, handle), core.query_qp(ctx, handle)) else {
        return;
    };
    if q.attr.timeout == 0 {
        return;
    }
    let each = std::time::Duration::from_nanos(4096u64 << q.attr.timeout.min(31));
    let at = std::time::Instant::now()
        + each * (u32::from(q.attr.retry_cnt) + 1)
        + std::time::Duration::from_millis(1);
    dp.direct_wake_at(at, ctx, info.send_cq);
    if let Some(cq) = info.recv_cq.filter(|&r| r != info.send_cq) {
        dp.direct_wake_at(at, ctx, cq);
    }
}

impl Direct {
    /// The daemon changed what a direct QP's library can do next — its peer attached
    /// (`solicited` false: the waiting requests can now complete), failed or went
    /// (`solicited` true: the QP flushes with errors) — but only that library moves the QP
    /// on, at its next post or poll. Its armed CQs fire, so a program blocked in
    /// `ibv_get_cq_event` polls (the daemon path's completions would have woken it).
    /// `qpn`'s partners are woken.
    pub fn wake_partners(&self, core: &Core, dp: &mut DataPath, qpn: u32, solicited: bool) {
        for &(a, b) in self.pairs.keys() {
            if a == qpn {
                wake_qp(core, dp, b, solicited);
            } else if b == qpn {
                wake_qp(core, dp, a, solicited);
            }
        }
    }

    /// [`wake_partners`](Self::wake_partners) of every QP of `ctx` (it is closing).
    pub fn wake_partners_of_context(&self, core: &Core, dp: &mut DataPath, ctx: CtxId) {
        for (&(a, b), p) in &self.pairs {
            if p.ctx[0] == ctx && p.ctx[1] != ctx {
                wake_qp(core, dp, b, true);
            } else if p.ctx[1] == ctx && p.ctx[0] != ctx {
                wake_qp(core, dp, a, true);
            }
        }
    }
}

impl Direct {
    /// `(ctx, qp)` was modified: its partner learns of an ERR (`wake_partners`), and the
    /// channel's word of its access
    /// flags (`CH_ACCESS`, which its peer's library checks WRITEs and READs against, IBA
    /// 10.2.4.3) follows `ibv_modify_qp(IBV_QP_ACCESS_FLAGS)`.
    pub fn modified(&self, core: &Core, dp: &mut DataPath, ctx: CtxId, qp: Handle) {
        self.access_changed(core, ctx, qp);
        let in_error = core
            .query_qp(ctx, qp)
            .is_ok_and(|q| q.attr.qp_state == softverbs_core::types::QpState::Err);
        if let (true, Ok(qpn)) = (in_error, core.qp_num(ctx, qp)) {
            // Its peer's requests go unanswered from now on.
            self.wake_partners(core, dp, qpn, true);
        }
    }

    /// After `DirectAttach`: both sides' words of the pair of `(ctx, qp)`.
    pub fn publish_attrs(&self, core: &Core, ctx: CtxId, qp: Handle) {
        self.access_changed(core, ctx, qp);
        if let Ok(p) = self.peer_of(core, ctx, qp) {
            self.access_changed(core, p.ctx, p.handle);
        }
    }

    fn access_changed(&self, core: &Core, ctx: CtxId, qp: Handle) {
        let Ok(qpn) = core.qp_num(ctx, qp) else {
            return;
        };
        let Ok(q) = core.query_qp(ctx, qp) else {
            return;
        };
        for (&(a, b), p) in &self.pairs {
            let side = if a == qpn && p.ctx[0] == ctx {
                0
            } else if b == qpn && p.ctx[1] == ctx {
                1
            } else {
                continue;
            };
            p.region
                .atomic_u32(softverbs_abi::direct::CH_ACCESS[side])
                .store(
                    q.attr.qp_access_flags.0,
                    std::sync::atomic::Ordering::Release,
                );
            p.region
                .atomic_u32(softverbs_abi::direct::CH_MIN_RNR[side])
                .store(
                    u32::from(q.attr.min_rnr_timer),
                    std::sync::atomic::Ordering::Release,
                );
        }
    }
}
