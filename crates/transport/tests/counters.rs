//! The engine's counters (`crate::counters`, docs/guide/counters.md) move by exactly what
//! went on the wire: each test scripts an exchange on the simulated network, captures every
//! datagram as sent, and checks the counters of both QPs and both ports against the capture.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use softverbs_core::types::{Access, Mtu, QpType};
use softverbs_transport::sim::{ConnParams, Faults, Host, Network};
use softverbs_transport::wr::{Payload, RecvWr, SendOp, SendWr, Sge, WcStatus};
use softverbs_transport::Counters;
use softverbs_wire::ip::split_ip_udp;
use softverbs_wire::{Direction, Operation, Packet, Syndrome};

const LEN: u32 = 4096;

struct Pair {
    net: Network,
    qa: u32,
    qb: u32,
    /// `b`'s memory key (every access).
    kb: u32,
}

/// Two hosts with one connected RC QP each (PSNs start at 1000, MTU 1024); `a` posts `ops`
/// (each `LEN` bytes), `b` posts `recvs` receives first.
fn pair(ops: &[SendOp], recvs: usize, params: ConnParams) -> Pair {
    let mut a = Host::new("198.51.100.1".parse().unwrap(), Mtu::M1024);
    let mut b = Host::new("198.51.100.2".parse().unwrap(), Mtu::M1024);
    let ca = a.context(1, 1 << 16);
    let cb = b.context(2, 1 << 16);
    let (pa, pb) = (a.pd(ca), b.pd(cb));
    let ka = a.mr(pa, 0, 1 << 16, Access::LOCAL_WRITE);
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let kb = b.mr(pb, 0, 1 << 16, all | Access::REMOTE_ATOMIC);
    let (cqa, cqb) = (a.cq(ca), b.cq(cb));
    let qa = a.qp(QpType::Rc, pa, cqa, None);
    let qb = b.qp(QpType::Rc, pb, cqb, None);
    let (ga, gb) = (a.gid, b.gid);
    a.connect(qa, gb, qb, params);
    b.connect(qb, ga, qa, params);
    for i in 0..recvs {
        let sges = vec![Sge {
            addr: 0x8000,
            length: LEN,
            lkey: kb,
        }];
        b.engine
            .post_recv(
                qb,
                RecvWr {
                    wr_id: i as u64,
                    sges,
                },
            )
            .unwrap();
    }
    for (i, op) in ops.iter().enumerate() {
        let op = match *op {
            SendOp::Write { remote_addr, .. } => SendOp::Write {
                remote_addr,
                rkey: kb,
            },
            SendOp::Read { remote_addr, .. } => SendOp::Read {
                remote_addr,
                rkey: kb,
            },
            SendOp::FetchAdd {
                remote_addr, add, ..
            } => SendOp::FetchAdd {
                remote_addr,
                rkey: kb,
                add,
            },
            op => op,
        };
        let length = if matches!(op, SendOp::FetchAdd { .. }) {
            8
        } else {
            LEN
        };
        let sges = vec![Sge {
            addr: 0,
            length,
            lkey: ka,
        }];
        let mut wr = SendWr::new(i as u64, op, Payload::Sges(sges));
        wr.signaled = true;
        a.engine.post_send(qa, wr).unwrap();
    }
    let mut net = Network::new(vec![a, b], Faults::NONE, 7);
    net.capture = Some(Vec::new());
    Pair { net, qa, qb, kb }
}

impl Pair {
    fn run(&mut self, completions: usize) {
        assert!(self
            .net
            .run_until(Duration::from_secs(120), |n| n.hosts[0].completions.len()
                >= completions));
    }

    fn qp(&self, host: usize) -> Counters {
        let qpn = [self.qa, self.qb][host];
        self.net.hosts[host].engine.qp_counters(qpn).unwrap()
    }

    /// (packets, bytes) the capture holds from `host` (by source address).
    fn sent_by(&self, host: usize) -> (u64, u64) {
        let std::net::IpAddr::V4(ip) = self.net.hosts[host].gid.to_ip() else {
            unreachable!("the hosts are IPv4")
        };
        let mut n = (0, 0);
        for (_, dgram) in self.net.capture.as_ref().unwrap() {
            let (iph, ib) = split_ip_udp(dgram).unwrap();
            // IPv4 source address: bytes 12..16 of the header (RFC 791).
            if iph[12..16] == ip.octets() {
                n.0 += 1;
                n.1 += ib.len() as u64;
            }
        }
        n
    }

