//! Property tests: random operation sequences against a `VecDeque` model, and a peer that
//! scribbles random values over the ring header between operations.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use proptest::prelude::*;
use softverbs_shm::{Consumer, Producer, PushError, Region, RingLayout, CACHE_LINE};

#[derive(Clone, Debug)]
enum Op {
    Push(u8),
    Stage(u8),
    Publish,
    Pop,
    PrepareSleep,
    FinishSleep,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => any::<u8>().prop_map(Op::Push),
        2 => any::<u8>().prop_map(Op::Stage),
        1 => Just(Op::Publish),
        4 => Just(Op::Pop),
        1 => Just(Op::PrepareSleep),
        1 => Just(Op::FinishSleep),
    ]
}

fn setup(cap: u32, esz: u32) -> (Producer, Consumer, Arc<Region>) {
    let layout = RingLayout::new(cap, esz).unwrap();
    // Put the ring at a non-zero offset, after some other ring's space.
    let off = 2 * CACHE_LINE;
    let (region, _fd) = Region::create("model", off + layout.size()).unwrap();
    let region = Arc::new(region);
    layout.init(&region, off).unwrap();
    (
        Producer::attach(region.clone(), off, layout).unwrap(),
        Consumer::attach(region.clone(), off, layout).unwrap(),
        region,
    )
}

fn fill(v: u8, esz: usize) -> Vec<u8> {
    (0..esz).map(|i| v.wrapping_add(i as u8)).collect()
}

proptest! {
    #[test]
    fn ring_matches_vecdeque(
        cap_log in 0u32..5,
        esz_words in 1u32..9,
        ops in proptest::collection::vec(op(), 0..300),
    ) {
        let cap = 1u32 << cap_log;
        let esz = (esz_words * 8) as usize;
        let (mut p, mut c, _r) = setup(cap, esz as u32);
        let mut published: VecDeque<u8> = VecDeque::new();
        let mut staged: Vec<u8> = Vec::new();
        let mut flag = false;
        let mut buf = vec![0u8; esz];
        for op in ops {
            match op {
                Op::Push(v) | Op::Stage(v) => {
                    let full = published.len() + staged.len() == cap as usize;
                    let push = matches!(op, Op::Push(_));
                    let r = if push { p.push(&fill(v, esz)) } else { p.stage(&fill(v, esz)).map(|()| false) };
                    if full {
                        prop_assert_eq!(r, Err(PushError::Full));
                    } else {
                        staged.push(v);
                        if push {
                            published.extend(staged.drain(..));
                            prop_assert_eq!(r, Ok(flag));
                        } else {
                            prop_assert_eq!(r, Ok(false));
                        }
                    }
                }
                Op::Publish => {
                    let any = !staged.is_empty();
                    published.extend(staged.drain(..));
                    prop_assert_eq!(p.publish(), any && flag);
                }
                Op::Pop => {
                    let got = c.pop(&mut buf).unwrap();
                    match published.pop_front() {
                        Some(v) => {
                            prop_assert!(got);
                            prop_assert_eq!(&buf, &fill(v, esz));
                        }
                        None => prop_assert!(!got),
                    }
                }
                Op::PrepareSleep => {
                    let may_sleep = published.is_empty();
                    prop_assert_eq!(c.prepare_sleep(), Ok(may_sleep));
                    flag = may_sleep;
                }
                Op::FinishSleep => {
                    c.finish_sleep();
                    flag = false;
                }
            }
            prop_assert_eq!(c.available().unwrap() as usize, published.len());
            prop_assert_eq!(p.free().unwrap() as usize, cap as usize - published.len() - staged.len());
        }
    }

    /// A hostile peer overwrites random header words (indices, flag, magic, capacity)
    /// between operations. Every operation still returns (no panic, no access outside the
    /// ring); an impossible index is reported as `Corrupt`, and that report is sticky.
    #[test]
    fn header_scribbles_are_errors_not_crashes(
        cap_log in 0u32..5,
        steps in proptest::collection::vec(
            (op(), proptest::option::weighted(0.3, (0usize..(4 * CACHE_LINE / 4), any::<u32>()))),
            0..300,
        ),
    ) {
        let cap = 1u32 << cap_log;
        let (mut p, mut c, region) = setup(cap, 16);
        let base = 2 * CACHE_LINE;
        let mut buf = [0u8; 16];
        let (mut p_err, mut c_err) = (None, None);
        for (op, scribble) in steps {
            if let Some((word, value)) = scribble {
                // Favour the words that matter.
                let off = match word % 4 {
                    0 => base + CACHE_LINE,
                    1 => base + 2 * CACHE_LINE,
                    2 => base + 3 * CACHE_LINE,
                    _ => base + word * 4,
                };
                region.atomic_u32(off).store(value, Ordering::Relaxed);
            }
            let (pr, cr) = match op {
                Op::Push(v) | Op::Stage(v) => (p.push(&[v; 16]).err().and_then(|e| match e {
                    PushError::Full => None,
                    PushError::Corrupt(c) => Some(c),
                }), None),
                Op::Publish => { p.publish(); (None, None) }
                Op::Pop => (None, c.pop(&mut buf).err()),
                Op::PrepareSleep => (None, c.prepare_sleep().err()),
                Op::FinishSleep => { c.finish_sleep(); (None, None) }
            };
            let (pf, cf) = (p.free(), c.available());
            for (seen, now, later) in [(&mut p_err, pr, pf.err()), (&mut c_err, cr, cf.err())] {
                if let Some(prev) = *seen {
                    prop_assert_eq!(later, Some(prev), "corruption must be sticky");
                }
                if let Some(e) = now.or(later) {
                    *seen = Some(e);
                }
            }
            if let Ok(n) = cf {
                prop_assert!(n <= cap);
            }
            if let Ok(n) = pf {
                prop_assert!(n <= cap);
            }
        }
    }
}
