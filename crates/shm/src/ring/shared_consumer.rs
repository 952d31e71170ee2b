//! One of several consumers of a ring (a shared receive queue taken from by the daemon's
//! engine and by the direct-path libraries of every peer of its QPs, docs/design/direct-path.md,
//! "SRQs").
//!
//! The ring's layout and its producer are unchanged ([`Producer`](super::Producer)): a
//! consumer here keeps no private index but claims the entry at the shared consumer index
//! with a compare-and-swap, so each entry goes to exactly one consumer, oldest first. It reads
//! the entry before it claims it: a consumer that loses the race may have read a slot the
//! producer was already overwriting, and drops what it read. The consumer index only ever
//! grows, so the producer's validation of it (between the last value seen and what it
//! produced) holds with any number of consumers.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{in_window, Corrupt, Index, LayoutError, RingLayout, Shared};
use crate::Region;

/// How often a claim is retried against indices that moved under it before the ring is
/// called corrupt: the indices of a sound ring settle within a few tries (each failure
/// means another consumer took an entry), a peer that scribbles on them does not.
const RETRIES: u32 = 1 << 16;

/// A consumer end that others share.
#[derive(Debug, Clone)]
pub struct SharedConsumer {
    shared: Shared,
}

impl SharedConsumer {
    /// Attaches to the ring initialised at `offset` of `region`.
    pub fn attach(
        region: Arc<Region>,
        offset: usize,
        layout: RingLayout,
    ) -> Result<SharedConsumer, LayoutError> {
        layout.attach(&region, offset)?;
        Ok(SharedConsumer {
            shared: Shared {
                region,
                base: offset,
                layout,
            },
        })
    }

    /// The ring's layout.
    pub fn layout(&self) -> RingLayout {
        self.shared.layout
    }

    /// Consistent `(consumer, producer)` indices: the consumer index is read first, so the
    /// producer's, read after it, is at most a ring ahead unless others consumed in between
    /// (then read again).
    fn indices(&self) -> Result<(u32, u32), Corrupt> {
        let cap = self.shared.layout.capacity;
        let mut last = (0, 0);
        for _ in 0..RETRIES {
            let head = self.shared.consumer().load(Ordering::Acquire);
            // Acquire: pairs with the producer's release, so the slots below are visible.
            let tail = self.shared.producer().load(Ordering::Acquire);
            if in_window(tail, head, head.wrapping_add(cap)) {
                return Ok((head, tail));
            }
            last = (head, tail);
            std::hint::spin_loop();
        }
        Err(Corrupt {
            index: Index::Producer,
            value: last.1,
            low: last.0,
            high: last.0.wrapping_add(cap),
        })
    }

    /// Entries posted and not yet taken by anyone.
    pub fn available(&self) -> Result<u32, Corrupt> {
        let (head, tail) = self.indices()?;
        Ok(tail.wrapping_sub(head))
    }

    /// Takes the oldest entry: `read` gets the region and the entry's offset and reads what
    /// it needs (it may be called more than once, on entries others then take; only the
    /// value of the entry claimed is returned). `Ok(None)` when the ring is empty.
    pub fn pop_with<T>(
        &self,
        mut read: impl FnMut(&Region, usize) -> T,
    ) -> Result<Option<T>, Corrupt> {
        for _ in 0..RETRIES {
            let (head, tail) = self.indices()?;
            if head == tail {
                return Ok(None);
            }
            let v = read(&self.shared.region, self.shared.slot(head));
            // Release: our read of the slot happens before the producer, acquiring the new
            // index, reuses it; a failure means another consumer claimed `head` first.
            if self
                .shared
                .consumer()
                .compare_exchange(
                    head,
                    head.wrapping_add(1),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                return Ok(Some(v));
            }
            std::hint::spin_loop();
        }
        let head = self.shared.consumer().load(Ordering::Relaxed);
        Err(Corrupt {
            index: Index::Consumer,
            value: head,
            low: head,
            high: head,
        })
    }

