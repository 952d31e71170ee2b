//! Protection domains, memory regions and address handles: `ibv_alloc_pd(3)`,
//! `ibv_reg_mr(3)`, `ibv_create_ah(3)`, `ibv_create_ah_from_wc(3)`.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::AtomicU32;

use softverbs::{Access, AhAttr, Gid};

use crate::ffi::*;
use crate::objects::*;
use crate::util::*;

unsafe extern "C" fn alloc_pd(c: *mut ibv_context) -> *mut ibv_pd {
    let Some(o) = ctx_obj(c) else {
        return null_with(EINVAL);
    };
    match o.inner.alloc_pd() {
        Ok(pd) => {
            hold(&o.users);
            into_c(PdObj {
                base: ibv_pd {
                    context: c,
                    handle: pd.handle(),
                },
                magic: LIVE,
                ctx: o,
                pd: Some(pd),
                users: AtomicU32::new(0),
                mrs: Default::default(),
            }) as *mut ibv_pd
        }
        Err(e) => null_with(errno_of(&e)),
    }
}
export!(default "ibv_alloc_pd", "IBVERBS_1.1", alloc_pd);

unsafe extern "C" fn dealloc_pd(pd: *mut ibv_pd) -> c_int {
    // SAFETY: NULL or a PD of ours.
    let Some(o) = (unsafe { obj::<PdObj>(pd) }) else {
        return EINVAL;
    };
    if busy(&o.users) {
        return EBUSY;
    }
    let Some(inner) = o.pd.take() else {
        return EINVAL;
    };
    o.magic = DEAD;
    release(&o.ctx.users);
    match inner.dealloc() {
        Ok(()) => 0,
        Err(e) => errno_of(&e),
    }
}
export!(default "ibv_dealloc_pd", "IBVERBS_1.1", dealloc_pd);

/// `IBV_ACCESS_OPTIONAL_RANGE`: hints a device may ignore (ibv_reg_mr(3)); softverbs does.
const ACCESS_OPTIONAL_RANGE: c_uint = 0x3ff0_0000;

/// Registration turns the pages into shared memory in place (`Pd::reg_mr_shared`), so the
/// daemon and same-host peers copy without a system call — the bench's fast path
/// (docs/design/registered-memory.md, "Sharing by default"). Other threads' writes during
/// `ibv_reg_mr` wait for the conversion and are kept (where that cannot be arranged, nothing
/// is converted); a child forked later gets its own copy, and deregistration makes the pages
/// private again. `SOFTVERBS_SHARED_MR=0` registers without converting.
fn share_in_place() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SOFTVERBS_SHARED_MR").is_none_or(|v| v != "0"))
}

fn reg(pd: *mut ibv_pd, addr: *mut c_void, len: usize, iova: u64, access: c_uint) -> *mut ibv_mr {
    // SAFETY: NULL or a PD of ours.
    let Some(o) = (unsafe { obj::<PdObj>(pd) }) else {
        return null_with(EINVAL);
    };
    let Some(p) = o.pd() else {
        return null_with(EINVAL);
    };
    let access = Access(access & !ACCESS_OPTIONAL_RANGE);
    // An ODP MR is reached as the memory is mapped at each access: never converted to a
    // shared mapping (a pinned copy), never copied from by this library (a post over an
    // unmapped page must end in LOC_PROT_ERR, not SIGSEGV in the caller).
    let on_demand = access.contains(Access::ON_DEMAND);
    let made = if share_in_place() && !on_demand && iova == addr as u64 {
        // SAFETY: ibv_reg_mr(3)'s caller keeps `[addr, addr+len)` allocated until
        // ibv_dereg_mr and reaches it from C only (no Rust references); the in-place
        // conversion keeps its contents and holds other threads' writes back while it runs
        // (docs/design/registered-memory.md).
        let mem = unsafe { softverbs::RawMemory::new_shareable(addr as usize, len) };
        p.reg_mr_shared(mem, access)
    } else {
        // SAFETY: as above: the C caller owns the range until ibv_dereg_mr, as a NIC's DMA
        // target, and no Rust reference reaches it.
        let mem = unsafe { softverbs::RawMemory::new(addr as usize, len) };
        p.reg_mr_iova(mem, iova, access)
    };
    let mr = match made {
        Ok(m) => m,
        Err(e) => return null_with(errno_of(&e)),
    };
    hold(&o.users);
    let (lkey, rkey, handle) = (mr.lkey(), mr.rkey(), mr.handle());
    if !on_demand {
        o.remember_mr(
            lkey,
            MrRange {
                iova,
                len: len as u64,
                addr: addr as usize,
            },
        );
    }
    // SAFETY: PdObj shells are never freed; the MR holds a use of the PD until dereg.
    let pd_ref: &'static PdObj = unsafe { &*(o as *const PdObj) };
    into_c(MrObj {
        base: ibv_mr {
            context: o.base.context,
            pd,
            addr,
            length: len,
            handle,
            lkey,
            rkey,
        },
        magic: LIVE,
        pd: pd_ref,
        mr: Some(mr),
    }) as *mut ibv_mr
}

