//! The direct path's requests that need the daemon (ABI 15, docs/design/direct-path.md, "Atomics
//! and memory windows"), and completion events for the completions the libraries keep
//! ("Completion channels").
//!
//! Atomics and memory windows keep the daemon as their one authority: an atomic must be
//! atomic with respect to the engine's atomics on the same memory (`IBV_ATOMIC_HCA`), and a
//! window's binding is the engine's (`crates/transport/src/mw.rs`), seen by daemon-path QPs
//! too. So the requester's library, executing its queue in posting order as for every other
//! request, runs each of these as one synchronous command: the daemon checks what the
//! responder's engine checks and answers the requester's status and the responder's event;
//! the data still moves between the two processes directly.

use softverbs_abi::direct::{
    ATOMIC_CMP_SWP, ATOMIC_FETCH_ADD, CH_MIN_RNR, CH_RECV_CHANNEL, CH_WAITING, LOCAL_BIND,
    LOCAL_INV, NOTIFY_OWN, NOTIFY_PEER_RECV, NOTIFY_PEER_SEND, NOTIFY_RETRY, NOTIFY_RNR,
    SIDE_ERROR, SIDE_GONE, SIDE_OPEN, SIDE_PENDING,
};
use softverbs_abi::msg::{
    cmd, Command, DirectAtomicReq, DirectLocalOpReq, DirectNotifyReq, DirectOpResp,
    DirectRemoteInvReq, DirectWindowReq, PostRecvReq, WcWire,
};
use softverbs_core::memory::AtomicOp;
use softverbs_core::mw::is_window_key;
use softverbs_core::types::{Access, EventType, QpType};
use softverbs_core::wr::{SendOp, WcOpcode, WcStatus, WorkCompletion, WC_WITH_INV};
use softverbs_memaccess::{PeerFault, PeerMemory};
use std::sync::atomic::{fence, Ordering};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromZeros, IntoBytes};

use super::{
    check_entry, local_pieces, peer_state, push_entry, receive_pieces, scatter, settle, Chan, Exec,
    Inner, Pending,
};
use crate::conn::Conn;
use crate::Context;
use softverbs_abi::direct::{CH_ACCESS, NO_EVENT};
use softverbs_shm::Region;

/// Whether the daemon speaks the commands of this module.
pub(super) fn offered(ctx: &Context) -> bool {
    ctx.conn.abi >= <cmd::DirectAtomic as Command>::CMD.since_abi()
}

/// What a request finds before anything is checked: the peer's side as the engine's
/// requester would find its responder (`super::execute`'s first rule).
fn gate(c: &Chan, reliable: bool) -> Option<Exec> {
    match peer_state(c) {
        SIDE_OPEN => None,
        SIDE_PENDING => Some(Exec::Rnr),
        _ if reliable => Some(Exec::Done(WcStatus::RetryExcErr, 0)),
        _ => Some(Exec::Done(WcStatus::Success, 0)),
    }
}

/// The daemon's answer as the request's end: done, or the rule the responder found broken
/// (the library then fails the responder with its event, `DirectPeerError`).
fn answered(r: &DirectOpResp) -> std::result::Result<u64, Exec> {
    match WcStatus::from_raw(r.status.get()) {
        Some(WcStatus::Success) => Ok(r.value.get()),
        Some(s) => {
            let event = match r.reserved.get() {
                NO_EVENT => None,
                e => EventType::from_raw(e),
            };
            Err(Exec::PeerFault(s, event))
        }
        None => Err(Exec::PeerFault(
            WcStatus::RemOpErr,
            Some(EventType::QpFatal),
        )),
    }
}

/// A command failed (the pair is gone from the daemon: the peer was destroyed or its
/// context closed): the responder never answers.
fn unanswered(reliable: bool) -> Exec {
    if reliable {
        Exec::Done(WcStatus::RetryExcErr, 0)
    } else {
        Exec::Done(WcStatus::Success, 0)
    }
}

