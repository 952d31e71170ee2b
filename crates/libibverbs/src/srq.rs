//! Shared receive queues: `ibv_create_srq(3)`, `ibv_create_srq_ex(3)` (basic and XRC),
//! `ibv_modify_srq(3)`, `ibv_query_srq(3)`, `ibv_get_srq_num(3)`, `ibv_post_srq_recv(3)`.

use std::ffi::{c_int, c_void};
use std::sync::atomic::AtomicU32;

use softverbs::SrqAttr;

use crate::ffi::*;
use crate::objects::*;
use crate::qp::{post_list, with_recv_sges};
use crate::util::*;

// enum ibv_srq_init_attr_mask
const SRQ_INIT_ATTR_TYPE: u32 = 1 << 0;
const SRQ_INIT_ATTR_PD: u32 = 1 << 1;
const SRQ_INIT_ATTR_XRCD: u32 = 1 << 2;
const SRQ_INIT_ATTR_CQ: u32 = 1 << 3;
const SRQ_INIT_ATTR_KNOWN: u32 = (1 << 5) - 1;
// enum ibv_srq_type
const SRQT_BASIC: c_int = 0;
const SRQT_XRC: c_int = 1;

fn finish(
    pd: &'static PdObj,
    cq: Option<&mut CqObj>,
    xrcd: Option<&mut XrcdObj>,
    srq: softverbs::Srq<'static>,
    srq_context: *mut c_void,
    attr: &mut ibv_srq_attr,
) -> *mut ibv_srq {
    let srq_num = if xrcd.is_some() {
        match srq.srq_num() {
            Ok(n) => n,
            Err(e) => return null_with(errno_of(&e)),
        }
    } else {
        0
    };
    if let Ok(a) = srq.query() {
        attr.max_wr = a.max_wr;
        attr.max_sge = a.max_sge;
    }
    let handle = srq.handle();
    // SAFETY: ibv_srq is plain C data; zero is valid and the live fields are set below.
    let mut base: ibv_srq = unsafe { std::mem::zeroed() };
    base.context = pd.base.context;
    base.srq_context = srq_context;
    base.pd = &pd.base as *const ibv_pd as *mut ibv_pd;
    base.handle = handle;
    hold(&pd.users);
    let cq = cq.map_or(std::ptr::null_mut(), |c| {
        hold(&c.users);
        c as *mut CqObj
    });
    let xrcd = xrcd.map_or(std::ptr::null_mut(), |x| {
        hold(&x.users);
        x as *mut XrcdObj
    });
    let p = into_c(SrqObj {
        base,
        magic: LIVE,
        ctx: pd.ctx,
        srq: Some(srq),
        pd,
        cq,
        xrcd,
        users: AtomicU32::new(0),
        srq_num,
    });
    // SAFETY: `p` is fresh; its sync objects are initialised once, here.
    unsafe { init_sync(&mut (*p).base.mutex, &mut (*p).base.cond) };
    pd.ctx.remember(|e| &mut e.srqs, handle, p as usize);
    hold(&pd.ctx.users);
    p as *mut ibv_srq
}

fn pd_static(p: &mut PdObj) -> &'static PdObj {
    // SAFETY: PdObj shells are never freed.
    unsafe { &*(p as *const PdObj) }
}

unsafe extern "C" fn create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    // SAFETY: NULL or a PD of ours.
    let Some(o) = (unsafe { obj::<PdObj>(pd) }) else {
        return null_with(EINVAL);
    };
    let Some(p) = o.pd() else {
        return null_with(EINVAL);
    };
    if attr.is_null() {
        return null_with(EINVAL);
    }
    // SAFETY: the caller's attr is readable and writable (granted sizes are written back).
    let a = unsafe { &mut *attr };
    let srq = match p.create_srq(SrqAttr {
        max_wr: a.attr.max_wr,
        max_sge: a.attr.max_sge,
        srq_limit: a.attr.srq_limit,
    }) {
        Ok(s) => s,
        Err(e) => return null_with(errno_of(&e)),
    };
    finish(pd_static(o), None, None, srq, a.srq_context, &mut a.attr)
}
export!(default "ibv_create_srq", "IBVERBS_1.1", create_srq);

