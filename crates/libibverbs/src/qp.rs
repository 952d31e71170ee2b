//! QPs: `ibv_create_qp(3)`, `ibv_create_qp_ex(3)`, `ibv_modify_qp(3)`, `ibv_query_qp(3)`,
//! `ibv_destroy_qp(3)` and the data path `ibv_post_send(3)` / `ibv_post_recv(3)`.

use std::ffi::{c_int, c_void};
use std::sync::Mutex;

use softverbs::{
    Access, AttrMask, Mtu, QpAttr, QpCap, QpInit, QpState, QpType, SendOp, SendRequest, Sge,
    UdAddress,
};

use crate::ffi::*;
use crate::objects::*;
use crate::pd::{ah_attr_from_c, ah_attr_to_c};
use crate::util::*;

// enum ibv_qp_type
pub const QPT_RC: c_int = 2;
pub const QPT_UC: c_int = 3;
pub const QPT_UD: c_int = 4;
pub const QPT_RAW_PACKET: c_int = 8;
pub const QPT_XRC_SEND: c_int = 9;
pub const QPT_XRC_RECV: c_int = 10;

// enum ibv_qp_init_attr_mask
const INIT_ATTR_PD: u32 = 1 << 0;
const INIT_ATTR_XRCD: u32 = 1 << 1;
const INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
const INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;
const INIT_ATTR_KNOWN: u32 = (1 << 7) - 1;
const INIT_ATTR_SUPPORTED: u32 =
    INIT_ATTR_PD | INIT_ATTR_XRCD | INIT_ATTR_CREATE_FLAGS | INIT_ATTR_SEND_OPS_FLAGS;

/// `IBV_QP_STATE` in `enum ibv_qp_attr_mask`.
const ATTR_STATE: c_int = 1;

// enum ibv_wr_opcode
pub const WR_RDMA_WRITE: c_int = 0;
pub const WR_RDMA_WRITE_WITH_IMM: c_int = 1;
pub const WR_SEND: c_int = 2;
pub const WR_SEND_WITH_IMM: c_int = 3;
pub const WR_RDMA_READ: c_int = 4;
pub const WR_ATOMIC_CMP_AND_SWP: c_int = 5;
pub const WR_ATOMIC_FETCH_AND_ADD: c_int = 6;
pub const WR_SEND_WITH_INV: c_int = 9;

// enum ibv_send_flags
pub const SEND_SIGNALED: u32 = 1 << 1;
pub const SEND_SOLICITED: u32 = 1 << 2;
pub const SEND_INLINE: u32 = 1 << 3;

/// Scatter/gather entries one request may carry (the wire format's limit).
pub const MAX_SGE: usize = 16;
/// Inline bytes one request may carry.
pub const MAX_INLINE: usize = 256;

fn qp_type_of(t: c_int) -> Option<QpType> {
    match t {
        QPT_RC => Some(QpType::Rc),
        QPT_UC => Some(QpType::Uc),
        QPT_UD => Some(QpType::Ud),
        QPT_XRC_SEND => Some(QpType::XrcSend),
        QPT_XRC_RECV => Some(QpType::XrcRecv),
        _ => None,
    }
}

/// What the create paths share once the C attributes are read.
#[derive(Clone, Copy)]
pub struct CreateArgs {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: *mut ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: bool,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut ibv_xrcd,
    pub create_flags: u32,
    pub send_ops_flags: u64,
}

