//! The same-host direct path's shared layout (docs/design/direct-path.md): the channel memfd the
//! daemon makes for a connected pair of RC or UC QPs, and the per-context MR table.
//!
//! A channel is a header page of state words, each in its own 128-byte block, then four
//! single-producer/single-consumer rings (`softverbs_shm` rings): each side's receive ring
//! (produced by its owner's `post_recv`, consumed by the peer's library when it delivers a
//! SEND or a WRITE with immediate) and each side's receive-completion ring (produced by the
//! peer's library, consumed by the owner's `poll_cq`).

pub mod inline;
mod ops;
pub use ops::*;

/// Not decided yet (a daemon of this ABI decides at the first ask; kept for the library's
/// sake, which waits on the word while it reads this).
pub const PATH_UNDECIDED: u32 = 0;
/// The pair goes direct.
pub const PATH_DIRECT: u32 = 1;
/// The pair stays on the daemon's engine.
pub const PATH_DAEMON: u32 = 2;
/// ABI 17: the QP is connected to another host and its library runs the transport engine
/// for it (docs/design/net-path.md). Since ABI 20 the descriptor of the answer (the context's first
/// one only) is a private UDP socket bound to the device's address and an ephemeral port:
/// the library sends from it to its peers' device port (`DirectAttachResp::net_port`), and
/// the daemon forwards the QP's packets to it from that port. No channel.
pub const PATH_NET: u32 = 3;

/// ABI 17: [`DirectAttachReq::able`](crate::msg::DirectAttachReq) bit: the library can run
/// the engine for an RC QP connected to another host ([`PATH_NET`]).
pub const ABLE_NET: u32 = 2;
/// ABI 20: [`DirectAttachReq::able`](crate::msg::DirectAttachReq) bit, with [`ABLE_NET`]:
/// the library runs the net path over a private socket and takes the packets the daemon
/// forwards (docs/design/net-path.md, "Receiving"). A daemon gives [`PATH_NET`] only with it: a
/// library of ABI 17–19 expects a socket of the device's reuseport group, which no daemon
/// hands out any more (issue 35, item 1).
pub const ABLE_NET_FORWARDED: u32 = 4;
/// [`DirectAttachReq::able`](crate::msg::DirectAttachReq) bit (issue 35, item 7): the
/// library publishes its net-path engine's state in a net status region
/// ([`NS_LEN`] bytes) the daemon makes with the context's socket and hands over as one more
/// descriptor (`DirectAttachResp::status_len`), so that the daemon can answer for a process
/// that stopped running (docs/design/net-path.md, "Stalls"). A daemon that does not know the bit
/// leaves `status_len` 0.
pub const ABLE_NET_STATUS: u32 = 8;

/// Net status region: when the library last ran a round or woke its progress thread
/// (`u64`, `CLOCK_MONOTONIC` nanoseconds; 0: never).
pub const NS_RAN: usize = 0;
/// Net status region: the time the daemon — the forwarder every packet of the context's
/// net-path QPs passes — could not run, in total (`u64` nanoseconds, written by the daemon
/// only, as it finds each of its own stalls): the library's requester timers move by
/// what it grew since its last round, as by the library's own stalls, since an ACK that
/// waited in a stalled forwarder is no silence of the peer (docs/design/net-path.md, "Stalls").
/// A library scribble reaches only that library's own timers.
pub const NS_DAEMON_LOST: usize = 8;
/// Net status region: the device's retry floor (`softverbs_transport::time::RETRY_FLOOR`,
/// the daemon's `--retry-floor-ms`) as `u64` nanoseconds with [`NS_FLOOR_SET`], written by
/// the daemon when it makes the region; the library's engine retries by it (issue 35,
/// item 7). Without the bit (an older daemon) the library keeps its default. A library
/// that scribbles it changes only its own QPs' patience.
pub const NS_RETRY_FLOOR: usize = 16;
/// [`NS_RETRY_FLOOR`]'s bit for "set" (so that a floor of zero can be said).
pub const NS_FLOOR_SET: u64 = 1 << 63;
/// Net status region: first slot.
pub const NS_SLOTS: usize = 64;
/// Net status region: bytes per slot, one per QP the library's engine runs: `u64` the QP
/// number with [`NS_VALID`] (0: a free slot), then `u64` the responder's expected PSN
/// (high 32 bits) and MSN (low 32 bits), both 24-bit values (IBA 9.7.5.1.1, 9.7.4.1.1).
/// Written by the library only, read by the daemon as untrusted input: a scribble reaches
/// only answers the daemon gives for that context's own QPs.
pub const NS_SLOT: usize = 16;
/// Net status region: slots; a library with more QPs on the path leaves the rest
/// unpublished (the daemon then cannot answer for them).
pub const NS_CAPACITY: usize = 1024;
/// Net status region: [`NS_SLOT`]'s first word of a slot in use.
pub const NS_VALID: u64 = 1 << 32;
/// Net status region: bytes of the memfd.
pub const NS_LEN: usize = NS_SLOTS + NS_CAPACITY * NS_SLOT;

