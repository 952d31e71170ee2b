//! CQ notification over the simulated network: the responder's CQ semantics
//! (crates/transport/src/cq.rs) see what the wire carried (the BTH solicited-event bit).

use softverbs_core::types::{Access, Mtu, QpType};
use softverbs_transport::sim::{ConnParams, Faults, Host, Network};
use softverbs_transport::wr::{Payload, RecvWr, SendOp, SendWr, Sge};

/// IBA 11.4.2.2, ibv_req_notify_cq(3): a CQ armed for solicited completions only is not
/// notified by an unsolicited SEND, is notified once by a solicited one (IBA 9.2.3: the SE
/// bit of the request's last packet), and not again until it is re-armed; an arm for any
/// completion fires on the next.
#[test]
fn a_solicited_only_arm_fires_on_the_solicited_send_once() {
    let mut a = Host::new("10.0.0.1".parse().unwrap(), Mtu::M1024);
    let mut b = Host::new("10.0.0.2".parse().unwrap(), Mtu::M1024);
    let ca = a.context(1, 1 << 16);
    let cb = b.context(2, 1 << 16);
    let (pa, pb) = (a.pd(ca), b.pd(cb));
    let ka = a.mr(pa, 0, 1 << 16, Access::LOCAL_WRITE);
    let kb = b.mr(pb, 0, 1 << 16, Access::LOCAL_WRITE);
    let (cqa, cqb) = (a.cq(ca), b.cq(cb));
    let qa = a.qp(QpType::Rc, pa, cqa, None);
    let qb = b.qp(QpType::Rc, pb, cqb, None);
    let (ga, gb) = (a.gid, b.gid);
    a.connect(qa, gb, qb, ConnParams::default());
    b.connect(qb, ga, qa, ConnParams::default());
    for i in 0..4 {
        let sges = vec![Sge {
            addr: 0x1000 * i,
            length: 0x1000,
            lkey: kb,
        }];
        b.engine.post_recv(qb, RecvWr { wr_id: i, sges }).unwrap();
    }
    b.req_notify(cqb, true);
    let mut net = Network::new(vec![a, b], Faults::NONE, 7);
    let send = |net: &mut Network, wr_id: u64, solicited: bool| {
        let payload = Payload::Sges(vec![Sge {
            addr: 0,
            length: 64,
            lkey: ka,
        }]);
        let mut wr = SendWr::new(wr_id, SendOp::Send, payload);
        wr.solicited = solicited;
        net.hosts[0].engine.post_send(qa, wr).unwrap();
        let want = net.hosts[1].completions.len() + 1;
        assert!(net.run_until(std::time::Duration::from_secs(1), |n| {
            n.hosts[1].completions.len() == want
        }));
    };
    send(&mut net, 0, false);
    assert_eq!(net.hosts[1].channel.next_event(), None, "unsolicited");
    send(&mut net, 1, true);
    assert_eq!(net.hosts[1].channel.next_event(), Some(cqb));
    assert_eq!(net.hosts[1].channel.next_event(), None, "one event");
    send(&mut net, 2, true);
    assert_eq!(net.hosts[1].channel.next_event(), None, "not re-armed");
    net.hosts[1].req_notify(cqb, false);
    send(&mut net, 3, false);
    assert_eq!(net.hosts[1].channel.next_event(), Some(cqb));
    // The sender's CQ was never armed.
    assert_eq!(net.hosts[0].channel.next_event(), None);
    assert_eq!(net.hosts[1].take_completions(cqb).len(), 4);
}