fn new_obj(
    o: &'static CtxObj,
    c: *mut ibv_context,
    a: &CreateArgs,
    kind: QpKind,
    handle: u32,
    qpn: u32,
    max_inline: u32,
) -> *mut QpObj {
    // SAFETY: ibv_qp_ex is plain C data; zero is valid and the live fields are set below.
    let mut base: ibv_qp_ex = unsafe { std::mem::zeroed() };
    base.qp_base.context = c;
    base.qp_base.qp_context = a.qp_context;
    base.qp_base.pd = a.pd;
    base.qp_base.send_cq = a.send_cq;
    base.qp_base.recv_cq = a.recv_cq;
    base.qp_base.srq = a.srq;
    base.qp_base.handle = handle;
    base.qp_base.qp_num = qpn;
    base.qp_base.state = 0;
    base.qp_base.qp_type = a.qp_type;
    if a.send_ops_flags != 0 {
        crate::qp_ex::fill_slots(&mut base);
    }
    let p = into_c(QpObj {
        base,
        magic: LIVE,
        ctx: o,
        kind: Some(kind),
        pd: a.pd as *mut PdObj,
        send_cq: a.send_cq as *mut CqObj,
        recv_cq: a.recv_cq as *mut CqObj,
        srq: a.srq as *mut SrqObj,
        xrcd: a.xrcd as *mut XrcdObj,
        send_ops_flags: a.send_ops_flags,
        max_inline,
        wr: Mutex::new(WrBuild::default()),
    });
    // SAFETY: `p` is fresh; its sync objects are initialised once, here.
    unsafe { init_sync(&mut (*p).base.qp_base.mutex, &mut (*p).base.qp_base.cond) };
    o.remember(|e| &mut e.qps, handle, p as usize);
    hold(&o.users);
    p
}

/// Wraps a receive-QP handle from `ibv_open_qp` (the domain's use was already counted).
pub fn adopt_recv_qp(
    o: &'static CtxObj,
    c: *mut ibv_context,
    a: &CreateArgs,
    q: softverbs::XrcRecvQp<'static>,
) -> *mut QpObj {
    let (h, n) = (q.handle(), q.qpn());
    new_obj(o, c, a, QpKind::XrcRecv(q), h, n, 0)
}

/// Creates a QP from attributes both create paths read.
pub fn create(o: &'static CtxObj, c: *mut ibv_context, a: &CreateArgs) -> *mut QpObj {
    if a.cap.is_null() {
        return null_with(EINVAL);
    }
    if a.qp_type == QPT_RAW_PACKET {
        return null_with(EOPNOTSUPP);
    }
    let Some(t) = qp_type_of(a.qp_type) else {
        return null_with(EOPNOTSUPP);
    };
    // SAFETY: the caller's cap is read and written back (ibv_create_qp(3) returns the
    // capacities granted in it).
    let cap_in = unsafe { *a.cap };
    if t == QpType::XrcRecv {
        // SAFETY: NULL or an XRCD of ours.
        let Some(x) = (unsafe { obj::<XrcdObj>(a.xrcd) }) else {
            return null_with(EINVAL);
        };
        let Some(xrcd) = x.xrcd() else {
            return null_with(EINVAL);
        };
        if !a.pd.is_null() || !a.send_cq.is_null() || !a.recv_cq.is_null() || !a.srq.is_null() {
            return null_with(EINVAL);
        }
        let rq = match xrcd.create_recv_qp() {
            Ok(q) => q,
            Err(e) => return null_with(errno_of(&e)),
        };
        // SAFETY: as above; a receive QP has no work queues.
        unsafe { *a.cap = ibv_qp_cap::default() };
        hold(&x.users);
        let (h, n) = (rq.handle(), rq.qpn());
        return new_obj(o, c, a, QpKind::XrcRecv(rq), h, n, 0);
    }
    // SAFETY: NULL or objects of ours.
    let (pd, scq, rcq, srq) = unsafe {
        (
            obj::<PdObj>(a.pd),
            obj::<CqObj>(a.send_cq),
            obj::<CqObj>(a.recv_cq),
            obj::<SrqObj>(a.srq),
        )
    };
    let Some(pd) = pd else {
        return null_with(EINVAL);
    };
    let Some(p) = pd.pd() else {
        return null_with(EINVAL);
    };
    if (!a.send_cq.is_null() && scq.is_none())
        || (!a.recv_cq.is_null() && rcq.is_none())
        || (!a.srq.is_null() && srq.is_none())
    {
        return null_with(EINVAL);
    }
    let mut init = QpInit::new(t, p)
        .cap(QpCap {
            max_send_wr: cap_in.max_send_wr,
            max_recv_wr: cap_in.max_recv_wr,
            max_send_sge: cap_in.max_send_sge,
            max_recv_sge: cap_in.max_recv_sge,
            max_inline_data: cap_in.max_inline_data,
        })
        .sq_sig_all(a.sq_sig_all)
        .create_flags(a.create_flags);
    if let Some(cq) = scq.as_ref().and_then(|c| c.cq()) {
        init = init.send_cq(cq);
    }
    // An XRC send QP has no receive side; rdma-core programs pass their CQ there anyway.
    if t != QpType::XrcSend {
        if let Some(cq) = rcq.as_ref().and_then(|c| c.cq()) {
            init = init.recv_cq(cq);
        }
        if let Some(s) = srq.as_ref().and_then(|s| s.srq()) {
            init = init.srq(s);
        }
    }
    // Ask for the whole inline room a request entry has, whatever the program asked: small
    // sends then travel inline without it knowing (`auto_inline`), and a device may always
    // grant more than asked (ibv_create_qp(3)). A daemon with a smaller limit gets the ask.
    // An XRC send QP's entries hold 16 bytes less (`softverbs_core::qp::max_inline_data`).
    let mut roomy = init;
    roomy.cap.max_inline_data = roomy
        .cap
        .max_inline_data
        .max(softverbs_core::qp::max_inline_data(MAX_INLINE as u32, t));
    let made = match o.inner.create_qp(&roomy) {
        Err(e) if e.errno() as c_int == EINVAL && roomy.cap != init.cap => o.inner.create_qp(&init),
        r => r,
    };
    let q = match made {
        Ok(q) => q,
        Err(e) => return null_with(errno_of(&e)),
    };
    let got = q.cap();
    // SAFETY: see above.
    unsafe {
        *a.cap = ibv_qp_cap {
            max_send_wr: got.max_send_wr,
            max_recv_wr: got.max_recv_wr,
            max_send_sge: got.max_send_sge,
            max_recv_sge: got.max_recv_sge,
            max_inline_data: got.max_inline_data,
        }
    };
    hold(&pd.users);
    if let Some(c) = &scq {
        hold(&c.users);
    }
    let mut args = *a;
    if t == QpType::XrcSend {
        args.recv_cq = std::ptr::null_mut();
        args.srq = std::ptr::null_mut();
    } else {
        if let Some(c) = &rcq {
            hold(&c.users);
        }
        if let Some(s) = &srq {
            hold(&s.users);
        }
    }
    let (h, n) = (q.handle(), q.qpn());
    new_obj(o, c, &args, QpKind::Qp(q), h, n, got.max_inline_data)
}

