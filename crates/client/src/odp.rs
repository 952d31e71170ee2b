//! On-demand paging: the device's ODP capabilities, ODP and implicit ODP registrations, and
//! `ibv_advise_mr(3)` (docs/design/registered-memory.md, "On-demand paging").

use softverbs_abi::msg::{cmd, AdviseMrReq, OdpCapsResp, SgeWire, MAX_WIRE_SGE};
use softverbs_core::odp::{Advice, OdpCaps};
use softverbs_core::types::Access;
use softverbs_core::wr::Sge;
use zerocopy::little_endian::{U32, U64};

use crate::error::{errno, Error, Result};
use crate::objects::{Mr, Pd};
use crate::Context;

impl Context {
    /// `ibv_query_device_ex`'s `odp_caps` and `xrc_odp_caps`. A daemon older than ABI 11
    /// has no on-demand paging: all zero.
    pub fn odp_caps(&self) -> Result<OdpCaps> {
        match self
            .conn
            .call::<cmd::QueryOdpCaps>("query_odp_caps", 0, &())
        {
            Ok(r) => Ok(caps_of(&r)),
            Err(e) if e.errno() == errno::EOPNOTSUPP => Ok(OdpCaps {
                general_caps: 0,
                rc: 0,
                uc: 0,
                ud: 0,
                xrc: 0,
            }),
            Err(e) => Err(e),
        }
    }
}

fn caps_of(r: &OdpCapsResp) -> OdpCaps {
    OdpCaps {
        general_caps: r.general_caps.get(),
        rc: r.rc_odp_caps.get(),
        uc: r.uc_odp_caps.get(),
        ud: r.ud_odp_caps.get(),
        xrc: r.xrc_odp_caps.get(),
    }
}

impl<'c> Pd<'c> {
    /// `ibv_reg_mr` with `IBV_ACCESS_ON_DEMAND`: nothing is pinned or checked at
    /// registration, so the range need not be mapped yet; each access reaches the memory as
    /// it is mapped at that moment, and one that finds nothing mapped ends in the NIC's
    /// error (a remote access error for a peer, `LOC_PROT_ERR` for local work).
    /// [`RawMemory::address_space`](crate::RawMemory::address_space) makes it an implicit
    /// ODP MR: its keys are valid at every address (the iova is the address).
    pub fn reg_mr_on_demand(&self, mem: crate::RawMemory, access: Access) -> Result<Mr<'_>> {
        let access = access | Access::ON_DEMAND;
        self.reg_mr_with(
            mem.addr() as u64,
            mem.len() as u64,
            mem.addr() as u64,
            access,
            None,
        )
    }

    /// `ibv_advise_mr(3)`: prefetch the ranges `sges` name (each inside an ODP MR of this
    /// PD, by lkey). `flags` is 0 or [`ADVISE_MR_FLAG_FLUSH`](crate::ADVISE_MR_FLAG_FLUSH)
    /// (prefetch before returning, reporting a range that is not mapped as `EFAULT`). The
    /// errnos are the kernel's: `EINVAL` for no range or an unknown flag, `EOPNOTSUPP` for an
    /// unknown advice, `ENOENT` for an lkey that names no ODP MR of this PD (or one without
    /// local write, for `PrefetchWrite`).
    pub fn advise_mr(&self, advice: Advice, flags: u32, sges: &[Sge]) -> Result<()> {
        if sges.is_empty() {
            return Err(Error::new("advise_mr", errno::EINVAL));
        }
        let raw = match advice {
            Advice::Prefetch => 0,
            Advice::PrefetchWrite => 1,
            Advice::PrefetchNoFault => 2,
        };
        self.advise_mr_raw(raw, flags, sges)
    }

    /// [`Pd::advise_mr`] with the advice as verbs.h numbers it (for the C boundary, which
    /// may pass values this library does not know: `EOPNOTSUPP` from the daemon).
    pub fn advise_mr_raw(&self, advice: u32, flags: u32, sges: &[Sge]) -> Result<()> {
        if sges.is_empty() {
            return Err(Error::new("advise_mr", errno::EINVAL));
        }
        // The wire carries MAX_WIRE_SGE ranges per call; a longer list is sent in parts (the
        // kernel treats the ranges independently too).
        for part in sges.chunks(MAX_WIRE_SGE) {
            let mut req = AdviseMrReq {
                pd: U32::new(self.handle()),
                advice: U32::new(advice),
                flags: U32::new(flags),
                num_sge: U32::new(part.len() as u32),
                sg_list: [SgeWire {
                    addr: U64::new(0),
                    length: U32::new(0),
                    lkey: U32::new(0),
                }; MAX_WIRE_SGE],
            };
            for (w, s) in req.sg_list.iter_mut().zip(part) {
                *w = SgeWire {
                    addr: U64::new(s.addr),
                    length: U32::new(s.length),
                    lkey: U32::new(s.lkey),
                };
            }
            self.context()
                .conn
                .call::<cmd::AdviseMr>("advise_mr", 0, &req)?;
        }
        Ok(())
    }
}