    /// PSNs of the request packets sent, in wire order.
    fn request_psns(&self) -> Vec<u32> {
        let mut v = Vec::new();
        for (_, d) in self.net.capture.as_ref().unwrap() {
            let p = Packet::parse(split_ip_udp(d).unwrap().1).unwrap();
            if p.info.direction == Direction::Request {
                v.push(p.headers.bth.psn);
            }
        }
        v
    }
}

#[test]
fn a_clean_exchange_counts_every_packet_and_byte_once() {
    let ops = [
        SendOp::Send,
        SendOp::Write {
            remote_addr: 0,
            rkey: 0,
        },
        SendOp::Read {
            remote_addr: 0,
            rkey: 0,
        },
        SendOp::FetchAdd {
            remote_addr: 0x100,
            rkey: 0,
            add: 1,
        },
    ];
    let mut p = pair(
        &ops,
        1,
        ConnParams {
            sq_psn: 1000,
            rq_psn: 1000,
            ..ConnParams::default()
        },
    );
    p.run(4);
    let st: Vec<WcStatus> = p.net.hosts[0]
        .completions
        .iter()
        .map(|(_, wc)| wc.status)
        .collect();
    assert_eq!(st, [WcStatus::Success; 4]);
    let (a, b) = (p.qp(0), p.qp(1));
    let (a_sent, a_bytes) = p.sent_by(0);
    let (b_sent, b_bytes) = p.sent_by(1);
    // 4 SEND packets, 4 WRITE packets, 1 READ request, 1 atomic: 10 request packets.
    assert_eq!(a.sent_pkts, 10);
    assert_eq!((a.sent_pkts, a.sent_bytes), (a_sent, a_bytes));
    assert_eq!((b.rcvd_pkts, b.rcvd_bytes), (a_sent, a_bytes));
    assert_eq!((b.sent_pkts, b.sent_bytes), (b_sent, b_bytes));
    assert_eq!((a.rcvd_pkts, a.rcvd_bytes), (b_sent, b_bytes));
    assert_eq!(a.rdma_sends, 4);
    assert_eq!(b.rdma_recvs, 4);
    assert_eq!(
        (
            b.rx_write_requests,
            b.rx_read_requests,
            b.rx_atomic_requests
        ),
        (1, 1, 1)
    );
    for c in [a, b] {
        assert_eq!(
            c.retransmitted_pkts + c.duplicate_request + c.out_of_seq_request,
            0
        );
        assert_eq!(c.rcvd_seq_err + c.completer_retry_err + c.send_rnr_err, 0);
    }
    // The port is the sum of its QPs, and keeps a destroyed QP's counts.
    assert_eq!(p.net.hosts[0].engine.counters(), a);
    p.net.hosts[1].destroy_qp(p.qb);
    assert_eq!(p.net.hosts[1].engine.counters(), b);
}

#[test]
fn a_lost_request_is_counted_as_a_timeout_and_its_retransmissions() {
    let ops = [SendOp::Write {
        remote_addr: 0,
        rkey: 0,
    }];
    let mut p = pair(
        &ops,
        0,
        ConnParams {
            sq_psn: 1000,
            rq_psn: 1000,
            ..ConnParams::default()
        },
    );
    // The first transmission of the WRITE's second packet is lost, and so is every NAK:
    // only the ACK timer recovers.
    let seen: Rc<Cell<bool>> = Rc::default();
    p.net.lose = Some(Box::new(move |d: &[u8]| {
        let p = Packet::parse(split_ip_udp(d).unwrap().1).unwrap();
        let nak = matches!(
            p.headers.aeth.map(|a| a.syndrome),
            Some(Syndrome::Nak { .. })
        );
        nak || (p.headers.bth.psn == 1001
            && p.info.direction == Direction::Request
            && !seen.replace(true))
    }));
    p.run(1);
    let (a, b) = (p.qp(0), p.qp(1));
    let requests = p.request_psns();
    let first_time = {
        let mut s = requests.clone();
        s.sort();
        s.dedup();
        s.len() as u64
    };
    assert_eq!(first_time, 4);
    assert_eq!(a.sent_pkts, requests.len() as u64);
    assert_eq!(a.retransmitted_pkts, requests.len() as u64 - first_time);
    assert!(a.retransmitted_pkts >= 3, "1001..=1003 went again");
    assert_eq!(a.completer_retry_err, 1);
    assert_eq!(a.rcvd_seq_err, 0, "every NAK was lost");
    // 1002 and 1003 came after the gap; one sequence NAK answered it.
    assert_eq!(b.out_of_seq_request, 2);
    assert_eq!(b.send_seq_nak, 1);
    assert_eq!(b.rcvd_pkts, requests.len() as u64 - 1);
    assert_eq!(b.rx_write_requests, 1);
    assert_eq!(b.rdma_recvs, 1);
}

