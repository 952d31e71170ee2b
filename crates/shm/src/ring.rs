//! Single-producer/single-consumer rings of fixed-size entries inside a [`Region`].
//!
//! ```text
//! offset  0          CACHE_LINE   2*CACHE_LINE 3*CACHE_LINE 4*CACHE_LINE
//!         | magic    | producer    | consumer    | need_wakeup | slot 0 | slot 1 | ...
//!         | capacity | index (u32) | index (u32) | (u32)       |
//!         | entry sz |             | +64: note   |             |
//!
//! The consumer's `note` is a word it publishes for the producer's bookkeeping, beyond what
//! the indices say (a send queue's consumer, the daemon, counts there the requests it has
//! retired, so the client can refuse a post past the queue's depth, ibv_post_send(3)).
//! ```
//!
//! Indices run freely (wrapping `u32`); slot of index `i` is `i & (capacity - 1)`.
//! The producer alone writes the producer index, the consumer alone writes the consumer
//! index and `need_wakeup`. Each side keeps its own index privately and only *reads* the
//! other's, validating it every time, so a peer that writes garbage into the header can
//! make this side see a protocol error but never read or write outside the ring.
//!
//! A **stamped** ring ([`RingLayout::stamped`], flag word at offset 12) gives every slot
//! its own 8-byte stamp in front of the entry, the slots spaced by whole 64-byte lines:
//! the producer writes the entry, then the stamp (`STAMPED | index`, released), then the
//! producer index as before; the consumer learns that entry `i` is there from its stamp
//! alone, in the line it reads the entry from, and never reads the producer index. Where the
//! two ends run on two CPUs that is one cache miss per entry instead of two in a row (the
//! index's line, then the entry's), what a NIC's completion queue does with its owner bit
//! and UCX's shared-memory FIFO with its element flag (docs/design/direct-path.md, "Stamped
//! rings"). A garbage stamp can only make an entry look absent, or present with garbage
//! in it, which a peer could publish through the index anyway.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::{Doorbell, Region};

mod shared_consumer;
pub use shared_consumer::SharedConsumer;

/// Spacing of the header words: 128 bytes, two 64-byte lines, so the adjacent-line
/// prefetcher of some x86 cores does not couple the producer's and consumer's words either.
pub const CACHE_LINE: usize = 128;

/// `"SVRG"`: marks an initialised ring header.
pub const RING_MAGIC: u32 = u32::from_le_bytes(*b"SVRG");

const OFF_MAGIC: usize = 0;
const OFF_CAPACITY: usize = 4;
const OFF_ENTRY_SIZE: usize = 8;
const OFF_FLAGS: usize = 12;
/// Flag word bit: the ring is stamped.
const FLAG_STAMPED: u32 = 1;
/// Bytes of a stamp in front of a stamped ring's entry.
const STAMP: usize = 8;
/// Set in every stamp written, so a zeroed slot never reads as written.
const STAMPED: u64 = 1 << 32;
const OFF_PRODUCER: usize = CACHE_LINE;
const OFF_CONSUMER: usize = 2 * CACHE_LINE;
const OFF_NOTE: usize = 2 * CACHE_LINE + 64;
/// The consumer's pending pair (u64, 8-aligned), next to its note: see
/// [`Consumer::publish_pending`].
const OFF_PENDING: usize = 2 * CACHE_LINE + 72;
const OFF_NEED_WAKEUP: usize = 3 * CACHE_LINE;
const HEADER: usize = 4 * CACHE_LINE;

/// Largest capacity: indices must be able to tell full (`capacity` apart) from empty.
pub const MAX_CAPACITY: u32 = 1 << 24;
/// Largest entry.
pub const MAX_ENTRY_SIZE: u32 = 1 << 16;

/// Why a ring cannot be laid out or attached.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// Capacity must be a power of two between 1 and [`MAX_CAPACITY`].
    #[error("ring capacity {0} is not a power of two in 1..={MAX_CAPACITY}")]
    Capacity(u32),
    /// Entry size must be a non-zero multiple of 8 up to [`MAX_ENTRY_SIZE`].
    #[error("ring entry size {0} is not a multiple of 8 in 8..={MAX_ENTRY_SIZE}")]
    EntrySize(u32),
    /// The ring does not fit the region at that offset, or the offset is not a multiple of
    /// [`CACHE_LINE`].
    #[error("ring of {size} bytes at offset {offset} does not fit a region of {region} bytes")]
    Placement {
        /// Requested offset.
        offset: usize,
        /// Ring size.
        size: usize,
        /// Region size.
        region: usize,
    },
    /// The header does not describe this layout (not initialised, or another layout).
    #[error("ring header (magic {magic:#x}, capacity {capacity}, entry size {entry_size}, flags {flags:#x}) does not match")]
    Header {
        /// Magic found.
        magic: u32,
        /// Capacity found.
        capacity: u32,
        /// Entry size found.
        entry_size: u32,
        /// Flags found.
        flags: u32,
    },
    /// The indices found at attach time are impossible.
    #[error(transparent)]
    Corrupt(#[from] Corrupt),
}

/// Which shared word held an impossible value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Index {
    /// The producer index (read by the consumer).
    Producer,
    /// The consumer index (read by the producer).
    Consumer,
}

/// Protocol error: the peer published an index that cannot follow from the last one seen
/// (it would overrun the ring or run backwards). Sticky: once a side has seen one, every
/// later operation on it reports the same error, and the owner should tear the ring down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("peer wrote impossible {index:?} index {value} (valid {low}..={high} wrapping)")]
pub struct Corrupt {
    /// The word.
    pub index: Index,
    /// What it held.
    pub value: u32,
    /// Lowest valid value.
    pub low: u32,
    /// Highest valid value (wrapping: may be below `low`).
    pub high: u32,
}

impl From<Corrupt> for std::io::Error {
    fn from(c: Corrupt) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidData, c)
    }
}

/// Why [`Producer::push`] did not push.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    /// No free slot; retry once the consumer has caught up.
    #[error("ring is full")]
    Full,
    /// The consumer index is impossible.
    #[error(transparent)]
    Corrupt(#[from] Corrupt),
}

/// `true` when `v` lies in the wrapping interval `low..=high`.
fn in_window(v: u32, low: u32, high: u32) -> bool {
    v.wrapping_sub(low) <= high.wrapping_sub(low)
}

/// Where a ring's pieces are, from its capacity and entry size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    capacity: u32,
    entry_size: u32,
    stamped: bool,
}

