//! The two 4-byte headers that close the header stack (IBA 9.3): ImmDt, the immediate data of
//! `*_WITH_IMMEDIATE` opcodes, and IETH, the R_Key of `SEND_*_WITH_INVALIDATE`.

use crate::be;
use crate::view::header_view;
use crate::{HeaderKind, WireError};

header_view!(
    /// Zero-copy view of an ImmDt (IBA 9.3).
    ImmDt,
    HeaderKind::ImmDt
);

impl<T: AsRef<[u8]>> ImmDt<T> {
    /// The immediate value, read big-endian. Verbs' `imm_data` is a `__be32` whose bytes in
    /// memory are these four bytes on the wire, so a C consumer gets `imm().to_be()`
    /// (docs/design/roce-wire.md §2.1).
    pub fn imm(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDt<T> {
    /// Sets the immediate value (written big-endian).
    pub fn set_imm(&mut self, imm: u32) {
        be::put_u32(self.buffer.as_mut(), 0, imm);
    }
}

/// Owned content of an ImmDt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImmDtRepr {
    /// Immediate data, big-endian on the wire.
    pub imm: u32,
}

impl ImmDtRepr {
    /// Reads an ImmDt.
    pub fn parse<T: AsRef<[u8]>>(view: &ImmDt<T>) -> Result<Self, WireError> {
        view.check_len()?;
        Ok(Self { imm: view.imm() })
    }

    /// Writes an ImmDt.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, view: &mut ImmDt<T>) -> Result<(), WireError> {
        view.check_len()?;
        view.set_imm(self.imm);
        Ok(())
    }

    /// Bytes [`Self::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HeaderKind::ImmDt.wire_len()
    }
}

header_view!(
    /// Zero-copy view of an IETH (IBA 9.3).
    Ieth,
    HeaderKind::Ieth
);

impl<T: AsRef<[u8]>> Ieth<T> {
    /// R_Key the responder invalidates when the message completes.
    pub fn rkey(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ieth<T> {
    /// Sets the R_Key to invalidate.
    pub fn set_rkey(&mut self, rkey: u32) {
        be::put_u32(self.buffer.as_mut(), 0, rkey);
    }
}

/// Owned content of an IETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IethRepr {
    /// R_Key to invalidate.
    pub rkey: u32,
}

impl IethRepr {
    /// Reads an IETH.
    pub fn parse<T: AsRef<[u8]>>(view: &Ieth<T>) -> Result<Self, WireError> {
        view.check_len()?;
        Ok(Self { rkey: view.rkey() })
    }

    /// Writes an IETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, view: &mut Ieth<T>) -> Result<(), WireError> {
        view.check_len()?;
        view.set_rkey(self.rkey);
        Ok(())
    }

    /// Bytes [`Self::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HeaderKind::Ieth.wire_len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imm_is_big_endian_raw() {
        let mut buf = [0u8; 4];
        ImmDtRepr { imm: 0x1234_5678 }
            .emit(&mut ImmDt::new_unchecked(&mut buf[..]))
            .unwrap();
        assert_eq!(buf, [0x12, 0x34, 0x56, 0x78]);
        assert_eq!(
            ImmDtRepr::parse(&ImmDt::new_checked(&buf[..]).unwrap()),
            Ok(ImmDtRepr { imm: 0x1234_5678 })
        );
    }

    #[test]
    fn ieth_round_trip() {
        let mut buf = [0u8; 4];
        IethRepr { rkey: 0xCAFE_F00D }
            .emit(&mut Ieth::new_unchecked(&mut buf[..]))
            .unwrap();
        assert_eq!(
            IethRepr::parse(&Ieth::new_checked(&buf[..]).unwrap()),
            Ok(IethRepr { rkey: 0xCAFE_F00D })
        );
    }

    #[test]
    fn truncated() {
        assert!(matches!(
            ImmDt::new_checked(&[0u8; 3][..]),
            Err(WireError::Truncated {
                header: HeaderKind::ImmDt,
                needed: 4,
                available: 3
            })
        ));
        assert!(matches!(
            Ieth::new_checked(&[][..]),
            Err(WireError::Truncated {
                header: HeaderKind::Ieth,
                needed: 4,
                available: 0
            })
        ));
        let mut short = [0u8; 2];
        assert!(IethRepr { rkey: 1 }
            .emit(&mut Ieth::new_unchecked(&mut short[..]))
            .is_err());
    }
}