unsafe extern "C" fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    reg(pd, addr, len, addr as u64, access as c_uint)
}
export!(default "ibv_reg_mr", "IBVERBS_1.1", reg_mr);

unsafe extern "C" fn reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    reg(pd, addr, len, iova, access as c_uint)
}
export!(default "ibv_reg_mr_iova", "IBVERBS_1.7", reg_mr_iova);

unsafe extern "C" fn reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    reg(pd, addr, len, iova, access)
}
export!(default "ibv_reg_mr_iova2", "IBVERBS_1.8", reg_mr_iova2);

unsafe extern "C" fn dereg_mr(mr: *mut ibv_mr) -> c_int {
    // SAFETY: NULL or an MR of ours.
    let Some(o) = (unsafe { obj::<MrObj>(mr) }) else {
        return EINVAL;
    };
    let Some(inner) = o.mr.take() else {
        return EINVAL;
    };
    // No small send copies from the MR while it is being deregistered.
    let range =
        o.pd.mrs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&o.base.lkey)
            .copied();
    o.pd.forget_mr(o.base.lkey);
    match inner.dereg_or_keep() {
        Ok(()) => {}
        Err((Some(kept), e)) => {
            // Refused (memory windows are bound to it: IBA 10.6.7.2.6): the MR stays as it was.
            o.mr = Some(kept);
            if let Some(r) = range {
                o.pd.remember_mr(o.base.lkey, r);
            }
            return errno_of(&e);
        }
        Err((None, e)) => {
            o.magic = DEAD;
            release(&o.pd.users);
            return errno_of(&e);
        }
    }
    o.magic = DEAD;
    release(&o.pd.users);
    0
}
export!(default "ibv_dereg_mr", "IBVERBS_1.1", dereg_mr);

/// `ibv_rereg_mr(3)`: `IBV_REREG_MR_CHANGE_TRANSLATION | _PD | _ACCESS`.
const REREG_MR_CHANGE_TRANSLATION: c_int = 1;
const REREG_MR_CHANGE_PD: c_int = 2;
const REREG_MR_CHANGE_ACCESS: c_int = 4;
/// `IBV_REREG_MR_ERR_INPUT`: bad arguments, the MR is untouched.
const REREG_MR_ERR_INPUT: c_int = -1;
/// `IBV_REREG_MR_ERR_CMD`: the device refused; here too the MR is untouched.
const REREG_MR_ERR_CMD: c_int = -4;