impl RingLayout {
    /// `capacity` entries (a power of two) of `entry_size` bytes (a multiple of 8).
    pub fn new(capacity: u32, entry_size: u32) -> Result<RingLayout, LayoutError> {
        if !capacity.is_power_of_two() || capacity > MAX_CAPACITY {
            return Err(LayoutError::Capacity(capacity));
        }
        if entry_size == 0 || entry_size % 8 != 0 || entry_size > MAX_ENTRY_SIZE {
            return Err(LayoutError::EntrySize(entry_size));
        }
        Ok(RingLayout {
            capacity,
            entry_size,
            stamped: false,
        })
    }

    /// [`new`](RingLayout::new), stamped (see the module doc).
    pub fn stamped(capacity: u32, entry_size: u32) -> Result<RingLayout, LayoutError> {
        Ok(RingLayout {
            stamped: true,
            ..RingLayout::new(capacity, entry_size)?
        })
    }

    /// Whether entries carry their own stamps.
    pub fn is_stamped(&self) -> bool {
        self.stamped
    }

    /// Bytes from one slot to the next.
    fn stride(&self) -> usize {
        if self.stamped {
            (STAMP + self.entry_size as usize).next_multiple_of(64)
        } else {
            self.entry_size as usize
        }
    }

    fn flags(&self) -> u32 {
        if self.stamped {
            FLAG_STAMPED
        } else {
            0
        }
    }

    /// Number of slots.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Bytes per entry.
    pub fn entry_size(&self) -> usize {
        self.entry_size as usize
    }

    /// Bytes the ring occupies (header plus slots, rounded up to [`CACHE_LINE`]); place the
    /// next ring of a region this far on.
    pub fn size(&self) -> usize {
        let data = self.capacity as usize * self.stride();
        HEADER + data.div_ceil(CACHE_LINE) * CACHE_LINE
    }

    /// Offset of the entry of index `i`, relative to the ring.
    fn slot(&self, i: u32) -> usize {
        self.stamp(i) + if self.stamped { STAMP } else { 0 }
    }

    /// Offset of the stamp of index `i` (of a stamped ring), relative to the ring.
    fn stamp(&self, i: u32) -> usize {
        HEADER + (i & (self.capacity - 1)) as usize * self.stride()
    }

    fn check_placement(&self, region: &Region, offset: usize) -> Result<(), LayoutError> {
        let fits = offset % CACHE_LINE == 0
            && offset
                .checked_add(self.size())
                .is_some_and(|end| end <= region.len());
        if fits {
            Ok(())
        } else {
            Err(LayoutError::Placement {
                offset,
                size: self.size(),
                region: region.len(),
            })
        }
    }

    /// Writes a fresh header (empty ring, no wake-up requested) at `offset`. Done once, by
    /// the side that creates the region, before the other side attaches.
    pub fn init(&self, region: &Region, offset: usize) -> Result<(), LayoutError> {
        self.check_placement(region, offset)?;
        for (off, v) in [
            (OFF_CAPACITY, self.capacity),
            (OFF_ENTRY_SIZE, self.entry_size),
            (OFF_FLAGS, self.flags()),
            (OFF_PRODUCER, 0),
            (OFF_CONSUMER, 0),
            (OFF_NEED_WAKEUP, 0),
        ] {
            region.atomic_u32(offset + off).store(v, Ordering::Relaxed);
        }
        region.atomic_u64s(offset + OFF_PENDING, 1)[0].store(0, Ordering::Relaxed);
        region
            .atomic_u32(offset + OFF_MAGIC)
            .store(RING_MAGIC, Ordering::Release);
        Ok(())
    }

    /// Checks placement and header, and returns the indices (producer, consumer) found.
    fn attach(&self, region: &Region, offset: usize) -> Result<(u32, u32), LayoutError> {
        self.check_placement(region, offset)?;
        let word = |off: usize| region.atomic_u32(offset + off);
        let magic = word(OFF_MAGIC).load(Ordering::Acquire);
        let capacity = word(OFF_CAPACITY).load(Ordering::Relaxed);
        let entry_size = word(OFF_ENTRY_SIZE).load(Ordering::Relaxed);
        let flags = word(OFF_FLAGS).load(Ordering::Relaxed);
        if (magic, capacity, entry_size, flags)
            != (RING_MAGIC, self.capacity, self.entry_size, self.flags())
        {
            return Err(LayoutError::Header {
                magic,
                capacity,
                entry_size,
                flags,
            });
        }
        let tail = word(OFF_PRODUCER).load(Ordering::Acquire);
        let head = word(OFF_CONSUMER).load(Ordering::Acquire);
        if !in_window(tail, head, head.wrapping_add(self.capacity)) {
            return Err(Corrupt {
                index: Index::Producer,
                value: tail,
                low: head,
                high: head.wrapping_add(self.capacity),
            }
            .into());
        }
        Ok((tail, head))
    }
}

/// The shared words of one ring, resolved once.
#[derive(Debug, Clone)]
struct Shared {
    region: Arc<Region>,
    base: usize,
    layout: RingLayout,
}

impl Shared {
    #[inline]
    fn word(&self, off: usize) -> &AtomicU32 {
        self.region.atomic_u32(self.base + off)
    }
    #[inline]
    fn producer(&self) -> &AtomicU32 {
        self.word(OFF_PRODUCER)
    }
    #[inline]
    fn consumer(&self) -> &AtomicU32 {
        self.word(OFF_CONSUMER)
    }
    fn need_wakeup(&self) -> &AtomicU32 {
        self.word(OFF_NEED_WAKEUP)
    }
    fn note(&self) -> &AtomicU32 {
        self.word(OFF_NOTE)
    }
    fn pending(&self) -> &AtomicU64 {
        &self.region.atomic_u64s(self.base + OFF_PENDING, 1)[0]
    }
    #[inline]
    fn slot(&self, i: u32) -> usize {
        self.base + self.layout.slot(i)
    }
    /// The stamp of index `i` of a stamped ring.
    #[inline]
    fn stamp(&self, i: u32) -> &AtomicU64 {
        &self.region.atomic_u64s(self.base + self.layout.stamp(i), 1)[0]
    }
    /// Whether entry `i` of a stamped ring has been published. Acquire: pairs with the
    /// producer's release of the stamp, so the entry's bytes are visible once it is seen.
    #[inline]
    fn stamped(&self, i: u32) -> bool {
        self.stamp(i).load(Ordering::Acquire) == STAMPED | u64::from(i)
    }
    /// Releases the stamps of `from..to`: their entries were written before.
    #[inline]
    fn release_stamps(&self, from: u32, to: u32) {
        if self.layout.stamped {
            let mut i = from;
            while i != to {
                self.stamp(i)
                    .store(STAMPED | u64::from(i), Ordering::Release);
                i = i.wrapping_add(1);
            }
        }
    }
}

