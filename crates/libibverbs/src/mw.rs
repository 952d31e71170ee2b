//! Memory windows (`ibv_alloc_mw(3)`, `ibv_bind_mw(3)`, `ibv_dealloc_mw`, `IBV_WR_BIND_MW` and
//! `IBV_WR_LOCAL_INV` in `ibv_post_send(3)`, `ibv_wr_bind_mw`/`ibv_wr_local_inv`): the
//! `ibv_context_ops` slots verbs.h's inline functions call, over the client's
//! [`softverbs::Mw`]. The argument checks are the ones libibverbs and rxe's provider make
//! before posting (`EINVAL`, `EPERM`); every rule of the bind itself is the daemon's and is
//! answered in the bind's completion (docs/design/memory-windows.md).

use std::ffi::{c_int, c_uint};
use std::mem::{offset_of, size_of};
use std::sync::Mutex;

use softverbs::{Access, Mw, MwType, SendOp};
use softverbs_core::wr::BindMw;

use crate::ffi::*;
use crate::objects::*;
use crate::qp::{post_parts, Parts};
use crate::util::*;

/// `struct ibv_mw` (verbs.h 44).
#[repr(C)]
pub struct ibv_mw {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub rkey: u32,
    pub handle: u32,
    /// `enum ibv_mw_type`.
    pub mw_type: c_int,
}

/// `struct ibv_mw_bind_info`.
#[repr(C)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: c_uint,
}

/// `struct ibv_mw_bind` (what `ibv_bind_mw` takes).
#[repr(C)]
pub struct ibv_mw_bind {
    pub wr_id: u64,
    pub send_flags: c_uint,
    pub bind_info: ibv_mw_bind_info,
}

const _: () = {
    assert!(size_of::<ibv_mw>() == 32);
    assert!(offset_of!(ibv_mw, rkey) == 16);
    assert!(offset_of!(ibv_mw, mw_type) == 24);
    assert!(size_of::<ibv_mw_bind_info>() == 32);
    assert!(size_of::<ibv_mw_bind>() == 48);
    assert!(offset_of!(ibv_mw_bind, bind_info) == 16);
};

/// `IBV_ACCESS_ZERO_BASED`: zero-based windows are not offered (rxe refuses them too).
const ACCESS_ZERO_BASED: c_uint = 1 << 5;
/// `IBV_WR_LOCAL_INV` and `IBV_WR_BIND_MW` (`enum ibv_wr_opcode`).
pub const WR_LOCAL_INV: c_int = 7;
pub const WR_BIND_MW: c_int = 8;

#[repr(C)]
pub struct MwObj {
    pub base: ibv_mw,
    pub magic: u32,
    pub pd: &'static PdObj,
    /// Taken by dealloc; locked by binds (which move the window's R_Key on).
    pub mw: Mutex<Option<Mw<'static>>>,
}
impl Magic for MwObj {
    type Base = ibv_mw;
    fn magic(&self) -> u32 {
        // Live while it and its context are (objects.rs `magic!`).
        if self.pd.ctx.magic == LIVE {
            self.magic
        } else {
            DEAD
        }
    }
}

/// `ibv_context.ops.alloc_mw`: `EINVAL` for a type that is neither 1 nor 2 (uverbs'
/// `ib_uverbs_alloc_mw`), `ENOMEM` past `max_mw`.
pub unsafe extern "C" fn op_alloc_mw(pd: *mut ibv_pd, mw_type: c_int) -> *mut ibv_mw {
    // SAFETY: NULL or a PD of ours.
    let Some(o) = (unsafe { obj_ref::<PdObj>(pd) }) else {
        return null_with(EINVAL);
    };
    let Some(p) = o.pd() else {
        return null_with(EINVAL);
    };
    let t = match mw_type {
        1 => MwType::One,
        2 => MwType::Two,
        _ => return null_with(EINVAL),
    };
    let mw = match p.alloc_mw(t) {
        Ok(m) => m,
        Err(e) => return null_with(errno_of(&e)),
    };
    hold(&o.users);
    // SAFETY: PdObj shells are never freed; the window holds a use of the PD until dealloc.
    let pd_ref: &'static PdObj = unsafe { &*(o as *const PdObj) };
    into_c(MwObj {
        base: ibv_mw {
            context: o.base.context,
            pd,
            rkey: mw.rkey(),
            handle: mw.handle(),
            mw_type,
        },
        magic: LIVE,
        pd: pd_ref,
        mw: Mutex::new(Some(mw)),
    }) as *mut ibv_mw
}

/// `ibv_context.ops.dealloc_mw`: the window is invalidated at once.
pub unsafe extern "C" fn op_dealloc_mw(mw: *mut ibv_mw) -> c_int {
    // SAFETY: NULL or a window of ours.
    let Some(o) = (unsafe { obj::<MwObj>(mw) }) else {
        return EINVAL;
    };
    let Some(inner) = o.mw.get_mut().unwrap_or_else(|e| e.into_inner()).take() else {
        return EINVAL;
    };
    o.magic = DEAD;
    let r = inner.dealloc();
    release(&o.pd.users);
    match r {
        Ok(()) => 0,
        Err(e) => errno_of(&e),
    }
}