unsafe extern "C" fn create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    // SAFETY: NULL or a PD of ours.
    let Some(p) = (unsafe { obj::<PdObj>(pd) }) else {
        return null_with(EINVAL);
    };
    if attr.is_null() {
        return null_with(EINVAL);
    }
    // SAFETY: the caller's attr is readable and writable (cap is written back).
    let a = unsafe { &mut *attr };
    let args = CreateArgs {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: &mut a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all != 0,
        pd,
        xrcd: std::ptr::null_mut(),
        create_flags: 0,
        send_ops_flags: 0,
    };
    create(p.ctx, p.base.context, &args) as *mut ibv_qp
}
export!(default "ibv_create_qp", "IBVERBS_1.1", create_qp);

/// `IBV_QP_EX_WITH_*` the `ibv_wr_*` API implements: RDMA write (+imm), send (+imm),
/// RDMA read, both atomics, bind MW and local invalidate (`IBV_QP_EX_WITH_BIND_MW` 1 << 7,
/// `_LOCAL_INV` 1 << 8; docs/design/memory-windows.md) and send with invalidate.
pub const SEND_OPS_SUPPORTED: u64 = 0x3ff;

/// `verbs_context.create_qp_ex` (`ibv_create_qp_ex(3)`).
pub unsafe extern "C" fn slot_create_qp_ex(
    c: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    let Some(o) = ctx_obj(c) else {
        return null_with(EINVAL);
    };
    if attr.is_null() {
        return null_with(EINVAL);
    }
    // SAFETY: the caller's attr is readable and writable.
    let a = unsafe { &mut *attr };
    if a.comp_mask & !INIT_ATTR_KNOWN != 0 {
        return null_with(EINVAL);
    }
    if a.comp_mask & !INIT_ATTR_SUPPORTED != 0 {
        return null_with(EOPNOTSUPP);
    }
    let send_ops_flags = if a.comp_mask & INIT_ATTR_SEND_OPS_FLAGS != 0 {
        if a.send_ops_flags & !SEND_OPS_SUPPORTED != 0 {
            return null_with(EOPNOTSUPP);
        }
        // A QP made with the flag is an ibv_qp_ex even if it asked for no op.
        a.send_ops_flags | (1 << 63)
    } else {
        0
    };
    // An XRC receive QP belongs to its XRC domain alone: rdma-core sends the domain's handle
    // in place of the PD's and no CQ or SRQ handle for it (ibv_cmd_create_qp_ex2), so what a
    // caller leaves in those fields is ignored, not refused. librdmacm's rdma_create_qp_ex
    // always fills in the id's PD.
    let xrc_recv = a.qp_type == QPT_XRC_RECV;
    let unless_xrc_recv = |p: *mut c_void| if xrc_recv { std::ptr::null_mut() } else { p };
    let args = CreateArgs {
        qp_context: a.qp_context,
        send_cq: unless_xrc_recv(a.send_cq.cast()).cast(),
        recv_cq: unless_xrc_recv(a.recv_cq.cast()).cast(),
        srq: unless_xrc_recv(a.srq.cast()).cast(),
        cap: &mut a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all != 0,
        pd: if a.comp_mask & INIT_ATTR_PD != 0 && !xrc_recv {
            a.pd
        } else {
            std::ptr::null_mut()
        },
        xrcd: if a.comp_mask & INIT_ATTR_XRCD != 0 {
            a.xrcd
        } else {
            std::ptr::null_mut()
        },
        create_flags: if a.comp_mask & INIT_ATTR_CREATE_FLAGS != 0 {
            a.create_flags
        } else {
            0
        },
        send_ops_flags,
    };
    create(o, c, &args) as *mut ibv_qp
}