/// Runs the requests of this module; `None`: `super::execute` runs it.
pub(super) fn execute(
    ctx: &Context,
    own_table: &Region,
    handle: u32,
    c: &mut Chan,
    qp_type: QpType,
    p: &Pending,
) -> Option<Exec> {
    let reliable = qp_type == QpType::Rc;
    let window = |rkey: u32| is_window_key(rkey) && offered(ctx);
    if reliable && matches!(peer_state(c), SIDE_ERROR | SIDE_GONE) {
        // A responder in ERR or gone answers nothing: the request waits as its retries
        // would, then fails.
        return Some(if retries_run_out(ctx, handle, c) {
            Exec::Done(WcStatus::RetryExcErr, 0)
        } else {
            Exec::Rnr
        });
    }
    // What these requests do to the peer's memory comes after the bytes of earlier small
    // SENDs that wait in inline slots (IBA 9.5: the responder executes in order), and a
    // completion they push must find its slot free (`super::settle`).
    let touches_peer = match p.op {
        SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } | SendOp::SendWithInv(_) => {
            offered(ctx)
        }
        SendOp::Write { rkey, .. }
        | SendOp::WriteWithImm { rkey, .. }
        | SendOp::Read { rkey, .. } => window(rkey),
        _ => false,
    };
    if touches_peer {
        settle(ctx, c);
    }
    match p.op {
        SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } if offered(ctx) => {
            Some(gate(c, reliable).unwrap_or_else(|| atomic(ctx, own_table, handle, c, p)))
        }
        SendOp::BindMw(_) | SendOp::LocalInv(_) if offered(ctx) => Some(local_op(ctx, handle, p)),
        SendOp::SendWithInv(rkey) if offered(ctx) => Some(
            gate(c, reliable)
                .unwrap_or_else(|| send_with_inv(ctx, own_table, handle, c, reliable, p, rkey)),
        ),
        SendOp::Write { rkey, .. }
        | SendOp::WriteWithImm { rkey, .. }
        | SendOp::Read { rkey, .. }
            if window(rkey) =>
        {
            Some(
                gate(c, reliable).unwrap_or_else(|| {
                    through_window(ctx, own_table, handle, c, reliable, p, rkey)
                }),
            )
        }
        _ => None,
    }
}

/// An atomic: the read-modify-write in the daemon (`DirectAtomic`), then the original value
/// into the requester's own SGEs, as the engine's completer places the atomic ACK (a local
/// key that fails there fails here: `LOC_PROT_ERR`, after the responder executed it).
fn atomic(ctx: &Context, own_table: &Region, handle: u32, c: &mut Chan, p: &Pending) -> Exec {
    let (op, remote_addr, rkey, compare, swap_add) = match p.op {
        SendOp::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => (ATOMIC_CMP_SWP, remote_addr, rkey, compare, swap),
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        } => (ATOMIC_FETCH_ADD, remote_addr, rkey, 0, add),
        _ => return Exec::Done(WcStatus::LocQpOpErr, 0),
    };
    let aop = if op == ATOMIC_CMP_SWP {
        AtomicOp::CompareSwap {
            compare,
            swap: swap_add,
        }
    } else {
        AtomicOp::FetchAdd { add: swap_add }
    };
    if let Some(orig) = mapped_atomic(ctx, c, remote_addr, rkey, aop) {
        return match place_own(own_table, c, p, &orig.to_ne_bytes()) {
            Ok(()) => Exec::Done(WcStatus::Success, 8),
            Err(s) => Exec::Done(s, 0),
        };
    }
    let req = DirectAtomicReq {
        qp: U32::new(handle),
        op: U32::new(op),
        remote_addr: U64::new(remote_addr),
        rkey: U32::new(rkey),
        reserved: U32::new(0),
        compare: U64::new(compare),
        swap_add: U64::new(swap_add),
    };
    let Ok(r) = ctx.conn.call::<cmd::DirectAtomic>("direct_atomic", 0, &req) else {
        return unanswered(true);
    };
    let orig = match answered(&r) {
        Ok(v) => v,
        Err(e) => return e,
    };
    match place_own(own_table, c, p, &orig.to_ne_bytes()) {
        Ok(()) => Exec::Done(WcStatus::Success, 8),
        Err(s) => Exec::Done(s, 0),
    }
}