/// The writing end of a ring. Exactly one `Producer` may exist per ring (across both
/// processes); the type is `Send` but not `Clone`.
#[derive(Debug)]
pub struct Producer {
    shared: Shared,
    /// Next index to write (staged entries included). Private: never re-read from memory.
    tail: u32,
    /// Last tail made visible to the consumer.
    published: u32,
    /// Last consumer index seen (validated).
    head: u32,
    poisoned: Option<Corrupt>,
}

impl Producer {
    /// Attaches the producer end of the ring initialised at `offset` of `region`.
    pub fn attach(
        region: Arc<Region>,
        offset: usize,
        layout: RingLayout,
    ) -> Result<Producer, LayoutError> {
        let (tail, head) = layout.attach(&region, offset)?;
        Ok(Producer {
            shared: Shared {
                region,
                base: offset,
                layout,
            },
            tail,
            published: tail,
            head,
            poisoned: None,
        })
    }

    /// The ring's layout.
    #[inline]
    pub fn layout(&self) -> RingLayout {
        self.shared.layout
    }

    fn capacity(&self) -> u32 {
        self.shared.layout.capacity
    }

    /// Re-reads the consumer index; it must lie between the last value seen and our tail.
    #[inline]
    fn refresh_head(&mut self) -> Result<(), Corrupt> {
        if let Some(c) = self.poisoned {
            return Err(c);
        }
        // Acquire: the consumer released this index after it finished reading the slots
        // below it, so those reads happen before our overwrite of the slots.
        let head = self.shared.consumer().load(Ordering::Acquire);
        if !in_window(head, self.head, self.tail) {
            let c = Corrupt {
                index: Index::Consumer,
                value: head,
                low: self.head,
                high: self.tail,
            };
            self.poisoned = Some(c);
            return Err(c);
        }
        self.head = head;
        Ok(())
    }

    /// Free slots (re-reading the consumer index).
    #[inline]
    pub fn free(&mut self) -> Result<u32, Corrupt> {
        self.refresh_head()?;
        Ok(self.capacity() - self.tail.wrapping_sub(self.head))
    }

    /// Whether one more entry fits: the consumer index is re-read only when the last value
    /// seen says the ring is full. A free-space check that re-reads it every time fetches
    /// the line the consumer last wrote, a cache miss per entry when the two run on two CPUs.
    #[inline]
    pub fn has_room(&mut self) -> Result<bool, Corrupt> {
        if let Some(c) = self.poisoned {
            return Err(c);
        }
        if self.tail.wrapping_sub(self.head) < self.capacity() {
            return Ok(true);
        }
        self.refresh_head()?;
        Ok(self.tail.wrapping_sub(self.head) < self.capacity())
    }

    /// The consumer's note (see the module doc); 0 until it publishes one. The value is the
    /// peer's word: callers must not trust it beyond their own bookkeeping.
    pub fn note(&self) -> u32 {
        // Acquire: pairs with the consumer's release in `publish_note`.
        self.shared.note().load(Ordering::Acquire)
    }

    /// The consumer's pending pair ([`Consumer::publish_pending`]); 0 until it publishes one.
    /// A peer's word, like the note.
    pub fn pending(&self) -> u64 {
        self.shared.pending().load(Ordering::Acquire)
    }

    /// Index of the next entry to write: how many entries this producer has written since the
    /// ring was initialised (wrapping), staged ones included.
    #[inline]
    pub fn produced(&self) -> u32 {
        self.tail
    }

    /// Reads back entry `index`, one this producer wrote and whose slot it has not reused
    /// since (`produced() - capacity <= index < produced()`); `false` for any other index.
    /// The bytes are whatever the slot holds now: the consumer only reads slots, so they are
    /// the entry as written unless the peer scribbled on them.
    ///
    /// # Panics
    /// If `buf.len()` is not the ring's entry size (a caller bug).
    pub fn read_back(&self, index: u32, buf: &mut [u8]) -> bool {
        assert_eq!(buf.len(), self.shared.layout.entry_size(), "entry size");
        if self.tail.wrapping_sub(index).wrapping_sub(1) >= self.capacity() {
            return false;
        }
        self.shared.region.read(self.shared.slot(index), buf);
        true
    }

    /// Writes one entry into the next slot without making it visible yet; [`publish`]
    /// makes every staged entry visible at once (one release store, one wake-up check).
    ///
    /// # Panics
    /// If `entry.len()` is not the ring's entry size (a caller bug).
    ///
    /// [`publish`]: Producer::publish
    pub fn stage(&mut self, entry: &[u8]) -> Result<(), PushError> {
        assert_eq!(entry.len(), self.shared.layout.entry_size(), "entry size");
        self.stage_padded(entry)
    }

    /// [`stage`](Producer::stage) of `bytes` shorter than an entry (a wire struct whose size
    /// is not a whole number of 8-byte words): the rest of the slot is zeroed, so no stale
    /// bytes of an earlier entry reach the consumer. Bytes past the entry size are not sent.
    pub fn stage_padded(&mut self, bytes: &[u8]) -> Result<(), PushError> {
        self.stage_prefix(bytes, true)
    }

    fn stage_prefix(&mut self, bytes: &[u8], pad: bool) -> Result<(), PushError> {
        if let Some(c) = self.poisoned {
            return Err(c.into());
        }
        if self.tail.wrapping_sub(self.head) == self.capacity() {
            self.refresh_head()?;
            if self.tail.wrapping_sub(self.head) == self.capacity() {
                return Err(PushError::Full);
            }
        }
        let off = self.shared.slot(self.tail);
        let size = self.shared.layout.entry_size();
        let n = bytes.len().min(size);
        self.shared.region.write(off, &bytes[..n]);
        const ZEROS: [u8; 64] = [0; 64];
        let mut at = if pad { n } else { size };
        while at < size {
            let k = (size - at).min(ZEROS.len());
            self.shared.region.write(off + at, &ZEROS[..k]);
            at += k;
        }
        self.tail = self.tail.wrapping_add(1);
        Ok(())
    }

