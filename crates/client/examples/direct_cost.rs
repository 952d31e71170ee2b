//! What one 8-byte SEND costs the two libraries of a direct pair when no other CPU is
//! involved: both contexts live in this process and one thread posts the receive, the SEND,
//! and polls both CQs, so every line stays in this CPU's cache. The difference between this
//! and the bench's one-way latency (`softverbs bench lat --op send`) is what the lines
//! handed between two CPUs cost (docs/performance.md, "the SEND round trip").
//!
//!     cargo run --release -p softverbs --example direct_cost [N]

#[path = "common/mod.rs"]
mod common;

use std::time::Instant;

use softverbs::{Context, QpInit, QpType, SendOp, SendRequest, Sge, WcStatus};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: u32 = std::env::args().nth(1).map_or(Ok(200_000), |s| s.parse())?;
    let d = common::daemon("direct-cost");
    let (ca, cb) = (
        Context::open_at_direct(&d.socket, 0, true)?,
        Context::open_at_direct(&d.socket, 0, true)?,
    );
    let (pa, pb) = (ca.alloc_pd()?, cb.alloc_pd()?);
    let (qa_cq, qb_cq) = (ca.create_cq(64)?, cb.create_cq(64)?);
    let qa = ca.create_qp(
        &QpInit::new(QpType::Rc, &pa)
            .cqs(&qa_cq, &qa_cq)
            .cap(common::cap()),
    )?;
    let qb = cb.create_qp(
        &QpInit::new(QpType::Rc, &pb)
            .cqs(&qb_cq, &qb_cq)
            .cap(common::cap()),
    )?;
    let gid = ca.query_gid(1, 0)?;
    common::connect_rc(&qa, gid, qb.qpn())?;
    common::connect_rc(&qb, gid, qa.qpn())?;
    if !(qa.is_direct() && qb.is_direct()) {
        return Err("the pair did not go direct".into());
    }
    let (mut ma, mut mb) = (
        pa.alloc_mr(4096, common::ALL)?,
        pb.alloc_mr(4096, common::ALL)?,
    );
    let (a, b) = (ma.take(8)?, mb.take(8)?);
    let sge = |buf: &softverbs::Buf| Sge {
        addr: buf.addr(),
        length: 8,
        lkey: buf.lkey(),
    };
    let (src, dst) = ([sge(&a)], [sge(&b)]);
    let mut signaled = 0;
    let mut round = |i: u32| -> Result<(), Box<dyn std::error::Error>> {
        qb.post_recv(u64::from(i), &dst)?;
        let mut req = SendRequest::new(u64::from(i), SendOp::Send, &src);
        // perftest's ib_send_lat signals one send in a few, like most latency loops.
        req.signaled = i % 16 == 0;
        qa.post_send(&req)?;
        loop {
            if let Some(w) = qb_cq.poll(1)?.pop() {
                if w.status != WcStatus::Success {
                    return Err(format!("receive {:?}", w.status).into());
                }
                break;
            }
        }
        if req.signaled {
            signaled += 1;
            while qa_cq.poll(1)?.is_empty() {}
        }
        Ok(())
    };
    for i in 0..n / 10 {
        round(i)?;
    }
    let t = Instant::now();
    for i in 0..n {
        round(i)?;
    }
    let per = t.elapsed().as_secs_f64() * 1e9 / f64::from(n);
    println!("8 B SEND, one thread, both libraries: {per:.0} ns per SEND ({n} rounds, {signaled} signaled)");
    // What a receiver waiting for the next message spends per look at its CQ.
    let t = Instant::now();
    for _ in 0..n {
        if qb_cq.poll_with(16, |_| ())? != 0 {
            return Err("a completion nobody sent".into());
        }
    }
    let empty = t.elapsed().as_secs_f64() * 1e9 / f64::from(n);
    println!("an empty poll of a direct QP's CQ: {empty:.0} ns");
    Ok(())
}
