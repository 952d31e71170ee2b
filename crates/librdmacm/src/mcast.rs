//! Multicast joins on UD ids: `rdma_join_multicast(3)`, `rdma_join_multicast_ex`,
//! `rdma_leave_multicast`.
//!
//! On RoCE the kernel's rdma_cm has no SA to ask: a join maps the group's IP address to its
//! MGID (an IPv4 group as the IPv4-mapped IPv6 address `::ffff:a.b.c.d`, an IPv6 group as
//! itself), and reports `RDMA_CM_EVENT_MULTICAST_JOIN` with UD parameters the program makes
//! its AH from: the MGID as DGID (`is_global`, hop limit 64), remote QPN `0xFFFFFF` and the
//! port space's Q_Key (`RDMA_UDP_QKEY` 0x01234567 for `RDMA_PS_UDP`); the join's `context`
//! comes back as `param.ud.private_data`. librdmacm then attaches the id's QP to the MGID
//! (`ibv_attach_mcast`, lid 0 on RoCE) and detaches it on leave. softverbs' verbs multicast
//! (docs/design/roce-wire.md §8) does what the kernel's IGMP join does for the host, so the whole
//! join is the attach: no message goes to the daemon's CM.
//!
//! A send-only member (`RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`) gets the event but its QP is
//! not attached, so it receives nothing sent to the group.

use core::ffi::{c_int, c_void};
use std::net::IpAddr;

use crate::api::{done, fail, id_ref, is_sync, wait_sync};
use crate::cm::{ev, guard, Ev, Id};
use crate::ffi::*;
use crate::verbs::QPT_UD;

/// `RDMA_MC_JOIN_FLAG_FULLMEMBER`, `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER` (rdma_cma.h).
const JOIN_FULLMEMBER: u32 = 0;
const JOIN_SENDONLY_FULLMEMBER: u32 = 1;
/// `RDMA_CM_JOIN_MC_ATTR_ADDRESS`, `RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS`.
const ATTR_ADDRESS: u32 = 1;
const ATTR_JOIN_FLAGS: u32 = 2;
/// The remote QPN of a multicast send (IBA 10.5.2.1).
const MULTICAST_QPN: u32 = 0xFF_FFFF;

/// `struct rdma_cm_join_mc_attr_ex`.
#[repr(C)]
pub struct rdma_cm_join_mc_attr_ex {
    pub comp_mask: u32,
    pub join_flags: u32,
    pub addr: *mut libc::sockaddr,
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<rdma_cm_join_mc_attr_ex>() == 16);
    assert!(offset_of!(rdma_cm_join_mc_attr_ex, addr) == 8);
};

#[link(name = "ibverbs")]
unsafe extern "C" {
    fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int;
    fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int;
}

/// One group an id has joined.
pub struct Join {
    group: IpAddr,
    mgid: [u8; 16],
    /// The QP attached to the group (NULL for a send-only member or an id without a QP).
    qp: *mut ibv_qp,
}

/// The MGID rdma_cm gives a RoCE group.
fn mgid(group: IpAddr) -> [u8; 16] {
    crate::addr::gid(group)
}

