//! Cost of the core's per-object operations at two scales (1,000 and 100,000 pre-existing
//! XRC receive QPs), to show it does not grow with the number of objects, and the cost of
//! tearing down a context that holds many registrations.
//!
//! ```text
//! cargo bench -p softverbs-core --bench core_ops -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! Every pair benchmark (`create + destroy`, `reg + unreg`, ...) leaves the core exactly as
//! it found it, so the scale stays fixed for the whole measurement. Ops that act on an
//! existing QP walk the pre-existing QPs in a scattered order, so at the large scale the
//! numbers include the cache misses a real daemon would see.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, SamplingMode};
use softverbs_core::attr::QpInitAttr;
use softverbs_core::device::Device;
use softverbs_core::errno::O_CREAT;
use softverbs_core::ids::{CtxId, FileId, Handle};
use softverbs_core::types::{EventType, Mtu, QpType};
use softverbs_core::{ContextInfo, Core};

/// Numbers of pre-existing receive QPs the per-op benchmarks run against.
const SCALES: [usize; 2] = [1_000, 100_000];
/// Contexts in every fixture (the fan-out benchmark uses all of them as holders).
const CONTEXTS: usize = 10;
/// The file every context opens its XRC domain on.
const FILE: FileId = FileId { dev: 1, ino: 42 };

/// A core with [`CONTEXTS`] contexts sharing one file-keyed XRC domain, and `n` receive QPs
/// created by context 0 (legacy create: a registration) and registered by context 1, so
/// every pre-existing QP has two holders. Contexts 2.. hold nothing yet.
struct Fixture {
    core: Core,
    ctxs: Vec<CtxId>,
    xrcd: Vec<Handle>,
    qpns: Vec<u32>,
    /// Position in the scattered walk over `qpns`.
    cursor: usize,
}

impl Fixture {
    fn new(n: usize) -> Fixture {
        let ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let mut core = Core::new(vec![Device::roce("softverbs0", 1, &[ip], Mtu::M1024)]);
        let mut ctxs = Vec::with_capacity(CONTEXTS);
        let mut xrcd = Vec::with_capacity(CONTEXTS);
        for i in 0..CONTEXTS {
            let info = ContextInfo {
                pid: 1000 + i as u32,
                uid: 0,
                comm: format!("bench{i}"),
            };
            let ctx = core.open_context(0, info).unwrap();
            xrcd.push(core.open_xrcd(ctx, Some(FILE), O_CREAT).unwrap().handle);
            ctxs.push(ctx);
        }
        let mut qpns = Vec::with_capacity(n);
        for _ in 0..n {
            let qpn = core.create_xrc_rcv_qp(ctxs[0], xrcd[0]).unwrap();
            core.reg_xrc_rcv_qp(ctxs[1], xrcd[1], qpn).unwrap();
            qpns.push(qpn);
        }
        Fixture {
            core,
            ctxs,
            xrcd,
            qpns,
            cursor: 0,
        }
    }

    /// The next pre-existing QP in a scattered (large odd stride) order.
    fn next_qpn(&mut self) -> u32 {
        self.cursor = (self.cursor + 7919) % self.qpns.len();
        self.qpns[self.cursor]
    }
}

fn label(n: usize) -> String {
    format!("{n}_qps")
}

