//! XRC Extended Transport Header (IBA Annex A14), 4 bytes.
//!
//! ```text
//! byte 0      reserved (sent as 0)
//! bytes 1-3   XRCSRQ: the 24-bit number of the XRC SRQ at the target
//! ```
//!
//! It follows BTH directly in every XRC request packet (first, middle, last and only) and is
//! absent from XRC responses (docs/design/xrc-semantics.md §7).

use crate::be::{self, U24_MASK};
use crate::view::header_view;
use crate::{HeaderKind, WireError};

mod field {
    pub const RESERVED: usize = 0;
    pub const XRC_SRQ: usize = 1;
}

header_view!(
    /// Zero-copy view of an XRCETH (IBA Annex A14).
    Xrceth,
    HeaderKind::Xrceth
);

impl<T: AsRef<[u8]>> Xrceth<T> {
    /// XRCSRQ: number of the SRQ that receives the message at the target.
    pub fn xrc_srq(&self) -> u32 {
        be::u24_at(self.buffer.as_ref(), field::XRC_SRQ)
    }

    /// The reserved top byte; ignored on receive.
    pub fn reserved(&self) -> u8 {
        self.buffer.as_ref()[field::RESERVED]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Xrceth<T> {
    /// Sets XRCSRQ (low 24 bits) and zeroes the reserved byte.
    pub fn set_xrc_srq(&mut self, srqn: u32) {
        let b = self.buffer.as_mut();
        b[field::RESERVED] = 0;
        be::put_u24(b, field::XRC_SRQ, srqn & U24_MASK);
    }
}

/// Owned content of an XRCETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct XrcethRepr {
    /// XRCSRQ (24 bits).
    pub xrc_srq: u32,
}

impl XrcethRepr {
    /// Reads an XRCETH, ignoring the reserved byte.
    pub fn parse<T: AsRef<[u8]>>(view: &Xrceth<T>) -> Result<Self, WireError> {
        view.check_len()?;
        Ok(Self {
            xrc_srq: view.xrc_srq(),
        })
    }

    /// Writes an XRCETH with the reserved byte 0.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        view: &mut Xrceth<T>,
    ) -> Result<(), WireError> {
        view.check_len()?;
        be::check_bits("XRCETH.XRCSRQ", self.xrc_srq.into(), 24)?;
        view.set_xrc_srq(self.xrc_srq);
        Ok(())
    }

    /// Bytes [`Self::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HeaderKind::Xrceth.wire_len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_reserved_byte() {
        let mut buf = [0xFFu8; 4];
        XrcethRepr { xrc_srq: 0x000123 }
            .emit(&mut Xrceth::new_unchecked(&mut buf[..]))
            .unwrap();
        assert_eq!(buf, [0x00, 0x00, 0x01, 0x23]);
        // A peer that sets the reserved byte must not change the SRQ number we read.
        buf[0] = 0xAB;
        let view = Xrceth::new_checked(&buf[..]).unwrap();
        assert_eq!(view.reserved(), 0xAB);
        assert_eq!(
            XrcethRepr::parse(&view).unwrap(),
            XrcethRepr { xrc_srq: 0x123 }
        );
    }

    #[test]
    fn errors() {
        assert!(matches!(
            Xrceth::new_checked(&[0u8; 3][..]),
            Err(WireError::Truncated {
                header: HeaderKind::Xrceth,
                needed: 4,
                available: 3
            })
        ));
        let mut buf = [0u8; 4];
        assert!(matches!(
            XrcethRepr {
                xrc_srq: 0x0100_0000
            }
            .emit(&mut Xrceth::new_unchecked(&mut buf[..])),
            Err(WireError::FieldOutOfRange { bits: 24, .. })
        ));
    }
}
