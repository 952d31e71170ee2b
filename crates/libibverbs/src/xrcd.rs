//! XRC domains and shared receive QPs, upstream face: `ibv_open_xrcd(3)`,
//! `ibv_close_xrcd(3)`, `ibv_create_qp_ex(3)` with `IBV_QPT_XRC_RECV` (in `qp.rs`) and
//! `ibv_open_qp(3)`.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::os::fd::BorrowedFd;
use std::sync::atomic::AtomicU32;
use std::sync::Mutex;

use crate::ffi::*;
use crate::objects::*;
use crate::qp::{CreateArgs, QPT_XRC_RECV};
use crate::util::*;

// enum ibv_xrcd_init_attr_mask
const XRCD_INIT_ATTR_FD: u32 = 1 << 0;
const XRCD_INIT_ATTR_OFLAGS: u32 = 1 << 1;
const XRCD_INIT_ATTR_KNOWN: u32 = (1 << 3) - 1;
// enum ibv_qp_open_attr_mask
const QP_OPEN_ATTR_NUM: u32 = 1 << 0;
const QP_OPEN_ATTR_XRCD: u32 = 1 << 1;
const QP_OPEN_ATTR_CONTEXT: u32 = 1 << 2;
const QP_OPEN_ATTR_TYPE: u32 = 1 << 3;
const QP_OPEN_ATTR_KNOWN: u32 = (1 << 5) - 1;

/// Opens the domain of file descriptor `fd` (-1: a private domain) with `oflags`
/// (`O_CREAT`, `O_EXCL`): what both the upstream and the legacy face call.
pub fn open(c: *mut ibv_context, fd: c_int, oflags: c_int) -> *mut XrcdObj {
    let Some(o) = ctx_obj(c) else {
        return null_with(EINVAL);
    };
    let file = if fd >= 0 {
        // SAFETY: the caller's fd is open for the duration of this call (ibv_open_xrcd(3));
        // we keep our own duplicate only while passing it to the daemon.
        match unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned() {
            Ok(f) => Some(std::fs::File::from(f)),
            Err(e) => return null_with(e.raw_os_error().unwrap_or(EINVAL)),
        }
    } else {
        None
    };
    let x = match o.inner.open_xrcd(file.as_ref(), oflags as u32) {
        Ok(x) => x,
        Err(e) => return null_with(errno_of(&e)),
    };
    hold(&o.users);
    into_c(XrcdObj {
        base: ibv_xrcd { context: c },
        magic: LIVE,
        ctx: o,
        xrcd: Some(x),
        users: AtomicU32::new(0),
        regs: Mutex::new(HashMap::new()),
    })
}

/// `verbs_context.open_xrcd`.
pub unsafe extern "C" fn slot_open_xrcd(
    c: *mut ibv_context,
    attr: *mut ibv_xrcd_init_attr,
) -> *mut ibv_xrcd {
    if attr.is_null() {
        return null_with(EINVAL);
    }
    // SAFETY: the caller's attr is readable.
    let a = unsafe { &*attr };
    if a.comp_mask & !XRCD_INIT_ATTR_KNOWN != 0 {
        return null_with(EINVAL);
    }
    // ibv_open_xrcd(3): both FD and OFLAGS are required.
    if a.comp_mask & (XRCD_INIT_ATTR_FD | XRCD_INIT_ATTR_OFLAGS)
        != XRCD_INIT_ATTR_FD | XRCD_INIT_ATTR_OFLAGS
    {
        return null_with(EINVAL);
    }
    open(c, a.fd, a.oflags) as *mut ibv_xrcd
}

/// Closes a domain handle: `EBUSY` while SRQs, QPs or registrations of this process use it.
pub fn close(x: *mut ibv_xrcd) -> c_int {
    // SAFETY: NULL or an XRCD of ours.
    let Some(o) = (unsafe { obj::<XrcdObj>(x) }) else {
        return EINVAL;
    };
    let regs_held = !o.regs.lock().unwrap_or_else(|e| e.into_inner()).is_empty();
    if busy(&o.users) || regs_held {
        return EBUSY;
    }
    let Some(inner) = o.xrcd.take() else {
        return EINVAL;
    };
    o.magic = DEAD;
    release(&o.ctx.users);
    match inner.close() {
        Ok(()) => 0,
        Err(e) => errno_of(&e),
    }
}

/// `verbs_context.close_xrcd` (called by the inline `ibv_close_xrcd` without checks).
pub unsafe extern "C" fn slot_close_xrcd(x: *mut ibv_xrcd) -> c_int {
    close(x)
}

/// `verbs_context.open_qp`: another handle on a receive QP of the domain.
pub unsafe extern "C" fn slot_open_qp(
    c: *mut ibv_context,
    attr: *mut ibv_qp_open_attr,
) -> *mut ibv_qp {
    let Some(ctx) = ctx_obj(c) else {
        return null_with(EINVAL);
    };
    if attr.is_null() {
        return null_with(EINVAL);
    }
    // SAFETY: the caller's attr is readable.
    let a = unsafe { &*attr };
    let need = QP_OPEN_ATTR_NUM | QP_OPEN_ATTR_XRCD | QP_OPEN_ATTR_TYPE;
    if a.comp_mask & !QP_OPEN_ATTR_KNOWN != 0 || a.comp_mask & need != need {
        return null_with(EINVAL);
    }
    if a.qp_type != QPT_XRC_RECV {
        return null_with(EINVAL);
    }
    // SAFETY: NULL or an XRCD of ours.
    let Some(x) = (unsafe { obj::<XrcdObj>(a.xrcd) }) else {
        return null_with(EINVAL);
    };
    let Some(xrcd) = x.xrcd() else {
        return null_with(EINVAL);
    };
    let q = match xrcd.open_recv_qp(a.qp_num) {
        Ok(q) => q,
        Err(e) => return null_with(errno_of(&e)),
    };
    hold(&x.users);
    let qp_context = if a.comp_mask & QP_OPEN_ATTR_CONTEXT != 0 {
        a.qp_context
    } else {
        std::ptr::null_mut::<c_void>()
    };
    let mut cap = ibv_qp_cap::default();
    let args = CreateArgs {
        qp_context,
        send_cq: std::ptr::null_mut(),
        recv_cq: std::ptr::null_mut(),
        srq: std::ptr::null_mut(),
        cap: &mut cap,
        qp_type: QPT_XRC_RECV,
        sq_sig_all: false,
        pd: std::ptr::null_mut(),
        xrcd: a.xrcd,
        create_flags: 0,
        send_ops_flags: 0,
    };
    crate::qp::adopt_recv_qp(ctx, c, &args, q) as *mut ibv_qp
}