    /// Makes the staged entries visible. Returns `true` when the consumer has asked to be
    /// woken (it is in or entering [`Consumer::prepare_sleep`]): ring its doorbell then.
    pub fn publish(&mut self) -> bool {
        if self.tail == self.published {
            return false;
        }
        self.shared.release_stamps(self.published, self.tail);
        // Release: the slot writes above happen before the consumer's acquire of this index.
        self.shared.producer().store(self.tail, Ordering::Release);
        self.published = self.tail;
        // Store(index) ; full fence ; load(flag) -- paired with the consumer's
        // store(flag) ; full fence ; load(index). At least one side sees the other's store,
        // so either we see the flag and ring, or the consumer sees our entry and stays up.
        fence(Ordering::SeqCst);
        self.shared.need_wakeup().load(Ordering::Relaxed) != 0
    }

    /// [`stage`](Producer::stage) plus [`publish`](Producer::publish): `Ok(true)` means
    /// "ring the consumer's doorbell".
    pub fn push(&mut self, entry: &[u8]) -> Result<bool, PushError> {
        self.stage(entry)?;
        Ok(self.publish())
    }

    /// [`push`](Producer::push) of `bytes` zero-padded to the entry size
    /// ([`stage_padded`](Producer::stage_padded)).
    pub fn push_padded(&mut self, bytes: &[u8]) -> Result<bool, PushError> {
        self.stage_padded(bytes)?;
        Ok(self.publish())
    }

    /// Pushes `bytes` (at most an entry; the rest of the slot keeps what it held, so the
    /// consumer must read only what the bytes themselves say is there, as
    /// [`Consumer::pop_with`] lets it) onto a ring whose consumer never sleeps on it (it
    /// polls and never calls [`Consumer::prepare_sleep`]): published without the full fence
    /// and the look at `need_wakeup` that only a sleeping consumer needs. The direct path's
    /// channel rings carry 272-byte receive requests of which a one-SGE receive uses 32:
    /// padding and fencing were a tenth of an 8-byte SEND there.
    pub fn push_polled(&mut self, bytes: &[u8]) -> Result<(), PushError> {
        self.stage_prefix(bytes, false)?;
        if self.tail != self.published {
            self.shared.release_stamps(self.published, self.tail);
            // Release: the slot writes happen before the consumer's acquire of this index.
            self.shared.producer().store(self.tail, Ordering::Release);
            self.published = self.tail;
        }
        Ok(())
    }

    /// [`push`](Producer::push) of a plain-old-data value whose size is the entry size.
    pub fn push_value<T: IntoBytes + Immutable>(&mut self, v: &T) -> Result<bool, PushError> {
        self.push(v.as_bytes())
    }
}

/// A look at whether a ring may hold entries, without its [`Consumer`] (which its owner
/// may keep behind a lock): the two indices compared as they are now. `false` is as good as
/// the consumer's own look at that instant; `true` may be stale or come from a producer that
/// wrote nonsense, so take the consumer and pop to know.
#[derive(Debug, Clone)]
pub struct Peek {
    shared: Shared,
}

impl Peek {
    /// Whether the producer index differs from the consumer's.
    #[inline]
    pub fn maybe_ready(&self) -> bool {
        if self.shared.layout.stamped {
            let head = self.shared.consumer().load(Ordering::Relaxed);
            return self.shared.stamped(head);
        }
        self.shared.producer().load(Ordering::Acquire)
            != self.shared.consumer().load(Ordering::Relaxed)
    }
}

/// The reading end of a ring. Exactly one `Consumer` may exist per ring.
#[derive(Debug)]
pub struct Consumer {
    shared: Shared,
    /// Next index to read. Private: never re-read from memory.
    head: u32,
    /// Last producer index seen (validated).
    tail: u32,
    poisoned: Option<Corrupt>,
}

impl Consumer {
    /// Attaches the consumer end of the ring initialised at `offset` of `region`.
    pub fn attach(
        region: Arc<Region>,
        offset: usize,
        layout: RingLayout,
    ) -> Result<Consumer, LayoutError> {
        let (tail, head) = layout.attach(&region, offset)?;
        Ok(Consumer {
            shared: Shared {
                region,
                base: offset,
                layout,
            },
            head,
            tail,
            poisoned: None,
        })
    }

    /// The ring's layout.
    #[inline]
    pub fn layout(&self) -> RingLayout {
        self.shared.layout
    }

    /// Re-reads the producer index; it must lie between the last value seen and one full
    /// ring ahead of our head.
    #[inline]
    fn refresh_tail(&mut self) -> Result<(), Corrupt> {
        if let Some(c) = self.poisoned {
            return Err(c);
        }
        let high = self.head.wrapping_add(self.shared.layout.capacity);
        if self.shared.layout.stamped {
            // The entries' own stamps, from the first not seen yet: never past a full ring
            // ahead of our head, whatever the stamps say.
            while self.tail != high && self.shared.stamped(self.tail) {
                self.tail = self.tail.wrapping_add(1);
            }
            return Ok(());
        }
        // Acquire: pairs with the producer's release, so the slot contents below this index
        // are visible before we read them.
        let tail = self.shared.producer().load(Ordering::Acquire);
        if !in_window(tail, self.tail, high) {
            let c = Corrupt {
                index: Index::Producer,
                value: tail,
                low: self.tail,
                high,
            };
            self.poisoned = Some(c);
            return Err(c);
        }
        self.tail = tail;
        Ok(())
    }

    /// Entries ready to pop (re-reading the producer index).
    #[inline]
    pub fn available(&mut self) -> Result<u32, Corrupt> {
        self.refresh_tail()?;
        Ok(self.tail.wrapping_sub(self.head))
    }

    /// Brings the next entry's first line into this CPU's cache without taking it, for a
    /// consumer that has nothing else to do and will pop it later (a direct-path sender's
    /// next receive, docs/design/direct-path.md "Warm lines"): its later pop then does not wait for
    /// the line the producer wrote. `Ok(true)` when an entry is there; an empty ring is
    /// looked at as [`available`](Consumer::available) does.
    pub fn warm(&mut self) -> Result<bool, Corrupt> {
        if self.head == self.tail {
            // A stamped ring reads the head entry's stamp, in the entry's first line.
            self.refresh_tail()?;
            if self.head == self.tail {
                return Ok(false);
            }
        }
        if !self.shared.layout.stamped {
            let word = self.shared.region.atomic_u32(self.shared.slot(self.head));
            std::hint::black_box(word.load(Ordering::Relaxed));
        }
        Ok(true)
    }

    /// A [`Peek`] at this ring.
    pub fn peek(&self) -> Peek {
        Peek {
            shared: self.shared.clone(),
        }
    }

    /// Entries popped so far (a wrapping count: the consumer index).
    #[inline]
    pub fn consumed(&self) -> u32 {
        self.head
    }