/// An atomic on the peer's shared-memory MR, executed here with a CPU atomic on this
/// library's mapping of the MR's memfd — atomic with respect to the daemon, which executes
/// the atomics of the engine's QPs on such an MR with the same instructions on its own
/// mapping (`crates/memaccess/src/shared.rs`) — when nothing about it can fail: the peer QP
/// allows `REMOTE_ATOMIC`, the address is 8-byte aligned, the key is an MR's (not a
/// window's) and allows it in the peer's table for the peer QP's PD, and the MR is shared
/// and not ODP. `None`: the daemon executes it (`DirectAtomic`), which also reports and
/// raises whatever fails (IBA 9.4.5, the responder's `execute_atomic`). The busy word is up
/// (`super::progress`), so the owner's `dereg_mr` waits for it.
fn mapped_atomic(ctx: &Context, c: &mut Chan, va: u64, rkey: u32, op: AtomicOp) -> Option<u64> {
    if is_window_key(rkey) || va % 8 != 0 {
        return None;
    }
    let peer_access = Access(
        c.region
            .atomic_u32(CH_ACCESS[1 - c.side])
            .load(Ordering::Acquire),
    );
    if !peer_access.contains(Access::REMOTE_ATOMIC) {
        return None;
    }
    let (e, addr) = check_entry(&c.peer_table, c.peer_pd, rkey, va, 8, Access::REMOTE_ATOMIC)?;
    if Access(e.access).contains(Access::ON_DEMAND) {
        return None;
    }
    let handle = c.handle;
    c.maps.get(ctx, handle, &e)?.atomic(addr, op).ok()
}

/// Writes `data` into the request's own SGEs in order (the completer's `place`): each piece
/// checked in this context's MR table for `LOCAL_WRITE` (`LOC_PROT_ERR`), `LOC_LEN_ERR` if
/// they hold less.
fn place_own(
    own_table: &Region,
    c: &Chan,
    p: &Pending,
    data: &[u8],
) -> std::result::Result<(), WcStatus> {
    let mut off = 0usize;
    for s in &p.sges {
        if off == data.len() {
            break;
        }
        let take = (s.length as usize).min(data.len() - off);
        let (e, at) = check_entry(
            own_table,
            c.own_pd,
            s.lkey,
            s.addr,
            take as u64,
            Access::LOCAL_WRITE,
        )
        .ok_or(WcStatus::LocProtErr)?;
        let piece = &data[off..off + take];
        if Access(e.access).contains(Access::ON_DEMAND) {
            // Its pages may be unmapped: through the kernel, which reports that as an error.
            own_memory(|own| own.write_from(&[(piece.as_ptr() as u64, take as u64)], at))
                .map_err(|_| WcStatus::LocProtErr)?;
        } else {
            // Registered memory of this process, allocated while registered (`RawMemory`).
            softverbs_memaccess::write_own(at, piece);
        }
        off += take;
    }
    if off < data.len() {
        return Err(WcStatus::LocLenErr);
    }
    Ok(())
}

/// Runs `f` on this process's own memory through the kernel (an unmapped buffer is an
/// error, not a fault), opened once per process: a forked child opens its own, never
/// writing its parent's.
fn own_memory(
    f: impl FnOnce(&PeerMemory) -> std::result::Result<(), PeerFault>,
) -> std::result::Result<(), ()> {
    static OWN: std::sync::Mutex<Option<(u32, PeerMemory)>> = std::sync::Mutex::new(None);
    let mut g = OWN.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    if g.as_ref().is_none_or(|(p, _)| *p != pid) {
        let m = softverbs_memaccess::open_own_memory().map_err(|_| ())?;
        *g = Some((pid, PeerMemory::new(m)));
    }
    let (_, own) = g.as_ref().ok_or(())?;
    f(own).map_err(|_| ())
}

