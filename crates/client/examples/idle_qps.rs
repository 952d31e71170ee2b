//! Holds N idle RC QPs open on a daemon, for the idle-QP benchmark (`scripts/idle-qps.sh`,
//! docs/performance.md): another client's latency must not depend on them.
//!
//! `idle_qps SOCKET N STATE` with STATE `reset`, `init` or `rts` (each QP connected to
//! itself, so it is a valid RTS QP that never sends). Every QP has its work queues mapped
//! (what `ibv_create_qp` through the drop-in gives). Prints how long creating (and moving)
//! the QPs took and what one more create + destroy costs then, then `ready`, and holds the
//! QPs until its standard input closes.

use std::io::Read;
use std::time::Instant;

use softverbs::{AhAttr, AttrMask as M, Context, Mtu, QpAttr, QpCap, QpInit, QpState, QpType};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: idle_qps SOCKET N reset|init|rts");
        std::process::exit(2);
    }
    let n: usize = args[2].parse().expect("N");
    let state = args[3].as_str();
    let ctx = Context::open_at(std::path::Path::new(&args[1]), 0).expect("open");
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(16).expect("cq");
    let gid = ctx.query_gid(1, 0).expect("gid");
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut qps = Vec::with_capacity(n);
    let start = Instant::now();
    let mut last = start;
    for i in 0..n {
        let qp = ctx
            .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap))
            .expect("create_qp");
        if state != "reset" {
            let init = QpAttr {
                qp_state: QpState::Init,
                port_num: 1,
                ..QpAttr::default()
            };
            qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
                .expect("INIT");
        }
        if state == "rts" {
            let rtr = QpAttr {
                qp_state: QpState::Rtr,
                ah_attr: AhAttr {
                    dgid: gid,
                    is_global: true,
                    port_num: 1,
                    hop_limit: 64,
                    ..AhAttr::default()
                },
                path_mtu: Mtu::M1024,
                dest_qp_num: qp.qpn(),
                max_dest_rd_atomic: 1,
                min_rnr_timer: 1,
                ..QpAttr::default()
            };
            qp.modify(
                &rtr,
                M::STATE
                    | M::AV
                    | M::PATH_MTU
                    | M::DEST_QPN
                    | M::RQ_PSN
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER,
            )
            .expect("RTR");
            let rts = QpAttr {
                qp_state: QpState::Rts,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                max_rd_atomic: 1,
                ..rtr
            };
            qp.modify(
                &rts,
                M::STATE
                    | M::SQ_PSN
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC,
            )
            .expect("RTS");
        }
        qps.push(qp);
        if (i + 1) % 1000 == 0 {
            let now = Instant::now();
            println!(
                "qps {} last_1000_ms {:.1}",
                i + 1,
                (now - last).as_secs_f64() * 1e3
            );
            last = now;
        }
    }
    println!(
        "created {n} {state} QPs in {:.1} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    // What one more QP costs now: create (with its rings mapped) and destroy, 200 times.
    let t = Instant::now();
    for _ in 0..200 {
        let qp = ctx
            .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap))
            .expect("create_qp");
        drop(qp);
    }
    println!(
        "create+destroy at {n} QPs: {:.1} us",
        t.elapsed().as_secs_f64() * 1e6 / 200.0
    );
    println!("ready");
    let _ = std::io::stdin().read(&mut [0u8; 1]);
    drop(qps);
}
