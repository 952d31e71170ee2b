//! 24-bit packet sequence number arithmetic (IBA 9.7, PSN rules: PSNs wrap modulo 2^24, and a
//! responder treats the 2^23 values behind the expected PSN as duplicates and the rest as
//! ahead of it; docs/design/roce-wire.md §4).

use core::cmp::Ordering;

/// PSN space mask.
pub const PSN_MASK: u32 = 0x00FF_FFFF;

/// `psn + n` modulo 2^24.
pub const fn psn_add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & PSN_MASK
}

/// Signed distance `a - b` in the 24-bit circle, in `-2^23 ..= 2^23 - 1`.
pub const fn psn_diff(a: u32, b: u32) -> i32 {
    // Shifting the 24-bit difference into the top of an i32 makes the sign bit the
    // half-space indicator; shifting back sign-extends.
    ((a.wrapping_sub(b) << 8) as i32) >> 8
}

/// Orders `a` relative to `b` within the half-space around `b`.
pub const fn psn_cmp(a: u32, b: u32) -> Ordering {
    let d = psn_diff(a, b);
    if d < 0 {
        Ordering::Less
    } else if d > 0 {
        Ordering::Greater
    } else {
        Ordering::Equal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps() {
        assert_eq!(psn_add(PSN_MASK, 1), 0);
        assert_eq!(psn_add(PSN_MASK - 1, 5), 3);
        assert_eq!(psn_diff(0, PSN_MASK), 1);
        assert_eq!(psn_diff(PSN_MASK, 0), -1);
        assert_eq!(psn_diff(0x80_0000, 0), -0x80_0000);
        assert_eq!(psn_diff(0x7F_FFFF, 0), 0x7F_FFFF);
        assert_eq!(psn_cmp(2, PSN_MASK), Ordering::Greater);
        assert_eq!(psn_cmp(PSN_MASK, 2), Ordering::Less);
        assert_eq!(psn_cmp(7, 7), Ordering::Equal);
    }
}
