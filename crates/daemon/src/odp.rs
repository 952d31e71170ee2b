//! On-demand paging in the daemon (docs/design/registered-memory.md, "On-demand paging"): what
//! `reg_mr`/`rereg_mr` check for an ODP MR, the capabilities the device reports, and
//! `ibv_advise_mr(3)`.

use softverbs_abi::msg::{AdviseMrReq, OdpCapsResp, MAX_WIRE_SGE};
use softverbs_core::datapath::{MemError, PdRef};
use softverbs_core::errno::{EFAULT, EINVAL, ENOENT};
use softverbs_core::ids::{CtxId, Handle};
use softverbs_core::odp::{Advice, ADVISE_MR_FLAG_FLUSH, SOFTVERBS_ODP};
use softverbs_core::types::Access;
use zerocopy::little_endian::{U32, U64};

use crate::datapath::DataPath;
use crate::dispatch::Dispatcher;

/// The `ibv_query_device_ex` ODP fields of every softverbs device.
pub(crate) fn caps() -> OdpCapsResp {
    let c = SOFTVERBS_ODP;
    OdpCapsResp {
        general_caps: U64::new(c.general_caps),
        rc_odp_caps: U32::new(c.rc),
        uc_odp_caps: U32::new(c.uc),
        ud_odp_caps: U32::new(c.ud),
        xrc_odp_caps: U32::new(c.xrc),
    }
}

/// What `reg_mr` (and `rereg_mr`, for the range and access the MR will have) checks of the
/// client's memory. A pinned MR needs every page mapped as its access needs (`EFAULT`,
/// as `ib_umem_get` fails); an ODP MR pins nothing, so its pages may be mapped, unmapped
/// and remapped at any time and nothing is checked. A shared mapping (memfd) is a pinned
/// copy of the pages, which would hide later remaps from an ODP MR: `EINVAL`.
pub(crate) fn check_registration(
    dp: &DataPath,
    ctx: CtxId,
    addr: u64,
    len: u64,
    access: Access,
    shared: bool,
) -> Result<(), i32> {
    if softverbs_core::odp::is_implicit(addr, len) {
        // The core's rules come first for the whole address space (without ON_DEMAND it is
        // EINVAL, as the kernel's driver answers before it would pin anything).
        return if shared { Err(EINVAL) } else { Ok(()) };
    }
    if !access.contains(Access::ON_DEMAND) {
        return dp.check_range(ctx, addr, len, access);
    }
    if shared {
        return Err(EINVAL);
    }
    Ok(())
}

impl Dispatcher {
    /// `ibv_advise_mr(3)` with the kernel's answers (uverbs `ADVISE_MR` and mlx5's
    /// `mlx5_ib_advise_mr`): an unknown flag or no range is `EINVAL`, an unknown advice
    /// `EOPNOTSUPP`; a range whose lkey names no ODP MR of this PD, or that asks
    /// `PREFETCH_WRITE` of an MR without local write, is `ENOENT`, checked for every range
    /// before any is prefetched. With `IBV_ADVISE_MR_FLAG_FLUSH` the pages are made present
    /// before the call returns and a range outside its MR or not mapped (for
    /// `PREFETCH_WRITE`: not writable) is `EFAULT`; without it the prefetch is best-effort
    /// and its faults are not reported, as the kernel's deferred work does not report them.
    /// `PREFETCH_NO_FAULT` only validates: it maps what is present, and softverbs reaches
    /// whatever is present at each access anyway.
    pub(crate) fn advise_mr(&mut self, ctx: CtxId, r: AdviseMrReq) -> Result<(), i32> {
        let flags = r.flags.get();
        if flags & !ADVISE_MR_FLAG_FLUSH != 0 {
            return Err(EINVAL);
        }
        let n = r.num_sge.get() as usize;
        if n == 0 || n > MAX_WIRE_SGE {
            return Err(EINVAL);
        }
        let advice = Advice::from_raw(r.advice.get()).map_err(|e| e.errno())?;
        let pd = PdRef {
            ctx,
            pd: Handle(r.pd.get()),
        };
        let need = if advice == Advice::PrefetchWrite {
            Access::LOCAL_WRITE
        } else {
            Access::EMPTY
        };
        let mut targets = Vec::with_capacity(n);
        for s in &r.sg_list[..n] {
            let (va, len) = (s.addr.get(), u64::from(s.length.get()));
            match self.core.check_mem(pd, s.lkey.get(), va, len, need) {
                Ok(t) if t.on_demand => targets.push(Some((t.addr, t.len))),
                Ok(_) | Err(MemError::UnknownKey | MemError::WrongPd | MemError::AccessDenied) => {
                    return Err(ENOENT)
                }
                // The key is an ODP MR of this PD (else one of the above): the range is
                // what is wrong, which only the fault itself reports.
                Err(MemError::OutOfBounds) => targets.push(None),
            }
        }
        if advice == Advice::PrefetchNoFault {
            return Ok(());
        }
        let flush = flags & ADVISE_MR_FLAG_FLUSH != 0;
        for t in targets {
            let done = match t {
                None => Err(EFAULT),
                Some((addr, len)) => self.prefetch(ctx, addr, len, need),
            };
            if flush {
                done?;
            }
        }
        Ok(())
    }

    /// One range's prefetch: every page mapped readable, and writable for `PREFETCH_WRITE`
    /// (judged from the client's own `maps`, as a fault would judge it), then the first
    /// [`PREFETCH_MAX_PAGES`] pages made present. The cap keeps one client's advice of a
    /// huge range from stalling the daemon's single thread, which serves every client.
    fn prefetch(&mut self, ctx: CtxId, addr: u64, len: u64, need: Access) -> Result<(), i32> {
        self.dp.check_range(ctx, addr, len, need)?;
        self.dp
            .prefetch(ctx, addr, len.min(PREFETCH_MAX_PAGES * 4096))
    }
}

/// Pages one `ibv_advise_mr` range makes present at most (4 MiB); the rest is reached at
/// access time as always.
const PREFETCH_MAX_PAGES: u64 = 1024;

#[cfg(test)]
mod tests {
    #[test]
    fn caps_are_the_cores() {
        let c = super::caps();
        assert_eq!(c.general_caps.get(), 3);
        assert_eq!(c.rc_odp_caps.get(), 0x3f);
        assert_eq!(c.xrc_odp_caps.get(), 0x3f);
        assert_eq!(c.ud_odp_caps.get(), 0x23);
    }
}
