//! `ibv_attach_mcast(3)` / `ibv_detach_mcast(3)`: a UD QP joins or leaves a multicast group
//! (`softverbs::Qp::attach_mcast`; the rules and errnos are the kernel's, see
//! `docs/guide/dropin.md`, "Multicast"). Both return 0 or a positive errno, as rdma-core's do
//! (the value of `ibv_cmd_attach_mcast`'s write). The LID is ignored on a RoCE port.

use std::ffi::c_int;

use softverbs::Gid;

use crate::ffi::*;
use crate::objects::*;
use crate::util::*;

/// The QP and GID of a call, or its errno: NULL arguments and a handle on an XRC receive
/// QP (never UD) are `EINVAL`, as `ib_attach_mcast` answers for a QP that is not UD.
unsafe fn args<'a>(qp: *mut ibv_qp, gid: *const ibv_gid) -> Result<(&'a QpObj, Gid), c_int> {
    // SAFETY: NULL or a QP of ours.
    let o = unsafe { obj::<QpObj>(qp) }.ok_or(EINVAL)?;
    if gid.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: the caller passes a readable `union ibv_gid`.
    let raw = unsafe { (*gid).raw };
    Ok((o, Gid(raw)))
}

unsafe extern "C" fn attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, _lid: u16) -> c_int {
    // SAFETY: forwarded from the caller.
    let (o, gid) = match unsafe { args(qp, gid) } {
        Ok(a) => a,
        Err(e) => return e,
    };
    match &o.kind {
        Some(QpKind::Qp(q)) => q.attach_mcast(gid).map_or_else(|e| errno_of(&e), |()| 0),
        _ => EINVAL,
    }
}
export!(default "ibv_attach_mcast", "IBVERBS_1.1", attach_mcast);

unsafe extern "C" fn detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, _lid: u16) -> c_int {
    // SAFETY: forwarded from the caller.
    let (o, gid) = match unsafe { args(qp, gid) } {
        Ok(a) => a,
        Err(e) => return e,
    };
    match &o.kind {
        Some(QpKind::Qp(q)) => q.detach_mcast(gid).map_or_else(|e| errno_of(&e), |()| 0),
        _ => EINVAL,
    }
}
export!(default "ibv_detach_mcast", "IBVERBS_1.1", detach_mcast);