/// Re-registration in place: the daemon changes the MR and keeps its handle and keys (as rxe
/// and mlx5 do), so a peer holding the rkey reaches the MR as it is now. The argument checks
/// are libibverbs' (`ERR_INPUT`), the rest the kernel's (`ERR_CMD` with its errno).
unsafe extern "C" fn rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> c_int {
    // SAFETY: NULL or an MR of ours.
    let Some(o) = (unsafe { obj::<MrObj>(mr) }) else {
        set_errno(EINVAL);
        return REREG_MR_ERR_INPUT;
    };
    let all = REREG_MR_CHANGE_TRANSLATION | REREG_MR_CHANGE_PD | REREG_MR_CHANGE_ACCESS;
    let translate = flags & REREG_MR_CHANGE_TRANSLATION != 0;
    if flags & !all != 0
        || (translate && (addr.is_null() || len == 0))
        || (access != 0 && flags & REREG_MR_CHANGE_ACCESS == 0)
    {
        set_errno(EINVAL);
        return REREG_MR_ERR_INPUT;
    }
    let fail = |e: c_int| {
        set_errno(e);
        REREG_MR_ERR_CMD
    };
    let target = if flags & REREG_MR_CHANGE_PD != 0 {
        // SAFETY: NULL or a PD of ours.
        match unsafe { obj::<PdObj>(pd) } {
            Some(t) if t.ctx.ibv() == o.base.context => Some(t),
            _ => return fail(EINVAL),
        }
    } else {
        None
    };
    let new_pd = match target.as_ref().map(|t| t.pd()) {
        Some(None) => return fail(EINVAL),
        Some(p) => p,
        None => None,
    };
    let acc = (flags & REREG_MR_CHANGE_ACCESS != 0)
        .then_some(Access(access as c_uint & !ACCESS_OPTIONAL_RANGE));
    let range = translate.then(|| {
        // SAFETY: ibv_rereg_mr(3)'s caller hands over the new range on the same terms as
        // ibv_reg_mr's: allocated until deregistration, reached from C only.
        let mem = unsafe { softverbs::RawMemory::new(addr as usize, len) };
        (mem, addr as u64)
    });
    // Posts from this MR take the daemon's path from now on (no local copy of a stale range).
    o.pd.forget_mr(o.base.lkey);
    let Some(inner) = o.mr.as_mut() else {
        return fail(EINVAL);
    };
    if let Err(e) = inner.rereg(new_pd, acc, range) {
        return fail(errno_of(&e));
    }
    let (lkey, rkey) = (inner.lkey(), inner.rkey());
    if let Some(t) = target {
        release(&o.pd.users);
        hold(&t.users);
        // SAFETY: PdObj shells are never freed.
        o.pd = unsafe { &*(t as *const PdObj) };
        o.base.pd = pd;
    }
    if translate {
        o.base.addr = addr;
        o.base.length = len;
    }
    o.base.lkey = lkey;
    o.base.rkey = rkey;
    0
}
export!(default "ibv_rereg_mr", "IBVERBS_1.1", rereg_mr);

// ---- address handles -------------------------------------------------------------------------

pub fn ah_attr_from_c(a: &ibv_ah_attr) -> AhAttr {
    AhAttr {
        dgid: Gid(a.grh.dgid.raw),
        flow_label: a.grh.flow_label,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: a.is_global != 0,
        port_num: a.port_num,
    }
}

pub fn ah_attr_to_c(a: &AhAttr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: a.dgid.0 },
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: u8::from(a.is_global),
        port_num: a.port_num,
    }
}

unsafe extern "C" fn create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
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
    // SAFETY: the caller's attr is readable.
    let a = ah_attr_from_c(unsafe { &*attr });
    match p.create_ah(&a) {
        Ok(ah) => {
            hold(&o.users);
            let handle = ah.handle();
            // SAFETY: PdObj shells are never freed.
            let pd_ref: &'static PdObj = unsafe { &*(o as *const PdObj) };
            into_c(AhObj {
                base: ibv_ah {
                    context: o.base.context,
                    pd,
                    handle,
                },
                magic: LIVE,
                pd: pd_ref,
                ah: Some(ah),
            }) as *mut ibv_ah
        }
        Err(e) => null_with(errno_of(&e)),
    }
}
export!(default "ibv_create_ah", "IBVERBS_1.1", create_ah);

