//! Scale check: 100,000 shared XRC receive QPs, each held by 10 contexts (one creator and 9
//! joiners), in two variants — joiners use legacy registrations, or `open_qp` handles.
//!
//! Reports the net heap bytes per receive QP (with its creator holder) and per additional
//! holder, the time `close_context` takes for a context holding 100,000 of them, and checks
//! that closing every context leaves the core empty.
//!
//! ```text
//! cargo run --release -p softverbs-core --example scale
//! ```

use std::alloc::System;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use softverbs_core::attr::QpInitAttr;
use softverbs_core::device::Device;
use softverbs_core::errno::O_CREAT;
use softverbs_core::ids::{CtxId, FileId, Handle};
use softverbs_core::types::{Mtu, QpType};
use softverbs_core::{ContextInfo, Core};
use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const QPS: usize = 100_000;
const CONTEXTS: usize = 10;
const FILE: FileId = FileId { dev: 1, ino: 42 };

/// Bytes currently allocated on the heap (allocated minus freed, reallocs included).
fn heap() -> isize {
    let s = GLOBAL.stats();
    s.bytes_allocated as isize - s.bytes_deallocated as isize
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// Creator: legacy `create_xrc_rcv_qp`; joiners: `reg_xrc_rcv_qp`.
    Registration,
    /// Creator: `create_qp(XRC_RECV)`; joiners: `open_qp`.
    OpenQp,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Registration => "registrations",
            Variant::OpenQp => "open_qp handles",
        }
    }
}

struct Report {
    variant: Variant,
    bytes_per_qp: f64,
    bytes_per_holder: f64,
    build: Duration,
    close_joiner: Duration,
    close_rest: Vec<Duration>,
    unreg_scattered: Duration,
    unreg_sorted: Duration,
    residual: isize,
}

