//! UD multicast on the simulated network (`crates/transport/src/mcast.rs`): one sender, QPs
//! attached on its own host and on two others. Every attached QP whose Q_Key matches gets
//! every datagram exactly once, with `IBV_WC_GRH`, the group's address in the GRH and the
//! sender's QPN; the sending QP does not get its own (rxe); a QP with another Q_Key, a
//! detached QP and a destroyed QP get nothing; and with loss and duplication on the wire no
//! QP completes a datagram more often than the wire delivered it to its host.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use softverbs_core::device::Gid;
use softverbs_core::ids::CtxId;
use softverbs_core::mcast::MULTICAST_QPN;
use softverbs_core::types::{Access, Mtu, QpType};
use softverbs_transport::engine::CqId;
use softverbs_transport::sim::{ConnParams, Faults, Host, Network};
use softverbs_transport::wr::{Payload, RecvWr, SendOp, SendWr, Sge, UdDest, WcStatus, WC_GRH};
use softverbs_wire::Packet;

const SLOT: u64 = 512;
const QKEY: u32 = 0x1111_1111;
const GROUP: Ipv4Addr = Ipv4Addr::new(239, 1, 2, 3);

struct Node {
    host: Host,
    cq: CqId,
    lkey: u32,
    ctx: CtxId,
    pd: softverbs_core::datapath::PdRef,
    next_slot: u64,
}

impl Node {
    fn new(ip: &str) -> Node {
        let mut host = Host::new(ip.parse().unwrap(), Mtu::M1024);
        let ctx = host.context(1, 1 << 22);
        let pd = host.pd(ctx);
        let lkey = host.mr(pd, 0, 1 << 22, Access::LOCAL_WRITE);
        let cq = host.cq(ctx);
        Node {
            host,
            cq,
            lkey,
            ctx,
            pd,
            next_slot: 1,
        }
    }

    /// A UD QP in RTS with Q_Key `qkey` and `recvs` receives posted.
    fn qp(&mut self, qkey: u32, recvs: usize) -> u32 {
        let q = self.host.qp(QpType::Ud, self.pd, self.cq, None);
        let p = ConnParams {
            qkey,
            ..ConnParams::default()
        };
        self.host.connect(q, Gid::default(), 0, p);
        self.post(q, recvs);
        q
    }

    fn post(&mut self, q: u32, n: usize) {
        for _ in 0..n {
            let slot = self.next_slot;
            self.next_slot += 1;
            let wr = RecvWr {
                wr_id: slot,
                sges: vec![Sge {
                    addr: slot * SLOT,
                    length: SLOT as u32,
                    lkey: self.lkey,
                }],
            };
            self.host.engine.post_recv(q, wr).unwrap();
        }
    }
}

fn group() -> Gid {
    Gid::from(GROUP)
}

/// Posts datagrams `ids` from QP `qp` of the host whose one context is `ctx` (registered
/// whole with `lkey`) to the group; payload "mc<id>".
fn send(h: &mut Host, ctx: CtxId, lkey: u32, qp: u32, ids: std::ops::Range<u32>) {
    for id in ids {
        let text = format!("mc{id:05}");
        let at = (1 << 21) + u64::from(id) * 16;
        h.mem.space_mut(ctx)[at as usize..][..text.len()].copy_from_slice(text.as_bytes());
        let mut wr = SendWr::new(
            u64::from(id),
            SendOp::Send,
            Payload::Sges(vec![Sge {
                addr: at,
                length: text.len() as u32,
                lkey,
            }]),
        );
        // Any DQPN: a multicast destination puts 0xFFFFFF on the wire.
        wr.ud = Some(UdDest {
            dgid: group(),
            dest_qpn: 0x1234,
            qkey: QKEY,
        });
        h.engine.post_send(qp, wr).unwrap();
    }
}