    /// Copies the oldest entry into `buf` and takes it. `Ok(false)` when empty.
    ///
    /// # Panics
    /// If `buf.len()` is not the ring's entry size (a caller bug).
    pub fn pop(&self, buf: &mut [u8]) -> Result<bool, Corrupt> {
        assert_eq!(buf.len(), self.shared.layout.entry_size(), "entry size");
        Ok(self.pop_with(|region, at| region.read(at, buf))?.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Producer;

    fn ring(cap: u32) -> (Arc<Region>, RingLayout) {
        let l = RingLayout::new(cap, 8).unwrap();
        let (r, _fd) = Region::create("shared-consumer-test", l.size()).unwrap();
        l.init(&r, 0).unwrap();
        (Arc::new(r), l)
    }

    #[test]
    fn consumers_take_in_order_and_the_producer_sees_the_room() {
        let (r, l) = ring(4);
        let mut p = Producer::attach(r.clone(), 0, l).unwrap();
        let (a, b) = (
            SharedConsumer::attach(r.clone(), 0, l).unwrap(),
            SharedConsumer::attach(r, 0, l).unwrap(),
        );
        for v in 0u64..4 {
            p.push(&v.to_le_bytes()).unwrap();
        }
        assert!(p.push(&9u64.to_le_bytes()).is_err(), "full");
        let mut buf = [0u8; 8];
        assert!(a.pop(&mut buf).unwrap());
        assert_eq!(u64::from_le_bytes(buf), 0);
        assert!(b.pop(&mut buf).unwrap());
        assert_eq!(u64::from_le_bytes(buf), 1);
        assert_eq!(a.available().unwrap(), 2);
        p.push(&4u64.to_le_bytes()).unwrap();
        let mut got = Vec::new();
        while b.pop(&mut buf).unwrap() {
            got.push(u64::from_le_bytes(buf));
        }
        assert_eq!(got, [2, 3, 4]);
        assert!(!a.pop(&mut buf).unwrap(), "empty");
    }

    /// Two consumers racing a producer through a small ring: every entry is taken exactly
    /// once (none lost, none doubled), and each consumer sees its own in posting order.
    #[test]
    fn racing_consumers_take_each_entry_exactly_once() {
        const N: u64 = 200_000;
        let (r, l) = ring(8);
        let mut p = Producer::attach(r.clone(), 0, l).unwrap();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let takers: Vec<_> = (0..2)
            .map(|_| {
                let c = SharedConsumer::attach(r.clone(), 0, l).unwrap();
                let done = done.clone();
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    let mut buf = [0u8; 8];
                    loop {
                        if c.pop(&mut buf).unwrap() {
                            got.push(u64::from_le_bytes(buf));
                        } else if done.load(Ordering::Acquire) && c.available().unwrap() == 0 {
                            return got;
                        } else {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        for v in 0..N {
            loop {
                match p.push(&v.to_le_bytes()) {
                    Ok(_) => break,
                    Err(crate::PushError::Full) => std::thread::yield_now(),
                    Err(e) => panic!("{e}"),
                }
            }
        }
        done.store(true, Ordering::Release);
        let mut all = Vec::new();
        for t in takers {
            let got = t.join().unwrap();
            assert!(got.windows(2).all(|w| w[0] < w[1]), "out of order");
            all.extend(got);
        }
        all.sort_unstable();
        assert_eq!(all.len() as u64, N, "lost or doubled");
        assert!(all.iter().copied().eq(0..N), "lost or doubled");
    }

    #[test]
    fn a_scribbled_index_is_an_error_not_a_wild_read() {
        let (r, l) = ring(4);
        let c = SharedConsumer::attach(r.clone(), 0, l).unwrap();
        r.atomic_u32(super::super::OFF_PRODUCER)
            .store(1000, Ordering::Release);
        assert!(c.available().is_err());
        assert!(c.pop(&mut [0u8; 8]).is_err());
    }
}
