//! The legacy OFED XRC API (OFED 1.3–1.5 `ibv_*_xrc_*`) and the minimal register/unregister
//! pair proposed in the 2010 thread, as C functions (`include/softverbs/xrc_legacy.h`).
//!
//! All three faces share one mechanism in the daemon: a legacy `ibv_xrc_domain` is the same
//! object as an upstream `ibv_xrcd`, registrations are this process's holds on a shared
//! receive QP, and the last holder's unregister destroys it (docs/design/xrc-design.md). Errors are
//! positive errno values, as the legacy header documents.

use std::ffi::c_int;

use softverbs::AttrMask;

use crate::ffi::*;
use crate::objects::*;
use crate::qp::{attr_from_c, attr_to_c, QPT_XRC_RECV};
use crate::util::*;

/// `ibv_open_xrc_domain(context, fd, oflag)`: the legacy name of `ibv_open_xrcd`.
unsafe extern "C" fn open_xrc_domain(
    c: *mut ibv_context,
    fd: c_int,
    oflag: c_int,
) -> *mut ibv_xrcd {
    crate::xrcd::open(c, fd, oflag) as *mut ibv_xrcd
}
export!(default "ibv_open_xrc_domain", "SOFTVERBS_XRC_1.0", open_xrc_domain);

unsafe extern "C" fn close_xrc_domain(d: *mut ibv_xrcd) -> c_int {
    crate::xrcd::close(d)
}
export!(default "ibv_close_xrc_domain", "SOFTVERBS_XRC_1.0", close_xrc_domain);

unsafe extern "C" fn create_xrc_srq(
    pd: *mut ibv_pd,
    d: *mut ibv_xrcd,
    cq: *mut ibv_cq,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    crate::srq::create_xrc_srq(pd, d, cq, attr)
}
export!(default "ibv_create_xrc_srq", "SOFTVERBS_XRC_1.0", create_xrc_srq);

fn domain<'a>(d: *mut ibv_xrcd) -> Option<&'a mut XrcdObj> {
    // SAFETY: NULL or an XRCD of ours.
    unsafe { obj::<XrcdObj>(d) }
}

fn keep(x: &mut XrcdObj, reg: softverbs::XrcRegistration<'static>) -> u32 {
    let qpn = reg.qpn();
    x.regs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(qpn)
        .or_default()
        .push(reg);
    qpn
}

/// `ibv_create_xrc_rcv_qp(domain, init_attr, &qpn)`: creates a receive QP in the domain and
/// registers this process with it ("to avoid race conditions", the legacy header says).
/// `init_attr` may be NULL; its fields are ignored except that it is checked like the
/// legacy call did. (OFED passed the domain inside `init_attr`; rdma-core's struct has no
/// such field, so it is the first argument here.)
unsafe extern "C" fn create_xrc_rcv_qp(
    d: *mut ibv_xrcd,
    _init_attr: *mut ibv_qp_init_attr,
    qpn: *mut u32,
) -> c_int {
    let Some(x) = domain(d) else {
        return EINVAL;
    };
    let Some(xrcd) = x.xrcd() else {
        return EINVAL;
    };
    if qpn.is_null() {
        return EINVAL;
    }
    match xrcd.create_xrc_rcv_qp() {
        Ok(r) => {
            let n = keep(x, r);
            // SAFETY: the caller's out pointer is writable.
            unsafe { *qpn = n };
            0
        }
        Err(e) => errno_of(&e),
    }
}
export!(default "ibv_create_xrc_rcv_qp", "SOFTVERBS_XRC_1.0", create_xrc_rcv_qp);

unsafe extern "C" fn reg_xrc_rcv_qp(d: *mut ibv_xrcd, qpn: u32) -> c_int {
    let Some(x) = domain(d) else {
        return EINVAL;
    };
    let Some(xrcd) = x.xrcd() else {
        return EINVAL;
    };
    match xrcd.reg_xrc_rcv_qp(qpn) {
        Ok(r) => {
            keep(x, r);
            0
        }
        Err(e) => errno_of(&e),
    }
}
export!(default "ibv_reg_xrc_rcv_qp", "SOFTVERBS_XRC_1.0", reg_xrc_rcv_qp);