unsafe extern "C" fn qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    // SAFETY: NULL or a QP of ours.
    match unsafe { obj::<QpObj>(qp) } {
        Some(o) if o.send_ops_flags != 0 => &mut o.base,
        _ => std::ptr::null_mut(),
    }
}
export!(default "ibv_qp_to_qp_ex", "IBVERBS_1.6", qp_to_qp_ex);

fn state_of(v: c_int) -> QpState {
    QpState::from_raw(v as u32).unwrap_or(QpState::Err)
}

pub fn attr_from_c(a: &ibv_qp_attr, mask: c_int) -> Result<QpAttr, c_int> {
    // Values are only checked where the mask says they are read.
    let m = mask as u32;
    let state = |bit: u32, v: c_int| -> Result<QpState, c_int> {
        if m & bit == 0 {
            return Ok(QpState::Reset);
        }
        QpState::from_raw(v as u32).ok_or(EINVAL)
    };
    let mtu = if m & (1 << 8) != 0 {
        Mtu::from_raw(a.path_mtu as u32).ok_or(EINVAL)?
    } else {
        Mtu::M1024
    };
    Ok(QpAttr {
        qp_state: state(1 << 0, a.qp_state)?,
        cur_qp_state: state(1 << 1, a.cur_qp_state)?,
        path_mtu: mtu,
        path_mig_state: a.path_mig_state as u32,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: Access(a.qp_access_flags),
        cap: QpCap {
            max_send_wr: a.cap.max_send_wr,
            max_recv_wr: a.cap.max_recv_wr,
            max_send_sge: a.cap.max_send_sge,
            max_recv_sge: a.cap.max_recv_sge,
            max_inline_data: a.cap.max_inline_data,
        },
        ah_attr: ah_attr_from_c(&a.ah_attr),
        alt_ah_attr: ah_attr_from_c(&a.alt_ah_attr),
        pkey_index: a.pkey_index,
        alt_pkey_index: a.alt_pkey_index,
        en_sqd_async_notify: a.en_sqd_async_notify != 0,
        sq_draining: a.sq_draining != 0,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: a.alt_port_num,
        alt_timeout: a.alt_timeout,
        rate_limit: a.rate_limit,
    })
}