fn per_op(c: &mut Criterion) {
    for n in SCALES {
        let mut g = c.benchmark_group("open_xrcd_existing+close_xrcd");
        let mut f = Fixture::new(n);
        let ctx = f.ctxs[2];
        g.bench_function(BenchmarkId::from_parameter(label(n)), |b| {
            b.iter(|| {
                let o = f.core.open_xrcd(ctx, Some(FILE), O_CREAT).unwrap();
                debug_assert!(!o.created);
                f.core.close_xrcd(ctx, black_box(o.handle)).unwrap();
            })
        });
        g.finish();
        drop(f);

        let mut g = c.benchmark_group("create_qp_xrc_recv+destroy_qp");
        let mut f = Fixture::new(n);
        let (ctx, xh) = (f.ctxs[2], f.xrcd[2]);
        let init = QpInitAttr {
            xrcd: Some(xh),
            ..QpInitAttr::new(QpType::XrcRecv)
        };
        g.bench_function(BenchmarkId::from_parameter(label(n)), |b| {
            b.iter(|| {
                let q = f.core.create_qp(ctx, black_box(&init)).unwrap();
                let n = f.core.destroy_qp(ctx, q.handle).unwrap();
                // The data-path changes are drained, as the daemon does after each command.
                while f.core.poll_change().is_some() {}
                n
            })
        });
        g.finish();
        drop(f);

        let mut g = c.benchmark_group("open_qp+destroy_qp");
        let mut f = Fixture::new(n);
        let (ctx, xh) = (f.ctxs[2], f.xrcd[2]);
        g.bench_function(BenchmarkId::from_parameter(label(n)), |b| {
            b.iter(|| {
                let qpn = f.next_qpn();
                let h = f.core.open_qp(ctx, xh, qpn, QpType::XrcRecv).unwrap();
                f.core.destroy_qp(ctx, black_box(h)).unwrap()
            })
        });
        g.finish();
        drop(f);

        // The same, always on one QP: no cache misses, so what is left is the algorithmic
        // cost (hash lookups and the O(log n) holder-map walk).
        let mut g = c.benchmark_group("open_qp+destroy_qp_same_qp");
        let mut f = Fixture::new(n);
        let (ctx, xh, qpn) = (f.ctxs[2], f.xrcd[2], f.qpns[n / 2]);
        g.bench_function(BenchmarkId::from_parameter(label(n)), |b| {
            b.iter(|| {
                let h = f
                    .core
                    .open_qp(ctx, xh, black_box(qpn), QpType::XrcRecv)
                    .unwrap();
                f.core.destroy_qp(ctx, black_box(h)).unwrap()
            })
        });
        g.finish();
        drop(f);

        let mut g = c.benchmark_group("create_xrc_rcv_qp+unreg");
        let mut f = Fixture::new(n);
        let (ctx, xh) = (f.ctxs[2], f.xrcd[2]);
        g.bench_function(BenchmarkId::from_parameter(label(n)), |b| {
            b.iter(|| {
                let qpn = f.core.create_xrc_rcv_qp(ctx, xh).unwrap();
                let n = f.core.unreg_xrc_rcv_qp(ctx, xh, black_box(qpn)).unwrap();
                while f.core.poll_change().is_some() {}
                n
            })
        });
        g.finish();
        drop(f);

        let mut g = c.benchmark_group("reg_xrc_rcv_qp+unreg");
        let mut f = Fixture::new(n);
        let (ctx, xh) = (f.ctxs[2], f.xrcd[2]);
        g.bench_function(BenchmarkId::from_parameter(label(n)), |b| {
            b.iter(|| {
                let qpn = f.next_qpn();
                f.core.reg_xrc_rcv_qp(ctx, xh, qpn).unwrap();
                f.core.unreg_xrc_rcv_qp(ctx, xh, black_box(qpn)).unwrap()
            })
        });
        g.finish();
        drop(f);

        let mut g = c.benchmark_group("reg_xrc_rcv_qp+unreg_same_qp");
        let mut f = Fixture::new(n);
        let (ctx, xh, qpn) = (f.ctxs[2], f.xrcd[2], f.qpns[n / 2]);
        g.bench_function(BenchmarkId::from_parameter(label(n)), |b| {
            b.iter(|| {
                f.core.reg_xrc_rcv_qp(ctx, xh, black_box(qpn)).unwrap();
                f.core.unreg_xrc_rcv_qp(ctx, xh, black_box(qpn)).unwrap()
            })
        });
        g.finish();
        drop(f);

        // One QP with 10 holders, one per context: 5 registrations (contexts 0, 2, 4, ...)
        // and 5 open_qp handles. Each iteration raises one event and drains all 10 queues.
        let mut g = c.benchmark_group("raise_qp_event_fanout10+drain");
        let mut f = Fixture::new(n);
        let qpn = f.core.create_xrc_rcv_qp(f.ctxs[0], f.xrcd[0]).unwrap();
        for i in 1..CONTEXTS {
            if i & 1 == 0 {
                f.core.reg_xrc_rcv_qp(f.ctxs[i], f.xrcd[i], qpn).unwrap();
            } else {
                f.core
                    .open_qp(f.ctxs[i], f.xrcd[i], qpn, QpType::XrcRecv)
                    .unwrap();
            }
        }
        assert_eq!(f.core.xrc_rcv_qp_holders(qpn).len(), CONTEXTS);
        g.bench_function(BenchmarkId::from_parameter(label(n)), |b| {
            b.iter(|| {
                let woken = f.core.raise_qp_event(black_box(qpn), EventType::CommEst);
                debug_assert_eq!(woken.len(), CONTEXTS);
                for ctx in woken {
                    while let Some(ev) = f.core.next_event(ctx).unwrap() {
                        black_box(ev);
                    }
                }
            })
        });
        g.finish();
        drop(f);
    }
}

/// `close_context` of a context holding `regs` registrations, in a core where the QPs also
/// have a creator in another context (so they survive) and, optionally, `others` further
/// QPs the closing context has nothing to do with.
fn close_fixture(regs: usize, others: usize) -> (Core, CtxId) {
    let mut f = Fixture::new(regs);
    for _ in 0..others {
        f.core.create_xrc_rcv_qp(f.ctxs[3], f.xrcd[3]).unwrap();
    }
    (f.core, f.ctxs[1])
}

fn close_context(c: &mut Criterion) {
    let mut g = c.benchmark_group("close_context");
    // Every iteration needs a freshly built core (up to ~0.2 s of setup), so run few: flat
    // sampling, 10 samples of a few iterations, with the measurement time sized to each case.
    g.sample_size(10);
    g.sampling_mode(SamplingMode::Flat);
    g.warm_up_time(Duration::from_millis(1));
    for (regs, others) in [(1_000, 0), (1_000, 99_000), (100_000, 0)] {
        g.measurement_time(Duration::from_micros(regs as u64 * 8));
        let id = format!("{regs}_regs/{}_qps_total", regs + others);
        g.bench_function(BenchmarkId::from_parameter(id), |b| {
            b.iter_batched(
                || close_fixture(regs, others),
                |(mut core, ctx)| {
                    core.close_context(ctx).unwrap();
                    // Returned so dropping the core is not timed.
                    core
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = per_op, close_context
}
criterion_main!(benches);
