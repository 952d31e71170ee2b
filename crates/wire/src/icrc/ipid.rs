//! Solving for the IPv4 identification a received RoCE v2 packet's ICRC was computed with,
//! when the receiver cannot see it (a UDP socket hides the IP header;
//! docs/design/roce-wire.md §6).
//!
//! The CRC register update is affine over GF(2): for two messages of the same length the
//! registers differ by the CRC (zero initial value, no final xor) of the messages' xor.
//! Two versions of one packet that differ only in the identification therefore have ICRCs
//! that differ by a linear function of the 16 identification bits, seen through the bytes
//! that follow the field. Moving the difference of the received and the identification-0
//! ICRC back over those `T` bytes (multiplying by the inverse of "one zero byte", raised to
//! the `T`-th power with precomputed `2^k` powers, the idea behind zlib's `crc32_combine`)
//! leaves a 32-bit syndrome that must be a combination of 16 fixed vectors, one per
//! identification bit. Gaussian elimination finds the combination, or shows there is none.
//!
//! CRC-32 detects every burst error of up to 32 bits, so no nonzero change confined to the
//! 16 identification bits leaves the ICRC unchanged: the 16 vectors are independent and a
//! solution, when there is one, is unique. Only 16 of the 32 bits remain as a check.

/// The reflected CRC-32 polynomial (Ethernet, zlib; IBA 7.8.1).
const POLY: u32 = 0xEDB8_8320;

/// `TABLE[b]`: the register after one byte `b` from a zero register, the usual
/// byte-at-a-time table. It is linear in `b`.
const TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// A 32×32 matrix over GF(2), as its columns: `m[i]` is the image of bit `i`.
type Matrix = [u32; 32];

const fn apply(m: &Matrix, v: u32) -> u32 {
    let mut out = 0;
    let mut i = 0;
    while i < 32 {
        if v & (1 << i) != 0 {
            out ^= m[i];
        }
        i += 1;
    }
    out
}

const fn square(m: &Matrix) -> Matrix {
    let mut out = [0u32; 32];
    let mut i = 0;
    while i < 32 {
        out[i] = apply(m, m[i]);
        i += 1;
    }
    out
}

/// The register one zero byte earlier: the inverse of `r -> TABLE[r & 0xff] ^ (r >> 8)`.
/// The top byte of the result came only from `TABLE[r & 0xff]`, whose top bytes are all
/// distinct, so it names the low byte that was shifted out.
const fn unstep(r: u32) -> u32 {
    let top = r >> 24;
    let mut b = 0;
    while b < 256 {
        if TABLE[b] >> 24 == top {
            return ((r ^ TABLE[b]) << 8) | b as u32;
        }
        b += 1;
    }
    unreachable!()
}

/// Powers of "back over one zero byte": `BACK[k]` goes back over `2^k` bytes. 2^17 bytes
/// exceed any UDP datagram.
const BACK: [Matrix; 17] = {
    let mut one = [0u32; 32];
    let mut i = 0;
    while i < 32 {
        one[i] = unstep(1 << i);
        i += 1;
    }
    let mut p = [[0u32; 32]; 17];
    p[0] = one;
    let mut k = 1;
    while k < 17 {
        p[k] = square(&p[k - 1]);
        k += 1;
    }
    p
};

/// Effect of identification bit `k` on the register right after the field: the low byte
/// (bits 0–7) is the field's second byte (network order), the high byte passes through one
/// more byte step.
const BASIS: [u32; 16] = {
    let mut b = [0u32; 16];
    let mut k = 0;
    while k < 8 {
        b[k] = TABLE[1 << k];
        let hi = TABLE[1 << k];
        b[k + 8] = TABLE[(hi & 0xff) as usize] ^ (hi >> 8);
        k += 1;
    }
    b
};

/// [`BASIS`] in echelon form: `(pivot bit, vector, identification bits combined)`, each
/// vector clear of every earlier pivot bit. All 16 are independent (see the module doc).
const ECHELON: [(u32, u32, u16); 16] = {
    let mut e = [(0u32, 0u32, 0u16); 16];
    let mut k = 0;
    while k < 16 {
        let mut v = BASIS[k];
        let mut m: u16 = 1 << k;
        let mut j = 0;
        while j < k {
            if v & e[j].0 != 0 {
                v ^= e[j].1;
                m ^= e[j].2;
            }
            j += 1;
        }
        assert!(v != 0, "identification bits dependent");
        e[k] = (v & v.wrapping_neg(), v, m);
        k += 1;
    }
    e
};

/// The identification `x` such that changing the identification from the one the ICRC was
/// computed with by `x` (xor) changes the ICRC by `diff`, where `after` bytes follow the
/// field in the ICRC's input. `None` when no identification explains `diff`.
pub(super) fn solve(diff: u32, after: usize) -> Option<u16> {
    let mut s = diff;
    let mut k = 0;
    let mut n = after;
    while n != 0 {
        if n & 1 != 0 {
            s = apply(BACK.get(k)?, s);
        }
        n >>= 1;
        k += 1;
    }
    let mut x = 0u16;
    for &(pivot, v, m) in &ECHELON {
        if s & pivot != 0 {
            s ^= v;
            x ^= m;
        }
    }
    (s == 0).then_some(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_crc32fasts() {
        // One byte then zeros, complemented at both ends, is crc32fast's CRC-32.
        for b in [0u8, 1, 0x80, 0xA5, 0xFF] {
            let mut r = !0u32;
            r = TABLE[((r ^ u32::from(b)) & 0xff) as usize] ^ (r >> 8);
            assert_eq!(!r, crc32fast::hash(&[b]));
        }
    }

    #[test]
    fn back_undoes_zero_bytes() {
        for (n, r0) in [
            (1usize, 0x1234_5678u32),
            (3, 0xdead_beef),
            (1000, 1),
            (65_535, !0),
        ] {
            let mut r = r0;
            for _ in 0..n {
                r = TABLE[(r & 0xff) as usize] ^ (r >> 8);
            }
            let mut s = r;
            for (k, m) in BACK.iter().enumerate() {
                if n & (1 << k) != 0 {
                    s = apply(m, s);
                }
            }
            assert_eq!(s, r0, "{n} bytes");
        }
    }
}
