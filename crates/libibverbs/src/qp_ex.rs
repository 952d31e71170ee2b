//! The `ibv_wr_*` post API of `ibv_qp_ex` (`ibv_wr_post(3)`): `ibv_wr_start`, one builder
//! and setters per request, then `ibv_wr_complete` posts them all (or `ibv_wr_abort` drops
//! them).

use std::ffi::{c_int, c_void};

use softverbs::{SendOp, Sge};

use crate::ffi::*;
use crate::objects::*;
use crate::qp::{post_parts, Parts, MAX_INLINE, MAX_SGE, SEND_INLINE};
use crate::util::*;

/// One request built between `ibv_wr_start` and `ibv_wr_complete`.
pub struct Staged {
    wr_id: u64,
    flags: u32,
    op: SendOp,
    sges: Vec<Sge>,
    inline: Option<Vec<u8>>,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
    remote_srqn: u32,
}

/// Fills the builder slots of a QP created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`.
pub fn fill_slots(q: &mut ibv_qp_ex) {
    q.wr_atomic_cmp_swp = atomic_cmp_swp as *const c_void;
    q.wr_atomic_fetch_add = atomic_fetch_add as *const c_void;
    q.wr_bind_mw = bind_mw as *const c_void;
    q.wr_local_inv = local_inv as *const c_void;
    q.wr_rdma_read = rdma_read as *const c_void;
    q.wr_rdma_write = rdma_write as *const c_void;
    q.wr_rdma_write_imm = rdma_write_imm as *const c_void;
    q.wr_send = send as *const c_void;
    q.wr_send_imm = send_imm as *const c_void;
    q.wr_send_inv = send_inv as *const c_void;
    q.wr_send_tso = unsupported as *const c_void;
    q.wr_set_ud_addr = set_ud_addr as *const c_void;
    q.wr_set_xrc_srqn = set_xrc_srqn as *const c_void;
    q.wr_set_inline_data = set_inline_data as *const c_void;
    q.wr_set_inline_data_list = set_inline_data_list as *const c_void;
    q.wr_set_sge = set_sge as *const c_void;
    q.wr_set_sge_list = set_sge_list as *const c_void;
    q.wr_start = start as *const c_void;
    q.wr_complete = complete as *const c_void;
    q.wr_abort = abort as *const c_void;
    q.wr_atomic_write = unsupported as *const c_void;
}

fn with<R>(q: *mut ibv_qp_ex, f: impl FnOnce(&QpObj, &mut WrBuild) -> R) -> Option<R> {
    // SAFETY: these slots are only reachable through QPs of ours.
    let o: &QpObj = unsafe { obj_ref::<QpObj>(q as *mut ibv_qp) }?;
    let mut g = o.wr.lock().unwrap_or_else(|e| e.into_inner());
    Some(f(o, &mut g))
}

fn push(q: *mut ibv_qp_ex, op: SendOp) {
    with(q, |o, b| {
        b.pending.push(Staged {
            wr_id: o.base.wr_id,
            flags: o.base.wr_flags,
            op,
            sges: Vec::new(),
            inline: None,
            ah: std::ptr::null_mut(),
            remote_qpn: 0,
            remote_qkey: 0,
            remote_srqn: 0,
        })
    });
}

fn last(q: *mut ibv_qp_ex, f: impl FnOnce(&mut Staged)) {
    with(q, |_, b| match b.pending.last_mut() {
        Some(s) => f(s),
        // A setter with no builder before it.
        None => b.error = Some(EINVAL),
    });
}

unsafe extern "C" fn start(q: *mut ibv_qp_ex) {
    with(q, |_, b| {
        b.pending.clear();
        b.error = None;
    });
}

unsafe extern "C" fn complete(q: *mut ibv_qp_ex) -> c_int {
    with(q, |o, b| {
        let pending = std::mem::take(&mut b.pending);
        if let Some(e) = b.error.take() {
            return e;
        }
        for s in &pending {
            let r = post_parts(
                o,
                &Parts {
                    wr_id: s.wr_id,
                    flags: s.flags,
                    op: s.op,
                    sges: &s.sges,
                    inline: s.inline.as_deref(),
                    ah: s.ah,
                    remote_qpn: s.remote_qpn,
                    remote_qkey: s.remote_qkey,
                    remote_srqn: s.remote_srqn,
                },
            );
            if let Err(e) = r {
                return e;
            }
        }
        0
    })
    .unwrap_or(EINVAL)
}

unsafe extern "C" fn abort(q: *mut ibv_qp_ex) {
    with(q, |_, b| {
        b.pending.clear();
        b.error = None;
    });
}

unsafe extern "C" fn unsupported(q: *mut ibv_qp_ex) {
    with(q, |_, b| b.error = Some(EOPNOTSUPP));
}