    /// Publishes the note the producer reads with [`Producer::note`].
    pub fn publish_note(&self, value: u32) {
        // Release: what led to the value (completions pushed elsewhere) happens before a
        // producer's acquire load sees it.
        self.shared.note().store(value, Ordering::Release);
    }

    /// Publishes a pair of words in one store, which the producer reads with
    /// [`Producer::pending`]: what the consumer is about to do, so a producer that outlives
    /// the consumer can tell whether it was done (a QP's send ring: the note it is about to
    /// publish and where in a CQ ring the completion that goes with it will land,
    /// docs/design/shm-rings.md).
    pub fn publish_pending(&self, value: u64) {
        self.shared.pending().store(value, Ordering::Release);
    }

    /// Copies the oldest entry into `buf` and frees its slot. `Ok(false)` when empty.
    ///
    /// # Panics
    /// If `buf.len()` is not the ring's entry size (a caller bug).
    pub fn pop(&mut self, buf: &mut [u8]) -> Result<bool, Corrupt> {
        assert_eq!(buf.len(), self.shared.layout.entry_size(), "entry size");
        Ok(self.pop_with(|region, at| region.read(at, buf))?.is_some())
    }

    /// Reads the oldest entry with `read` — given the region and the entry's offset in it,
    /// it reads what it needs with [`Region::read`] and atomics — then frees its slot.
    /// `Ok(None)` when empty. `read` must not read past the entry size.
    pub fn pop_with<T>(
        &mut self,
        read: impl FnOnce(&Region, usize) -> T,
    ) -> Result<Option<T>, Corrupt> {
        let Some(v) = self.peek_with(read)? else {
            return Ok(None);
        };
        self.head = self.head.wrapping_add(1);
        // Release: our reads of the slot happen before the producer's acquire of this index
        // and so before it overwrites the slot.
        self.shared.consumer().store(self.head, Ordering::Release);
        Ok(Some(v))
    }

    /// Reads the oldest entry with `read` as [`pop_with`](Consumer::pop_with) does, without
    /// taking it: `Ok(None)` when empty.
    pub fn peek_with<T>(
        &mut self,
        read: impl FnOnce(&Region, usize) -> T,
    ) -> Result<Option<T>, Corrupt> {
        if let Some(c) = self.poisoned {
            return Err(c);
        }
        if self.head == self.tail {
            self.refresh_tail()?;
            if self.head == self.tail {
                return Ok(None);
            }
        }
        Ok(Some(read(&self.shared.region, self.shared.slot(self.head))))
    }

    /// [`pop`](Consumer::pop) into a plain-old-data value whose size is the entry size.
    pub fn pop_value<T: FromBytes + IntoBytes>(&mut self) -> Result<Option<T>, Corrupt> {
        let mut v = T::new_zeroed();
        Ok(self.pop(v.as_mut_bytes())?.then_some(v))
    }

    /// First half of going to sleep: raises `need_wakeup`, then checks the ring once more.
    /// `Ok(true)`: still empty, the producer will see the flag on its next publish and
    /// ring the doorbell, so it is safe to block on it. `Ok(false)`: entries arrived; the
    /// flag is cleared again, keep polling. Call [`finish_sleep`](Consumer::finish_sleep)
    /// after waking.
    pub fn prepare_sleep(&mut self) -> Result<bool, Corrupt> {
        if let Some(c) = self.poisoned {
            return Err(c);
        }
        self.shared.need_wakeup().store(1, Ordering::Relaxed);
        // Store(flag) ; full fence ; load(index): see `Producer::publish`.
        fence(Ordering::SeqCst);
        if self.available()? > 0 {
            self.finish_sleep();
            return Ok(false);
        }
        Ok(true)
    }

    /// Clears `need_wakeup`: the producer stops ringing the doorbell.
    pub fn finish_sleep(&mut self) {
        self.shared.need_wakeup().store(0, Ordering::Relaxed);
    }

