//! On-demand paging (`IBV_ACCESS_ON_DEMAND`, ibv_reg_mr(3); `struct ibv_odp_caps`,
//! ibv_query_device_ex(3)): what the device advertises, and the rules an ODP registration
//! follows. docs/design/registered-memory.md, "On-demand paging", has the design.
//!
//! softverbs reaches memory that is not a shared mapping through the client's own
//! `/proc/self/mem` at the moment of each access, so every registration behaves like an ODP
//! one underneath: an ODP MR differs from a pinned one only in what registration checks and
//! charges (nothing is pinned: no `EFAULT` for pages that are not mapped yet, no registered
//! bytes) and in what an access that finds no mapping reports (the NIC's access errors, see
//! [`crate::datapath::MemTarget::on_demand`]).

use crate::error::{Error, Result};
use crate::types::Access;

/// `IBV_ODP_SUPPORT` (`enum ibv_odp_general_caps`, verbs.h).
pub const ODP_SUPPORT: u64 = 1 << 0;
/// `IBV_ODP_SUPPORT_IMPLICIT`: an MR over the whole address space.
pub const ODP_SUPPORT_IMPLICIT: u64 = 1 << 1;

/// `IBV_ODP_SUPPORT_SEND` (`enum ibv_odp_transport_cap_bits`, verbs.h).
pub const ODP_SEND: u32 = 1 << 0;
/// `IBV_ODP_SUPPORT_RECV`.
pub const ODP_RECV: u32 = 1 << 1;
/// `IBV_ODP_SUPPORT_WRITE`.
pub const ODP_WRITE: u32 = 1 << 2;
/// `IBV_ODP_SUPPORT_READ`.
pub const ODP_READ: u32 = 1 << 3;
/// `IBV_ODP_SUPPORT_ATOMIC`.
pub const ODP_ATOMIC: u32 = 1 << 4;
/// `IBV_ODP_SUPPORT_SRQ_RECV`.
pub const ODP_SRQ_RECV: u32 = 1 << 5;

/// `struct ibv_odp_caps` plus `xrc_odp_caps` of `struct ibv_device_attr_ex`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OdpCaps {
    /// `general_caps`.
    pub general_caps: u64,
    /// `per_transport_caps.rc_odp_caps`.
    pub rc: u32,
    /// `per_transport_caps.uc_odp_caps`.
    pub uc: u32,
    /// `per_transport_caps.ud_odp_caps`.
    pub ud: u32,
    /// `xrc_odp_caps`.
    pub xrc: u32,
}

/// What every softverbs device offers. Each bit is backed by the same path (an access to an
/// ODP MR goes to the client's memory as mapped at that moment, whatever the operation), and
/// each is exercised by a test (`crates/client/tests/odp.rs`, rdma-core's `tests.test_odp`).
/// A transport gets the bits for the operations it has: UC has no READ or atomics (IBA
/// Table 48), UD only SEND/RECV.
pub const SOFTVERBS_ODP: OdpCaps = OdpCaps {
    general_caps: ODP_SUPPORT | ODP_SUPPORT_IMPLICIT,
    rc: ODP_SEND | ODP_RECV | ODP_WRITE | ODP_READ | ODP_ATOMIC | ODP_SRQ_RECV,
    uc: ODP_SEND | ODP_RECV | ODP_WRITE | ODP_SRQ_RECV,
    ud: ODP_SEND | ODP_RECV | ODP_SRQ_RECV,
    xrc: ODP_SEND | ODP_RECV | ODP_WRITE | ODP_READ | ODP_ATOMIC | ODP_SRQ_RECV,
};

/// Whether `(addr, length)` asks for an implicit ODP MR: ibv_reg_mr(3) with `addr` NULL and
/// `length` `SIZE_MAX`.
pub fn is_implicit(addr: u64, length: u64) -> bool {
    addr == 0 && length == u64::MAX
}

/// The rules of an implicit registration, as the kernel applies them (mlx5's
/// `mlx5_ib_reg_user_mr`): only with `IBV_ACCESS_ON_DEMAND`, and the IOVA is the address
/// itself (0), both `EINVAL` otherwise. `Ok(false)` for an ordinary range.
pub fn check_implicit(addr: u64, length: u64, iova: u64, access: Access) -> Result<bool> {
    if !is_implicit(addr, length) {
        return Ok(false);
    }
    if !access.contains(Access::ON_DEMAND) {
        return Err(Error::InvalidArgument(
            "a whole-address-space MR needs IBV_ACCESS_ON_DEMAND",
        ));
    }
    if iova != 0 {
        return Err(Error::InvalidArgument("an implicit ODP MR has IOVA 0"));
    }
    Ok(true)
}

/// The bytes a registration pins, which `RegisteredBytes` counts (as `RLIMIT_MEMLOCK`
/// counts pinned pages): none for an ODP MR, whose pages are reached as they are mapped
/// when accessed (the kernel's ODP umem does not charge `pinned_vm` either).
pub fn pinned_bytes(length: u64, access: Access) -> u64 {
    if access.contains(Access::ON_DEMAND) {
        0
    } else {
        length
    }
}

/// `ibv_advise_mr(3)` advice (`enum ibv_advise_mr_advice`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Advice {
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH`: fault the pages in for reading.
    Prefetch,
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE`: fault them in for writing.
    PrefetchWrite,
    /// `IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT`: map what is present, fault nothing.
    PrefetchNoFault,
}

impl Advice {
    /// The advice numbered `v` in verbs.h; `EOPNOTSUPP` for others, as mlx5 and rxe
    /// answer.
    pub fn from_raw(v: u32) -> Result<Advice> {
        match v {
            0 => Ok(Advice::Prefetch),
            1 => Ok(Advice::PrefetchWrite),
            2 => Ok(Advice::PrefetchNoFault),
            _ => Err(Error::NotSupported("unknown advise_mr advice")),
        }
    }
}

/// `IBV_ADVISE_MR_FLAG_FLUSH`: prefetch before returning (and report faults).
pub const ADVISE_MR_FLAG_FLUSH: u32 = 1 << 0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn implicit_rules() {
        let odp = Access::LOCAL_WRITE | Access::ON_DEMAND;
        assert_eq!(check_implicit(0, u64::MAX, 0, odp), Ok(true));
        assert_eq!(check_implicit(0x1000, u64::MAX, 0, odp), Ok(false));
        assert!(check_implicit(0, u64::MAX, 0, Access::LOCAL_WRITE).is_err());
        assert!(check_implicit(0, u64::MAX, 0x1000, odp).is_err());
        assert_eq!(pinned_bytes(4096, odp), 0);
        assert_eq!(pinned_bytes(4096, Access::LOCAL_WRITE), 4096);
    }

    #[test]
    fn advice_numbers() {
        assert_eq!(Advice::from_raw(1), Ok(Advice::PrefetchWrite));
        assert_eq!(
            Advice::from_raw(3).unwrap_err().errno(),
            crate::errno::EOPNOTSUPP
        );
    }
}