/// Joins `id` to the group at `addr` with `flags` (see the module comment).
///
/// # Safety
/// `id` is NULL or an id of ours; `addr` NULL or a sockaddr.
unsafe fn join(
    id: *mut rdma_cm_id,
    addr: *const libc::sockaddr,
    flags: u32,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the caller's promises.
    let (Ok(i), Some((group, _))) = (unsafe { id_ref(id) }, unsafe { crate::addr::parse(addr) })
    else {
        return fail(libc::EINVAL);
    };
    if !group.is_multicast()
        || i.id.qp_type != QPT_UD as i32
        || !matches!(flags, JOIN_FULLMEMBER | JOIN_SENDONLY_FULLMEMBER)
    {
        return fail(libc::EINVAL);
    }
    let mgid = mgid(group);
    {
        let mut s = guard(&i.st);
        // rdma_join_multicast(3) needs an id bound to a device (rdma_bind_addr or
        // rdma_resolve_addr).
        if s.dev.is_none() {
            return fail(libc::EINVAL);
        }
        if s.mcast.iter().any(|j| j.group == group) {
            return fail(libc::EADDRINUSE);
        }
        let qp = if flags == JOIN_SENDONLY_FULLMEMBER || i.id.qp.is_null() {
            std::ptr::null_mut()
        } else {
            let gid = ibv_gid(mgid);
            // SAFETY: the drop-in's QP on this id; `gid` lives across the call.
            let r = unsafe { ibv_attach_mcast(i.id.qp, &gid, 0) };
            if r != 0 {
                return fail(r);
            }
            i.id.qp
        };
        s.mcast.push(Join { group, mgid, qp });
    }
    let mut e = Ev::new(ev::MULTICAST_JOIN, i, std::ptr::null_mut(), 0);
    e.ev.param.ud = rdma_ud_param {
        private_data: context,
        private_data_len: 0,
        ah_attr: ibv_ah_attr {
            grh: ibv_global_route {
                dgid: mgid,
                hop_limit: 64,
                ..Default::default()
            },
            is_global: 1,
            port_num: 1,
            ..Default::default()
        },
        qp_num: MULTICAST_QPN,
        qkey: crate::verbs::RDMA_UDP_QKEY,
    };
    i.chan.push_local(e);
    if is_sync(i) {
        return done(wait_sync(i, ev::MULTICAST_JOIN));
    }
    0
}

unsafe extern "C" fn join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the caller's id and sockaddr.
    unsafe { join(id, addr, JOIN_FULLMEMBER, context) }
}
export!("rdma_join_multicast", "RDMACM_1.0", join_multicast);

unsafe extern "C" fn join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    // SAFETY: NULL or the caller's attributes.
    let Some(a) = (unsafe { attr.as_ref() }) else {
        return fail(libc::EINVAL);
    };
    // Both the address and the flags are required (rdma_join_multicast_ex(3)); unknown
    // mask bits are refused.
    if a.comp_mask != ATTR_ADDRESS | ATTR_JOIN_FLAGS {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's id and sockaddr.
    unsafe { join(id, a.addr, a.join_flags, context) }
}
export!("rdma_join_multicast_ex", "RDMACM_1.1", join_multicast_ex);

unsafe extern "C" fn leave_multicast(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    // SAFETY: the caller's id and sockaddr.
    let (Ok(i), Some((group, _))) = (unsafe { id_ref(id) }, unsafe { crate::addr::parse(addr) })
    else {
        return fail(libc::EINVAL);
    };
    let j = {
        let mut s = guard(&i.st);
        let Some(at) = s.mcast.iter().position(|j| j.group == group) else {
            return fail(libc::EADDRNOTAVAIL);
        };
        s.mcast.remove(at)
    };
    detach(i, &j);
    0
}
export!("rdma_leave_multicast", "RDMACM_1.0", leave_multicast);

/// Detaches the QP a join attached, if it is still the id's.
fn detach(i: &Id, j: &Join) {
    if !j.qp.is_null() && j.qp == i.id.qp {
        let gid = ibv_gid(j.mgid);
        // SAFETY: the id's QP, still alive (rdma_destroy_qp clears id->qp).
        unsafe { ibv_detach_mcast(j.qp, &gid, 0) };
    }
}

/// Detaches the id's QP from its groups, which stay joined (rdma_destroy_qp).
pub fn detach_qp(i: &Id) {
    let mut s = guard(&i.st);
    for j in s.mcast.iter_mut() {
        detach(i, j);
        j.qp = std::ptr::null_mut();
    }
}

/// Leaves every group (rdma_destroy_id).
pub fn leave_all(i: &Id) {
    let joins = std::mem::take(&mut guard(&i.st).mcast);
    for j in &joins {
        detach(i, j);
    }
}
