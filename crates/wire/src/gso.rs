//! UDP GSO batches of RoCE packets: what one `sendmsg` with `UDP_SEGMENT` may carry, and the
//! rule both senders of softverbs follow — the daemon's devices (`crates/daemon/src/netdev.rs`)
//! and the net path's socket (`crates/client/src/direct/udp.rs`, docs/design/net-path.md,
//! "Batching"). Which destination a batch is for is the sender's business; this is the shape.

/// Most segments of one GSO send (`UDP_MAX_SEGMENTS`, include/linux/udp.h): also the range
/// of IPv4 identifications a softverbs sender gives its packets (segment *i* gets *i*).
pub const MAX_SEGMENTS: usize = 64;

/// Most UDP payload bytes of one GSO send (an IPv4 datagram's 65,535 less its headers).
pub const MAX_BATCH_BYTES: usize = 65_507;

/// Whether a packet of `len` bytes may join a batch of segments `lens` (`used` bytes in
/// all): room for one more segment and its bytes, and segments of one size — the kernel
/// cuts a GSO send at the first segment's size, so only the last may be shorter, and a
/// shorter one ends the batch. An empty batch takes nothing here: it starts with the first
/// packet, whatever its size.
pub fn joins(lens: &[usize], used: usize, len: usize) -> bool {
    lens.len() < MAX_SEGMENTS
        && used + len <= MAX_BATCH_BYTES
        && lens.first().is_some_and(|&l| len <= l)
        && lens.last() == lens.first()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_takes_packets_of_its_size_until_a_shorter_one_or_a_limit() {
        assert!(!joins(&[], 0, 100), "an empty batch is started, not joined");
        assert!(joins(&[1000], 1000, 1000));
        assert!(joins(&[1000, 1000], 2000, 600), "a shorter last segment");
        assert!(
            !joins(&[1000, 600], 1600, 600),
            "nothing behind a shorter one"
        );
        assert!(!joins(&[1000], 1000, 1001), "nothing longer than the first");
        assert!(!joins(&[1000; MAX_SEGMENTS], 64_000, 1000), "segment limit");
        assert!(!joins(&[4096; 15], 61_440, 4096), "byte limit");
        assert!(joins(&[4096; 15], 61_440, 4067));
    }
}
