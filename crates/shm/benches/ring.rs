//! Ring costs between two threads that poll with `std::thread::yield_now()` when empty (as
//! every poller must on this 2-vCPU machine kind):
//!
//! * `one_way_latency`: ping-pong over two rings, reported per one-way hop (round trip / 2);
//! * `throughput_64B`: one thread pushes 64-byte entries, the other pops them (per-entry
//!   publish, and staged in batches of 32 with one publish per batch);
//! * `doorbell_wake_latency`: the same ping-pong, but each side goes to sleep on its eventfd
//!   doorbell as soon as its ring is empty, and the producer rings only when the consumer asked
//!   (the need-wakeup flag): the cost of waking a sleeping daemon or client;
//! * `push_pop_same_thread`: the uncontended cost of one push plus one pop.
//!
//! ```text
//! CARGO_TARGET_DIR=/work/target-shm cargo bench -p softverbs-shm --bench ring -- \
//!     --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use softverbs_shm::{Consumer, Doorbell, Producer, PushError, Region, RingLayout};

const ENTRY: usize = 64;
const STOP: u64 = u64::MAX;

/// Two rings (`a`: main → worker, `b`: worker → main) of `cap` 64-byte entries in one region.
fn rings(cap: u32) -> ((Producer, Consumer), (Producer, Consumer)) {
    let layout = RingLayout::new(cap, ENTRY as u32).unwrap();
    let (region, _fd) = Region::create("bench", 2 * layout.size()).unwrap();
    let region = Arc::new(region);
    let mut ends = Vec::new();
    for off in [0, layout.size()] {
        layout.init(&region, off).unwrap();
        ends.push((
            Producer::attach(region.clone(), off, layout).unwrap(),
            Consumer::attach(region.clone(), off, layout).unwrap(),
        ));
    }
    let b = ends.pop().unwrap();
    (ends.pop().unwrap(), b)
}

fn entry(n: u64) -> [u8; ENTRY] {
    let mut e = [0u8; ENTRY];
    e[..8].copy_from_slice(&n.to_le_bytes());
    e
}

fn push_spin(p: &mut Producer, e: &[u8]) {
    loop {
        match p.push(e) {
            Ok(_) => return,
            Err(PushError::Full) => std::thread::yield_now(),
            Err(e) => panic!("{e}"),
        }
    }
}

