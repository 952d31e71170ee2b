//! Small SENDs with no system call (docs/design/direct-path.md, "Small SENDs"): the sender leaves
//! the payload of a SEND of at most [`INLINE_MAX`] bytes, and the receive SGEs it goes to,
//! in the inline slot of the receive completion it pushes
//! (`softverbs_abi::direct::inline`); the receiver's library copies the bytes into its own
//! receive buffer when it takes the completion, before the program can see it.
//!
//! Order with what the sender places itself (a larger SEND, a WRITE, a READ's source): the
//! sender first *settles* every slot it filled that the receiver has not placed yet — it
//! takes the slot and places the bytes itself (`pwritev`, or `memcpy` into a mapped MR) —
//! so data reaches the receiver's memory in posting order whoever copies it, and the
//! receiver hands out a completion only once its slot is free.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use softverbs_abi::direct::inline::*;
use softverbs_shm::Region;

/// What this library writes to its `CH_INLINE` word: it places slots, near payloads too,
/// and frees each slot before it pops the slot's entry.
pub(super) const PLACES: u32 = INLINE_FREES_FIRST;

/// How long a party waits for the other to finish placing one slot (a copy of at most
/// [`INLINE_MAX`] bytes; longer only if that process is descheduled or dead).
const SETTLE_WAIT: Duration = Duration::from_secs(1);

/// One receive SGE a slot's payload goes to, as the receive named it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Piece {
    pub(super) lkey: u32,
    pub(super) addr: u64,
    pub(super) len: u64,
}

/// The inline slots of one side's receive-completion ring.
#[derive(Debug)]
pub(super) struct Slots {
    region: Arc<Region>,
    offset: usize,
    capacity: u32,
}

/// Why a slot's bytes were not placed by the one who asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failed {
    /// The other party was placing it and never finished (it died, or stalled past
    /// [`SETTLE_WAIT`]).
    Stuck,
    /// The sender could not place it ([`SLOT_FAILED`]).
    Unplaced,
}

/// What a slot held when it was taken: fixed arrays, not vectors (one is taken for every
/// small SEND received, and their allocations were a measurable part of the round trip).
#[derive(Debug)]
pub(super) struct Taken {
    pieces: [Piece; INLINE_PIECES],
    npieces: usize,
    payload: [u8; INLINE_MAX],
    len: usize,
}

impl Default for Taken {
    fn default() -> Taken {
        Taken {
            pieces: [Piece::default(); INLINE_PIECES],
            npieces: 0,
            payload: [0u8; INLINE_MAX],
            len: 0,
        }
    }
}

impl Taken {
    /// The receive's pieces the payload goes to, in order.
    pub(super) fn pieces(&self) -> &[Piece] {
        &self.pieces[..self.npieces]
    }

    /// The SEND's bytes.
    pub(super) fn payload(&self) -> &[u8] {
        &self.payload[..self.len]
    }
}

impl Slots {
    /// The slots at `offset` of the channel, one per entry of a ring of `capacity`; `None`
    /// when the daemon made none (`slot` 0) or they do not fit the region.
    pub(super) fn new(region: Arc<Region>, offset: u32, capacity: u32, slot: u32) -> Option<Slots> {
        if slot as usize != INLINE_SLOT || capacity == 0 {
            return None;
        }
        let end = (offset as usize).checked_add(capacity as usize * INLINE_SLOT)?;
        (end <= region.len() && offset as usize % 128 == 0).then_some(Slots {
            region,
            offset: offset as usize,
            capacity,
        })
    }

    fn base(&self, index: u32) -> usize {
        self.offset + (index % self.capacity) as usize * INLINE_SLOT
    }

    fn state(&self, index: u32) -> &std::sync::atomic::AtomicU32 {
        self.region.atomic_u32(self.base(index) + SLOT_STATE)
    }

    /// Whether the slot of ring entry `index` is free.
    pub(super) fn is_free(&self, index: u32) -> bool {
        self.state(index).load(Ordering::Acquire) == SLOT_FREE
    }