unsafe extern "C" fn destroy_ah(ah: *mut ibv_ah) -> c_int {
    // SAFETY: NULL or an AH of ours.
    let Some(o) = (unsafe { obj::<AhObj>(ah) }) else {
        return EINVAL;
    };
    let Some(inner) = o.ah.take() else {
        return EINVAL;
    };
    o.magic = DEAD;
    let r = inner.destroy();
    release(&o.pd.users);
    match r {
        Ok(()) => 0,
        Err(e) => errno_of(&e),
    }
}
export!(default "ibv_destroy_ah", "IBVERBS_1.1", destroy_ah);

/// The 40-byte GRH a UD receive buffer starts with (IBA 8.3): on RoCE v2 the source GID of the
/// sender is at byte 8 and the destination GID (ours) at byte 24.
const GRH_LEN: usize = 40;

/// `ibv_init_ah_from_wc(3)`: the reply path to the sender of a received UD message.
unsafe extern "C" fn init_ah_from_wc(
    c: *mut ibv_context,
    port: u8,
    wc: *mut ibv_wc,
    grh: *mut u8,
    attr: *mut ibv_ah_attr,
) -> c_int {
    let Some(o) = ctx_obj(c) else {
        return minus_one(EINVAL);
    };
    if wc.is_null() || attr.is_null() {
        return minus_one(EINVAL);
    }
    // SAFETY: the caller's wc is readable.
    let flags = unsafe { (*wc).wc_flags };
    if flags & softverbs::WC_GRH == 0 || grh.is_null() {
        // RoCE needs the GRH to find the way back.
        return minus_one(EINVAL);
    }
    // SAFETY: `grh` points to the 40 bytes the receive buffer starts with.
    let g = unsafe { std::slice::from_raw_parts(grh, GRH_LEN) };
    let mut word0 = u32::from_be_bytes([g[0], g[1], g[2], g[3]]);
    let mut sgid = [0u8; 16];
    sgid.copy_from_slice(&g[8..24]);
    let mut dgid = [0u8; 16];
    dgid.copy_from_slice(&g[24..40]);
    // RoCE v2 over IPv4: twenty zero bytes, then the IPv4 header (version 4, IHL 5), whose
    // addresses are the IPv4-mapped GIDs (rdma-core's ibv_init_ah_from_wc does the same).
    if g[..20].iter().all(|&b| b == 0) && g[20] == 0x45 {
        let v4 = |at: usize| std::net::Ipv4Addr::new(g[at], g[at + 1], g[at + 2], g[at + 3]);
        sgid = v4(32).to_ipv6_mapped().octets();
        dgid = v4(36).to_ipv6_mapped().octets();
        // The traffic class is the IPv4 TOS byte.
        word0 = u32::from(g[21]) << 20;
    }
    // Our GID the message was sent to becomes the source GID index of the reply.
    let len = o.inner.query_port(port).map_or(0, |p| p.gid_tbl_len);
    let Some(index) = (0..len).find(|&i| o.inner.query_gid(port, i).is_ok_and(|x| x.0 == dgid))
    else {
        return minus_one(ENOENT);
    };
    let a = ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: sgid },
            flow_label: word0 & 0xf_ffff,
            sgid_index: index as u8,
            hop_limit: 0xff,
            traffic_class: ((word0 >> 20) & 0xff) as u8,
        },
        dlid: 0,
        sl: 0,
        src_path_bits: 0,
        static_rate: 0,
        is_global: 1,
        port_num: port,
    };
    // SAFETY: the caller's attr is writable.
    unsafe { attr.write(a) };
    0
}
export!(default "ibv_init_ah_from_wc", "IBVERBS_1.1", init_ah_from_wc);

unsafe extern "C" fn create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut u8,
    port: u8,
) -> *mut ibv_ah {
    // SAFETY: NULL or a PD of ours.
    let Some(o) = (unsafe { obj::<PdObj>(pd) }) else {
        return null_with(EINVAL);
    };
    let mut a = ibv_ah_attr::default();
    // SAFETY: forwarding the caller's pointers with the same contract.
    if unsafe { init_ah_from_wc(o.base.context, port, wc, grh, &mut a) } != 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: as above.
    unsafe { create_ah(pd, &mut a) }
}
export!(default "ibv_create_ah_from_wc", "IBVERBS_1.1", create_ah_from_wc);
