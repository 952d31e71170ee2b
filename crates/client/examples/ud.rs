//! UD: datagrams to a QP named by an address handle and a Q_Key. Each received datagram
//! starts with the 40-byte GRH slot (ibv_post_recv(3)), then the payload.
//!
//!     cargo run -p softverbs --example ud

#[path = "common/mod.rs"]
mod common;

use std::time::Duration;

use softverbs::{
    AhAttr, AttrMask as M, Context, Op, Qp, QpAttr, QpInit, QpState, QpType, SendWork, UdAddress,
    WcStatus,
};

const QKEY: u32 = 0x1111_1111;
const GRH: usize = 40;

fn ready(qp: &Qp<'_>) -> softverbs::Result<()> {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qkey: QKEY,
        ..QpAttr::default()
    };
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)?;
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ..init
    };
    qp.modify(&rtr, M::STATE)?;
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..rtr
    };
    qp.modify(&rts, M::STATE | M::SQ_PSN)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let d = common::daemon("ud");
    let (a, b) = (
        Context::open_at(&d.socket, 0)?,
        Context::open_at(&d.socket, 0)?,
    );
    let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
    let (cqa, cqb) = (a.create_cq(16)?, b.create_cq(16)?);
    let qa = a.create_qp(
        &QpInit::new(QpType::Ud, &pa)
            .cqs(&cqa, &cqa)
            .cap(common::cap()),
    )?;
    let qb = b.create_qp(
        &QpInit::new(QpType::Ud, &pb)
            .cqs(&cqb, &cqb)
            .cap(common::cap()),
    )?;
    ready(&qa)?;
    ready(&qb)?;

    let mut mb = pb.alloc_mr(4096, common::ALL)?;
    for _ in 0..3 {
        qb.post_recv_buf(mb.take(GRH + 64)?).map_err(|r| r.error)?;
    }
    let ah = pa.create_ah(&AhAttr {
        dgid: b.query_gid(1, 0)?,
        is_global: true,
        port_num: 1,
        hop_limit: 64,
        ..AhAttr::default()
    })?;
    let to = UdAddress {
        ah: &ah,
        remote_qpn: qb.qpn(),
        remote_qkey: QKEY,
    };
    let mut ma = pa.alloc_mr(4096, common::ALL)?;
    let t = Duration::from_secs(10);
    for i in 0..3u8 {
        let mut msg = ma.take(16)?;
        msg.write(0, format!("datagram number{i}").as_bytes())?;
        qa.post(SendWork::new(Op::Send, msg).ud(to))
            .map_err(|r| r.error)?;
        let sent = cqa.wait_bufs(1, t)?.pop().ok_or("no send completion")?;
        assert_eq!(sent.wc.status, WcStatus::Success);
    }
    for c in cqb.wait_bufs(3, t)? {
        assert_eq!(c.wc.status, WcStatus::Success);
        let buf = c.buf.ok_or("buffer")?;
        let payload = &buf.to_vec()[GRH..c.wc.byte_len as usize];
        println!(
            "from QP {:#x}: {:?}",
            c.wc.src_qp,
            String::from_utf8_lossy(payload)
        );
        assert_eq!(c.wc.src_qp, qa.qpn());
    }
    Ok(())
}