/// (receiving QP → datagram id → copies), with every completion's fields checked.
fn received(net: &mut Network, host: usize, cq: CqId, sender: (Gid, u32)) -> Received {
    let h = &mut net.hosts[host];
    let ctx = CtxId(1);
    let mut got: Received = BTreeMap::new();
    for wc in h.take_completions(cq) {
        if wc.opcode != softverbs_transport::wr::WcOpcode::Recv {
            continue;
        }
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        assert_eq!(wc.wc_flags & WC_GRH, WC_GRH, "IBV_WC_GRH");
        assert_eq!(wc.src_qp, sender.1, "src_qp is the sender's QPN");
        assert_eq!(wc.sl, 2, "IPv4: mlx5's L3 type");
        assert_eq!(wc.byte_len, 40 + 7);
        let mem = h.mem.space(ctx);
        let buf = &mem[(wc.wr_id * SLOT) as usize..][..47];
        assert_eq!(&buf[..20], &[0u8; 20], "rxe's IPv4 GRH area: 20 zero bytes");
        let ip = |o: usize| Ipv4Addr::new(buf[o], buf[o + 1], buf[o + 2], buf[o + 3]);
        assert_eq!(Gid::from(ip(32)), sender.0, "GRH source is the sender");
        assert_eq!(ip(36), GROUP, "GRH destination is the group");
        assert_eq!(buf[28], 1, "GRH TTL: multicast leaves with TTL 1");
        let id: u32 = std::str::from_utf8(&buf[42..47]).unwrap().parse().unwrap();
        *got.entry(wc.qp_num).or_default().entry(id).or_default() += 1;
    }
    got
}

type Received = BTreeMap<u32, BTreeMap<u32, u32>>;

fn once_each(ids: std::ops::Range<u32>) -> BTreeMap<u32, u32> {
    ids.map(|i| (i, 1)).collect()
}

#[test]
fn every_attached_qp_gets_every_datagram_once_and_nothing_else_does() {
    let mut a = Node::new("10.0.0.1");
    let mut b = Node::new("10.0.0.2");
    let mut c = Node::new("10.0.0.3");
    let s = a.qp(QKEY, 64);
    let a_local = a.qp(QKEY, 64);
    let b1 = b.qp(QKEY, 64);
    let b2 = b.qp(QKEY, 64);
    let b_wrong_qkey = b.qp(0x2222_2222, 64);
    let c1 = c.qp(QKEY, 64);
    let c_detached = c.qp(QKEY, 64);
    let c_never = c.qp(QKEY, 64);
    a.host.attach_mcast(s, group()).unwrap();
    a.host.attach_mcast(a_local, group()).unwrap();
    b.host.attach_mcast(b1, group()).unwrap();
    b.host.attach_mcast(b2, group()).unwrap();
    b.host.attach_mcast(b_wrong_qkey, group()).unwrap();
    c.host.attach_mcast(c1, group()).unwrap();
    c.host.attach_mcast(c_detached, group()).unwrap();
    c.host.attach_mcast(c1, group()).unwrap();
    c.host.detach_mcast(c_detached, group()).unwrap();
    let _ = c_never;
    let sender = (a.host.gid, s);
    send(&mut a.host, a.ctx, a.lkey, s, 0..20);
    let (ca, cb, cc) = (a.cq, b.cq, c.cq);
    let mut net = Network::new(vec![a.host, b.host, c.host], Faults::NONE, 1);
    net.capture = Some(Vec::new());
    net.run_until(Duration::from_secs(5), |_| false);
    let ra = received(&mut net, 0, ca, sender);
    let rb = received(&mut net, 1, cb, sender);
    let rc = received(&mut net, 2, cc, sender);
    assert_eq!(
        ra,
        BTreeMap::from([(a_local, once_each(0..20))]),
        "the sender's host: the other attached QP, not the sender"
    );
    assert_eq!(
        rb,
        BTreeMap::from([(b1, once_each(0..20)), (b2, once_each(0..20))]),
        "the wrong Q_Key gets nothing"
    );
    assert_eq!(
        rc,
        BTreeMap::from([(c1, once_each(0..20))]),
        "attached twice: once; detached or never attached: nothing"
    );
    // One datagram per joined host on the wire, each addressed to DQPN 0xFFFFFF.
    let cap = net.capture.as_ref().unwrap();
    assert_eq!(cap.len(), 20, "one datagram per send: the wire copies it");
    for (_, d) in cap {
        let (_, ib) = softverbs_wire::ip::split_ip_udp(d).unwrap();
        assert_eq!(
            Packet::parse(ib).unwrap().headers.bth.dest_qp,
            MULTICAST_QPN
        );
    }
}

