//! The async API (feature `async`): posting returns a future of the completion, which
//! hands the buffer back; the task sleeps in tokio's reactor on the completion channel
//! instead of polling.
//!
//!     cargo run -p softverbs --features async --example async_pingpong

#[path = "common/mod.rs"]
mod common;

use softverbs::{AsyncCq, Context, Op, QpInit, QpType, SendWork, WcStatus};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let d = common::daemon("async");
    let ctx = Context::open_at(&d.socket, 0)?;
    let pd = ctx.alloc_pd()?;
    let channel = ctx.create_comp_channel()?;
    let cq = ctx.create_cq_with_channel(32, &channel)?;
    let init = QpInit::new(QpType::Rc, &pd)
        .cqs(&cq, &cq)
        .cap(common::cap());
    let (qa, qb) = (ctx.create_qp(&init)?, ctx.create_qp(&init)?);
    let gid = ctx.query_gid(1, 0)?;
    common::connect_rc(&qa, gid, qb.qpn())?;
    common::connect_rc(&qb, gid, qa.qpn())?;
    let acq = AsyncCq::new(&cq, &channel)?;

    let mut mr = pd.alloc_mr(4096, common::ALL)?;
    let mut msg = mr.take(32)?;
    let mut slot = mr.take(32)?;
    for i in 0..10u32 {
        let recv = acq.post_recv(&qb, slot).map_err(|r| r.error)?;
        msg.write(0, &i.to_le_bytes())?;
        let send = acq
            .post(&qa, SendWork::new(Op::Send, msg))
            .map_err(|r| r.error)?;
        let (got, sent) = (recv.await?, send.await?);
        assert_eq!(
            (got.wc.status, sent.wc.status),
            (WcStatus::Success, WcStatus::Success)
        );
        slot = got.buf.ok_or("receive buffer")?;
        msg = sent.buf.ok_or("send buffer")?;
        assert_eq!(slot.to_vec()[..4], i.to_le_bytes());
    }
    println!("10 messages, each awaited as a future");
    Ok(())
}