/// A bind or local invalidate, on the engine's windows (`DirectLocalOp`): `MW_BIND_ERR` or
/// `LOC_QP_OP_ERR` when refused, the QP then in error (`requester::local_op`).
fn local_op(ctx: &Context, handle: u32, p: &Pending) -> Exec {
    let mut req = DirectLocalOpReq {
        qp: U32::new(handle),
        ..DirectLocalOpReq::default()
    };
    let fail = match p.op {
        SendOp::BindMw(b) => {
            req.op = U32::new(LOCAL_BIND);
            req.mw_rkey = U32::new(b.mw_rkey);
            req.new_rkey = U32::new(b.new_rkey);
            req.mr_lkey = U32::new(b.mr_lkey);
            req.access = U32::new(b.access.0);
            req.addr = U64::new(b.addr);
            req.length = U64::new(b.length);
            WcStatus::MwBindErr
        }
        SendOp::LocalInv(rkey) => {
            req.op = U32::new(LOCAL_INV);
            req.mw_rkey = U32::new(rkey);
            WcStatus::LocQpOpErr
        }
        _ => return Exec::Done(WcStatus::LocQpOpErr, 0),
    };
    match ctx
        .conn
        .call::<cmd::DirectLocalOp>("direct_local_op", 0, &req)
    {
        Ok(r) if r.status.get() == WcStatus::Success as u32 => Exec::Done(WcStatus::Success, 0),
        Ok(r) => Exec::Done(WcStatus::from_raw(r.status.get()).unwrap_or(fail), 0),
        Err(_) => Exec::Done(fail, 0),
    }
}

/// An RDMA WRITE (with immediate) or READ through a window's R_Key: the daemon checks the
/// window for the peer QP (`DirectWindowTarget`) where the MR table would have checked an
/// MR's key; the data moves directly as for an MR.
fn through_window(
    ctx: &Context,
    own_table: &Region,
    handle: u32,
    c: &mut Chan,
    reliable: bool,
    p: &Pending,
    rkey: u32,
) -> Exec {
    let (remote_addr, need, write) = match p.op {
        SendOp::Write { remote_addr, .. } | SendOp::WriteWithImm { remote_addr, .. } => {
            (remote_addr, (Access::EMPTY, Access::REMOTE_WRITE), true)
        }
        SendOp::Read { remote_addr, .. } => (
            remote_addr,
            (Access::LOCAL_WRITE, Access::REMOTE_READ),
            false,
        ),
        _ => return Exec::Done(WcStatus::LocQpOpErr, 0),
    };
    let access_err = || {
        if reliable {
            Exec::PeerFault(WcStatus::RemAccessErr, Some(EventType::QpAccessErr))
        } else {
            Exec::Done(WcStatus::Success, 0)
        }
    };
    let peer_access = Access(
        c.region
            .atomic_u32(CH_ACCESS[1 - c.side])
            .load(Ordering::Acquire),
    );
    // The local keys, then the responder QP's flags (the engine's order, `rdma_target`).
    let local = match local_pieces(own_table, c, p, need.0) {
        Ok(l) => l,
        Err(s) => return Exec::Done(s, 0),
    };
    if !peer_access.contains(need.1) {
        return access_err();
    }
    let total: u64 = local.iter().map(|&(_, l)| l).sum();
    if total > 0 {
        let req = DirectWindowReq {
            qp: U32::new(handle),
            rkey: U32::new(rkey),
            va: U64::new(remote_addr),
            len: U64::new(total),
            need: U32::new(need.1 .0),
            reserved: U32::new(0),
        };
        let Ok(r) = ctx
            .conn
            .call::<cmd::DirectWindowTarget>("direct_window_target", 0, &req)
        else {
            return unanswered(reliable);
        };
        let target = match answered(&r) {
            Ok(a) => a,
            Err(_) => return access_err(),
        };
        let moved = if write {
            c.peer.write_from(&local, target)
        } else {
            c.peer.read_into(&local, target)
        };
        match moved {
            Ok(()) => {}
            Err(PeerFault::Local) => return Exec::Done(WcStatus::LocProtErr, 0),
            Err(PeerFault::Gone) => return unanswered(reliable),
            Err(PeerFault::Remote) if reliable => {
                return Exec::PeerFault(WcStatus::RemOpErr, Some(EventType::QpFatal))
            }
            Err(PeerFault::Remote) => return Exec::Done(WcStatus::Success, 0),
        }
    }
    if let SendOp::WriteWithImm { imm, .. } = p.op {
        return match super::deliver(
            ctx,
            c,
            reliable,
            total,
            0,
            Some(imm),
            WcOpcode::RecvRdmaWithImm,
            None,
        ) {
            Exec::Done(WcStatus::Success, _) => Exec::Done(WcStatus::Success, total as u32),
            e => e,
        };
    }
    Exec::Done(WcStatus::Success, total as u32)
}