/// [`DirectAttachReq::able`](crate::msg::DirectAttachReq) bit (issue 36 item 5), with
/// [`ABLE_NET_STATUS`]: the library publishes its net-path QPs' counters in the net status
/// region, which the daemon then makes [`NS_LEN_COUNTERS`] bytes long (`status_len` says
/// which it made), so that `softverbs stat` shows what the libraries' engines counted
/// (docs/guide/counters.md). A daemon that does not know the bit makes [`NS_LEN`].
pub const ABLE_NET_COUNTERS: u32 = 16;
/// Net status region: `u64` words per counter block, in the order of
/// `softverbs_transport::Counters::NAMES` (the unused tail stays 0).
pub const NS_COUNTER_WORDS: usize = 32;
/// Net status region: the first counter block; slot `i`'s QP's counters are at
/// `NS_COUNTERS + i * NS_COUNTER_WORDS * 8`, valid while the slot is. Written by the library
/// only; the daemon reads them as untrusted input (they reach only the figures it shows
/// for that context's own QPs and their port's sums).
pub const NS_COUNTERS: usize = NS_LEN;
/// Net status region: one counter block, the sums of the library's QPs that left its
/// engine (destroyed, or reset), so that a port's totals keep them.
pub const NS_RETIRED: usize = NS_COUNTERS + NS_CAPACITY * NS_COUNTER_WORDS * 8;
/// Net status region with counters: bytes of the memfd.
pub const NS_LEN_COUNTERS: usize = NS_RETIRED + NS_COUNTER_WORDS * 8;

/// [`DirectAttachReq::able`](crate::msg::DirectAttachReq) bit: the library can run the QP
/// on the same-host direct path (what `able == 1` meant before ABI 17).
pub const ABLE_DIRECT: u32 = 1;