/// Polls until an entry arrives: `pauses` busy polls (with `spin_loop`), then a
/// `yield_now()` after every empty poll.
fn pop_spin(c: &mut Consumer, buf: &mut [u8], pauses: u32) {
    let mut n = 0;
    while !c.pop(buf).unwrap() {
        if n < pauses {
            n += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

fn one_way_latency(crit: &mut Criterion) {
    // 0: yield after every empty poll (what every poller must do on 2 vCPUs when three
    // parties poll); 200: a short busy spin first, possible when only two parties poll.
    for pauses in [0u32, 200] {
        let ((mut a_tx, mut a_rx), (mut b_tx, mut b_rx)) = rings(64);
        std::thread::scope(|s| {
            s.spawn(move || {
                let mut buf = [0u8; ENTRY];
                loop {
                    pop_spin(&mut a_rx, &mut buf, pauses);
                    if buf[..8] == STOP.to_le_bytes() {
                        return;
                    }
                    push_spin(&mut b_tx, &buf);
                }
            });
            let mut g = crit.benchmark_group("ring");
            let name = if pauses == 0 {
                "one_way_latency (round trip / 2, yield when empty)".to_string()
            } else {
                format!("one_way_latency (round trip / 2, {pauses} pauses then yield)")
            };
            g.bench_function(name, |bch| {
                bch.iter_custom(|iters| {
                    let mut buf = [0u8; ENTRY];
                    let start = Instant::now();
                    for i in 0..iters {
                        push_spin(&mut a_tx, &entry(i));
                        pop_spin(&mut b_rx, &mut buf, pauses);
                        debug_assert_eq!(buf, entry(i));
                    }
                    start.elapsed() / 2
                })
            });
            g.finish();
            push_spin(&mut a_tx, &entry(STOP));
        });
    }
}

fn doorbell_wake_latency(crit: &mut Criterion) {
    let ((mut a_tx, mut a_rx), (mut b_tx, mut b_rx)) = rings(64);
    let (a_bell, b_bell) = (Doorbell::new().unwrap(), Doorbell::new().unwrap());
    let wait = |c: &mut Consumer, bell: &Doorbell, buf: &mut [u8]| {
        while !c.pop(buf).unwrap() {
            c.wait(bell, 0, None).unwrap();
        }
    };
    std::thread::scope(|s| {
        let (a_bell, b_bell) = (&a_bell, &b_bell);
        s.spawn(move || {
            let mut buf = [0u8; ENTRY];
            loop {
                wait(&mut a_rx, a_bell, &mut buf);
                if buf[..8] == STOP.to_le_bytes() {
                    return;
                }
                if b_tx.push(&buf).unwrap() {
                    b_bell.ring();
                }
            }
        });
        let mut g = crit.benchmark_group("ring");
        g.bench_function(
            "doorbell_wake_latency (round trip / 2, sleep when empty)",
            |bch| {
                bch.iter_custom(|iters| {
                    let mut buf = [0u8; ENTRY];
                    let start = Instant::now();
                    for i in 0..iters {
                        if a_tx.push(&entry(i)).unwrap() {
                            a_bell.ring();
                        }
                        wait(&mut b_rx, b_bell, &mut buf);
                        debug_assert_eq!(buf, entry(i));
                    }
                    start.elapsed() / 2
                })
            },
        );
        g.finish();
        if a_tx.push(&entry(STOP)).unwrap() {
            a_bell.ring();
        }
    });
}

fn throughput(crit: &mut Criterion) {
    for batch in [1usize, 32] {
        let ((mut tx, mut rx), _) = rings(1024);
        let consumed = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut buf = [0u8; ENTRY];
                let mut n = 0u64;
                loop {
                    if rx.pop(&mut buf).unwrap() {
                        debug_assert_eq!(buf[..8], n.to_le_bytes());
                        n += 1;
                        consumed.store(n, Ordering::Release);
                    } else if stop.load(Ordering::Relaxed) {
                        return;
                    } else {
                        std::thread::yield_now();
                    }
                }
            });
            let mut g = crit.benchmark_group("ring");
            g.throughput(Throughput::Elements(1));
            let name = if batch == 1 {
                "throughput_64B (publish each)".to_string()
            } else {
                format!("throughput_64B (publish per {batch})")
            };
            let mut next = 0u64;
            g.bench_function(name, |bch| {
                bch.iter_custom(|iters| {
                    let start = Instant::now();
                    let end = next + iters;
                    while next < end {
                        let mut staged = 0;
                        while staged < batch && next < end {
                            match tx.stage(&entry(next)) {
                                Ok(()) => {
                                    next += 1;
                                    staged += 1;
                                }
                                Err(PushError::Full) => break,
                                Err(e) => panic!("{e}"),
                            }
                        }
                        tx.publish();
                        if staged < batch && next < end {
                            std::thread::yield_now();
                        }
                    }
                    while consumed.load(Ordering::Acquire) < end {
                        std::thread::yield_now();
                    }
                    start.elapsed()
                })
            });
            g.finish();
            stop.store(true, Ordering::Relaxed);
        });
    }
}

fn same_thread(crit: &mut Criterion) {
    let ((mut tx, mut rx), _) = rings(64);
    let mut buf = [0u8; ENTRY];
    let e = entry(1);
    crit.bench_function("ring/push_pop_same_thread", |bch| {
        bch.iter(|| {
            tx.push(black_box(&e)).unwrap();
            rx.pop(&mut buf).unwrap();
            black_box(&buf);
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1));
    targets = one_way_latency, doorbell_wake_latency, throughput, same_thread
}
criterion_main!(benches);
