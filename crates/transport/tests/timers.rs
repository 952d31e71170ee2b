//! The engine looks for due timers only among QPs whose requester has one running, so an
//! engine holding many idle QPs spends nothing on them per turn (issue 10, item 5). Counted
//! (`Engine::timed_qps`), not timed.

use softverbs_core::types::{Access, Mtu, QpType};
use softverbs_transport::sim::{ConnParams, Faults, Host, Network};
use softverbs_transport::wr::{Payload, RecvWr, SendOp, SendWr, Sge, WcStatus};

#[test]
fn only_qps_with_requests_out_are_timer_candidates_and_lost_packets_still_retry() {
    let mut a = Host::new("10.0.0.1".parse().unwrap(), Mtu::M1024);
    let mut b = Host::new("10.0.0.2".parse().unwrap(), Mtu::M1024);
    let ca = a.context(1, 1 << 16);
    let cb = b.context(2, 1 << 16);
    let (pa, pb) = (a.pd(ca), b.pd(cb));
    let ka = a.mr(pa, 0, 1 << 16, Access::LOCAL_WRITE);
    let kb = b.mr(pb, 0, 1 << 16, Access::LOCAL_WRITE);
    let (cqa, cqb) = (a.cq(ca), b.cq(cb));
    let (ga, gb) = (a.gid, b.gid);
    // 500 connected RC QPs that never send.
    for _ in 0..500 {
        let qa = a.qp(QpType::Rc, pa, cqa, None);
        let qb = b.qp(QpType::Rc, pb, cqb, None);
        a.connect(qa, gb, qb, ConnParams::default());
        b.connect(qb, ga, qa, ConnParams::default());
    }
    let qa = a.qp(QpType::Rc, pa, cqa, None);
    let qb = b.qp(QpType::Rc, pb, cqb, None);
    a.connect(qa, gb, qb, ConnParams::default());
    b.connect(qb, ga, qa, ConnParams::default());
    assert_eq!(a.engine.timed_qps(), 0, "idle QPs have no timer");
    const N: u64 = 20;
    for i in 0..N {
        b.engine
            .post_recv(
                qb,
                RecvWr {
                    wr_id: i,
                    sges: vec![Sge {
                        addr: 64 * i,
                        length: 64,
                        lkey: kb,
                    }],
                },
            )
            .unwrap();
        a.engine
            .post_send(
                qa,
                SendWr::new(
                    i,
                    SendOp::Send,
                    Payload::Sges(vec![Sge {
                        addr: 0,
                        length: 32,
                        lkey: ka,
                    }]),
                ),
            )
            .unwrap();
    }
    // A lossy wire: only retransmission timers finish the transfer.
    let faults = Faults {
        loss: 0.3,
        ..Faults::NONE
    };
    let mut net = Network::new(vec![a, b], faults, 7);
    let mut most = 0;
    let ok = net.run_until(std::time::Duration::from_secs(30), |n| {
        most = most.max(n.hosts[0].engine.timed_qps() + n.hosts[1].engine.timed_qps());
        n.hosts[0].completions.len() == N as usize
    });
    assert!(
        ok,
        "{} of {N} sends completed",
        net.hosts[0].completions.len()
    );
    assert!(
        net.stats.lost > 0,
        "the wire lost nothing; the test proves nothing"
    );
    assert!(
        net.hosts[0]
            .completions
            .iter()
            .all(|(_, w)| w.status == WcStatus::Success),
        "{:?}",
        net.hosts[0].completions
    );
    assert_eq!(
        most, 1,
        "only the sending QP ever had a timer (of 1,002 QPs)"
    );
    assert_eq!(net.hosts[0].engine.timed_qps(), 0, "all acknowledged");
}
