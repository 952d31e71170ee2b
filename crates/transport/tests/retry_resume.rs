//! After a retransmission timeout the requester goes back to the oldest unacknowledged PSN,
//! not to the first PSN of the oldest message (go-back-N, IBA 9.7.4.1.4 and 9.7.5.1.3): what
//! the responder acknowledged is never sent again, so a long message on a lossy or loaded
//! path makes progress with every retry instead of resending its whole head each time (an
//! 8 MiB message is 2,048 packets at a 4 KiB MTU). A WRITE resumed mid-message sends middle
//! packets without a RETH: the responder continues the message it is receiving, as it does
//! after a sequence NAK.

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use softverbs_core::types::{Access, Mtu, QpType};
use softverbs_transport::sim::{ConnParams, Faults, Host, Network};
use softverbs_transport::wr::{Payload, RecvWr, SendOp, SendWr, Sge, WcStatus};
use softverbs_wire::ip::split_ip_udp;
use softverbs_wire::{Operation, Packet, Syndrome};

const LEN: usize = 64 * 1024;
/// The packet of the message (of 64) whose first transmission is lost.
const LOST_PKT: u32 = 40;

struct Run {
    /// Request PSNs in the order they went on the wire.
    requests: Vec<u32>,
    /// The highest PSN a positive ACK carried before the first retransmission.
    acked_before_retry: u32,
    /// The message as it arrived at the responder.
    arrived: Vec<u8>,
    status: WcStatus,
}

fn run(write: bool) -> Run {
    let mut a = Host::new("198.51.100.1".parse().unwrap(), Mtu::M1024);
    let mut b = Host::new("198.51.100.2".parse().unwrap(), Mtu::M1024);
    let ca = a.context(1, 1 << 18);
    let cb = b.context(2, 1 << 18);
    let (pa, pb) = (a.pd(ca), b.pd(cb));
    let ka = a.mr(pa, 0, 1 << 18, Access::LOCAL_WRITE);
    let kb = b.mr(pb, 0, 1 << 18, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (cqa, cqb) = (a.cq(ca), b.cq(cb));
    let qa = a.qp(QpType::Rc, pa, cqa, None);
    let qb = b.qp(QpType::Rc, pb, cqb, None);
    let params = ConnParams {
        sq_psn: 1000,
        rq_psn: 1000,
        ..ConnParams::default()
    };
    let (ga, gb) = (a.gid, b.gid);
    a.connect(qa, gb, qb, params);
    b.connect(qb, ga, qa, ConnParams { ..params });
    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + i / 1024) as u8).collect();
    a.mem.space_mut(ca)[..LEN].copy_from_slice(&data);
    let target = 0x10000u64;
    let op = if write {
        SendOp::Write {
            remote_addr: target,
            rkey: kb,
        }
    } else {
        b.engine
            .post_recv(
                qb,
                RecvWr {
                    wr_id: 9,
                    sges: vec![Sge {
                        addr: target,
                        length: LEN as u32,
                        lkey: kb,
                    }],
                },
            )
            .unwrap();
        SendOp::Send
    };
    let mut wr = SendWr::new(
        1,
        op,
        Payload::Sges(vec![Sge {
            addr: 0,
            length: LEN as u32,
            lkey: ka,
        }]),
    );
    wr.signaled = true;
    a.engine.post_send(qa, wr).unwrap();

    let mut net = Network::new(vec![a, b], Faults::NONE, 1);
    net.capture = Some(Vec::new());
    // Lose the first transmission of one packet in the middle of the message and every
    // sequence NAK, so only the retransmission timer can recover.
    let seen: Rc<Cell<bool>> = Rc::default();
    let seen2 = seen.clone();
    net.lose = Some(Box::new(move |dgram: &[u8]| {
        let Ok((_, ib)) = split_ip_udp(dgram) else {
            return false;
        };
        let Ok(p) = Packet::parse(ib) else {
            return false;
        };
        let nak = matches!(
            p.headers.aeth.map(|a| a.syndrome),
            Some(Syndrome::Nak { .. })
        );
        let first_loss = p.info.operation != Operation::Acknowledge
            && p.headers.bth.psn == 1000 + LOST_PKT
            && !seen2.replace(true);
        nak || first_loss
    }));
    assert!(net.run_until(Duration::from_secs(60), |n| !n.hosts[0]
        .completions
        .is_empty()));
    let capture = net.capture.take().unwrap();
    let mut requests = Vec::new();
    let mut acked_before_retry = None;
    let mut highest_ack = 0;
    let mut sent: HashMap<u32, u32> = HashMap::new();
    for (_, dgram) in &capture {
        let (_, ib) = split_ip_udp(dgram).unwrap();
        let p = Packet::parse(ib).unwrap();
        let psn = p.headers.bth.psn;
        if p.info.operation == Operation::Acknowledge {
            if matches!(p.headers.aeth.unwrap().syndrome, Syndrome::Ack { .. }) {
                highest_ack = highest_ack.max(psn);
            }
            continue;
        }
        let n = sent.entry(psn).or_default();
        *n += 1;
        if *n == 2 && acked_before_retry.is_none() {
            acked_before_retry = Some(highest_ack);
        }
        requests.push(psn);
    }
    let (_, wc) = net.hosts[0].completions[0];
    Run {
        requests,
        acked_before_retry: acked_before_retry.expect("a retransmission happened"),
        arrived: net.hosts[1].mem.space(cb)[target as usize..][..LEN].to_vec(),
        status: wc.status,
    }
    .check(&data)
}

impl Run {
    fn check(self, data: &[u8]) -> Run {
        assert_eq!(self.status, WcStatus::Success);
        assert!(self.arrived == data, "the message arrived byte-identical");
        self
    }
}

fn assert_resumes_after_the_acknowledged(r: &Run) {
    let mut count: HashMap<u32, u32> = HashMap::new();
    for p in &r.requests {
        *count.entry(*p).or_default() += 1;
    }
    let resent: Vec<u32> = {
        let mut v: Vec<u32> = count
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(p, _)| *p)
            .collect();
        v.sort();
        v
    };
    assert!(
        r.acked_before_retry >= 1000 && r.acked_before_retry < 1000 + LOST_PKT,
        "the responder acknowledged part of the message first (through {})",
        r.acked_before_retry
    );
    assert_eq!(
        resent.first().copied(),
        Some(r.acked_before_retry + 1),
        "the retry starts at the oldest unacknowledged PSN; resent: {resent:?}"
    );
    assert!(
        count
            .iter()
            .all(|(p, n)| *n == 1 || *p > r.acked_before_retry),
        "no acknowledged PSN is sent again"
    );
}

#[test]
fn a_timed_out_write_resumes_at_the_oldest_unacknowledged_psn() {
    assert_resumes_after_the_acknowledged(&run(true));
}

#[test]
fn a_timed_out_send_resumes_at_the_oldest_unacknowledged_psn() {
    assert_resumes_after_the_acknowledged(&run(false));
}
