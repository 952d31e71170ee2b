//! rdma_cm's service IDs for IP port spaces (docs/design/cm.md §2.2).
//!
//! rdma_cm maps an IP port in a port space to the IB service ID `port_space << 16 | port`
//! (the kernel's `cma_get_service_id`; `RDMA_IB_IP_PS_*` in rdma_cma.h). For the TCP, UDP and
//! IB spaces that is `0x0000_0000_01PP_pppp`, inside [`IB_CMA_SERVICE_ID`]. The listener is
//! found by that ID, so both ends must build it the same way.

/// The fixed upper part of the TCP, UDP and IB spaces' service IDs.
pub const IB_CMA_SERVICE_ID: u64 = 0x0000_0000_0100_0000;
/// The bits that must equal [`IB_CMA_SERVICE_ID`].
pub const IB_CMA_SERVICE_ID_MASK: u64 = 0xFFFF_FFFF_FF00_0000;

/// An rdma_cm port space (`enum rdma_port_space`, rdma_cma.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum PortSpace {
    /// RDMA_PS_IPOIB.
    Ipoib = 0x0002,
    /// RDMA_PS_TCP: reliable connected QPs.
    Tcp = 0x0106,
    /// RDMA_PS_UDP: UD QPs, resolved with SIDR.
    Udp = 0x0111,
    /// RDMA_PS_IB: any QP type.
    Ib = 0x013F,
}

impl PortSpace {
    /// The port space with this `enum rdma_port_space` value.
    pub fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            0x0002 => Self::Ipoib,
            0x0106 => Self::Tcp,
            0x0111 => Self::Udp,
            0x013F => Self::Ib,
            _ => return None,
        })
    }

    /// Whether connections of this space are resolved with SIDR (UD) rather than REQ/REP.
    pub fn uses_sidr(self) -> bool {
        matches!(self, Self::Udp | Self::Ipoib)
    }
}

/// A service ID split into rdma_cm's port space and port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceId {
    /// The port space.
    pub ps: PortSpace,
    /// The IP port.
    pub port: u16,
}

impl ServiceId {
    /// The 64-bit service ID on the wire.
    pub fn to_u64(self) -> u64 {
        u64::from(self.ps as u16) << 16 | u64::from(self.port)
    }

    /// Splits a wire service ID; `None` if it is not an rdma_cm IP service ID.
    pub fn from_u64(sid: u64) -> Option<Self> {
        if sid >> 32 != 0 {
            return None;
        }
        let ps = PortSpace::from_u16((sid >> 16) as u16)?;
        Some(Self {
            ps,
            port: sid as u16,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // rping's default port 7174 in RDMA_PS_TCP, as the kernel's rdma_cm builds it.
        let sid = ServiceId {
            ps: PortSpace::Tcp,
            port: 7174,
        };
        assert_eq!(sid.to_u64(), 0x0000_0000_0106_1C06);
        assert_eq!(
            ServiceId::from_u64(0x0000_0000_0111_4E20).map(|s| s.ps),
            Some(PortSpace::Udp)
        );
        assert_eq!(ServiceId::from_u64(0x0000_0000_0106_1C06), Some(sid));
        assert_eq!(ServiceId::from_u64(0x0000_0001_0106_1C06), None);
        assert_eq!(ServiceId::from_u64(0x0000_0000_0199_0001), None);
        let ib = ServiceId {
            ps: PortSpace::Ib,
            port: 1,
        }
        .to_u64();
        assert_eq!(ib & IB_CMA_SERVICE_ID_MASK, IB_CMA_SERVICE_ID);
    }
}
