//! Datagram Extended Transport Header (IBA 9.3, DETH), 8 bytes, carried by UD packets.
//!
//! ```text
//! bytes 0-3   Q_Key
//! byte 4      reserved (sent as 0)
//! bytes 5-7   SrcQP
//! ```

use crate::be::{self, U24_MASK};
use crate::view::header_view;
use crate::{HeaderKind, WireError};

mod field {
    pub const QKEY: usize = 0;
    pub const RESERVED: usize = 4;
    pub const SRC_QP: usize = 5;
}

/// Well-known Q_Key of the General Services Interface QP (QP1), IBA chapter 13
/// (docs/design/roce-wire.md §2).
pub const GSI_QKEY: u32 = 0x8001_0000;

header_view!(
    /// Zero-copy view of a DETH (IBA 9.3).
    Deth,
    HeaderKind::Deth
);

impl<T: AsRef<[u8]>> Deth<T> {
    /// Q_Key the receiver checks against its QP's.
    pub fn qkey(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), field::QKEY)
    }

    /// SrcQP: 24-bit QPN of the sender.
    pub fn src_qp(&self) -> u32 {
        be::u24_at(self.buffer.as_ref(), field::SRC_QP)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Deth<T> {
    /// Sets Q_Key.
    pub fn set_qkey(&mut self, qkey: u32) {
        be::put_u32(self.buffer.as_mut(), field::QKEY, qkey);
    }

    /// Sets SrcQP (low 24 bits) and zeroes the reserved byte.
    pub fn set_src_qp(&mut self, qpn: u32) {
        let b = self.buffer.as_mut();
        b[field::RESERVED] = 0;
        be::put_u24(b, field::SRC_QP, qpn & U24_MASK);
    }
}

/// Owned content of a DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DethRepr {
    /// Q_Key.
    pub qkey: u32,
    /// SrcQP (24 bits).
    pub src_qp: u32,
}

impl DethRepr {
    /// Reads a DETH, ignoring the reserved byte.
    pub fn parse<T: AsRef<[u8]>>(view: &Deth<T>) -> Result<Self, WireError> {
        view.check_len()?;
        Ok(Self {
            qkey: view.qkey(),
            src_qp: view.src_qp(),
        })
    }

    /// Writes a DETH with the reserved byte 0.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, view: &mut Deth<T>) -> Result<(), WireError> {
        view.check_len()?;
        be::check_bits("DETH.SrcQP", self.src_qp.into(), 24)?;
        view.set_qkey(self.qkey);
        view.set_src_qp(self.src_qp);
        Ok(())
    }

    /// Bytes [`Self::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HeaderKind::Deth.wire_len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let repr = DethRepr {
            qkey: GSI_QKEY,
            src_qp: 0x00_0001,
        };
        let mut buf = [0xFFu8; 8];
        repr.emit(&mut Deth::new_unchecked(&mut buf[..])).unwrap();
        assert_eq!(buf, [0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01]);
        assert_eq!(
            DethRepr::parse(&Deth::new_checked(&buf[..]).unwrap()),
            Ok(repr)
        );
    }

    #[test]
    fn errors() {
        assert!(matches!(
            Deth::new_checked(&[0u8; 7][..]),
            Err(WireError::Truncated {
                header: HeaderKind::Deth,
                needed: 8,
                available: 7
            })
        ));
        let mut buf = [0u8; 8];
        assert!(DethRepr {
            qkey: 0,
            src_qp: 1 << 24
        }
        .emit(&mut Deth::new_unchecked(&mut buf[..]))
        .is_err());
    }
}