/// `verbs_context.create_srq_ex`: basic SRQs and XRC SRQs (TYPE|PD|XRCD|CQ).
pub unsafe extern "C" fn slot_create_srq_ex(
    _c: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    if attr.is_null() {
        return null_with(EINVAL);
    }
    // SAFETY: the caller's attr is readable and writable.
    let a = unsafe { &mut *attr };
    if a.comp_mask & !SRQ_INIT_ATTR_KNOWN != 0 {
        return null_with(EINVAL);
    }
    let ty = if a.comp_mask & SRQ_INIT_ATTR_TYPE != 0 {
        a.srq_type
    } else {
        SRQT_BASIC
    };
    if a.comp_mask & SRQ_INIT_ATTR_PD == 0 {
        return null_with(EINVAL);
    }
    // SAFETY: NULL or a PD of ours.
    let Some(o) = (unsafe { obj::<PdObj>(a.pd) }) else {
        return null_with(EINVAL);
    };
    let Some(p) = o.pd() else {
        return null_with(EINVAL);
    };
    let sa = SrqAttr {
        max_wr: a.attr.max_wr,
        max_sge: a.attr.max_sge,
        srq_limit: a.attr.srq_limit,
    };
    match ty {
        SRQT_BASIC => match p.create_srq(sa) {
            Ok(s) => finish(pd_static(o), None, None, s, a.srq_context, &mut a.attr),
            Err(e) => null_with(errno_of(&e)),
        },
        SRQT_XRC => {
            if a.comp_mask & (SRQ_INIT_ATTR_XRCD | SRQ_INIT_ATTR_CQ)
                != SRQ_INIT_ATTR_XRCD | SRQ_INIT_ATTR_CQ
            {
                return null_with(EINVAL);
            }
            // SAFETY: NULL or objects of ours.
            let (x, cq) = unsafe { (obj::<XrcdObj>(a.xrcd), obj::<CqObj>(a.cq)) };
            let (Some(x), Some(cq)) = (x, cq) else {
                return null_with(EINVAL);
            };
            let (Some(xrcd), Some(cqi)) = (x.xrcd(), cq.cq()) else {
                return null_with(EINVAL);
            };
            match xrcd.create_xrc_srq(p, cqi, sa) {
                Ok(s) => finish(
                    pd_static(o),
                    Some(cq),
                    Some(x),
                    s,
                    a.srq_context,
                    &mut a.attr,
                ),
                Err(e) => null_with(errno_of(&e)),
            }
        }
        // Tag-matching SRQs (IBV_SRQT_TM) are a feature softverbs does not have.
        _ => null_with(EOPNOTSUPP),
    }
}

/// Creates an XRC SRQ for the legacy API (`ibv_create_xrc_srq`).
pub fn create_xrc_srq(
    pd: *mut ibv_pd,
    xrcd: *mut ibv_xrcd,
    cq: *mut ibv_cq,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    if attr.is_null() {
        return null_with(EINVAL);
    }
    // SAFETY: the caller's attr is readable and writable.
    let a = unsafe { &mut *attr };
    let mut ex = ibv_srq_init_attr_ex {
        srq_context: a.srq_context,
        attr: a.attr,
        comp_mask: SRQ_INIT_ATTR_TYPE | SRQ_INIT_ATTR_PD | SRQ_INIT_ATTR_XRCD | SRQ_INIT_ATTR_CQ,
        srq_type: SRQT_XRC,
        pd,
        xrcd,
        cq,
        tm_cap: [0; 2],
    };
    // SAFETY: forwarding a valid attr.
    let s = unsafe { slot_create_srq_ex(std::ptr::null_mut(), &mut ex) };
    a.attr = ex.attr;
    s
}