pub fn attr_to_c(a: &QpAttr) -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: a.qp_state as c_int,
        cur_qp_state: a.cur_qp_state as c_int,
        path_mtu: a.path_mtu as c_int,
        path_mig_state: a.path_mig_state as c_int,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags.0,
        cap: ibv_qp_cap {
            max_send_wr: a.cap.max_send_wr,
            max_recv_wr: a.cap.max_recv_wr,
            max_send_sge: a.cap.max_send_sge,
            max_recv_sge: a.cap.max_recv_sge,
            max_inline_data: a.cap.max_inline_data,
        },
        ah_attr: ah_attr_to_c(&a.ah_attr),
        alt_ah_attr: ah_attr_to_c(&a.alt_ah_attr),
        pkey_index: a.pkey_index,
        alt_pkey_index: a.alt_pkey_index,
        en_sqd_async_notify: u8::from(a.en_sqd_async_notify),
        sq_draining: u8::from(a.sq_draining),
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: a.alt_port_num,
        alt_timeout: a.alt_timeout,
        rate_limit: a.rate_limit,
    }
}

unsafe extern "C" fn modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    // SAFETY: NULL or a QP of ours.
    let Some(o) = (unsafe { obj::<QpObj>(qp) }) else {
        return EINVAL;
    };
    if attr.is_null() {
        return EINVAL;
    }
    // SAFETY: the caller's attr is readable.
    let a = unsafe { &*attr };
    let qa = match attr_from_c(a, mask) {
        Ok(x) => x,
        Err(e) => return e,
    };
    let r = match &o.kind {
        Some(QpKind::Qp(q)) => q.modify(&qa, AttrMask(mask as u32)),
        Some(QpKind::XrcRecv(q)) => q.modify(&qa, AttrMask(mask as u32)),
        None => return EINVAL,
    };
    match r {
        Ok(()) => {
            if mask & ATTR_STATE != 0 {
                o.base.qp_base.state = state_of(a.qp_state) as c_int;
                if state_of(a.qp_state) == QpState::Reset {
                    let qpn = o.base.qp_base.qp_num;
                    crate::cq::purge_qp(o.send_cq, qpn);
                    if o.recv_cq != o.send_cq {
                        crate::cq::purge_qp(o.recv_cq, qpn);
                    }
                }
            }
            0
        }
        Err(e) => errno_of(&e),
    }
}
export!(default "ibv_modify_qp", "IBVERBS_1.1", modify_qp);

unsafe extern "C" fn query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: NULL or a QP of ours.
    let Some(o) = (unsafe { obj::<QpObj>(qp) }) else {
        return EINVAL;
    };
    if attr.is_null() || init.is_null() {
        return EINVAL;
    }
    let r = match &o.kind {
        Some(QpKind::Qp(q)) => q.query(),
        Some(QpKind::XrcRecv(q)) => q.query(),
        None => return EINVAL,
    };
    let q = match r {
        Ok(q) => q,
        Err(e) => return errno_of(&e),
    };
    let b = &o.base.qp_base;
    let ca = attr_to_c(&q.attr);
    // SAFETY: the caller's structs are writable.
    unsafe {
        attr.write(ca);
        init.write(ibv_qp_init_attr {
            qp_context: b.qp_context,
            send_cq: b.send_cq,
            recv_cq: b.recv_cq,
            srq: b.srq,
            cap: ca.cap,
            qp_type: b.qp_type,
            sq_sig_all: c_int::from(q.init.sq_sig_all),
        });
    }
    o.base.qp_base.state = q.attr.qp_state as c_int;
    0
}
export!(default "ibv_query_qp", "IBVERBS_1.1", query_qp);

unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    // SAFETY: NULL or a QP of ours.
    let Some(o) = (unsafe { obj::<QpObj>(qp) }) else {
        return EINVAL;
    };
    let Some(kind) = o.kind.take() else {
        return EINVAL;
    };
    let (handle, r) = match kind {
        QpKind::Qp(q) => (q.handle(), q.destroy()),
        QpKind::XrcRecv(q) => (q.handle(), q.destroy()),
    };
    let reported = match r {
        Ok(n) => n,
        Err(e) => return errno_of(&e),
    };
    o.ctx.forget(|e| &mut e.qps, handle);
    let b = &mut o.base.qp_base;
    // SAFETY: the QP's own sync objects; ibv_destroy_qp waits until every async event
    // reported for it was acknowledged (libibverbs/cmd_qp.c).
    unsafe { wait_for(&mut b.mutex, &mut b.cond, &b.events_completed, reported) };
    o.magic = DEAD;
    // SAFETY: parents outlive the QP (their users count includes it).
    unsafe {
        if let Some(p) = o.pd.as_ref() {
            release(&p.users);
        }
        if let Some(c) = o.send_cq.as_ref() {
            release(&c.users);
        }
        if let Some(c) = o.recv_cq.as_ref() {
            release(&c.users);
        }
        if let Some(s) = o.srq.as_ref() {
            release(&s.users);
        }
        if let Some(x) = o.xrcd.as_ref() {
            release(&x.users);
        }
    }
    release(&o.ctx.users);
    0
}
export!(default "ibv_destroy_qp", "IBVERBS_1.1", destroy_qp);

/// `ibv_query_qp_data_in_order(3)`: softverbs writes a message's data in order, so every
/// operation is in order.
unsafe extern "C" fn query_qp_data_in_order(_qp: *mut ibv_qp, _op: c_int, flags: u32) -> c_int {
    // IBV_QUERY_QP_DATA_IN_ORDER_RETURN_CAPS asks for the caps: in order, aligned to 128 B.
    if flags & 1 != 0 {
        3
    } else {
        1
    }
}
export!(default "ibv_query_qp_data_in_order", "IBVERBS_1.14", query_qp_data_in_order);

// ---- data path -------------------------------------------------------------------------------

/// The caller's scatter/gather list, converted on the stack.
///
/// # Safety
/// `list` points to `n` readable entries (or `n` is 0).
pub unsafe fn sges(
    list: *const ibv_sge,
    n: c_int,
    out: &mut [Sge; MAX_SGE],
) -> Result<usize, c_int> {
    if n < 0 || n as usize > MAX_SGE {
        return Err(EINVAL);
    }
    if n > 0 && list.is_null() {
        return Err(EINVAL);
    }
    for (i, slot) in out.iter_mut().enumerate().take(n as usize) {
        // SAFETY: per the contract.
        let s = unsafe { *list.add(i) };
        *slot = Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        };
    }
    Ok(n as usize)
}

/// Gathers inline data from the caller's buffers (`IBV_SEND_INLINE`: the data is copied at
/// post time and the buffers may be reused at once, ibv_post_send(3)).
///
/// # Safety
/// Each entry's `[addr, addr + length)` is readable memory of the caller.
pub unsafe fn gather_inline(s: &[Sge], buf: &mut [u8; MAX_INLINE]) -> Result<usize, c_int> {
    let mut n = 0usize;
    for e in s {
        let l = e.length as usize;
        if n + l > MAX_INLINE {
            return Err(EINVAL);
        }
        if l > 0 {
            // SAFETY: per the contract.
            let src = unsafe { std::slice::from_raw_parts(e.addr as usize as *const u8, l) };
            buf[n..n + l].copy_from_slice(src);
        }
        n += l;
    }
    Ok(n)
}