    /// Sender: fills the free slot of ring entry `index` (the next one it will push); `near`
    /// (the receiver reads near payloads): a payload that fits goes right behind the pieces,
    /// in the lines the receiver reads for the slot's state and pieces anyway.
    pub(super) fn fill(&self, index: u32, pieces: &[Piece], payload: &[u8], near: bool) {
        debug_assert!(pieces.len() <= INLINE_PIECES && payload.len() <= INLINE_MAX);
        let b = self.base(index);
        let r = &self.region;
        let at = near
            .then(|| near_offset(pieces.len(), payload.len()))
            .flatten();
        r.atomic_u32(b + SLOT_PAYLOAD_AT)
            .store(at.unwrap_or(0) as u32, Ordering::Relaxed);
        r.atomic_u32(b + SLOT_NPIECES)
            .store(pieces.len() as u32, Ordering::Relaxed);
        r.atomic_u32(b + SLOT_LEN)
            .store(payload.len() as u32, Ordering::Relaxed);
        for (i, p) in pieces.iter().enumerate() {
            let at = b + SLOT_PIECES + i * PIECE;
            r.atomic_u32(at).store(p.lkey, Ordering::Relaxed);
            r.atomic_u32(at + 4).store(p.len as u32, Ordering::Relaxed);
            r.atomic_u64s(at + 8, 1)[0].store(p.addr, Ordering::Relaxed);
        }
        r.write(b + at.unwrap_or(SLOT_PAYLOAD), payload);
        // Release: the bytes above before the state (and the ring entry pushed after it).
        self.state(index).store(SLOT_FILLED, Ordering::Release);
    }

    fn read(&self, index: u32, t: &mut Taken) {
        let b = self.base(index);
        let r = &self.region;
        let n =
            (r.atomic_u32(b + SLOT_NPIECES).load(Ordering::Relaxed) as usize).min(INLINE_PIECES);
        let len = (r.atomic_u32(b + SLOT_LEN).load(Ordering::Relaxed) as usize).min(INLINE_MAX);
        // Where the payload is: only the offsets a sender writes are taken, and a near
        // payload ends within the slot's head (a peer that wrote anything else gets a length
        // its pieces do not add up to, and the receive fails `LOC_PROT_ERR`, `place_own`).
        let (at, len) = match r.atomic_u32(b + SLOT_PAYLOAD_AT).load(Ordering::Relaxed) as usize {
            0 => (SLOT_PAYLOAD, len),
            at if SLOT_NEAR.contains(&at) => (at, len.min(SLOT_PAYLOAD - at)),
            _ => (SLOT_PAYLOAD, 0),
        };
        t.npieces = n;
        t.len = len;
        for (i, p) in t.pieces[..n].iter_mut().enumerate() {
            let at = b + SLOT_PIECES + i * PIECE;
            *p = Piece {
                lkey: r.atomic_u32(at).load(Ordering::Relaxed),
                len: u64::from(r.atomic_u32(at + 4).load(Ordering::Relaxed)),
                addr: r.atomic_u64s(at + 8, 1)[0].load(Ordering::Relaxed),
            };
        }
        r.read(b + at, &mut t.payload[..len]);
    }