/// Header word (`u32`): the path of the pair, one of the `PATH_*` values; written by the
/// daemon only.
pub const CH_PATH: usize = 0;
/// Header word (`u32`) per side: [`SIDE_OPEN`], [`SIDE_ERROR`] or [`SIDE_GONE`].
pub const CH_STATE: [usize; 2] = [128, 256];
/// Header word (`u32`) per side: 1 while that side's library is taking entries from the
/// peer's receive ring (the peer, flushing its receive queue, waits for 0).
pub const CH_BUSY: [usize; 2] = [384, 512];
/// Header word (`u32`) per side: that side's QP access flags (`ibv_access_flags`) as the
/// daemon knew them when the pair was decided; the requester checks the responder's.
pub const CH_ACCESS: [usize; 2] = [640, 768];
/// Header word (`u32`) per side, written by that side's library (ABI 14): 1 once it
/// places the SENDs its peer leaves in its inline slots ([`inline`]); a peer sends inline
/// only to a side that says so (a library that predates the slots leaves it 0).
pub const CH_INLINE: [usize; 2] = [896, 1024];
/// [`DirectPeerErrorReq::event`](crate::msg::DirectPeerErrorReq) when the peer fails with
/// no async event.
pub const NO_EVENT: u32 = u32::MAX;
/// Header block per side (ABI 16): the receive that side's library took from its peer's
/// SRQ and has not completed yet — a `u32` flag (1 while held) and at +8 the receive's
/// `wr_id` (`u64`) — so the peer, finding that library's process gone, completes it with
/// `WR_FLUSH_ERR` instead of losing it (docs/design/direct-path.md, "SRQs").
pub const CH_SRQ_HELD: [usize; 2] = [1920, 2048];
/// Header words per side (issue 36 item 5): that side's QP's request messages completed
/// (`u64`, `rdma_sends`), bumped by that side's own library (docs/guide/counters.md).
pub const CH_SENT: [usize; 2] = [2176, 2304];
/// Header words per side: that side's QP's requests executed as responder — `u64`s
/// `rdma_recvs`, `rx_write_requests`, `rx_read_requests`, `rx_atomic_requests` — bumped by
/// the peer's library, which executes its requests there. Counters only: the daemon reads
/// them for `softverbs stat`, nothing acts on them.
pub const CH_RCVD: [usize; 2] = [2432, 2560];
/// Words at [`CH_RCVD`].
pub const CH_RCVD_WORDS: usize = 4;
/// Bytes before the first ring.
pub const CH_HEADER: usize = 4096;

/// [`DirectOpenReq::caps`](crate::msg::DirectOpenReq): the library takes receives from a
/// peer's SRQ and lets its own SRQ QPs go direct (ABI 16).
pub const CAP_SRQ: u32 = 1;
/// [`DirectOpenReq::caps`](crate::msg::DirectOpenReq): the library reads stamped channel
/// rings (ABI 19, `softverbs_shm::RingLayout::stamped`, docs/design/direct-path.md "Stamped rings").
pub const CAP_STAMPED: u32 = 2;
/// `DirectAttachResp::rings`: the channel's receive and receive-completion rings are stamped
/// (both contexts asked for [`CAP_STAMPED`]).
pub const RINGS_STAMPED: u32 = 1;

/// An SRQ's region (ABI 16) is its ring at offset 0, then, at the offset this returns for
/// the ring's size, its limit word (`u32`): the armed `srq_limit`, 0 when disarmed. Whoever
/// takes a receive — the daemon's engine or a peer's library — and leaves fewer posted than
/// the limit swaps it to 0 and raises the event (IBA 10.2.9.4, ibv_modify_srq(3)).
pub fn srq_limit_offset(ring_size: usize) -> usize {
    ring_size.next_multiple_of(128)
}
/// Bytes of an SRQ's region whose ring is `ring_size` bytes.
pub fn srq_region_len(ring_size: usize) -> usize {
    (srq_limit_offset(ring_size) + 128).max(4096)
}

/// The side's QP takes and delivers work.
pub const SIDE_OPEN: u32 = 0;
/// The side's QP is in the error state (moved by its owner, or after a request broke a
/// rule): the peer delivers nothing more to it.
pub const SIDE_ERROR: u32 = 1;
/// The side's QP or context is gone (destroyed, or the process died: written by the daemon).
pub const SIDE_GONE: u32 = 2;
/// The side's library has not attached yet (its QP is not at RTR): the peer's requests wait,
/// as they would retry against a responder that is not ready.
pub const SIDE_PENDING: u32 = 3;

/// MR table: seqlock word (`u64`, odd while the daemon rewrites the table).
pub const MRT_SEQ: usize = 0;
/// MR table: number of valid entries (`u32`).
pub const MRT_COUNT: usize = 8;
/// MR table: first entry.
pub const MRT_ENTRIES: usize = 64;
/// [`MrEntry::flags`]: the daemon holds a memfd of the MR's pages (registered as shared
/// memory); a peer library may map it (`DirectMrFd`).
pub const MR_SHARED: u32 = 1;
/// MR table: bytes per entry: key `u32`, PD handle `u32`, access `u32`, flags `u32`, iova `u64`,
/// length `u64`, address `u64`, 0 `u64` (little-endian).
pub const MRT_ENTRY: usize = 48;
/// MR table: entries at most; MRs beyond are not reachable on the direct path (their keys
/// fail as unknown keys would), so a context with more stays on the daemon path
/// ([`crate::msg::cmd::DirectAttach`] answers `PATH_DAEMON`).
pub const MRT_CAPACITY: usize = 4096;
/// MR table: bytes of the memfd.
pub const MRT_LEN: usize = MRT_ENTRIES + MRT_CAPACITY * MRT_ENTRY;

