//! The common MAD header (IBA 13.4.3, figure 144) and the CM class's constants
//! (IBA 12.6.2, tables 103–104).

use zerocopy::big_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{CmWireError, MAD_LEN};

/// Bytes of the common MAD header.
pub const MAD_HDR_LEN: usize = 24;
/// BaseVersion of every MAD this format describes.
pub const MAD_BASE_VERSION: u8 = 1;
/// Management class of Communication Management (IBA 13.4.4, table 145).
pub const MGMT_CLASS_CM: u8 = 0x07;
/// ClassVersion of the CM class (IBA 12.6.2).
pub const CM_CLASS_VERSION: u8 = 2;
/// The Send method, the only one CM messages use (IBA 12.6.2, table 104).
pub const METHOD_SEND: u8 = 0x03;

/// Common MAD header, big-endian on the wire.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct MadHdr {
    /// BaseVersion (1).
    pub base_version: u8,
    /// MgmtClass.
    pub mgmt_class: u8,
    /// ClassVersion.
    pub class_version: u8,
    /// R bit (response, bit 7) and Method (bits 6–0).
    pub method: u8,
    /// Status.
    pub status: U16,
    /// ClassSpecific.
    pub class_specific: U16,
    /// TransactionID.
    pub tid: U64,
    /// AttributeID: which CM message.
    pub attr_id: U16,
    /// Reserved.
    pub reserved: U16,
    /// AttributeModifier (0 for CM messages).
    pub attr_mod: U32,
}

const _: () = assert!(core::mem::size_of::<MadHdr>() == MAD_HDR_LEN);

impl MadHdr {
    /// Header of a CM Send MAD with this attribute and transaction ID.
    pub fn cm_send(attr: AttrId, tid: u64) -> Self {
        Self {
            base_version: MAD_BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: U16::ZERO,
            class_specific: U16::ZERO,
            tid: U64::new(tid),
            attr_id: U16::new(attr as u16),
            reserved: U16::ZERO,
            attr_mod: U32::ZERO,
        }
    }

    /// The raw AttributeID.
    pub fn attr_id(&self) -> u16 {
        self.attr_id.get()
    }
}

/// CM attribute IDs (IBA 12.6.2, table 103). LAP, APR and ClassPortInfo are not spoken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum AttrId {
    /// ConnectRequest.
    Req = 0x0010,
    /// MsgRcptAck.
    Mra = 0x0011,
    /// ConnectReject.
    Rej = 0x0012,
    /// ConnectReply.
    Rep = 0x0013,
    /// ReadyToUse.
    Rtu = 0x0014,
    /// DisconnectRequest.
    Dreq = 0x0015,
    /// DisconnectReply.
    Drep = 0x0016,
    /// ServiceIDResReq.
    SidrReq = 0x0017,
    /// ServiceIDResReqResp.
    SidrRep = 0x0018,
}

impl AttrId {
    /// The attribute of a raw AttributeID, if this CM speaks it.
    pub fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            0x10 => Self::Req,
            0x11 => Self::Mra,
            0x12 => Self::Rej,
            0x13 => Self::Rep,
            0x14 => Self::Rtu,
            0x15 => Self::Dreq,
            0x16 => Self::Drep,
            0x17 => Self::SidrReq,
            0x18 => Self::SidrRep,
            _ => return None,
        })
    }
}

/// Checks the header of a CM MAD and returns it with the data area.
pub(crate) fn split(bytes: &[u8]) -> Result<(MadHdr, &[u8]), CmWireError> {
    if bytes.len() < MAD_LEN {
        return Err(CmWireError::Truncated {
            available: bytes.len(),
        });
    }
    let (hdr, rest) =
        MadHdr::read_from_prefix(&bytes[..MAD_LEN]).map_err(|_| CmWireError::Truncated {
            available: bytes.len(),
        })?;
    if hdr.base_version != MAD_BASE_VERSION {
        return Err(CmWireError::BaseVersion(hdr.base_version));
    }
    if hdr.mgmt_class != MGMT_CLASS_CM {
        return Err(CmWireError::NotCm(hdr.mgmt_class));
    }
    if hdr.class_version != CM_CLASS_VERSION {
        return Err(CmWireError::ClassVersion(hdr.class_version));
    }
    if hdr.method != METHOD_SEND {
        return Err(CmWireError::Method(hdr.method));
    }
    Ok((hdr, rest))
}