fn send_op(wr: &ibv_send_wr) -> Result<SendOp, c_int> {
    if let Some(op) = crate::mw::send_op(wr) {
        return op;
    }
    let u = &wr.wr_u;
    Ok(match wr.opcode {
        WR_SEND => SendOp::Send,
        // `imm_data` is a `__be32`: its bytes in memory are the ImmDt's on the wire (IBA
        // 9.3; ibv_post_send(3)). The engine's immediate is the number whose big-endian
        // bytes go out, so read the memory big-endian (issue 37, defect 3).
        WR_SEND_WITH_IMM => SendOp::SendWithImm(u32::from_be(wr.imm_data)),
        // `invalidate_rkey` (the same union) is a host-order `uint32_t`.
        WR_SEND_WITH_INV => SendOp::SendWithInv(wr.imm_data),
        WR_RDMA_WRITE => SendOp::Write {
            remote_addr: u[0],
            rkey: u[1] as u32,
        },
        WR_RDMA_WRITE_WITH_IMM => SendOp::WriteWithImm {
            remote_addr: u[0],
            rkey: u[1] as u32,
            imm: u32::from_be(wr.imm_data),
        },
        WR_RDMA_READ => SendOp::Read {
            remote_addr: u[0],
            rkey: u[1] as u32,
        },
        WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            remote_addr: u[0],
            rkey: u[3] as u32,
            compare: u[1],
            swap: u[2],
        },
        WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
            remote_addr: u[0],
            rkey: u[3] as u32,
            add: u[1],
        },
        _ => return Err(EINVAL),
    })
}

/// One send request, whichever API built it.
pub struct Parts<'a> {
    pub wr_id: u64,
    pub flags: u32,
    pub op: SendOp,
    pub sges: &'a [Sge],
    pub inline: Option<&'a [u8]>,
    pub ah: *mut ibv_ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
    pub remote_srqn: u32,
}

/// Copies a small request's payload into `buf` when every SGE lies inside an MR of the QP's
/// PD, so it travels inline: the daemon then need not read this process's memory with
/// `process_vm_readv` (~1.6 µs per call whatever the size, docs/design/registered-memory.md), which
/// is most of what a small non-inline SEND or WRITE costs over a plain one (perftest never
/// asks for inline on a device it does not know). Reading at post time is one of the times a
/// NIC may read: the buffer must stay unchanged until the completion (ibv_post_send(3)).
/// Anything else — unknown lkey, range outside the MR, READ/atomic, too long — returns
/// `None` and keeps the daemon's checks and error completions.
fn auto_inline(o: &QpObj, p: &Parts<'_>, buf: &mut [u8; MAX_INLINE]) -> Option<usize> {
    if p.op.is_read_or_atomic() || p.sges.is_empty() {
        return None;
    }
    let limit = (o.max_inline as usize).min(MAX_INLINE);
    let total = p
        .sges
        .iter()
        .try_fold(0usize, |n, s| n.checked_add(s.length as usize))?;
    if total == 0 || total > limit {
        return None;
    }
    // SAFETY: NULL or a PD of ours (a QP's PD outlives it).
    let pd = unsafe { obj_ref::<PdObj>(o.pd as *mut ibv_pd) }?;
    let mut n = 0usize;
    for s in p.sges {
        let l = s.length as usize;
        if l == 0 {
            continue;
        }
        let at = pd.local_range(s.lkey, s.addr, u64::from(s.length))?;
        // SAFETY: `[at, at + l)` lies inside an MR this process registered and has not
        // deregistered, i.e. memory the program must keep mapped and readable while it is
        // registered (ibv_reg_mr(3)); the daemon would read the same bytes.
        let src = unsafe { std::slice::from_raw_parts(at as *const u8, l) };
        buf[n..n + l].copy_from_slice(src);
        n += l;
    }
    Some(n)
}

/// Posts one request on a QP.
pub fn post_parts(o: &QpObj, p: &Parts<'_>) -> Result<(), c_int> {
    let q = o.qp().ok_or(EINVAL)?;
    let ud = if o.base.qp_base.qp_type == QPT_UD {
        // SAFETY: NULL or an AH of ours.
        let ah: &'static AhObj = unsafe { obj_ref::<AhObj>(p.ah) }.ok_or(EINVAL)?;
        Some(UdAddress {
            ah: ah.ah.as_ref().ok_or(EINVAL)?,
            remote_qpn: p.remote_qpn,
            remote_qkey: p.remote_qkey,
        })
    } else {
        None
    };
    let mut copied = [0u8; MAX_INLINE];
    let inline = match p.inline {
        Some(b) => Some(b),
        None => auto_inline(o, p, &mut copied).map(|n| &copied[..n]),
    };
    let req = SendRequest {
        wr_id: p.wr_id,
        op: p.op,
        sges: if inline.is_some() { &[] } else { p.sges },
        inline,
        signaled: p.flags & SEND_SIGNALED != 0,
        solicited: p.flags & SEND_SOLICITED != 0,
        ud,
        remote_srqn: p.remote_srqn,
    };
    q.post_send(&req).map_err(|e| errno_of(&e))
}