#[test]
fn detach_and_destroy_stop_delivery_and_the_last_qp_leaving_stops_the_wire_copy() {
    let mut a = Node::new("10.0.0.1");
    let mut b = Node::new("10.0.0.2");
    let mut c = Node::new("10.0.0.3");
    let s = a.qp(QKEY, 0);
    let b1 = b.qp(QKEY, 64);
    let b2 = b.qp(QKEY, 64);
    let c1 = c.qp(QKEY, 64);
    b.host.attach_mcast(b1, group()).unwrap();
    b.host.attach_mcast(b2, group()).unwrap();
    c.host.attach_mcast(c1, group()).unwrap();
    let sender = (a.host.gid, s);
    let (cb, cc) = (b.cq, c.cq);
    let (actx, akey) = (a.ctx, a.lkey);
    send(&mut a.host, actx, akey, s, 0..10);
    let mut net = Network::new(vec![a.host, b.host, c.host], Faults::NONE, 2);
    net.deliveries = Some(Vec::new());
    net.run_until(Duration::from_secs(5), |_| false);
    let rb = received(&mut net, 1, cb, sender);
    assert_eq!(
        rb,
        BTreeMap::from([(b1, once_each(0..10)), (b2, once_each(0..10))])
    );
    assert_eq!(received(&mut net, 2, cc, sender).len(), 1);

    net.hosts[1].detach_mcast(b2, group()).unwrap();
    net.hosts[2].destroy_qp(c1);
    assert!(!net.hosts[2].engine.in_mcast_group(group()));
    net.deliveries = Some(Vec::new());
    send(&mut net.hosts[0], actx, akey, s, 10..20);
    net.run_until(Duration::from_secs(5), |_| false);
    let rb = received(&mut net, 1, cb, sender);
    assert_eq!(rb, BTreeMap::from([(b1, once_each(10..20))]), "b2 detached");
    assert!(received(&mut net, 2, cc, sender).is_empty(), "c1 destroyed");
    let d = net.deliveries.as_ref().unwrap();
    assert!(
        d.iter().all(|(to, _)| *to == 1),
        "host c left the group with its last QP: no copy goes there"
    );
    assert_eq!(d.len(), 10);
}

/// Loss and duplication on the wire (each host's copy faulted on its own): UD does not
/// recover losses or remove duplicates, so what a QP completes is what reached its host —
/// the assertion is, per receiving QP and per datagram, copies completed == copies the wire
/// delivered to that host (every QP has receives to spare), never more; and the profile did
/// lose and duplicate some datagrams, so the check is not vacuous.
#[test]
fn with_loss_and_duplication_no_qp_completes_more_copies_than_the_wire_delivered() {
    let mut a = Node::new("10.0.0.1");
    let mut b = Node::new("10.0.0.2");
    let mut c = Node::new("10.0.0.3");
    let s = a.qp(QKEY, 0);
    let b1 = b.qp(QKEY, 400);
    let b2 = b.qp(QKEY, 400);
    let c1 = c.qp(QKEY, 400);
    b.host.attach_mcast(b1, group()).unwrap();
    b.host.attach_mcast(b2, group()).unwrap();
    c.host.attach_mcast(c1, group()).unwrap();
    let sender = (a.host.gid, s);
    send(&mut a.host, a.ctx, a.lkey, s, 0..150);
    let (cb, cc) = (b.cq, c.cq);
    let faults = Faults {
        loss: 0.2,
        duplicate: 0.3,
        ..Faults::NONE
    };
    let mut net = Network::new(vec![a.host, b.host, c.host], faults, 7);
    net.deliveries = Some(Vec::new());
    net.run_until(Duration::from_secs(5), |_| false);
    assert!(
        net.stats.lost > 0 && net.stats.duplicated > 0,
        "{:?}",
        net.stats
    );
    let mut wire: BTreeMap<(usize, u32), u32> = BTreeMap::new();
    for (to, ib) in net.deliveries.as_ref().unwrap() {
        let p = Packet::parse(ib).unwrap();
        let id: u32 = std::str::from_utf8(&p.payload[2..7])
            .unwrap()
            .parse()
            .unwrap();
        *wire.entry((*to, id)).or_default() += 1;
    }
    let mut compared = 0;
    for (host, cq, qps) in [(1, cb, vec![b1, b2]), (2, cc, vec![c1])] {
        let got = received(&mut net, host, cq, sender);
        for q in qps {
            let mine = got.get(&q).cloned().unwrap_or_default();
            for id in 0..150 {
                let w = wire.get(&(host, id)).copied().unwrap_or(0);
                let r = mine.get(&id).copied().unwrap_or(0);
                assert!(
                    r <= w,
                    "QP {q:#x} completed datagram {id} {r}x, the wire gave {w}"
                );
                assert_eq!(r, w, "QP {q:#x}, datagram {id}: receives to spare");
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 450);
    assert!(wire.values().any(|&n| n > 1), "some datagram arrived twice");
    assert!(
        (0..150).any(|id| !wire.contains_key(&(1, id))),
        "some datagram never reached host b"
    );
}
