//! Atomic headers (IBA 9.3): AtomicETH (28 bytes) in CmpSwap/FetchAdd requests and
//! AtomicAckETH (8 bytes) in the Atomic Acknowledge.
//!
//! ```text
//! AtomicETH:    VA(0-7) R_Key(8-11) Swap/Add Data(12-19) Compare Data(20-27)
//! AtomicAckETH: Original Remote Data(0-7)
//! ```
//!
//! AtomicETH is 28 bytes, so its 64-bit fields are not 8-byte aligned in the packet; the
//! views copy bytes rather than casting.

use crate::be;
use crate::view::header_view;
use crate::{HeaderKind, WireError};

mod field {
    pub const VA: usize = 0;
    pub const RKEY: usize = 8;
    pub const SWAP_ADD: usize = 12;
    pub const COMPARE: usize = 20;
    pub const ORIG: usize = 0;
}

header_view!(
    /// Zero-copy view of an AtomicETH (IBA 9.3).
    AtomicEth,
    HeaderKind::AtomicEth
);

impl<T: AsRef<[u8]>> AtomicEth<T> {
    /// VA of the 8-byte target (must be 8-byte aligned, checked by the responder).
    pub fn va(&self) -> u64 {
        be::u64_at(self.buffer.as_ref(), field::VA)
    }

    /// R_Key.
    pub fn rkey(&self) -> u32 {
        be::u32_at(self.buffer.as_ref(), field::RKEY)
    }

    /// Swap (CmpSwap) or Add (FetchAdd) data.
    pub fn swap_add(&self) -> u64 {
        be::u64_at(self.buffer.as_ref(), field::SWAP_ADD)
    }

    /// Compare data (CmpSwap only; FetchAdd ignores it).
    pub fn compare(&self) -> u64 {
        be::u64_at(self.buffer.as_ref(), field::COMPARE)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEth<T> {
    /// Sets VA.
    pub fn set_va(&mut self, va: u64) {
        be::put_u64(self.buffer.as_mut(), field::VA, va);
    }

    /// Sets R_Key.
    pub fn set_rkey(&mut self, rkey: u32) {
        be::put_u32(self.buffer.as_mut(), field::RKEY, rkey);
    }

    /// Sets Swap/Add data.
    pub fn set_swap_add(&mut self, v: u64) {
        be::put_u64(self.buffer.as_mut(), field::SWAP_ADD, v);
    }

    /// Sets Compare data.
    pub fn set_compare(&mut self, v: u64) {
        be::put_u64(self.buffer.as_mut(), field::COMPARE, v);
    }
}

/// Owned content of an AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicEthRepr {
    /// Remote virtual address.
    pub va: u64,
    /// R_Key.
    pub rkey: u32,
    /// Swap or Add data.
    pub swap_add: u64,
    /// Compare data.
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Reads an AtomicETH.
    pub fn parse<T: AsRef<[u8]>>(view: &AtomicEth<T>) -> Result<Self, WireError> {
        view.check_len()?;
        Ok(Self {
            va: view.va(),
            rkey: view.rkey(),
            swap_add: view.swap_add(),
            compare: view.compare(),
        })
    }

    /// Writes an AtomicETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        view: &mut AtomicEth<T>,
    ) -> Result<(), WireError> {
        view.check_len()?;
        view.set_va(self.va);
        view.set_rkey(self.rkey);
        view.set_swap_add(self.swap_add);
        view.set_compare(self.compare);
        Ok(())
    }

    /// Bytes [`Self::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HeaderKind::AtomicEth.wire_len()
    }
}

header_view!(
    /// Zero-copy view of an AtomicAckETH (IBA 9.3).
    AtomicAckEth,
    HeaderKind::AtomicAckEth
);

impl<T: AsRef<[u8]>> AtomicAckEth<T> {
    /// Original Remote Data: the target's value before the atomic.
    pub fn orig(&self) -> u64 {
        be::u64_at(self.buffer.as_ref(), field::ORIG)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEth<T> {
    /// Sets Original Remote Data.
    pub fn set_orig(&mut self, v: u64) {
        be::put_u64(self.buffer.as_mut(), field::ORIG, v);
    }
}

/// Owned content of an AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicAckEthRepr {
    /// Original Remote Data.
    pub orig: u64,
}

impl AtomicAckEthRepr {
    /// Reads an AtomicAckETH.
    pub fn parse<T: AsRef<[u8]>>(view: &AtomicAckEth<T>) -> Result<Self, WireError> {
        view.check_len()?;
        Ok(Self { orig: view.orig() })
    }

    /// Writes an AtomicAckETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        view: &mut AtomicAckEth<T>,
    ) -> Result<(), WireError> {
        view.check_len()?;
        view.set_orig(self.orig);
        Ok(())
    }

    /// Bytes [`Self::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HeaderKind::AtomicAckEth.wire_len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_eth_round_trip_unaligned_fields() {
        let repr = AtomicEthRepr {
            va: 0x1000_2000_3000_4008,
            rkey: 0xDEAD_BEEF,
            swap_add: 0x0102_0304_0506_0708,
            compare: u64::MAX - 1,
        };
        let mut buf = [0u8; 28];
        repr.emit(&mut AtomicEth::new_unchecked(&mut buf[..]))
            .unwrap();
        assert_eq!(&buf[12..20], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            AtomicEthRepr::parse(&AtomicEth::new_checked(&buf[..]).unwrap()),
            Ok(repr)
        );
    }

    #[test]
    fn atomic_ack_eth_round_trip() {
        let repr = AtomicAckEthRepr {
            orig: 0x8877_6655_4433_2211,
        };
        let mut buf = [0u8; 8];
        repr.emit(&mut AtomicAckEth::new_unchecked(&mut buf[..]))
            .unwrap();
        assert_eq!(buf[0], 0x88);
        assert_eq!(
            AtomicAckEthRepr::parse(&AtomicAckEth::new_checked(&buf[..]).unwrap()),
            Ok(repr)
        );
    }

    #[test]
    fn truncated() {
        assert!(matches!(
            AtomicEth::new_checked(&[0u8; 27][..]),
            Err(WireError::Truncated {
                header: HeaderKind::AtomicEth,
                needed: 28,
                available: 27
            })
        ));
        assert!(matches!(
            AtomicAckEth::new_checked(&[0u8; 4][..]),
            Err(WireError::Truncated {
                header: HeaderKind::AtomicAckEth,
                needed: 8,
                available: 4
            })
        ));
    }
}