unsafe extern "C" fn send(q: *mut ibv_qp_ex) {
    push(q, SendOp::Send);
}
/// `ibv_wr_send_imm`: `imm` is a `__be32` (as `ibv_send_wr.imm_data`, see `qp::send_op`).
unsafe extern "C" fn send_imm(q: *mut ibv_qp_ex, imm: u32) {
    push(q, SendOp::SendWithImm(u32::from_be(imm)));
}
unsafe extern "C" fn send_inv(q: *mut ibv_qp_ex, rkey: u32) {
    push(q, SendOp::SendWithInv(rkey));
}
/// `ibv_wr_bind_mw`: binds `mw` (type 2, or type 1 as rxe allows) to `info` with R_Key
/// `rkey` (`ibv_inc_rkey(mw->rkey)` by convention).
unsafe extern "C" fn bind_mw(
    q: *mut ibv_qp_ex,
    mw: *mut crate::mw::ibv_mw,
    rkey: u32,
    info: *const crate::mw::ibv_mw_bind_info,
) {
    if info.is_null() {
        with(q, |_, b| b.error = Some(EINVAL));
        return;
    }
    // SAFETY: `info` is the caller's; `mw` and its MR are checked by their magic.
    match unsafe { crate::mw::bind_of(mw, rkey, &*info) } {
        Ok(op) => push(q, SendOp::BindMw(op)),
        Err(e) => {
            with(q, |_, b| b.error = Some(e));
        }
    }
}
/// `ibv_wr_local_inv`.
unsafe extern "C" fn local_inv(q: *mut ibv_qp_ex, rkey: u32) {
    push(q, SendOp::LocalInv(rkey));
}
unsafe extern "C" fn rdma_write(q: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    push(q, SendOp::Write { remote_addr, rkey });
}
unsafe extern "C" fn rdma_write_imm(q: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm: u32) {
    push(
        q,
        SendOp::WriteWithImm {
            remote_addr,
            rkey,
            imm: u32::from_be(imm),
        },
    );
}
unsafe extern "C" fn rdma_read(q: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    push(q, SendOp::Read { remote_addr, rkey });
}
unsafe extern "C" fn atomic_cmp_swp(
    q: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    push(
        q,
        SendOp::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        },
    );
}
unsafe extern "C" fn atomic_fetch_add(q: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, add: u64) {
    push(
        q,
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        },
    );
}

unsafe extern "C" fn set_ud_addr(q: *mut ibv_qp_ex, ah: *mut ibv_ah, qpn: u32, qkey: u32) {
    last(q, |s| {
        s.ah = ah;
        s.remote_qpn = qpn;
        s.remote_qkey = qkey;
    });
}

unsafe extern "C" fn set_xrc_srqn(q: *mut ibv_qp_ex, srqn: u32) {
    last(q, |s| s.remote_srqn = srqn);
}

unsafe extern "C" fn set_sge(q: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    last(q, |s| s.sges = vec![Sge { addr, length, lkey }]);
}

unsafe extern "C" fn set_sge_list(q: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    let mut out = [Sge::default(); MAX_SGE];
    // SAFETY: the caller's list holds `n` entries.
    let r = unsafe { crate::qp::sges(list, n.min(c_int::MAX as usize) as c_int, &mut out) };
    match r {
        Ok(k) => last(q, |s| s.sges = out[..k].to_vec()),
        Err(e) => {
            with(q, |_, b| b.error = Some(e));
        }
    }
}

fn set_inline(q: *mut ibv_qp_ex, bufs: &[(u64, usize)]) {
    let total: usize = bufs.iter().map(|b| b.1).sum();
    if total > MAX_INLINE {
        with(q, |_, b| b.error = Some(EINVAL));
        return;
    }
    let mut data = Vec::with_capacity(total);
    for &(addr, len) in bufs {
        if len > 0 {
            // SAFETY: ibv_wr_set_inline_data(3): the data is read now and the buffer may be
            // reused once the call returns.
            data.extend_from_slice(unsafe {
                std::slice::from_raw_parts(addr as usize as *const u8, len)
            });
        }
    }
    last(q, |s| {
        s.inline = Some(data);
        s.flags |= SEND_INLINE;
    });
}

unsafe extern "C" fn set_inline_data(q: *mut ibv_qp_ex, addr: *mut c_void, len: usize) {
    set_inline(q, &[(addr as u64, len)]);
}

unsafe extern "C" fn set_inline_data_list(q: *mut ibv_qp_ex, n: usize, list: *const ibv_data_buf) {
    if n > 0 && list.is_null() {
        with(q, |_, b| b.error = Some(EINVAL));
        return;
    }
    let bufs: Vec<(u64, usize)> = (0..n)
        // SAFETY: the caller's list holds `n` entries.
        .map(|i| unsafe { &*list.add(i) })
        .map(|b| (b.addr as u64, b.length))
        .collect();
    set_inline(q, &bufs);
}