    /// Adaptive wait until the ring has entries: up to `spins` polls with
    /// [`std::thread::yield_now`] between them (the machine has few CPUs, so a poller must
    /// yield), then [`prepare_sleep`](Consumer::prepare_sleep) and block on `bell`.
    /// Returns `Ok(true)` when entries are ready, `Ok(false)` after `timeout`.
    /// A corrupt index is reported as `InvalidData`.
    pub fn wait(
        &mut self,
        bell: &Doorbell,
        spins: u32,
        timeout: Option<Duration>,
    ) -> std::io::Result<bool> {
        for _ in 0..spins {
            if self.available()? > 0 {
                return Ok(true);
            }
            std::thread::yield_now();
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if !self.prepare_sleep()? {
                return Ok(true);
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let woke = bell.wait(left)?;
            bell.drain();
            self.finish_sleep();
            if self.available()? > 0 {
                return Ok(true);
            }
            if !woke {
                return Ok(false); // timed out (with no timeout, `wait` only returns readable)
            }
            // Woken with nothing there (a stale doorbell): go round and sleep again.
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(cap: u32, esz: u32) -> (Producer, Consumer, Arc<Region>) {
        ring_of(RingLayout::new(cap, esz).unwrap())
    }

    fn ring_of(layout: RingLayout) -> (Producer, Consumer, Arc<Region>) {
        let (region, _fd) = Region::create("ring", layout.size()).unwrap();
        let region = Arc::new(region);
        layout.init(&region, 0).unwrap();
        let p = Producer::attach(region.clone(), 0, layout).unwrap();
        let c = Consumer::attach(region.clone(), 0, layout).unwrap();
        (p, c, region)
    }

    #[test]
    fn has_room_rereads_the_consumer_index_only_when_the_ring_looks_full() {
        let (mut p, mut c, _r) = ring(2, 8);
        assert!(p.has_room().unwrap());
        p.push(&[1; 8]).unwrap();
        p.push(&[2; 8]).unwrap();
        assert!(!p.has_room().unwrap(), "two entries in a ring of two");
        let mut b = [0u8; 8];
        assert!(c.pop(&mut b).unwrap());
        assert!(
            p.has_room().unwrap(),
            "the pop is seen once the ring looked full"
        );
        p.push(&[3; 8]).unwrap();
        assert!(!p.has_room().unwrap());
    }

    fn entry(n: u64) -> [u8; 16] {
        let mut e = [0u8; 16];
        e[..8].copy_from_slice(&n.to_le_bytes());
        e[8..].copy_from_slice(&(!n).to_le_bytes());
        e
    }

    #[test]
    fn layout_rules() {
        assert!(RingLayout::new(0, 8).is_err());
        assert!(RingLayout::new(3, 8).is_err());
        assert!(RingLayout::new(4, 12).is_err());
        assert!(RingLayout::new(4, 0).is_err());
        let l = RingLayout::new(4, 64).unwrap();
        assert_eq!(l.size(), HEADER + 256);
        assert_eq!(RingLayout::new(1, 8).unwrap().size(), HEADER + CACHE_LINE);
        let (region, _fd) = Region::create("l", 4096).unwrap();
        assert!(matches!(
            l.init(&region, 64),
            Err(LayoutError::Placement { .. })
        ));
        assert!(matches!(
            l.init(&region, 4096 - 640),
            Err(LayoutError::Placement { .. })
        ));
        // Attaching to an uninitialised or differently laid out header fails.
        let region = Arc::new(region);
        assert!(matches!(
            Consumer::attach(region.clone(), 0, l),
            Err(LayoutError::Header { .. })
        ));
        l.init(&region, 0).unwrap();
        let other = RingLayout::new(8, 64).unwrap();
        assert!(Producer::attach(region.clone(), 0, other).is_err());
        assert!(Producer::attach(region, 0, l).is_ok());
    }

    #[test]
    fn the_consumers_note_reaches_the_producer_and_leaves_the_indices_alone() {
        let (mut p, mut c, _r) = ring(4, 16);
        assert_eq!(p.note(), 0, "a fresh ring's note");
        p.push(&entry(1)).unwrap();
        let mut buf = [0u8; 16];
        assert!(c.pop(&mut buf).unwrap());
        assert_eq!(c.consumed(), 1);
        c.publish_note(0xdead_beef);
        assert_eq!(p.note(), 0xdead_beef);
        // The note is not an index: the ring still has all its room and nothing to pop.
        assert_eq!(p.free().unwrap(), 4);
        assert!(!c.pop(&mut buf).unwrap());
        // The pending pair is its own word: it moves both halves at once, and not the note.
        assert_eq!(p.pending(), 0, "a fresh ring's pending pair");
        c.publish_pending(0x0000_0007_0000_0003);
        assert_eq!(p.pending(), 0x0000_0007_0000_0003);
        assert_eq!(p.note(), 0xdead_beef);
    }

    #[test]
    fn the_producer_reads_back_what_it_wrote_until_it_reuses_the_slot() {
        let (mut p, mut c, _r) = ring(4, 16);
        let mut buf = [0u8; 16];
        assert_eq!(p.produced(), 0);
        assert!(!p.read_back(0, &mut buf), "nothing written yet");
        for i in 0..3 {
            p.push(&entry(i)).unwrap();
        }
        // Consumed or not, an entry stays readable: the consumer only reads slots.
        assert!(c.pop(&mut buf).unwrap());
        for i in 0..3u32 {
            assert!(p.read_back(i, &mut buf));
            assert_eq!(buf, entry(u64::from(i)));
        }
        assert!(!p.read_back(3, &mut buf), "not written yet");
        // Index 4 reuses slot 0: entry 0 is gone, the last four are readable.
        assert!(c.pop(&mut buf).unwrap());
        p.push(&entry(3)).unwrap();
        p.push(&entry(4)).unwrap();
        assert_eq!(p.produced(), 5);
        assert!(!p.read_back(0, &mut buf));
        assert!(!p.read_back(u32::MAX, &mut buf));
        for i in 1..5u32 {
            assert!(p.read_back(i, &mut buf));
            assert_eq!(buf, entry(u64::from(i)));
        }
    }

    #[test]
    fn full_empty_and_wrap_around() {
        full_empty_and_wrap_around_of(RingLayout::new(4, 16).unwrap());
        full_empty_and_wrap_around_of(RingLayout::stamped(4, 16).unwrap());
    }

    fn full_empty_and_wrap_around_of(layout: RingLayout) {
        let (mut p, mut c, _r) = ring_of(layout);
        let mut buf = [0u8; 16];
        assert!(!c.pop(&mut buf).unwrap());
        let mut next_in = 0u64;
        let mut next_out = 0u64;
        // Many laps around the ring, in bursts of varying size, so the free-running indices
        // wrap the slot array many times.
        for round in 0..100u64 {
            let burst = round % 5;
            for _ in 0..burst {
                match p.push(&entry(next_in)) {
                    Ok(_) => next_in += 1,
                    Err(PushError::Full) => {
                        assert_eq!(next_in - next_out, 4);
                        break;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            while c.pop(&mut buf).unwrap() {
                assert_eq!(buf, entry(next_out));
                next_out += 1;
            }
            assert_eq!(next_in, next_out);
        }
        assert!(next_in > 100);
        for i in 0..4 {
            p.push(&entry(i)).unwrap();
        }
        assert_eq!(p.push(&entry(9)), Err(PushError::Full));
        assert_eq!(p.free().unwrap(), 0);
        assert_eq!(c.available().unwrap(), 4);
        assert!(c.pop(&mut buf).unwrap());
        assert_eq!(p.free().unwrap(), 1);
        p.push(&entry(4)).unwrap();
        for i in 1..5 {
            assert!(c.pop(&mut buf).unwrap());
            assert_eq!(buf, entry(i));
        }
        assert!(!c.pop(&mut buf).unwrap());
    }

    #[test]
    fn indices_wrap_past_u32_max() {
        indices_wrap_past_u32_max_of(RingLayout::new(8, 8).unwrap());
        indices_wrap_past_u32_max_of(RingLayout::stamped(8, 8).unwrap());
    }

    fn indices_wrap_past_u32_max_of(layout: RingLayout) {
        let (p, _, r) = ring_of(layout);
        let layout = p.layout();
        drop(p);
        // Start both indices just below the u32 wrap point, then attach afresh.
        let start = u32::MAX - 3;
        r.atomic_u32(OFF_PRODUCER).store(start, Ordering::Relaxed);
        r.atomic_u32(OFF_CONSUMER).store(start, Ordering::Relaxed);
        let mut p = Producer::attach(r.clone(), 0, layout).unwrap();
        let mut c = Consumer::attach(r.clone(), 0, layout).unwrap();
        let mut buf = [0u8; 8];
        for i in 0..40u64 {
            p.push(&i.to_le_bytes()).unwrap();
            if i % 3 == 0 {
                p.push(&(1000 + i).to_le_bytes()).unwrap();
                assert!(c.pop(&mut buf).unwrap());
                assert_eq!(u64::from_le_bytes(buf), i);
                assert!(c.pop(&mut buf).unwrap());
                assert_eq!(u64::from_le_bytes(buf), 1000 + i);
            } else {
                assert!(c.pop(&mut buf).unwrap());
                assert_eq!(u64::from_le_bytes(buf), i);
            }
        }
        assert!(r.atomic_u32(OFF_PRODUCER).load(Ordering::Relaxed) < 100);
    }

    #[test]
    fn padded_entries_zero_the_rest_of_their_slot() {
        let (mut p, mut c, _r) = ring(2, 16);
        let mut buf = [0u8; 16];
        // Fill both slots with ones, consume them, then push short entries over them.
        for _ in 0..2 {
            p.push(&[0xff; 16]).unwrap();
            assert!(c.pop(&mut buf).unwrap());
        }
        p.push_padded(&[1, 2, 3]).unwrap();
        assert!(c.pop(&mut buf).unwrap());
        assert_eq!(buf, [1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        // Longer than an entry: the first 16 bytes go.
        p.push_padded(&[7; 20]).unwrap();
        assert!(c.pop(&mut buf).unwrap());
        assert_eq!(buf, [7; 16]);
    }

    #[test]
    fn polled_pushes_write_only_their_bytes_and_pop_with_reads_only_what_it_asks() {
        let (mut p, mut c, _r) = ring(2, 16);
        for _ in 0..2 {
            p.push_polled(&[0xff; 16]).unwrap();
            let mut buf = [0u8; 16];
            assert!(c.pop(&mut buf).unwrap());
        }
        // A short entry over a used slot: the rest of the slot keeps the older bytes.
        p.push_polled(&[1, 2, 3]).unwrap();
        let got = c
            .pop_with(|region, at| {
                let mut head = [0u8; 3];
                region.read(at, &mut head);
                let mut whole = [0u8; 16];
                region.read(at, &mut whole);
                (head, whole)
            })
            .unwrap();
        let (head, whole) = got.expect("an entry");
        assert_eq!(head, [1, 2, 3]);
        assert_eq!(&whole[3..], &[0xff; 13], "unpadded: the older bytes stay");
        assert_eq!(c.pop_with(|_, _| ()).unwrap(), None, "empty after one pop");
        assert_eq!(c.peek_with(|_, _| ()).unwrap(), None, "nothing to peek at");
        // The slot is free again for the producer, and the ring fills as usual.
        p.push_polled(&[4; 16]).unwrap();
        p.push_polled(&[5; 16]).unwrap();
        assert_eq!(p.push_polled(&[6; 16]), Err(PushError::Full));
        let first = |region: &Region, at: usize| {
            let mut b = [0u8; 1];
            region.read(at, &mut b);
            b[0]
        };
        // A peek leaves the entry where it is, however often.
        assert_eq!(c.peek_with(first).unwrap(), Some(4));
        assert_eq!(c.peek_with(first).unwrap(), Some(4));
        let firsts: Vec<u8> = std::iter::from_fn(|| {
            c.pop_with(|region, at| {
                let mut b = [0u8; 1];
                region.read(at, &mut b);
                b[0]
            })
            .unwrap()
        })
        .collect();
        assert_eq!(firsts, [4, 5]);
    }

    #[test]
    fn staged_entries_are_invisible_until_published() {
        let (mut p, mut c, _r) = ring(4, 8);
        let mut buf = [0u8; 8];
        p.stage(&1u64.to_le_bytes()).unwrap();
        p.stage(&2u64.to_le_bytes()).unwrap();
        assert_eq!(c.available().unwrap(), 0);
        assert!(!p.publish());
        assert_eq!(c.available().unwrap(), 2);
        p.stage(&3u64.to_le_bytes()).unwrap();
        p.stage(&4u64.to_le_bytes()).unwrap();
        assert_eq!(p.stage(&5u64.to_le_bytes()), Err(PushError::Full));
        assert!(!p.publish());
        assert!(!p.publish(), "nothing new to publish");
        for i in 1..=4u64 {
            assert!(c.pop(&mut buf).unwrap());
            assert_eq!(u64::from_le_bytes(buf), i);
        }
    }

    #[test]
    fn typed_entries() {
        #[derive(Debug, PartialEq, zerocopy::IntoBytes, zerocopy::FromBytes, Immutable)]
        #[repr(C)]
        struct Wqe {
            wr_id: u64,
            opcode: u32,
            flags: u32,
        }
        let (mut p, mut c, _r) = ring(2, 16);
        let w = Wqe {
            wr_id: 7,
            opcode: 3,
            flags: 1,
        };
        p.push_value(&w).unwrap();
        assert_eq!(c.pop_value::<Wqe>().unwrap(), Some(w));
        assert_eq!(c.pop_value::<Wqe>().unwrap(), None);
    }

    #[test]
    fn wake_up_protocol() {
        let (mut p, mut c, _r) = ring(4, 8);
        let mut buf = [0u8; 8];
        // Nobody sleeping: no wake-up requested.
        assert_eq!(p.push(&[1; 8]), Ok(false));
        // Entries present: prepare_sleep refuses and leaves the flag down.
        assert_eq!(c.prepare_sleep(), Ok(false));
        assert_eq!(p.push(&[2; 8]), Ok(false));
        assert!(c.pop(&mut buf).unwrap() && c.pop(&mut buf).unwrap());
        // Empty: the consumer may sleep, and the next push asks for the doorbell.
        assert_eq!(c.prepare_sleep(), Ok(true));
        assert_eq!(p.push(&[3; 8]), Ok(true));
        // The race the fence pair closes: flag raised, then an entry lands before the
        // consumer re-checks. The producer asked to ring, and a second prepare_sleep also
        // sees the entry, so either way the consumer does not sleep through it.
        assert_eq!(c.prepare_sleep(), Ok(false));
        // After waking the consumer lowers the flag and pushes stop asking.
        c.finish_sleep();
        assert_eq!(p.push(&[4; 8]), Ok(false));
        assert!(c.pop(&mut buf).unwrap() && c.pop(&mut buf).unwrap());
        assert_eq!(buf, [4; 8]);
        // Staged-but-unpublished entries do not count: the consumer may sleep, and the
        // publish that reveals them asks for the wake-up.
        p.stage(&[5; 8]).unwrap();
        assert_eq!(c.prepare_sleep(), Ok(true));
        assert!(p.publish());
    }

    #[test]
    fn adaptive_wait_times_out_and_wakes() {
        let (mut p, mut c, _r) = ring(4, 8);
        let bell = Doorbell::new().unwrap();
        assert!(!c.wait(&bell, 3, Some(Duration::from_millis(10))).unwrap());
        // An entry already there: no sleep at all.
        assert!(!p.push(&[1; 8]).unwrap());
        assert!(c.wait(&bell, 0, Some(Duration::ZERO)).unwrap());
        let mut buf = [0u8; 8];
        assert!(c.pop(&mut buf).unwrap());
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                if p.push(&[2; 8]).unwrap() {
                    bell.ring();
                }
            });
            assert!(c.wait(&bell, 0, Some(Duration::from_secs(10))).unwrap());
        });
        assert!(c.pop(&mut buf).unwrap());
        assert_eq!(buf, [2; 8]);
    }

    #[test]
    fn scribbled_indices_are_reported_and_sticky() {
        let (mut p, mut c, r) = ring(8, 8);
        let mut buf = [0u8; 8];
        for i in 0..3u64 {
            p.push(&i.to_le_bytes()).unwrap();
        }
        assert_eq!(c.available().unwrap(), 3);
        // Producer index pushed past a full ring ahead of the consumer.
        r.atomic_u32(OFF_PRODUCER).store(3 + 100, Ordering::Relaxed);
        assert!(c.pop(&mut buf).unwrap(), "cached entries still readable");
        assert!(c.pop(&mut buf).unwrap());
        assert!(c.pop(&mut buf).unwrap());
        let e = c.pop(&mut buf).unwrap_err();
        assert_eq!(
            (e.index, e.value, e.low, e.high),
            (Index::Producer, 103, 3, 11)
        );
        // Even once the value is repaired, the consumer stays poisoned.
        r.atomic_u32(OFF_PRODUCER).store(3, Ordering::Relaxed);
        assert_eq!(c.pop(&mut buf), Err(e));
        assert_eq!(c.available(), Err(e));
        assert_eq!(c.prepare_sleep(), Err(e));
        // Consumer index moved beyond what was produced, seen when the producer needs room.
        r.atomic_u32(OFF_CONSUMER).store(50, Ordering::Relaxed);
        for i in 3..8u64 {
            p.push(&i.to_le_bytes()).unwrap();
        }
        let e = p.push(&[0; 8]).unwrap_err();
        assert!(matches!(
            e,
            PushError::Corrupt(Corrupt {
                index: Index::Consumer,
                value: 50,
                ..
            })
        ));
        assert_eq!(
            p.free(),
            Err(match e {
                PushError::Corrupt(c) => c,
                PushError::Full => unreachable!(),
            })
        );
    }

    #[test]
    fn a_stamped_ring_is_read_by_its_stamps_alone() {
        let layout = RingLayout::stamped(4, 48).unwrap();
        // Each entry and its stamp in one 64-byte line of its own.
        assert_eq!(layout.slot(1) - layout.slot(0), 64);
        assert_eq!(layout.slot(0) % 64, STAMP);
        assert_eq!(layout.size(), HEADER + 256);
        let (mut p, mut c, r) = ring_of(layout);
        let mut buf = [0u8; 48];
        p.push_polled(&[1; 48]).unwrap();
        p.push_polled(&[2; 48]).unwrap();
        // The consumer does not need the producer index: scribbled, it changes nothing.
        r.atomic_u32(OFF_PRODUCER).store(77, Ordering::Relaxed);
        assert_eq!(c.available().unwrap(), 2);
        assert!(c.peek().maybe_ready());
        assert!(c.pop(&mut buf).unwrap());
        assert_eq!(buf, [1; 48]);
        assert!(c.pop(&mut buf).unwrap());
        assert_eq!(buf, [2; 48]);
        assert!(!c.pop(&mut buf).unwrap());
        assert!(!c.peek().maybe_ready());
        // Staged entries stay invisible until published: their stamps come with it.
        p.stage(&[3; 48]).unwrap();
        assert_eq!(c.available().unwrap(), 0);
        p.publish();
        assert_eq!(c.available().unwrap(), 1);
        assert!(c.pop(&mut buf).unwrap());
        // A stamp of the slot's previous lap, or one no producer wrote, is not an entry.
        let next = c.consumed();
        r.atomic_u64s(layout.stamp(next), 1)[0]
            .store(STAMPED | u64::from(next.wrapping_sub(4)), Ordering::Relaxed);
        assert_eq!(c.available().unwrap(), 0);
        r.atomic_u64s(layout.stamp(next), 1)[0].store(u64::from(next), Ordering::Relaxed);
        assert_eq!(c.available().unwrap(), 0);
        // Stamps a peer wrote over the whole ring (with nothing in the entries) are a full
        // ring of entries, and no more: the slots of the next lap are the same four.
        for i in 0..4u32 {
            let i = next.wrapping_add(i);
            r.atomic_u64s(layout.stamp(i), 1)[0].store(STAMPED | u64::from(i), Ordering::Relaxed);
        }
        assert_eq!(c.available().unwrap(), 4);
        // A stamped header is not an unstamped ring, and the other way round.
        assert!(matches!(
            Consumer::attach(r.clone(), 0, RingLayout::new(4, 48).unwrap()),
            Err(LayoutError::Header { flags: 1, .. })
        ));
    }

    /// Warming says whether an entry is there and takes nothing: the entries still pop in
    /// order, on both layouts, and a scribbled producer index is still caught.
    #[test]
    fn warming_the_next_entry_takes_nothing() {
        for layout in [
            RingLayout::new(4, 16).unwrap(),
            RingLayout::stamped(4, 16).unwrap(),
        ] {
            let (mut p, mut c, r) = ring_of(layout);
            assert!(!c.warm().unwrap(), "empty");
            p.push(&entry(1)).unwrap();
            p.push(&entry(2)).unwrap();
            assert!(c.warm().unwrap());
            assert!(c.warm().unwrap(), "again: still there");
            let mut b = [0u8; 16];
            for n in [1, 2] {
                assert!(c.pop(&mut b).unwrap());
                assert_eq!(b, entry(n));
            }
            assert!(!c.warm().unwrap(), "both popped");
            if !layout.is_stamped() {
                r.atomic_u32(OFF_PRODUCER).store(99, Ordering::Relaxed);
                assert!(c.warm().is_err(), "a producer index a ring ahead");
            }
        }
    }

    #[test]
    fn producer_index_running_backwards_is_corrupt() {
        let (mut p, mut c, r) = ring(8, 8);
        for i in 0..4u64 {
            p.push(&i.to_le_bytes()).unwrap();
        }
        assert_eq!(c.available().unwrap(), 4);
        // Retracting published entries is a protocol error even though 2 - 0 <= capacity.
        r.atomic_u32(OFF_PRODUCER).store(2, Ordering::Relaxed);
        assert!(c.available().is_err());
    }
}
