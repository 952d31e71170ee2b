//! RDMA WRITE with immediate: A writes straight into B's memory, and B learns that it
//! landed from a receive completion carrying the immediate (which consumes a receive
//! request, without using its buffer). B reads the written bytes with atomic copies,
//! sound even while A could write again.
//!
//!     cargo run -p softverbs --example write_with_imm

#[path = "common/mod.rs"]
mod common;

use std::time::Duration;

use softverbs::{Context, Op, QpInit, QpType, SendWork, WcOpcode, WcStatus, WC_WITH_IMM};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let d = common::daemon("imm");
    let (a, b) = (
        Context::open_at(&d.socket, 0)?,
        Context::open_at(&d.socket, 0)?,
    );
    let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
    let (cqa, cqb) = (a.create_cq(16)?, b.create_cq(16)?);
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

    // B's target: its address, length and rkey are all A needs (sent out of band, as bytes).
    let mut mb = pb.alloc_mr(4096, common::ALL)?;
    let target = mb.take(1024)?;
    let wire = target.remote().to_bytes();
    let slot = mb.take(8)?;
    qb.post_recv_buf(slot).map_err(|r| r.error)?;

    let remote = softverbs::Remote::from_bytes(wire);
    let mut ma = pa.alloc_mr(4096, common::ALL)?;
    let mut src = ma.take(13)?;
    src.write(0, b"written by A!")?;
    qa.post(SendWork::new(Op::WriteWithImm(remote, 0xfeed), src))
        .map_err(|r| r.error)?;

    let t = Duration::from_secs(10);
    let sent = cqa.wait_bufs(1, t)?.pop().ok_or("no send completion")?;
    assert_eq!(sent.wc.status, WcStatus::Success);
    let got = cqb.wait_bufs(1, t)?.pop().ok_or("no receive completion")?;
    assert_eq!(got.wc.opcode, WcOpcode::RecvRdmaWithImm);
    assert!(got.wc.wc_flags & WC_WITH_IMM != 0);
    let mut text = [0u8; 13];
    target.read(0, &mut text)?;
    println!(
        "B got immediate {:#x} and {:?}",
        got.wc.imm_data,
        String::from_utf8_lossy(&text)
    );
    assert_eq!((got.wc.imm_data, &text), (0xfeed, b"written by A!"));
    Ok(())
}