/// A Send with Invalidate (RC only, IBA 10.6.7.2.5): delivered as a SEND
/// (`super::deliver`'s rules), then the peer QP invalidates the key (`DirectRemoteInv`).
/// Refused, the receive completes `REM_INV_REQ_ERR`, the requester gets `REM_INV_REQ_ERR`
/// and the responder `QP_REQ_ERR` (class J); done, the receive carries `IBV_WC_WITH_INV`
/// and the key.
fn send_with_inv(
    ctx: &Context,
    own_table: &Region,
    handle: u32,
    c: &mut Chan,
    reliable: bool,
    p: &Pending,
    rkey: u32,
) -> Exec {
    let local = match local_pieces(own_table, c, p, Access::EMPTY) {
        Ok(l) => l,
        Err(s) => return Exec::Done(s, 0),
    };
    let total: u64 = local.iter().map(|&(_, l)| l).sum();
    // The busy word is raised around the whole request by `super::progress`.
    let result = (|| {
        if let Some(e) = gate(c, reliable) {
            return e;
        }
        let mut r = PostRecvReq::new_zeroed();
        match super::pop_recv(c, &mut r) {
            Ok(true) => {}
            Ok(false) => return Exec::Rnr,
            Err(()) => return Exec::PeerFault(WcStatus::RemOpErr, Some(EventType::QpFatal)),
        }
        let (mut remote, mut pieces) = (super::RemotePieces::new(), smallvec::SmallVec::new());
        let mut status = receive_pieces(c, &r, total, &mut remote, &mut pieces);
        if status == WcStatus::Success {
            match scatter(ctx, c, &local, &remote) {
                Ok(()) => {}
                Err(PeerFault::Gone) => return Exec::Done(WcStatus::RetryExcErr, 0),
                Err(PeerFault::Local) => return Exec::Done(WcStatus::LocProtErr, 0),
                Err(PeerFault::Remote) => status = WcStatus::LocProtErr,
            }
        }
        let mut inv_refused = None;
        if status == WcStatus::Success {
            let req = DirectRemoteInvReq {
                qp: U32::new(handle),
                rkey: U32::new(rkey),
            };
            match ctx
                .conn
                .call::<cmd::DirectRemoteInv>("direct_remote_inv", 0, &req)
            {
                Ok(r) => {
                    if let Err(e) = answered(&r) {
                        status = WcStatus::RemInvReqErr;
                        inv_refused = Some(e);
                    }
                }
                Err(_) => return Exec::Done(WcStatus::RetryExcErr, 0),
            }
        }
        let mut wc = WorkCompletion::new(r.wr_id.get(), status, WcOpcode::Recv, c.peer_qpn);
        if status == WcStatus::Success {
            wc.byte_len = total as u32;
            wc.imm_data = rkey;
            wc.wc_flags |= WC_WITH_INV;
        }
        if push_entry(&mut c.cqe_out, WcWire::from(&wc).as_bytes()).is_err() {
            return Exec::PeerFault(WcStatus::RemOpErr, Some(EventType::QpFatal));
        }
        match status {
            WcStatus::Success => Exec::Done(WcStatus::Success, total as u32),
            WcStatus::LocLenErr => Exec::PeerFault(WcStatus::RemInvReqErr, None),
            WcStatus::RemInvReqErr => inv_refused.unwrap_or(Exec::PeerFault(
                WcStatus::RemInvReqErr,
                Some(EventType::QpReqErr),
            )),
            _ => Exec::PeerFault(WcStatus::RemOpErr, None),
        }
    })();
    result
}