#[test]
fn a_sequence_nak_is_counted_at_both_ends() {
    let ops = [SendOp::Write {
        remote_addr: 0,
        rkey: 0,
    }];
    let mut p = pair(&ops, 0, ConnParams::default());
    let seen: Rc<Cell<bool>> = Rc::default();
    p.net.lose = Some(Box::new(move |d: &[u8]| {
        let p = Packet::parse(split_ip_udp(d).unwrap().1).unwrap();
        p.headers.bth.psn == 1
            && p.info.operation == Operation::RdmaWriteMiddle
            && !seen.replace(true)
    }));
    p.run(1);
    let (a, b) = (p.qp(0), p.qp(1));
    assert_eq!(b.send_seq_nak, 1);
    assert_eq!(a.rcvd_seq_err, 1);
    assert_eq!(a.completer_retry_err, 0);
    assert_eq!(
        a.retransmitted_pkts, 3,
        "go-back-N from PSN 1 resends 1..=3"
    );
    assert_eq!(b.out_of_seq_request, 2);
}

#[test]
fn rnr_naks_and_their_exhaustion_are_counted() {
    let mut p = pair(
        &[SendOp::Send],
        0,
        ConnParams {
            rnr_retry: 2,
            ..ConnParams::default()
        },
    );
    p.run(1);
    let (_, wc) = p.net.hosts[0].completions[0];
    assert_eq!(wc.status, WcStatus::RnrRetryExcErr);
    let (a, b) = (p.qp(0), p.qp(1));
    // The first try and two retries: three RNR NAKs, then the request fails.
    assert_eq!(b.send_rnr_err, 3);
    assert_eq!(a.rcvd_rnr_err, 3);
    assert_eq!(a.retry_rnr_exceeded_err, 1);
    assert_eq!(b.rdma_recvs, 0);
}

#[test]
fn local_protection_and_length_errors_are_counted_where_they_happen() {
    // A send whose gather names no memory key of its own: LOC_PROT_ERR at the requester,
    // nothing on the wire for it.
    let mut p = pair(&[], 0, ConnParams::default());
    let bad = Sge {
        addr: 0,
        length: 64,
        lkey: 0x00de_ad00,
    };
    let mut wr = SendWr::new(9, SendOp::Send, Payload::Sges(vec![bad]));
    wr.signaled = true;
    let qa = p.qa;
    p.net.hosts[0].engine.post_send(qa, wr).unwrap();
    p.run(1);
    assert_eq!(p.net.hosts[0].completions[0].1.status, WcStatus::LocProtErr);
    let a = p.qp(0);
    assert_eq!((a.local_prot_err, a.local_length_err), (1, 0));
    assert_eq!(a.sent_pkts, 0);

    // A 4 KiB SEND into a 16-byte receive: LOC_LEN_ERR at the responder, which NAKs it.
    let mut p = pair(&[SendOp::Send], 0, ConnParams::default());
    let (qb, kb) = (p.qb, p.kb);
    let small = Sge {
        addr: 0x8000,
        length: 16,
        lkey: kb,
    };
    p.net.hosts[1]
        .engine
        .post_recv(
            qb,
            RecvWr {
                wr_id: 1,
                sges: vec![small],
            },
        )
        .unwrap();
    p.run(1);
    assert_eq!(p.net.hosts[1].completions[0].1.status, WcStatus::LocLenErr);
    let (a, b) = (p.qp(0), p.qp(1));
    assert_eq!((b.local_prot_err, b.local_length_err), (0, 1));
    assert_eq!((a.local_prot_err, a.local_length_err), (0, 0));
}

#[test]
fn every_counter_has_a_distinct_name_the_table_reads_back() {
    let mut c = Counters::default();
    for (i, n) in Counters::NAMES.iter().enumerate() {
        assert!(c.set(n, i as u64 + 1));
    }
    let got: Vec<(&str, u64)> = c.fields().collect();
    assert_eq!(got.len(), Counters::NAMES.len());
    for (i, (n, v)) in got.into_iter().enumerate() {
        assert_eq!((n, v), (Counters::NAMES[i], i as u64 + 1));
        assert_eq!(c.get(n), Some(v));
    }
    assert!(!c.set("no_such_counter", 1));
}
