//! On-demand paging at the C boundary: `verbs_context.advise_mr` (the slot verbs.h's inline
//! `ibv_advise_mr(3)` calls) and the `ibv_query_device_ex` ODP fields. `ibv_reg_mr` with
//! `IBV_ACCESS_ON_DEMAND` (and the implicit form, `addr` NULL and `length` `SIZE_MAX`) goes
//! through the ordinary registration (`pd.rs`), which the daemon answers for ODP.

use std::ffi::{c_int, c_uint};

use softverbs::Sge;

use crate::ffi::{ibv_device_attr_ex, ibv_pd, ibv_sge};
use crate::objects::{obj, CtxObj, PdObj};
use crate::util::{errno_of, EINVAL};

/// `verbs_context.advise_mr`: returns 0 or a positive errno, as rdma-core's providers do
/// (`ibv_cmd_advise_mr`). The errnos are the kernel's (`softverbs::Pd::advise_mr`).
pub unsafe extern "C" fn slot_advise_mr(
    pd: *mut ibv_pd,
    advice: c_uint,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> c_int {
    // SAFETY: NULL or a PD of ours.
    let Some(o) = (unsafe { obj::<PdObj>(pd) }) else {
        return EINVAL;
    };
    let Some(p) = o.pd() else {
        return EINVAL;
    };
    if num_sge == 0 || sg_list.is_null() {
        return EINVAL;
    }
    // SAFETY: ibv_advise_mr(3): `sg_list` holds `num_sge` entries, readable for the call.
    let list = unsafe { std::slice::from_raw_parts(sg_list, num_sge as usize) };
    let sges: Vec<Sge> = list
        .iter()
        .map(|s| Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        })
        .collect();
    match p.advise_mr_raw(advice, flags, &sges) {
        Ok(()) => 0,
        Err(e) => errno_of(&e),
    }
}

/// Fills `odp_caps` and `xrc_odp_caps` from the daemon (zero from one without ODP).
pub fn fill_odp_caps(o: &CtxObj, x: &mut ibv_device_attr_ex) -> Result<(), c_int> {
    let c = o.inner.odp_caps().map_err(|e| errno_of(&e))?;
    x.odp_general_caps = c.general_caps;
    x.odp_per_transport = [c.rc, c.uc, c.ud];
    x.xrc_odp_caps = c.xrc;
    Ok(())
}
