//! RDMA Extended Transport Header (IBA 9.3, RETH), 16 bytes.
//!
//! ```text
//! bytes 0-7    VA          remote virtual address
//! bytes 8-11   R_Key
//! bytes 12-15  DMA Length  length of the whole message, not of this packet
//! ```

use crate::be;
use crate::view::header_view;
use crate::{HeaderKind, WireError};

mod field {
    pub const VA: usize = 0;
    pub const RKEY: usize = 8;
    pub const DMA_LEN: usize = 12;
}

header_view!(
    /// Zero-copy view of a RETH (IBA 9.3).
    Reth,
    HeaderKind::Reth
);

impl<T: AsRef<[u8]>> Reth<T> {
    /// VA: remote virtual address of the first byte.
    pub fn va(&self) -> u64 {
        be::u64_at(self.buffer.as_ref(), field::VA)
    }

    /// R_Key authorising the access.
    pub fn rkey(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), field::RKEY)
    }

    /// DMA Length of the whole RDMA message.
    pub fn dma_len(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), field::DMA_LEN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Reth<T> {
    /// Sets VA.
    pub fn set_va(&mut self, va: u64) {
        be::put_u64(self.buffer.as_mut(), field::VA, va);
    }

    /// Sets R_Key.
    pub fn set_rkey(&mut self, rkey: u32) {
        be::put_u32(self.buffer.as_mut(), field::RKEY, rkey);
    }

    /// Sets DMA Length.
    pub fn set_dma_len(&mut self, len: u32) {
        be::put_u32(self.buffer.as_mut(), field::DMA_LEN, len);
    }
}

/// Owned content of a RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RethRepr {
    /// Remote virtual address.
    pub va: u64,
    /// R_Key.
    pub rkey: u32,
    /// DMA length of the message.
    pub dma_len: u32,
}

impl RethRepr {
    /// Reads a RETH.
    pub fn parse<T: AsRef<[u8]>>(view: &Reth<T>) -> Result<Self, WireError> {
        view.check_len()?;
        Ok(Self {
            va: view.va(),
            rkey: view.rkey(),
            dma_len: view.dma_len(),
        })
    }

    /// Writes a RETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, view: &mut Reth<T>) -> Result<(), WireError> {
        view.check_len()?;
        view.set_va(self.va);
        view.set_rkey(self.rkey);
        view.set_dma_len(self.dma_len);
        Ok(())
    }

    /// Bytes [`Self::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HeaderKind::Reth.wire_len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_big_endian() {
        let repr = RethRepr {
            va: 0x0102_0304_0506_0708,
            rkey: 0x1122_3344,
            dma_len: 0x10_0000,
        };
        let mut buf = [0u8; 16];
        repr.emit(&mut Reth::new_unchecked(&mut buf[..])).unwrap();
        assert_eq!(&buf[..8], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&buf[8..12], &[0x11, 0x22, 0x33, 0x44]);
        assert_eq!(
            RethRepr::parse(&Reth::new_checked(&buf[..]).unwrap()).unwrap(),
            repr
        );
    }

    #[test]
    fn truncated() {
        assert!(matches!(
            Reth::new_checked(&[0u8; 15][..]),
            Err(WireError::Truncated {
                header: HeaderKind::Reth,
                needed: 16,
                available: 15
            })
        ));
        let mut short = [0u8; 8];
        assert!(RethRepr {
            va: 0,
            rkey: 0,
            dma_len: 0
        }
        .emit(&mut Reth::new_unchecked(&mut short[..]))
        .is_err());
    }
}
