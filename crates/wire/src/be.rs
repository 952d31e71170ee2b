//! Big-endian field access for the header views.
//!
//! IBA 9.2: every transport header field is transmitted most significant byte first.
//! Callers guarantee the slice is long enough (the views check their length up front), so
//! these index directly.

pub(crate) const U24_MASK: u32 = 0x00FF_FFFF;

pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

pub(crate) fn u24_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(raw)
}

pub(crate) fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Writes the low 24 bits; the caller decides what happens to the byte above them.
pub(crate) fn put_u24(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}

pub(crate) fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

pub(crate) fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

/// Emit-side guard for fields narrower than their Rust type, so a caller bug (say a 32-bit
/// QPN) is reported instead of silently truncated on the wire.
pub(crate) fn check_bits(
    field: &'static str,
    value: u64,
    bits: u8,
) -> Result<(), crate::WireError> {
    if value >> bits == 0 {
        Ok(())
    } else {
        Err(crate::WireError::FieldOutOfRange { field, value, bits })
    }
}
