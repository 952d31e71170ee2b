//! Nothing waits for a window or a timer on the path of a message between two daemons
//! (docs/performance.md "Issue 16: two daemons"): the requester asks for an acknowledgement
//! on the last packet of what it has queued, even unsignaled (IBA 9.7.5.1.2 lets it ask
//! where it needs one), and the responder's ACK is ready to send at the same instant the
//! packet arrived, so the requester retires the work without its ACK timer. Time never
//! advances in these tests: a coalescing window or delayed ACK would show as a missing packet.

use softverbs_core::types::{Access, Mtu, QpType};
use softverbs_transport::sim::{ConnParams, Host};
use softverbs_transport::wr::{Payload, SendOp, SendWr, Sge};
use softverbs_transport::{Instant, RxMeta, MAX_PACKET};
use softverbs_wire::{Operation, Packet};

struct Pair {
    a: Host,
    b: Host,
    qa: u32,
    ka: u32,
    kb: u32,
}

fn pair() -> Pair {
    let mut a = Host::new("198.51.100.1".parse().unwrap(), Mtu::M1024);
    let mut b = Host::new("198.51.100.2".parse().unwrap(), Mtu::M1024);
    let ca = a.context(1, 1 << 20);
    let cb = b.context(2, 1 << 20);
    let (pa, pb) = (a.pd(ca), b.pd(cb));
    let ka = a.mr(pa, 0, 1 << 20, Access::LOCAL_WRITE);
    let kb = b.mr(pb, 0, 1 << 20, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (cqa, cqb) = (a.cq(ca), b.cq(cb));
    let qa = a.qp(QpType::Rc, pa, cqa, None);
    let qb = b.qp(QpType::Rc, pb, cqb, None);
    let (ga, gb) = (a.gid, b.gid);
    a.connect(qa, gb, qb, ConnParams::default());
    b.connect(qb, ga, qa, ConnParams::default());
    Pair { a, b, qa, ka, kb }
}

/// Every packet `from` has to send at `now`.
fn drain(from: &mut Host, now: Instant) -> Vec<Vec<u8>> {
    let mut buf = vec![0u8; MAX_PACKET];
    let mut out = Vec::new();
    while let Some(tx) = from
        .engine
        .poll_transmit(now, &from.core, &mut from.mem, &mut buf)
    {
        out.push(buf[..tx.len].to_vec());
    }
    out
}

fn deliver(to: &mut Host, src: &Host, now: Instant, pkts: &[Vec<u8>]) {
    for p in pkts {
        let meta = RxMeta {
            sgid: src.gid,
            dgid: to.gid,
        };
        to.engine.handle_packet(now, &to.core, &mut to.mem, meta, p);
    }
}

/// `n` unsignaled WRITEs of `len` bytes posted at once, carried A → B → A at one instant.
fn burst(n: usize, len: u32) {
    let mut p = pair();
    let now = Instant(1_000_000);
    for i in 0..n {
        let mut wr = SendWr::new(
            i as u64,
            SendOp::Write {
                remote_addr: 0x8000 + u64::from(len) * i as u64,
                rkey: p.kb,
            },
            Payload::Sges(vec![Sge {
                addr: u64::from(len) * i as u64,
                length: len,
                lkey: p.ka,
            }]),
        );
        wr.signaled = false;
        p.a.engine.post_send(p.qa, wr).unwrap();
    }
    let requests = drain(&mut p.a, now);
    let last = Packet::parse(requests.last().expect("requests")).unwrap();
    assert!(
        last.headers.bth.ack_req,
        "{n} × {len} B: the last packet queued asks for an ACK"
    );
    let (b_host, a_host) = (&mut p.b, &p.a);
    deliver(b_host, a_host, now, &requests);
    let acks = drain(&mut p.b, now);
    assert!(
        !acks.is_empty(),
        "{n} × {len} B: the responder answers at the instant the packets arrived"
    );
    let final_ack = Packet::parse(acks.last().unwrap()).unwrap();
    assert_eq!(
        final_ack.headers.bth.opcode.operation(),
        Some(Operation::Acknowledge)
    );
    assert_eq!(
        final_ack.headers.bth.psn, last.headers.bth.psn,
        "{n} × {len} B: the ACK covers the last PSN"
    );
    let (a_host, b_host) = (&mut p.a, &p.b);
    deliver(a_host, b_host, now, &acks);
    // The ACKs may make A send nothing more, and retire every request.
    assert!(drain(&mut p.a, now).is_empty());
    assert_eq!(
        p.a.engine.send_queued(p.qa),
        0,
        "{n} × {len} B: every request retired without a timer"
    );
}

#[test]
fn a_lone_unsignaled_write_is_acknowledged_at_once() {
    burst(1, 8);
}

#[test]
fn the_end_of_a_burst_is_acknowledged_at_once() {
    // 40 one-packet WRITEs (more than the periodic ACK stride) and 5 of 3 packets each.
    burst(40, 8);
    burst(5, 3000);
}