/// Drops one of this process's registrations on `qpn`; the last holder's drop destroys the
/// QP ("the unregister simply succeeds").
fn unreg(d: *mut ibv_xrcd, qpn: u32) -> c_int {
    let Some(x) = domain(d) else {
        return EINVAL;
    };
    let reg = {
        let mut regs = x.regs.lock().unwrap_or_else(|e| e.into_inner());
        let Some(v) = regs.get_mut(&qpn) else {
            return EINVAL;
        };
        let r = v.pop();
        if v.is_empty() {
            regs.remove(&qpn);
        }
        r
    };
    match reg.map(|r| r.unregister()) {
        Some(Ok(_)) => 0,
        Some(Err(e)) => errno_of(&e),
        None => EINVAL,
    }
}

unsafe extern "C" fn unreg_xrc_rcv_qp(d: *mut ibv_xrcd, qpn: u32) -> c_int {
    unreg(d, qpn)
}
export!(default "ibv_unreg_xrc_rcv_qp", "SOFTVERBS_XRC_1.0", unreg_xrc_rcv_qp);

unsafe extern "C" fn modify_xrc_rcv_qp(
    d: *mut ibv_xrcd,
    qpn: u32,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    let Some(xrcd) = domain(d).and_then(|x| x.xrcd()) else {
        return EINVAL;
    };
    if attr.is_null() {
        return EINVAL;
    }
    // SAFETY: the caller's attr is readable.
    let a = match attr_from_c(unsafe { &*attr }, mask) {
        Ok(a) => a,
        Err(e) => return e,
    };
    match xrcd.modify_xrc_rcv_qp(qpn, &a, AttrMask(mask as u32)) {
        Ok(()) => 0,
        Err(e) => errno_of(&e),
    }
}
export!(default "ibv_modify_xrc_rcv_qp", "SOFTVERBS_XRC_1.0", modify_xrc_rcv_qp);

unsafe extern "C" fn query_xrc_rcv_qp(
    d: *mut ibv_xrcd,
    qpn: u32,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    let Some(xrcd) = domain(d).and_then(|x| x.xrcd()) else {
        return EINVAL;
    };
    if attr.is_null() {
        return EINVAL;
    }
    match xrcd.query_xrc_rcv_qp(qpn) {
        Ok(q) => {
            let ca = attr_to_c(&q.attr);
            // SAFETY: the caller's structs are writable (init_attr may be NULL).
            unsafe {
                attr.write(ca);
                if !init.is_null() {
                    init.write(ibv_qp_init_attr {
                        qp_context: std::ptr::null_mut(),
                        send_cq: std::ptr::null_mut(),
                        recv_cq: std::ptr::null_mut(),
                        srq: std::ptr::null_mut(),
                        cap: ca.cap,
                        qp_type: QPT_XRC_RECV,
                        sq_sig_all: 0,
                    });
                }
            }
            0
        }
        Err(e) => errno_of(&e),
    }
}
export!(default "ibv_query_xrc_rcv_qp", "SOFTVERBS_XRC_1.0", query_xrc_rcv_qp);

/// The minimal face: `*qpn == 0xffffffff` creates a receive QP and registers this process
/// (the new number is written back); any other value registers with that QP.
unsafe extern "C" fn xrc_rcv_qp_register(d: *mut ibv_xrcd, qpn: *mut u32) -> c_int {
    let Some(x) = domain(d) else {
        return EINVAL;
    };
    let Some(xrcd) = x.xrcd() else {
        return EINVAL;
    };
    if qpn.is_null() {
        return EINVAL;
    }
    // SAFETY: the caller's in/out pointer is readable and writable.
    let want = unsafe { *qpn };
    let asked = (want != u32::MAX).then_some(want);
    match xrcd.register_xrc_rcv_qp(asked) {
        Ok(r) => {
            let n = keep(x, r);
            // SAFETY: as above.
            unsafe { *qpn = n };
            0
        }
        Err(e) => errno_of(&e),
    }
}
export!(default "ibv_xrc_rcv_qp_register", "SOFTVERBS_XRC_1.0", xrc_rcv_qp_register);

unsafe extern "C" fn xrc_rcv_qp_unregister(d: *mut ibv_xrcd, qpn: u32) -> c_int {
    unreg(d, qpn)
}
export!(default "ibv_xrc_rcv_qp_unregister", "SOFTVERBS_XRC_1.0", xrc_rcv_qp_unregister);
