//! What the owning API costs over the raw one: the same RDMA WRITEs on the same memory,
//! posted one at a time through `Qp::post` (a `Buf` moved in, handed back by
//! `Cq::poll_bufs`) and through `Qp::post_send` with a raw `Sge` (`Cq::poll`). Prints the
//! time per request, round trip and the post call alone, for each, and their ratio.
//!
//!     cargo run --release -p softverbs --example post_cost [N]

#[path = "common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use softverbs::{Context, Op, QpInit, QpType, SendOp, SendRequest, SendWork, Sge, WcStatus};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: u32 = std::env::args().nth(1).map_or(Ok(20_000), |s| s.parse())?;
    let d = common::daemon("cost");
    let ctx = Context::open_at(&d.socket, 0)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64)?;
    let init = QpInit::new(QpType::Rc, &pd)
        .cqs(&cq, &cq)
        .cap(common::cap());
    let (qa, qb) = (ctx.create_qp(&init)?, ctx.create_qp(&init)?);
    let gid = ctx.query_gid(1, 0)?;
    common::connect_rc(&qa, gid, qb.qpn())?;
    common::connect_rc(&qb, gid, qa.qpn())?;
    let mut mr = pd.alloc_mr(8192, common::ALL)?;
    let target = mr.take(4096)?.remote();
    let mut src = Some(mr.take(64)?);

    let owned = |rounds: u32,
                 src: &mut Option<softverbs::Buf>|
     -> Result<(Duration, Duration), Box<dyn std::error::Error>> {
        let (mut posting, start) = (Duration::ZERO, Instant::now());
        for _ in 0..rounds {
            let t = Instant::now();
            qa.post(SendWork::new(Op::Write(target), src.take().ok_or("buf")?))
                .map_err(|r| r.error)?;
            posting += t.elapsed();
            let c = loop {
                if let Some(c) = cq.poll_bufs(1)?.pop() {
                    break c;
                }
                // Two cores shared with the daemon: spinning would starve it.
                std::thread::yield_now();
            };
            assert_eq!(c.wc.status, WcStatus::Success);
            *src = c.buf;
        }
        Ok((start.elapsed(), posting))
    };
    let (addr, lkey) = {
        let b = src.as_ref().ok_or("buf")?;
        (b.addr(), b.lkey())
    };
    let raw = |rounds: u32| -> Result<(Duration, Duration), Box<dyn std::error::Error>> {
        let sge = [Sge {
            addr,
            length: 64,
            lkey,
        }];
        let op = SendOp::Write {
            remote_addr: target.addr,
            rkey: target.rkey,
        };
        let (mut posting, start) = (Duration::ZERO, Instant::now());
        for i in 0..rounds {
            let t = Instant::now();
            qa.post_send(&SendRequest::new(u64::from(i), op, &sge))?;
            posting += t.elapsed();
            let wc = loop {
                if let Some(w) = cq.poll(1)?.pop() {
                    break w;
                }
                std::thread::yield_now();
            };
            assert_eq!(wc.status, WcStatus::Success);
        }
        Ok((start.elapsed(), posting))
    };
    // Warm up both, then alternate quarters (and which goes first) so drift hits both alike.
    owned(n / 10, &mut src)?;
    raw(n / 10)?;
    let (mut o, mut r) = (
        (Duration::ZERO, Duration::ZERO),
        (Duration::ZERO, Duration::ZERO),
    );
    for i in 0..4 {
        let (x, y) = if i % 2 == 0 {
            let x = owned(n / 4, &mut src)?;
            (x, raw(n / 4)?)
        } else {
            let y = raw(n / 4)?;
            (owned(n / 4, &mut src)?, y)
        };
        o = (o.0 + x.0, o.1 + x.1);
        r = (r.0 + y.0, r.1 + y.1);
    }
    let per = |d: Duration| d.as_nanos() as f64 / f64::from(n);
    println!("{n} 64-byte WRITEs, one at a time, one daemon");
    println!(
        "owned API: {:8.0} ns per request, {:6.0} ns in post",
        per(o.0),
        per(o.1)
    );
    println!(
        "raw API:   {:8.0} ns per request, {:6.0} ns in post",
        per(r.0),
        per(r.1)
    );
    println!(
        "ratio owned/raw: {:.3} per request, {:.3} post call",
        per(o.0) / per(r.0),
        per(o.1) / per(r.1)
    );
    Ok(())
}