/// The L_Key of a bind's MR (NULL: an unbind, which names no MR).
fn mr_lkey(mr: *mut ibv_mr) -> Result<u32, c_int> {
    if mr.is_null() {
        return Ok(0);
    }
    // SAFETY: NULL or an MR of ours.
    let m = unsafe { obj_ref::<MrObj>(mr) }.ok_or(EINVAL)?;
    Ok(m.base.lkey)
}

/// The bind a work request or builder names: window `mw`, new R_Key `rkey`, `info`.
///
/// # Safety
/// `mw` is NULL or a window of ours; `info.mr` NULL or an MR of ours.
pub unsafe fn bind_of(
    mw: *mut ibv_mw,
    rkey: u32,
    info: &ibv_mw_bind_info,
) -> Result<BindMw, c_int> {
    // SAFETY: per the contract.
    let w = unsafe { obj_ref::<MwObj>(mw) }.ok_or(EINVAL)?;
    if info.mw_access_flags & ACCESS_ZERO_BASED != 0 {
        return Err(EINVAL);
    }
    Ok(BindMw {
        mw_rkey: w.base.rkey,
        new_rkey: rkey,
        mr_lkey: mr_lkey(info.mr)?,
        addr: info.addr,
        length: info.length,
        access: Access(info.mw_access_flags),
    })
}

/// The operation of an `ibv_send_wr` whose opcode is `IBV_WR_BIND_MW` (the `bind_mw` member
/// of its last union: `mw`, `rkey`, `bind_info`) or `IBV_WR_LOCAL_INV` (`invalidate_rkey`).
pub fn send_op(wr: &ibv_send_wr) -> Option<Result<SendOp, c_int>> {
    match wr.opcode {
        WR_LOCAL_INV => Some(Ok(SendOp::LocalInv(wr.imm_data))),
        WR_BIND_MW => {
            let t = &wr.tail;
            let info = ibv_mw_bind_info {
                mr: t[2] as usize as *mut ibv_mr,
                addr: t[3],
                length: t[4],
                mw_access_flags: t[5] as c_uint,
            };
            // SAFETY: a bind request names a window and an MR of the caller's
            // (ibv_post_send(3)); anything else fails the magic check.
            Some(
                unsafe { bind_of(t[0] as usize as *mut ibv_mw, t[1] as u32, &info) }
                    .map(SendOp::BindMw),
            )
        }
        _ => None,
    }
}

/// `ibv_context.ops.bind_mw` (`ibv_bind_mw(3)`): a type 1 bind posted on `qp`'s send queue
/// with the next consumer key; on success `mw->rkey` is the new R_Key (valid once the bind
/// completes; the caller undoes it after an error completion, as with rxe).
pub unsafe extern "C" fn op_bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    bind: *mut ibv_mw_bind,
) -> c_int {
    // SAFETY: NULL or objects of ours; `bind` the caller's.
    let (Some(q), Some(w)) = (unsafe { obj_ref::<QpObj>(qp) }, unsafe {
        obj_ref::<MwObj>(mw)
    }) else {
        return EINVAL;
    };
    if bind.is_null() {
        return EINVAL;
    }
    // SAFETY: non-NULL, the caller's ibv_mw_bind.
    let b = unsafe { &*bind };
    let info = &b.bind_info;
    if w.base.mw_type != 1 || (info.mr.is_null() && (info.addr != 0 || info.length != 0)) {
        return EINVAL;
    }
    if !info.mr.is_null() {
        // SAFETY: non-NULL; a foreign pointer fails the magic check.
        match unsafe { obj_ref::<MrObj>(info.mr) } {
            Some(m) if m.base.pd == w.base.pd => {}
            Some(_) => return libc::EPERM,
            None => return EINVAL,
        }
    }
    let mut g = w.mw.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none() {
        return EINVAL;
    }
    let new_rkey = softverbs::inc_rkey(w.base.rkey);
    // SAFETY: `mw` and `info.mr` checked above.
    let op = match unsafe { bind_of(mw, new_rkey, info) } {
        Ok(op) => op,
        Err(e) => return e,
    };
    let r = post_parts(
        q,
        &Parts {
            wr_id: b.wr_id,
            flags: b.send_flags,
            op: SendOp::BindMw(op),
            sges: &[],
            inline: None,
            ah: std::ptr::null_mut(),
            remote_qpn: 0,
            remote_qkey: 0,
            remote_srqn: 0,
        },
    );
    if let Err(e) = r {
        return e;
    }
    if let Some(m) = g.as_mut() {
        m.set_rkey(new_rkey);
    }
    // SAFETY: the window's own shell; the C caller reads `rkey` after this returns
    // (rdma-core's providers write it the same way).
    unsafe { std::ptr::addr_of_mut!((*mw).rkey).write(new_rkey) };
    0
}