/// Fisher-Yates with a fixed xorshift seed: a reproducible scattered order.
fn shuffle(v: &mut [u32]) {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn run(variant: Variant) -> Report {
    let start = heap();
    let ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    let mut core = Core::new(vec![Device::roce("softverbs0", 1, &[ip], Mtu::M1024)]);
    let mut ctxs: Vec<CtxId> = Vec::with_capacity(CONTEXTS);
    let mut xrcd: Vec<Handle> = Vec::with_capacity(CONTEXTS);
    for i in 0..CONTEXTS {
        let info = ContextInfo {
            pid: 2000 + i as u32,
            uid: 0,
            comm: format!("scale{i}"),
        };
        let ctx = core.open_context(0, info).unwrap();
        xrcd.push(core.open_xrcd(ctx, Some(FILE), O_CREAT).unwrap().handle);
        ctxs.push(ctx);
    }
    let mut qpns: Vec<u32> = Vec::with_capacity(QPS);

    let t = Instant::now();
    let before_qps = heap();
    for _ in 0..QPS {
        let qpn = match variant {
            Variant::Registration => core.create_xrc_rcv_qp(ctxs[0], xrcd[0]).unwrap(),
            Variant::OpenQp => {
                let init = QpInitAttr {
                    xrcd: Some(xrcd[0]),
                    ..QpInitAttr::new(QpType::XrcRecv)
                };
                core.create_qp(ctxs[0], &init).unwrap().qpn
            }
        };
        qpns.push(qpn);
    }
    let after_qps = heap();
    for &qpn in &qpns {
        for i in 1..CONTEXTS {
            match variant {
                Variant::Registration => core.reg_xrc_rcv_qp(ctxs[i], xrcd[i], qpn).unwrap(),
                Variant::OpenQp => {
                    core.open_qp(ctxs[i], xrcd[i], qpn, QpType::XrcRecv)
                        .unwrap();
                }
            }
        }
    }
    let after_holders = heap();
    let build = t.elapsed();

    let n = core.counts();
    assert_eq!(n.xrc_recv_qps, QPS);
    assert_eq!(n.xrc_recv_holders, QPS * CONTEXTS);
    match variant {
        Variant::Registration => assert_eq!(n.registrations, QPS * CONTEXTS),
        Variant::OpenQp => assert_eq!(n.qp_handles, QPS * CONTEXTS),
    }

    // A joiner with 100,000 holders goes away; the QPs survive (9 holders left each).
    let t = Instant::now();
    core.close_context(ctxs[1]).unwrap();
    let close_joiner = t.elapsed();
    assert_eq!(core.counts().xrc_recv_qps, QPS);

    // Diagnostic (registration variant): the same 100,000 leaves that close_context does,
    // made one by one through the public API, once in scattered QP-number order (like the
    // HashMap order close_context walks) and once in ascending order.
    let mut unreg_scattered = Duration::ZERO;
    let mut unreg_sorted = Duration::ZERO;
    let mut first_close = 2;
    if variant == Variant::Registration {
        let mut order = qpns.clone();
        shuffle(&mut order);
        let t = Instant::now();
        for &qpn in &order {
            core.unreg_xrc_rcv_qp(ctxs[2], xrcd[2], qpn).unwrap();
        }
        unreg_scattered = t.elapsed();
        order.sort_unstable();
        let t = Instant::now();
        for &qpn in &order {
            core.unreg_xrc_rcv_qp(ctxs[3], xrcd[3], qpn).unwrap();
        }
        unreg_sorted = t.elapsed();
        core.close_context(ctxs[2]).unwrap();
        core.close_context(ctxs[3]).unwrap();
        first_close = 4;
    }

    // The rest, creator last: the last close also destroys the 100,000 QPs.
    let mut close_rest = Vec::new();
    for &ctx in ctxs[first_close..].iter().chain(&ctxs[..1]) {
        let t = Instant::now();
        core.close_context(ctx).unwrap();
        close_rest.push(t.elapsed());
    }
    assert!(core.counts().is_empty(), "leak: {:?}", core.counts());
    let residual = heap() - start;
    drop(qpns);
    drop(core);

    let qp_bytes = (after_qps - before_qps) as f64;
    let holder_bytes = (after_holders - after_qps) as f64;
    Report {
        variant,
        bytes_per_qp: qp_bytes / QPS as f64,
        bytes_per_holder: holder_bytes / (QPS * (CONTEXTS - 1)) as f64,
        build,
        close_joiner,
        close_rest,
        unreg_scattered,
        unreg_sorted,
        residual,
    }
}

fn main() {
    let reports: Vec<Report> = [Variant::Registration, Variant::OpenQp]
        .into_iter()
        .map(run)
        .collect();

    println!(
        "{QPS} XRC receive QPs x {CONTEXTS} holders (1 creator + {} joiners each), one shared XRCD",
        CONTEXTS - 1
    );
    println!();
    println!(
        "| {:<15} | {:>12} | {:>15} | {:>9} | {:>17} | {:>15} | {:>16} | {:>13} |",
        "joiners",
        "B / QP+creat",
        "B / extra holder",
        "build ms",
        "close joiner ms",
        "other closes ms",
        "close last ms",
        "residual B"
    );
    println!(
        "|{:-<17}|{:->14}|{:->17}|{:->11}|{:->19}|{:->17}|{:->18}|{:->15}|",
        "", "", "", "", "", "", "", ""
    );
    for r in &reports {
        let (last, middle) = r.close_rest.split_last().expect("nine closes");
        let middle_max = middle.iter().max().copied().unwrap_or_default();
        println!(
            "| {:<15} | {:>12.1} | {:>15.1} | {:>9.1} | {:>17.2} | {:>15.2} | {:>16.2} | {:>13} |",
            r.variant.name(),
            r.bytes_per_qp,
            r.bytes_per_holder,
            ms(r.build),
            ms(r.close_joiner),
            ms(middle_max),
            ms(*last),
            r.residual
        );
    }
    println!();
    println!("close joiner:  close_context of a context holding {QPS} holders; the QPs survive");
    println!("other closes:   slowest of the other joiner closes (each holds {QPS}; QPs survive)");
    println!("close last:    the creator context, whose close also destroys the {QPS} QPs");
    println!("residual:      heap still held by the core once every context is closed");
    println!("core.counts().is_empty() after closing every context: ok (both variants)");
    if let Some(r) = reports.iter().find(|r| r.variant == Variant::Registration) {
        println!();
        println!(
            "diagnostic: {QPS} x unreg_xrc_rcv_qp of one joiner, by the order of the QP numbers"
        );
        println!(
            "  scattered order (hash-map order):                     {:>8.2} ms",
            ms(r.unreg_scattered)
        );
        println!(
            "  ascending order:                                      {:>8.2} ms",
            ms(r.unreg_sorted)
        );
    }
}
