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

/// Many rings, one consumer that visits only the announced ones (`ReadySet`) and sleeps on
/// the doorbell whenever nothing is queued: every entry of every ring arrives, in order,
/// although most rings are idle at any moment; the ready ring (one slot per ring) never
/// fills; a lost announcement or wake-up would leave entries behind and time out.
#[test]
fn announced_rings_lose_nothing_and_the_ready_ring_never_fills() {
    announced_rings(0);
}

/// The same with idle owners kept queued for a few rounds (as the daemon does).
#[test]
fn announced_rings_with_an_idle_grace_lose_nothing_either() {
    announced_rings(3);
}

fn announced_rings(grace: u32) {
    use softverbs_shm::{ReadySet, WorkFlag, CACHE_LINE};
    const RINGS: u32 = 64;
    const N: u64 = 200_000;
    let layout = RingLayout::new(4, 8).unwrap();
    let ready_layout = RingLayout::new(RINGS, 8).unwrap();
    let flags_off = ready_layout.size();
    let rings_off = flags_off + RINGS as usize * CACHE_LINE;
    let len = rings_off + RINGS as usize * layout.size();
    let (region, _fd) = Region::create("ready", len).unwrap();
    let region = Arc::new(region);
    ready_layout.init(&region, 0).unwrap();
    let mut producers = Vec::new();
    let mut set = ReadySet::with_grace(grace);
    let mut consumers = Vec::new();
    for i in 0..RINGS as usize {
        let off = rings_off + i * layout.size();
        layout.init(&region, off).unwrap();
        producers.push((
            Producer::attach(region.clone(), off, layout).unwrap(),
            WorkFlag::attach(region.clone(), flags_off + i * CACHE_LINE).unwrap(),
        ));
        consumers.push(Consumer::attach(region.clone(), off, layout).unwrap());
        set.insert(
            i as u32,
            Some(WorkFlag::attach(region.clone(), flags_off + i * CACHE_LINE).unwrap()),
        );
    }
    let mut ready_p = Producer::attach(region.clone(), 0, ready_layout).unwrap();
    let mut ready_c = Consumer::attach(region.clone(), 0, ready_layout).unwrap();
    let bell = Doorbell::new().unwrap();
    let bell2 = &bell;
    std::thread::scope(|s| {
        s.spawn(move || {
            // Bursts on a few rings at a time, pseudo-randomly chosen, so rings keep going
            // idle and busy again.
            let mut x = 0x2545_f491_4f6c_dd1du64;
            let mut seq = vec![0u64; RINGS as usize];
            for n in 0..N {
                if n % 64 == 0 {
                    std::thread::yield_now();
                }
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = (x % RINGS as u64) as usize;
                let (p, flag) = &mut producers[i];
                let mut wake = loop {
                    match p.push(&seq[i].to_le_bytes()) {
                        Ok(w) => break w,
                        Err(PushError::Full) => std::thread::yield_now(),
                        Err(e) => panic!("{e:?}"),
                    }
                };
                seq[i] += 1;
                if flag.announce() {
                    match ready_p.push(&(i as u64).to_le_bytes()) {
                        Ok(w) => wake |= w,
                        Err(e) => panic!("the ready ring must never fill: {e:?}"),
                    }
                }
                if wake {
                    bell2.ring();
                }
            }
        });
        let mut expect = vec![0u64; RINGS as usize];
        let mut got = 0u64;
        let mut visit = Vec::new();
        let mut buf = [0u8; 8];
        let mut most = 0;
        while got < N {
            while let Some(t) = ready_c.pop_value::<u64>().unwrap() {
                assert!(set.announced(t as u32), "token {t}");
            }
            set.start_round(&mut visit);
            most = most.max(visit.len());
            for &i in &visit {
                let c = &mut consumers[i as usize];
                while c.pop(&mut buf).unwrap() {
                    assert_eq!(u64::from_le_bytes(buf), expect[i as usize], "ring {i}");
                    expect[i as usize] += 1;
                    got += 1;
                }
                set.settle(i, false, || c.available().unwrap() > 0);
            }
            if got < N && set.queued().is_empty() && ready_c.prepare_sleep().unwrap() {
                assert!(
                    bell.wait(Some(Duration::from_secs(10))).unwrap(),
                    "lost announcement: {got} of {N} entries"
                );
                bell.drain();
                ready_c.finish_sleep();
            }
        }
        assert!(most <= RINGS as usize);
    });
}