unsafe extern "C" fn destroy_srq(srq: *mut ibv_srq) -> c_int {
    // SAFETY: NULL or an SRQ of ours.
    let Some(o) = (unsafe { obj::<SrqObj>(srq) }) else {
        return EINVAL;
    };
    if busy(&o.users) {
        return EBUSY;
    }
    let Some(inner) = o.srq.take() else {
        return EINVAL;
    };
    let handle = inner.handle();
    let reported = match inner.destroy() {
        Ok(n) => n,
        Err(e) => return errno_of(&e),
    };
    o.ctx.forget(|e| &mut e.srqs, handle);
    let b = &mut o.base;
    // SAFETY: the SRQ's own sync objects; destroy waits for the acks of its events.
    unsafe { wait_for(&mut b.mutex, &mut b.cond, &b.events_completed, reported) };
    o.magic = DEAD;
    release(&o.pd.users);
    // SAFETY: parents outlive their SRQs (users counts).
    unsafe {
        if let Some(c) = o.cq.as_ref() {
            release(&c.users);
        }
        if let Some(x) = o.xrcd.as_ref() {
            release(&x.users);
        }
    }
    release(&o.ctx.users);
    0
}
export!(default "ibv_destroy_srq", "IBVERBS_1.1", destroy_srq);

unsafe extern "C" fn modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    // SAFETY: NULL or an SRQ of ours.
    let Some(o) = (unsafe { obj::<SrqObj>(srq) }) else {
        return EINVAL;
    };
    let Some(s) = o.srq() else {
        return EINVAL;
    };
    if attr.is_null() {
        return EINVAL;
    }
    // SAFETY: the caller's attr is readable.
    let a = unsafe { *attr };
    match s.modify(
        &SrqAttr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        },
        mask as u32,
    ) {
        Ok(_) => 0,
        Err(e) => errno_of(&e),
    }
}
export!(default "ibv_modify_srq", "IBVERBS_1.1", modify_srq);

unsafe extern "C" fn query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    // SAFETY: NULL or an SRQ of ours.
    let Some(o) = (unsafe { obj::<SrqObj>(srq) }) else {
        return EINVAL;
    };
    let Some(s) = o.srq() else {
        return EINVAL;
    };
    if attr.is_null() {
        return EINVAL;
    }
    match s.query() {
        Ok(a) => {
            // SAFETY: the caller's attr is writable.
            unsafe {
                attr.write(ibv_srq_attr {
                    max_wr: a.max_wr,
                    max_sge: a.max_sge,
                    srq_limit: a.srq_limit,
                })
            };
            0
        }
        Err(e) => errno_of(&e),
    }
}
export!(default "ibv_query_srq", "IBVERBS_1.1", query_srq);

/// `verbs_context.get_srq_num`: the SRQ number senders name in XRCETH (XRC SRQs only).
pub unsafe extern "C" fn slot_get_srq_num(srq: *mut ibv_srq, num: *mut u32) -> c_int {
    // SAFETY: NULL or an SRQ of ours.
    let Some(o) = (unsafe { obj::<SrqObj>(srq) }) else {
        return EINVAL;
    };
    if num.is_null() {
        return EINVAL;
    }
    if o.xrcd.is_null() {
        return EOPNOTSUPP;
    }
    // SAFETY: the caller's out pointer is writable.
    unsafe { *num = o.srq_num };
    0
}

/// `ibv_context.ops.post_srq_recv`.
pub unsafe extern "C" fn op_post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: NULL or an SRQ of ours.
    let Some(o) = (unsafe { obj_ref::<SrqObj>(srq) }) else {
        return EINVAL;
    };
    let Some(s) = o.srq() else {
        return EINVAL;
    };
    // SAFETY: the caller's list and out pointer, per ibv_post_srq_recv(3).
    unsafe { post_list(wr, bad, |w| with_recv_sges(w, |l| s.post_recv(w.wr_id, l))) }
}
