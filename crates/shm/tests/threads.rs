//! Two threads, one ring: no entry lost, duplicated, reordered or torn.

use std::sync::Arc;
use std::time::Duration;

use softverbs_shm::{Consumer, Doorbell, Producer, PushError, Region, RingLayout};

const ENTRY: usize = 64;

fn ring(cap: u32) -> (Producer, Consumer) {
    let layout = RingLayout::new(cap, ENTRY as u32).unwrap();
    let (region, _fd) = Region::create("stress", layout.size()).unwrap();
    let region = Arc::new(region);
    layout.init(&region, 0).unwrap();
    (
        Producer::attach(region.clone(), 0, layout).unwrap(),
        Consumer::attach(region, 0, layout).unwrap(),
    )
}

/// Sequence number in word 0, and every other word derived from it, so a torn or stale slot
/// read shows up as a mismatch.
fn entry(seq: u64) -> [u8; ENTRY] {
    let mut e = [0u8; ENTRY];
    for (k, w) in e.chunks_exact_mut(8).enumerate() {
        let v = seq ^ (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        w.copy_from_slice(&v.to_le_bytes());
    }
    e
}

#[test]
fn million_entries_between_two_polling_threads() {
    const N: u64 = 1_000_000;
    let (mut p, mut c) = ring(256);
    std::thread::scope(|s| {
        s.spawn(move || {
            for seq in 0..N {
                let e = entry(seq);
                loop {
                    match p.push(&e) {
                        Ok(_) => break,
                        Err(PushError::Full) => std::thread::yield_now(),
                        Err(err) => panic!("{err}"),
                    }
                }
            }
        });
        let mut buf = [0u8; ENTRY];
        for seq in 0..N {
            while !c.pop(&mut buf).unwrap() {
                std::thread::yield_now();
            }
            assert_eq!(buf, entry(seq), "entry {seq}");
        }
        // Nothing extra.
        assert!(!c.pop(&mut buf).unwrap());
    });
}

/// The consumer never spins: whenever the ring is empty it goes through `prepare_sleep`
/// and blocks on the doorbell. A lost wake-up would leave it asleep with an entry in the
/// ring, which the timeout turns into a failure instead of a hang.
#[test]
fn sleeping_consumer_is_always_woken() {
    const N: u64 = 100_000;
    let (mut p, mut c) = ring(64);
    let bell = Doorbell::new().unwrap();
    let rings = std::thread::scope(|s| {
        let bell = &bell;
        let producer = s.spawn(move || {
            let mut rings = 0u64;
            for seq in 0..N {
                let e = entry(seq);
                loop {
                    match p.push(&e) {
                        Ok(wake) => {
                            if wake {
                                bell.ring();
                                rings += 1;
                            }
                            break;
                        }
                        Err(PushError::Full) => std::thread::yield_now(),
                        Err(err) => panic!("{err}"),
                    }
                }
                // Bursty producer, so the consumer really does empty the ring and sleep.
                if seq % 64 == 0 {
                    std::thread::yield_now();
                }
            }
            rings
        });
        let mut buf = [0u8; ENTRY];
        for seq in 0..N {
            if !c.pop(&mut buf).unwrap() {
                let ready = c.wait(bell, 0, Some(Duration::from_secs(10))).unwrap();
                assert!(ready, "lost wake-up before entry {seq}");
                assert!(c.pop(&mut buf).unwrap());
            }
            assert_eq!(buf, entry(seq), "entry {seq}");
        }
        producer.join().unwrap()
    });
    assert!(rings > 0, "the consumer never slept");
    eprintln!("{rings} doorbell rings for {N} entries");
}