/// One MR as the table holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MrEntry {
    /// L_Key and R_Key (softverbs uses one key for both).
    pub key: u32,
    /// PD handle in the owner's context.
    pub pd: u32,
    /// `ibv_access_flags`.
    pub access: u32,
    /// [`MR_SHARED`] or 0 (ABI 14; an older daemon writes 0).
    pub flags: u32,
    /// First byte as peers and work requests address it.
    pub iova: u64,
    /// Bytes.
    pub len: u64,
    /// Where the bytes are in the owner's address space.
    pub addr: u64,
}

impl MrEntry {
    /// The entry's bytes.
    pub fn encode(&self) -> [u8; MRT_ENTRY] {
        let mut b = [0u8; MRT_ENTRY];
        b[0..4].copy_from_slice(&self.key.to_le_bytes());
        b[4..8].copy_from_slice(&self.pd.to_le_bytes());
        b[8..12].copy_from_slice(&self.access.to_le_bytes());
        b[12..16].copy_from_slice(&self.flags.to_le_bytes());
        b[16..24].copy_from_slice(&self.iova.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..40].copy_from_slice(&self.addr.to_le_bytes());
        b
    }

    /// Reads an entry back.
    pub fn decode(b: &[u8; MRT_ENTRY]) -> MrEntry {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        MrEntry {
            key: u32_at(0),
            pd: u32_at(4),
            access: u32_at(8),
            flags: u32_at(12),
            iova: u64_at(16),
            len: u64_at(24),
            addr: u64_at(32),
        }
    }

    /// Where `[iova, iova + len)` lies in the owner's address space, if the MR covers it
    /// (IBA 10.6.3: bounds are checked against the region as registered).
    pub fn translate(&self, iova: u64, len: u64) -> Option<u64> {
        let off = iova.checked_sub(self.iova)?;
        if off.checked_add(len)? > self.len {
            return None;
        }
        self.addr.checked_add(off)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_bounds_are_checked() {
        let e = MrEntry {
            key: 7,
            pd: 3,
            access: 0xf,
            flags: MR_SHARED,
            iova: 0x1000,
            len: 64,
            addr: 0x7f00_0000,
        };
        assert_eq!(MrEntry::decode(&e.encode()), e);
        assert_eq!(e.translate(0x1000, 64), Some(0x7f00_0000));
        assert_eq!(e.translate(0x1010, 16), Some(0x7f00_0010));
        assert_eq!(e.translate(0x1010, 64), None, "past the end");
        assert_eq!(e.translate(0xfff, 1), None, "before the start");
        assert_eq!(e.translate(u64::MAX, 2), None, "overflow");
    }

    /// Every header word has its own 128-byte block inside the header page: two words
    /// sharing a block (or an offset) would let one side's writes clobber another field.
    #[test]
    fn header_words_have_distinct_blocks() {
        let mut words = vec![CH_PATH];
        for w in [
            CH_STATE,
            CH_BUSY,
            CH_ACCESS,
            CH_INLINE,
            CH_MIN_RNR,
            CH_WAITING,
            CH_RECV_CHANNEL,
            CH_SRQ_HELD,
        ] {
            words.extend(w);
        }
        let mut blocks: Vec<usize> = words.iter().map(|w| w / 128).collect();
        assert!(words.iter().all(|w| w % 128 == 0 && w + 4 <= CH_HEADER));
        blocks.sort_unstable();
        blocks.dedup();
        assert_eq!(blocks.len(), words.len(), "{words:?}");
    }
}