/// After a request ran: if it produced a receive completion for the peer whose receive CQ
/// has a completion channel, the daemon raises the CQ's event if it is armed (solicited:
/// the request asked for it, or the receive failed).
///
/// A request left waiting for a receive (RNR) says so in the channel ([`CH_WAITING`]), so
/// that the peer's next `post_recv` wakes this side's armed send CQ ([`posted_recv`]); if a
/// receive came in meanwhile, this side wakes its own CQ (the two sides store, then load:
/// one of them sees the other).
pub(super) fn delivered(
    ctx: &Context,
    handle: u32,
    c: &mut Chan,
    send_cq: Option<u32>,
    (before, p, e): (u32, &Pending, &Exec),
) {
    if !offered(ctx) {
        return;
    }
    let waiting = c.region.atomic_u32(CH_WAITING[c.side]);
    if matches!(e, Exec::Rnr) {
        if waiting.swap(1, Ordering::SeqCst) == 0 && peer_state(c) == SIDE_OPEN {
            fence(Ordering::SeqCst);
            if c.rq_in.available().unwrap_or(0) > 0 {
                if let Some(cq) = send_cq {
                    notify(ctx, 0, NOTIFY_OWN, cq, false);
                }
            }
        }
    } else if waiting.load(Ordering::Relaxed) != 0 {
        waiting.store(0, Ordering::Relaxed);
    }
    if c.cqe_out.produced() == before {
        return;
    }
    let peer = 1 - c.side;
    // The completion is pushed; the daemon sets the word before it answers the owner's
    // arm, after which the owner polls: one of the two sees the other (`CH_RECV_CHANNEL`).
    fence(Ordering::SeqCst);
    if c.region
        .atomic_u32(CH_RECV_CHANNEL[peer])
        .load(Ordering::SeqCst)
        == 0
    {
        return;
    }
    let solicited = p.solicited || !matches!(e, Exec::Done(WcStatus::Success, _));
    notify(ctx, handle, NOTIFY_PEER_RECV, 0, solicited);
}

fn notify(ctx: &Context, qp: u32, target: u32, cq: u32, solicited: bool) {
    notify_on(&ctx.conn, qp, target, cq, solicited);
}

fn notify_on(conn: &Conn, qp: u32, target: u32, cq: u32, solicited: bool) {
    let req = DirectNotifyReq {
        qp: U32::new(qp),
        target: U32::new(target),
        cq: U32::new(cq),
        solicited: U32::new(u32::from(solicited)),
    };
    let _ = conn.call::<cmd::DirectNotify>("direct_notify", 0, &req);
}

/// A receive was posted to the channel: a peer request waiting for one ([`CH_WAITING`])
/// can go on, and the daemon wakes the peer's armed send CQ.
pub(super) fn posted_recv(ctx: &Context, handle: u32, c: &Chan) {
    fence(Ordering::SeqCst);
    let peer = 1 - c.side;
    if c.region.atomic_u32(CH_WAITING[peer]).load(Ordering::SeqCst) != 0 && offered(ctx) {
        notify(ctx, handle, NOTIFY_PEER_SEND, 0, false);
    }
}

/// The arms of a channel CQ the daemon may hold, as far as this library can tell.
///
/// The daemon fires an arm for completions this library does not see (its own QPs' on the
/// same CQ, the peer's receive completions, `NOTIFY_PEER_SEND`...), so what is recorded here
/// is what it *may* hold: an arm for any completion (`any`) and one for solicited or
/// unsuccessful ones only (`solicited`), each set when `ibv_req_notify_cq` asked for it and
/// cleared only by a notification that surely spent it (IBA 11.4.2.2: an unsuccessful
/// completion fires either kind; a successful send completion only the first).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Arms {
    any: bool,
    solicited: bool,
}

impl Arms {
    fn set(self) -> bool {
        self.any || self.solicited
    }
}

/// The completions this library itself queued since the last call (`CqQueues::own`) raise
/// their CQ's event: the daemon is told whenever an arm it may hold would fire ([`Arms`]);
/// an arm it had already spent costs one notification it ignores, never a missed one.
/// Called after every post, poll and modify that may queue completions, and with nothing
/// queued costs a look at an empty list.
pub(super) fn notify_own(ctx: &Context, inner: &mut Inner) {
    notify_own_on(&ctx.conn, inner);
}

