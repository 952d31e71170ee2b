//! The hoarder: one object of every kind, held until the process is killed, so a test can
//! prove that the daemon frees all of it (tests/processes.rs).

use std::io::BufRead;
use std::path::Path;

use softverbs::{Context, QpInit};
use softverbs_core::attr::{AhAttr, SrqAttr};
use softverbs_core::errno::O_CREAT;
use softverbs_core::types::{Access, QpType};

use crate::dp_actor::{domain_file, say, OrFail};

/// Makes one object of every kind — PD, MR, CQ, basic SRQ, XRC SRQ, AH, RC/UC/UD/XRC-send
/// QPs, an XRC domain and receive QPs through every face — then waits to be killed.
pub fn run(socket: &Path, file: &Path) -> ! {
    let ctx = Context::open_at(socket, 0).or_fail("open device");
    let f = domain_file(file);
    let xrcd = ctx.open_xrcd(Some(&f), O_CREAT).or_fail("open xrcd");
    let pd = ctx.alloc_pd().or_fail("alloc_pd");
    let _mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).or_fail("reg_mr");
    let cq = ctx.create_cq(64).or_fail("create_cq");
    let srq_attr = SrqAttr {
        max_wr: 16,
        max_sge: 1,
        srq_limit: 0,
    };
    let srq = pd.create_srq(srq_attr).or_fail("create_srq");
    let _xsrq = xrcd
        .create_xrc_srq(&pd, &cq, srq_attr)
        .or_fail("create_xrc_srq");
    let gid = ctx.query_gid(1, 0).or_fail("query_gid");
    let _ah = pd
        .create_ah(&AhAttr {
            dgid: gid,
            is_global: true,
            port_num: 1,
            hop_limit: 64,
            ..AhAttr::default()
        })
        .or_fail("create_ah");
    let mut qps = Vec::new();
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        qps.push(
            ctx.create_qp(&QpInit::new(t, &pd).cqs(&cq, &cq))
                .or_fail("create_qp"),
        );
    }
    qps.push(
        ctx.create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).srq(&srq))
            .or_fail("create_qp"),
    );
    qps.push(
        ctx.create_qp(&QpInit::new(QpType::XrcSend, &pd).send_cq(&cq))
            .or_fail("create_qp"),
    );
    let _up = xrcd.create_recv_qp().or_fail("create_recv_qp");
    let legacy = xrcd.create_xrc_rcv_qp().or_fail("create_xrc_rcv_qp");
    let _min = xrcd.register_xrc_rcv_qp(None).or_fail("register");
    say(&format!("READY qpn={}", legacy.qpn()));
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    std::process::exit(0);
}