fn post_one(o: &QpObj, wr: &ibv_send_wr) -> Result<(), c_int> {
    let op = send_op(wr)?;
    let mut list = [Sge::default(); MAX_SGE];
    // SAFETY: the caller's sg_list holds num_sge entries (ibv_post_send(3)).
    let n = unsafe { sges(wr.sg_list, wr.num_sge, &mut list) }?;
    let mut inline_buf = [0u8; MAX_INLINE];
    let inline = if wr.send_flags & SEND_INLINE != 0 && !op.is_read_or_atomic() {
        // SAFETY: inline data is read from the caller's buffers now.
        let len = unsafe { gather_inline(&list[..n], &mut inline_buf) }?;
        Some(&inline_buf[..len])
    } else {
        None
    };
    post_parts(
        o,
        &Parts {
            wr_id: wr.wr_id,
            flags: wr.send_flags,
            op,
            sges: &list[..n],
            inline,
            ah: wr.wr_u[0] as usize as *mut ibv_ah,
            remote_qpn: wr.wr_u[1] as u32,
            remote_qkey: (wr.wr_u[1] >> 32) as u32,
            remote_srqn: wr.remote_srqn,
        },
    )
}

/// A work request list as verbs.h chains it.
pub trait Chained {
    fn next_wr(&self) -> *mut Self;
}

impl Chained for ibv_send_wr {
    fn next_wr(&self) -> *mut Self {
        self.next
    }
}

impl Chained for ibv_recv_wr {
    fn next_wr(&self) -> *mut Self {
        self.next
    }
}

/// Posts a list in order; the first request refused is named in `*bad` and its errno
/// returned, and nothing after it is posted (ibv_post_send(3), ibv_post_recv(3)).
///
/// # Safety
/// `first` is NULL or a valid list the caller owns; `bad` is NULL or writable.
pub unsafe fn post_list<W: Chained>(
    first: *mut W,
    bad: *mut *mut W,
    mut post: impl FnMut(&W) -> Result<(), c_int>,
) -> c_int {
    let mut cur = first;
    while !cur.is_null() {
        // SAFETY: per the contract, every element of the list is valid.
        let w = unsafe { &*cur };
        if let Err(e) = post(w) {
            if !bad.is_null() {
                // SAFETY: per the contract.
                unsafe { *bad = cur };
            }
            return e;
        }
        cur = w.next_wr();
    }
    0
}

/// A receive request's scatter list, converted on the stack, handed to `f`.
pub fn with_recv_sges(
    w: &ibv_recv_wr,
    f: impl FnOnce(&[Sge]) -> Result<(), softverbs::Error>,
) -> Result<(), c_int> {
    let mut list = [Sge::default(); MAX_SGE];
    // SAFETY: the caller's sg_list holds num_sge entries (ibv_post_recv(3)).
    let n = unsafe { sges(w.sg_list, w.num_sge, &mut list) }?;
    f(&list[..n]).map_err(|e| errno_of(&e))
}

/// `ibv_context.ops.post_send`.
pub unsafe extern "C" fn op_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: NULL or a QP of ours.
    let Some(o) = (unsafe { obj_ref::<QpObj>(qp) }) else {
        return EINVAL;
    };
    // SAFETY: the caller's list and out pointer, per ibv_post_send(3).
    unsafe { post_list(wr, bad, |w| post_one(o, w)) }
}

/// `ibv_context.ops.post_recv`.
pub unsafe extern "C" fn op_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: NULL or a QP of ours.
    let Some(o) = (unsafe { obj_ref::<QpObj>(qp) }) else {
        return EINVAL;
    };
    let Some(q) = o.qp() else {
        return EINVAL;
    };
    // SAFETY: the caller's list and out pointer, per ibv_post_recv(3).
    unsafe { post_list(wr, bad, |w| with_recv_sges(w, |s| q.post_recv(w.wr_id, s))) }
}