/// [`notify_own`] through the connection alone (the net path's progress thread, which has
/// no `Context`).
pub(super) fn notify_own_on(conn: &Conn, inner: &mut Inner) {
    overrun(conn, inner);
    if inner.cqs.own.is_empty() {
        return;
    }
    if inner.arms == 0 {
        // No arm recorded: nothing to fire now, and a later arm fires for later ones only.
        inner.cqs.own.clear();
        return;
    }
    let own = std::mem::take(&mut inner.cqs.own);
    for (cq, failed) in own {
        let Some(a) = inner.armed_cqs.get_mut(&cq) else {
            continue;
        };
        if !(a.any || (failed && a.solicited)) {
            continue;
        }
        // Whatever the daemon holds of what was asked for, this spends it — except a
        // solicited-only arm, which a successful completion leaves in place.
        a.any = false;
        if failed {
            a.solicited = false;
        }
        if !a.set() {
            inner.arms -= 1;
        }
        notify_on(conn, 0, NOTIFY_OWN, cq, failed);
    }
}

impl super::DirectCtx {
    /// The owner arms CQ `cq` (`ibv_req_notify_cq`); called before the command leaves and
    /// again after the daemon answered. Before: a completion this library adds while the
    /// command is on its way is notified (if it reaches the daemon first, the completion is
    /// in the queue the owner polls after arming, ibv_req_notify_cq(3)). After: another
    /// thread's notification may have spent the first record before the daemon armed, and
    /// from now on a notification reaches the daemon after the arm.
    pub(crate) fn armed(&self, cq: u32, solicited_only: bool) {
        let mut g = self.lock();
        let inner = &mut *g;
        // Recorded whether or not a direct QP reports to the CQ yet: one may later.
        let a = inner.armed_cqs.entry(cq).or_default();
        if !a.set() {
            inner.arms += 1;
        }
        if solicited_only {
            a.solicited = true;
        } else {
            a.any = true;
        }
    }
}

/// The daemon died (the device is gone, `crate::fatal`): every direct QP flushes its
/// requests and receives once, as the rings' QPs do (`crate::flush`, IBA 10.3.1.9); the
/// daemon is not told (nothing is left to tell).
pub(super) fn device_gone(ctx: &Context, inner: &mut Inner) {
    if let Some(n) = inner.net.as_mut() {
        n.fail_all(&mut inner.cqs);
    }
    let handles: Vec<u32> = inner.qps.keys().copied().collect();
    for h in handles {
        if let Some(q) = inner.qps.get_mut(&h) {
            super::fail(ctx, h, q, &mut inner.cqs, None, false);
        }
    }
}

/// A CQ holds `cqe` completions (ibv_create_cq(3)): past that, the completions the library
/// keeps for it are lost and its owner gets `IBV_EVENT_CQ_ERR` (IBA 11.4.2.1, the engine's
/// `Delivery::Overrun`). Counted per CQ over the direct path's own queue; the daemon counts
/// its ring's for its QPs.
fn overrun(conn: &Conn, inner: &mut Inner) {
    // A CQ holds at least one entry (the core refuses `cqe` 0), so only a queue that grew
    // past one needs a look at its CQ's size: this runs at every poll, post and completion.
    if !inner.cqs.grown {
        return;
    }
    let mut grown = false;
    for (&cq, q) in inner.cqs.map.iter_mut() {
        if q.len() <= 1 {
            continue;
        }
        grown = true;
        let Some(&cap) = inner.cq_cap.get(&cq) else {
            continue;
        };
        if q.len() <= cap as usize {
            continue;
        }
        q.truncate(cap as usize);
        let req = softverbs_abi::msg::HandleReq {
            handle: U32::new(cq),
        };
        let _ = conn.call::<cmd::DirectCqOverrun>("direct_cq_overrun", 0, &req);
    }
    inner.cqs.grown = grown;
}

impl super::DirectCtx {
    /// Completions the direct path holds for CQ `cq`.
    pub(crate) fn queued(&self, cq: u32) -> usize {
        self.lock().cqs.get(&cq).map_or(0, |q| q.len())
    }

    /// CQ `cq` was resized to `cqe` entries.
    pub(crate) fn cq_resized(&self, cq: u32, cqe: u32) {
        if let Some(c) = self.lock().cq_cap.get_mut(&cq) {
            *c = cqe;
        }
    }
}

