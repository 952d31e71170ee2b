//! RC ping-pong with owned buffers: two contexts (as two processes would have), each with
//! an MR the library allocates as shared memory; every message is a `Buf` that moves into
//! its work request and comes back with the completion.
//!
//!     cargo run -p softverbs --example rc_pingpong

#[path = "common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use softverbs::{Context, Op, QpInit, QpType, SendWork, WcStatus};

const ROUNDS: u32 = 1000;
const T: Duration = Duration::from_secs(10);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let d = common::daemon("rc");
    let (a, b) = (
        Context::open_at(&d.socket, 0)?,
        Context::open_at(&d.socket, 0)?,
    );
    let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
    let (cqa, cqb) = (a.create_cq(32)?, b.create_cq(32)?);
    let qa = a.create_qp(
        &QpInit::new(QpType::Rc, &pa)
            .cqs(&cqa, &cqa)
            .cap(common::cap()),
    )?;
    let qb = b.create_qp(
        &QpInit::new(QpType::Rc, &pb)
            .cqs(&cqb, &cqb)
            .cap(common::cap()),
    )?;
    common::connect_rc(&qa, b.query_gid(1, 0)?, qb.qpn())?;
    common::connect_rc(&qb, a.query_gid(1, 0)?, qa.qpn())?;

    let (mut ma, mut mb) = (
        pa.alloc_mr(4096, common::ALL)?,
        pb.alloc_mr(4096, common::ALL)?,
    );
    let (mut a_send, mut a_recv) = (ma.take(64)?, ma.take(64)?);
    let (mut b_send, mut b_recv) = (mb.take(64)?, mb.take(64)?);
    let start = Instant::now();
    for i in 0..ROUNDS {
        // Each side has its receive posted before the other sends.
        qb.post_recv_buf(b_recv).map_err(|r| r.error)?;
        qa.post_recv_buf(a_recv).map_err(|r| r.error)?;
        a_send.write(0, &i.to_le_bytes())?;
        qa.post(SendWork::new(Op::Send, a_send))
            .map_err(|r| r.error)?;
        let got = wait_one(&cqb)?;
        let n = u32::from_le_bytes(got.to_vec()[..4].try_into()?);
        assert_eq!(n, i);
        b_recv = got;
        b_send.write(0, &(n + 1).to_le_bytes())?;
        qb.post(SendWork::new(Op::Send, b_send))
            .map_err(|r| r.error)?;
        // A's send and B's reply complete on A's CQ; B's send completes on B's.
        let (mut sent, mut reply) = (None, None);
        while sent.is_none() || reply.is_none() {
            let c = cqa.wait_bufs(1, T)?.pop().ok_or("no completion")?;
            assert_eq!(c.wc.status, WcStatus::Success);
            let buf = c.buf.ok_or("buffer")?;
            match c.wc.opcode {
                softverbs::WcOpcode::Recv => reply = Some(buf),
                _ => sent = Some(buf),
            }
        }
        let reply = reply.unwrap();
        assert_eq!(u32::from_le_bytes(reply.to_vec()[..4].try_into()?), i + 1);
        (a_send, a_recv) = (sent.unwrap(), reply);
        b_send = wait_one(&cqb)?;
    }
    let rtt = start.elapsed() / ROUNDS;
    println!("{ROUNDS} round trips, {rtt:?} each (including polling)");
    Ok(())
}

/// The next completion on `cq`, successful, with its buffer.
fn wait_one(cq: &softverbs::Cq<'_>) -> Result<softverbs::Buf, Box<dyn std::error::Error>> {
    let c = cq
        .wait_bufs(1, T)?
        .pop()
        .ok_or("no completion within 10 s")?;
    if c.wc.status != WcStatus::Success {
        return Err(format!("completion {:?}", c.wc.status).into());
    }
    Ok(c.buf.ok_or("completion without its buffer")?)
}
