//! InfiniBand Communication Management MADs (IBA chapter 12) and the rdma_cm conventions
//! carried inside them (docs/design/cm.md §2).
//!
//! * [`mad`]: the 24-byte common MAD header (IBA 13.4.3) and the CM class constants.
//! * [`msg`]: REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ and SIDR_REP (IBA 12.6 tables
//!   106–120) as fixed zerocopy layouts plus owned values with typed fields.
//! * [`service_id`]: the rdma_cm IP service IDs `0x0000_0000_01PP_pppp` (port space, port).
//! * [`cma_hdr`]: the address header rdma_cm puts at the start of REQ and SIDR_REQ private
//!   data (version, IP version, source port, source and destination addresses).
//!
//! [`CmMad::parse`] never panics; anything that is not a well-formed CM MAD of a known
//! attribute is a [`CmWireError`]. CM MADs are sent as UD SENDs to QP1 with the GSI Q_Key
//! ([`crate::deth::GSI_QKEY`]); a MAD is always [`MAD_LEN`] bytes.

pub mod cma_hdr;
pub mod mad;
pub mod msg;
pub mod service_id;

pub use cma_hdr::{CmaHdr, CMA_HDR_LEN};
pub use mad::{AttrId, MadHdr, CM_CLASS_VERSION, MAD_BASE_VERSION, METHOD_SEND, MGMT_CLASS_CM};
pub use msg::{
    CmMessage, Drep, Dreq, Mra, PathInfo, Rej, RejReason, Rep, Req, Rtu, SidrRep, SidrReq,
    SidrStatus,
};
pub use service_id::{PortSpace, ServiceId};

use zerocopy::{FromBytes, IntoBytes};

/// Bytes of every MAD (IBA 13.4.2).
pub const MAD_LEN: usize = 256;
/// Bytes of a CM MAD's data area after the common header (IBA 12.6: "232 bytes of data").
pub const CM_DATA_LEN: usize = MAD_LEN - mad::MAD_HDR_LEN;
/// The GSI's queue pair number (IBA 13.5.1); CM MADs go to it.
pub const GSI_QPN: u32 = 1;

/// What is wrong with bytes that should be a CM MAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CmWireError {
    /// Shorter than a MAD.
    #[error("MAD truncated: {available} bytes, a MAD has {}", MAD_LEN)]
    Truncated {
        /// Bytes present.
        available: usize,
    },
    /// The base version is not 1 (IBA 13.4.3).
    #[error("MAD base version {0}, expected 1")]
    BaseVersion(u8),
    /// Not the CM management class (0x07).
    #[error("management class {0:#04x} is not CM (0x07)")]
    NotCm(u8),
    /// A CM class version other than 2 (IBA 12.6.2).
    #[error("CM class version {0}, expected 2")]
    ClassVersion(u8),
    /// CM MADs use only the Send method (IBA 12.6.2, table 104).
    #[error("CM method {0:#04x}, expected Send (0x03)")]
    Method(u8),
    /// An attribute this CM does not speak (ClassPortInfo, LAP, APR, …).
    #[error("CM attribute {0:#06x} not supported")]
    Attribute(u16),
    /// A field with a reserved or impossible value.
    #[error("CM field {field} has invalid value {value}")]
    Field {
        /// Name of the field, as in IBA 12.6.
        field: &'static str,
        /// The value found (or given to emit).
        value: u64,
    },
    /// A private-data address header that is not rdma_cm's (docs/design/cm.md §2.3).
    #[error("rdma_cm address header: {0}")]
    CmaHdr(&'static str),
}

/// One CM MAD: the transaction ID of its header and the message it carries.
///
/// IBA 12.6.1: a message and its retransmissions share one TransactionID; the answer to a
/// REQ or DREQ is matched by the communication IDs, not the TID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmMad {
    /// TransactionID of the MAD header.
    pub tid: u64,
    /// The message.
    pub msg: CmMessage,
}

impl CmMad {
    /// Parses a whole MAD. Reserved header and message bits are ignored.
    pub fn parse(bytes: &[u8]) -> Result<Self, CmWireError> {
        let (hdr, data) = mad::split(bytes)?;
        let msg = CmMessage::parse(hdr.attr_id(), data)?;
        Ok(Self {
            tid: hdr.tid.get(),
            msg,
        })
    }

    /// Writes the MAD: header (base version 1, class CM version 2, Send, status 0) and
    /// message; reserved fields are zero.
    pub fn emit(&self) -> Result<[u8; MAD_LEN], CmWireError> {
        let mut out = [0u8; MAD_LEN];
        let hdr = MadHdr::cm_send(self.msg.attr_id(), self.tid);
        let (h, data) = out.split_at_mut(mad::MAD_HDR_LEN);
        hdr.write_to(h).expect("header slot is exactly MAD_HDR_LEN");
        self.msg.emit(data)?;
        Ok(out)
    }
}

/// Reads the header of a MAD without its message, for callers that only route by class.
pub fn peek_header(bytes: &[u8]) -> Option<MadHdr> {
    MadHdr::read_from_prefix(bytes).ok().map(|(h, _)| h)
}

#[cfg(test)]
mod tests;

/// Headers of a CM MAD on the wire: a UD SEND_ONLY from QP1 to QP1 with the GSI Q_Key and
/// the default P_Key (IBA 13.5.1; docs/design/cm.md §2). `psn` is the sending GSI's next PSN.
pub fn gsi_headers(psn: u32) -> crate::Headers {
    let mut h = crate::Headers::new(crate::BthRepr::new(
        crate::Opcode(0x64), // UD SEND_ONLY (IBA 9.2, table 35)
        GSI_QPN,
        psn & crate::be::U24_MASK,
    ));
    h.deth = Some(crate::DethRepr {
        qkey: crate::deth::GSI_QKEY,
        src_qp: GSI_QPN,
    });
    h
}