/// A memory fault behind an on-demand-paging MR of the peer is the access error a NIC
/// reports for a failed ODP page fault, not an operational error (the engine's rule,
/// docs/design/registered-memory.md).
///
/// And a request that meets no receive (RNR) waits as the engine's requester would retry:
/// `rnr_retry` times the peer's RNR timer (`min_rnr_timer`, IBA table 45), then completes
/// `RNR_RETRY_EXC_ERR` (IBA 9.7.5.2.8, `crates/transport/src/completer.rs`); 7 waits
/// forever. The daemon wakes the QP's armed CQs when that time has passed (`NOTIFY_RNR`).
pub(super) fn adjusted(ctx: &Context, handle: u32, c: &mut Chan, p: &Pending, e: Exec) -> Exec {
    if matches!(e, Exec::Rnr) {
        return rnr(ctx, handle, c, e);
    }
    c.rnr_deadline = None;
    let Exec::PeerFault(WcStatus::RemOpErr, Some(EventType::QpFatal)) = e else {
        return e;
    };
    let rkey = match p.op {
        SendOp::Write { rkey, .. }
        | SendOp::WriteWithImm { rkey, .. }
        | SendOp::Read { rkey, .. } => rkey,
        _ => return e,
    };
    match super::lookup(&c.peer_table, rkey) {
        Some(m) if Access(m.access).contains(Access::ON_DEMAND) => {
            Exec::PeerFault(WcStatus::RemAccessErr, Some(EventType::QpAccessErr))
        }
        _ => e,
    }
}

/// Whether the retries of a request to a peer that stopped answering (in ERR, or gone) have
/// run out: an engine requester resends `retry_cnt` times, each after the local ACK timeout
/// (4.096 µs · 2^`timeout`, IBA 9.7.6.1.3; `timeout` 0: never), so the direct path reports
/// `RETRY_EXC_ERR` no sooner. (A peer that closes the connection right after its last
/// message, as rsocket does, must not fail its partner's last credits at once.) The daemon
/// wakes the QP's armed CQs when the time has passed (`NOTIFY_RETRY`).
pub(super) fn retries_run_out(ctx: &Context, handle: u32, c: &mut Chan) -> bool {
    let deadline = *c.retry_deadline.get_or_insert_with(|| {
        let now = std::time::Instant::now();
        match crate::objects::query_qp(ctx, "query_qp", handle) {
            Ok(q) if q.attr.timeout == 0 => None,
            Ok(q) => {
                let each = std::time::Duration::from_nanos(4096u64 << q.attr.timeout.min(31));
                // The daemon wakes this QP's armed CQs a little after this.
                notify(ctx, handle, NOTIFY_RETRY, 0, true);
                Some(now + each * (u32::from(q.attr.retry_cnt) + 1))
            }
            Err(_) => Some(now),
        }
    });
    deadline.is_some_and(|d| std::time::Instant::now() >= d)
}

/// IBA table 45: the RNR NAK timer, in microseconds, by the 5-bit code (0 is the longest).
const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

fn rnr(ctx: &Context, handle: u32, c: &mut Chan, e: Exec) -> Exec {
    if peer_state(c) != SIDE_OPEN {
        // Not an RNR: the peer has not attached yet, or does not answer (`retries_run_out`).
        return e;
    }
    let retry = *c.rnr_retry.get_or_insert_with(|| {
        crate::objects::query_qp(ctx, "query_qp", handle).map_or(7, |q| q.attr.rnr_retry)
    });
    let deadline = *c.rnr_deadline.get_or_insert_with(|| {
        if retry >= 7 {
            return None;
        }
        let code = c
            .region
            .atomic_u32(CH_MIN_RNR[1 - c.side])
            .load(Ordering::Acquire);
        let each = std::time::Duration::from_micros(u64::from(RNR_TIMER_US[(code & 31) as usize]));
        if retry > 0 {
            notify(ctx, handle, NOTIFY_RNR, 0, false);
        }
        Some(std::time::Instant::now() + each * u32::from(retry))
    });
    match deadline {
        Some(d) if std::time::Instant::now() >= d => {
            c.rnr_deadline = None;
            Exec::Done(WcStatus::RnrRetryExcErr, 0)
        }
        _ => e,
    }
}