    /// Takes the slot of entry `index` for placing (`by` is [`SLOT_RECEIVER`] or
    /// [`SLOT_SENDER`]): `true` with its contents in `t` if it was filled; `false` once it
    /// is free (nothing to place, or the other party placed it: waits while the other is
    /// placing, at most [`SETTLE_WAIT`] or until `gone()` says that party is dead). Into
    /// the caller's `t`, not returned: it is 340 bytes, taken for every small SEND.
    pub(super) fn take(
        &self,
        index: u32,
        by: u32,
        gone: impl Fn() -> bool,
        t: &mut Taken,
    ) -> std::result::Result<bool, Failed> {
        let st = self.state(index);
        // The clock is read only when the other party is placing (never on the common path).
        let mut end = None;
        loop {
            match st.compare_exchange(SLOT_FILLED, by, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    self.read(index, t);
                    return Ok(true);
                }
                Err(SLOT_FREE) => return Ok(false),
                // Only the receiver ever sees this (the sender's slot reuse waits for the
                // receiver's pop, after which the slot is free).
                Err(SLOT_FAILED) => return Err(Failed::Unplaced),
                Err(_) => {
                    let end = *end.get_or_insert_with(|| Instant::now() + SETTLE_WAIT);
                    if gone() || Instant::now() > end {
                        return Err(Failed::Stuck);
                    }
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Sender, between polls that found nothing: takes the line of the slot of ring entry
    /// `index`, known free (the receiver popped the entry that used it last, and frees a
    /// slot before it pops it), for writing ahead of filling it, so the SEND that fills it
    /// does not wait for the line the receiver wrote last. The receiver does not touch a
    /// free slot until it is filled, so the compare-and-swap changes nothing but where the
    /// line is (docs/design/direct-path.md, "Warm lines").
    pub(super) fn warm(&self, index: u32) {
        let _ = self.state(index).compare_exchange(
            SLOT_FREE,
            SLOT_FREE,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// The sender took the slot but placed nothing (see [`SLOT_FAILED`]).
    pub(super) fn failed(&self, index: u32) {
        self.state(index).store(SLOT_FAILED, Ordering::Release);
    }

    /// The slot taken with [`Slots::take`] is placed (or given up): free again.
    pub(super) fn release(&self, index: u32) {
        self.state(index).store(SLOT_FREE, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots() -> Slots {
        let (region, _fd) = Region::create("softverbs-test-slots", 4 * INLINE_SLOT).unwrap();
        Slots::new(Arc::new(region), 0, 4, INLINE_SLOT as u32).unwrap()
    }

    fn piece(n: u64) -> Piece {
        Piece {
            lkey: 7,
            addr: 0x1000 * n,
            len: n,
        }
    }

    /// A receiver that reads near payloads gets what a sender filled either way (a sender
    /// writes near only to such a receiver); an offset no sender writes yields no payload,
    /// so its pieces do not add up and the receive fails.
    #[test]
    fn filled_slots_read_back_near_or_far_and_a_bad_offset_reads_nothing() {
        let s = slots();
        let cases: [(&[Piece], usize, bool, usize); 5] = [
            (&[piece(8)], 8, true, SLOT_NEAR[0]),
            (&[piece(32)], 32, true, SLOT_NEAR[0]),
            (&[piece(1), piece(39)], 40, true, SLOT_NEAR[1]),
            (&[piece(200)], 200, true, SLOT_PAYLOAD),
            (&[piece(8)], 8, false, SLOT_PAYLOAD),
        ];
        for (i, (pieces, len, near, at)) in cases.into_iter().enumerate() {
            let payload: Vec<u8> = (0..len).map(|b| (b + i) as u8).collect();
            let idx = i as u32;
            s.fill(idx, pieces, &payload, near);
            let word = s.region.atomic_u32(s.base(idx) + SLOT_PAYLOAD_AT);
            let written = word.load(Ordering::Relaxed) as usize;
            assert_eq!(
                if written == 0 { SLOT_PAYLOAD } else { written },
                at,
                "case {i}"
            );
            let mut t = Taken::default();
            assert!(s.take(idx, SLOT_RECEIVER, || false, &mut t).unwrap());
            assert_eq!(t.pieces(), pieces, "case {i}");
            assert_eq!(t.payload(), &payload[..], "case {i}");
            s.release(idx);
        }
        // Warming a free slot leaves it free and fillable; warming a filled one (which a
        // sender never does) leaves it filled.
        s.warm(1);
        assert!(s.is_free(1));
        s.fill(1, &[piece(8)], &[5; 8], true);
        s.warm(1);
        let mut t = Taken::default();
        assert!(s.take(1, SLOT_RECEIVER, || false, &mut t).unwrap());
        assert_eq!(t.payload(), &[5; 8]);
        s.release(1);
        s.fill(0, &[piece(8)], &[1; 8], true);
        s.region
            .atomic_u32(s.base(0) + SLOT_PAYLOAD_AT)
            .store(100, Ordering::Relaxed);
        let mut t = Taken::default();
        assert!(s.take(0, SLOT_RECEIVER, || false, &mut t).unwrap());
        assert!(t.payload().is_empty(), "an offset no sender writes");
    }
}
