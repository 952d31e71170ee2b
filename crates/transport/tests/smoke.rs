use softverbs_core::types::{Access, Mtu, QpType};
use softverbs_transport::sim::{ConnParams, Faults, Host, Network};
use softverbs_transport::wr::{Payload, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus};

#[test]
fn rc_send_write_read_atomic_between_two_hosts() {
    let mut a = Host::new("10.0.0.1".parse().unwrap(), Mtu::M1024);
    let mut b = Host::new("10.0.0.2".parse().unwrap(), Mtu::M1024);
    let ca = a.context(1, 1 << 20);
    let cb = b.context(2, 1 << 20);
    let pa = a.pd(ca);
    let pb = b.pd(cb);
    let all =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let ka = a.mr(pa, 0, 1 << 20, all);
    let kb = b.mr(pb, 0, 1 << 20, all);
    let cqa = a.cq(ca);
    let cqb = b.cq(cb);
    let qa = a.qp(QpType::Rc, pa, cqa, None);
    let qb = b.qp(QpType::Rc, pb, cqb, None);
    let (ga, gb) = (a.gid, b.gid);
    a.connect(qa, gb, qb, ConnParams::default());
    b.connect(qb, ga, qa, ConnParams::default());
    for (i, x) in a.mem.space_mut(ca)[..5000].iter_mut().enumerate() {
        *x = i as u8;
    }
    b.engine
        .post_recv(
            qb,
            RecvWr {
                wr_id: 7,
                sges: vec![Sge {
                    addr: 0x10000,
                    length: 8192,
                    lkey: kb,
                }],
            },
        )
        .unwrap();
    let sge = |addr, length| {
        Payload::Sges(vec![Sge {
            addr,
            length,
            lkey: ka,
        }])
    };
    a.engine
        .post_send(qa, SendWr::new(1, SendOp::Send, sge(0, 5000)))
        .unwrap();
    a.engine
        .post_send(
            qa,
            SendWr::new(
                2,
                SendOp::Write {
                    remote_addr: 0x20000,
                    rkey: kb,
                },
                sge(0, 3000),
            ),
        )
        .unwrap();
    a.engine
        .post_send(
            qa,
            SendWr::new(
                3,
                SendOp::Read {
                    remote_addr: 0x20000,
                    rkey: kb,
                },
                sge(0x40000, 3000),
            ),
        )
        .unwrap();
    b.mem.space_mut(cb)[0x30000..0x30008].copy_from_slice(&5u64.to_ne_bytes());
    a.engine
        .post_send(
            qa,
            SendWr::new(
                4,
                SendOp::FetchAdd {
                    remote_addr: 0x30000,
                    rkey: kb,
                    add: 10,
                },
                sge(0x50000, 8),
            ),
        )
        .unwrap();
    let mut net = Network::new(vec![a, b], Faults::NONE, 1);
    let ok = net.run_until(std::time::Duration::from_secs(1), |n| {
        n.hosts[0].completions.len() == 4
    });
    let (a, b) = net.hosts.split_at_mut(1);
    let (a, b) = (&mut a[0], &mut b[0]);
    assert!(
        ok,
        "completions: {:?} failures {:?} {:?}",
        a.completions, a.failures, b.failures
    );
    let wcs = a.take_completions(cqa);
    assert_eq!(
        wcs.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success, WcOpcode::Send),
            (2, WcStatus::Success, WcOpcode::RdmaWrite),
            (3, WcStatus::Success, WcOpcode::RdmaRead),
            (4, WcStatus::Success, WcOpcode::FetchAdd),
        ]
    );
    let r = b.take_completions(cqb);
    assert_eq!(
        (r[0].wr_id, r[0].status, r[0].byte_len, r[0].opcode),
        (7, WcStatus::Success, 5000, WcOpcode::Recv)
    );
    assert_eq!(
        &b.mem.space(cb)[0x10000..0x10000 + 5000],
        &a.mem.space(ca)[..5000]
    );
    assert_eq!(
        &b.mem.space(cb)[0x20000..0x20000 + 3000],
        &a.mem.space(ca)[..3000]
    );
    assert_eq!(
        &a.mem.space(ca)[0x40000..0x40000 + 3000],
        &a.mem.space(ca)[..3000]
    );
    assert_eq!(a.mem.space(ca)[0x50000..0x50008], 5u64.to_ne_bytes());
    assert_eq!(b.mem.space(cb)[0x30000..0x30008], 15u64.to_ne_bytes());
}

/// IBA 9.7.5.1.2: a burst of unsignaled requests asks for acknowledgement only every 16th PSN
/// and at its end, and the responder answers only where asked; every request still lands and
/// the one signaled request at the end completes. Before this, every message cost an ACK.
#[test]
fn an_unsignaled_burst_is_acknowledged_in_coalesced_acks() {
    use softverbs_wire::datagram::parse_roce_v2;
    use softverbs_wire::opcode::Operation;
    const N: u64 = 64;
    let (mut net, cb) = unsignaled_writes(ConnParams::default(), N, 8, 8, 0x8000, |m| {
        for i in 0..N as usize {
            m[i * 8..][..8].copy_from_slice(&(i as u64 + 100).to_le_bytes());
        }
    });
    for i in 0..N as usize {
        assert_eq!(
            net.hosts[1].mem.space(cb)[0x8000 + i * 8..][..8],
            (i as u64 + 100).to_le_bytes()
        );
    }
    let (mut requests, mut asking, mut acks) = (0, 0, 0);
    for (_, d) in net.capture.take().unwrap() {
        let p = parse_roce_v2(&d).expect("a valid RoCE v2 datagram");
        match p.packet.info.operation {
            Operation::Acknowledge => acks += 1,
            _ => {
                requests += 1;
                asking += u32::from(p.packet.headers.bth.ack_req);
            }
        }
    }
    assert_eq!(requests, N);
    // Every 16th PSN plus the end of the burst (which may coincide with a 16th).
    assert!(
        (4..=5).contains(&asking),
        "{asking} of {N} unsignaled writes asked for an ACK"
    );
    // The responder answers only where asked (and may coalesce what it has not sent yet).
    assert!(
        (1..=asking).contains(&acks),
        "{acks} ACKs for {asking} requests"
    );
}

/// Unsignaled requests as long as the window (128 packets: 128 KiB at a 1 KiB MTU) with more
/// queued behind them, their PSNs not aligned to the 16-PSN ACK stride: after each one the
/// window is full, so its last packet must ask for the ACK that lets the next one start.
/// Before, only the retry timer moved the queue (perftest `ib_write_bw -a` at 512 KiB with a
/// 4 KiB MTU: 7 messages/s, then RETRY_EXC_ERR), and every message was sent twice.
#[test]
fn window_sized_unsignaled_requests_never_wait_for_the_retry_timer() {
    use softverbs_wire::datagram::parse_roce_v2;
    use softverbs_wire::opcode::Operation;
    let p = ConnParams {
        sq_psn: 5,
        rq_psn: 5,
        ..ConnParams::default()
    };
    const N: u64 = 4;
    const LEN: u32 = 128 << 10;
    let (mut net, cb) = unsignaled_writes(p, N, LEN, u64::from(LEN), 0, |m| {
        for (i, x) in m[..(N as usize) * LEN as usize].iter_mut().enumerate() {
            *x = (i % 251) as u8;
        }
    });
    let total = (N as usize) * LEN as usize;
    assert!(
        net.hosts[1].mem.space(cb)[..total]
            .iter()
            .enumerate()
            .all(|(i, x)| *x == (i % 251) as u8),
        "the writes did not land intact"
    );
    let requests = net
        .capture
        .take()
        .unwrap()
        .iter()
        .map(|(_, d)| parse_roce_v2(d).expect("a valid RoCE v2 datagram"))
        .filter(|p| p.packet.info.operation != Operation::Acknowledge)
        .count() as u64;
    assert_eq!(
        requests,
        N * u64::from(LEN / 1024),
        "packets were retransmitted: the queue waited for the retry timer"
    );
}

/// Host a posts `n` RDMA WRITEs of `len` bytes over one RC connection — request `i` from a's
/// offset `i * stride` to b's `base + i * stride`, only the last one signaled — after `fill`
/// wrote a's memory; the network (capturing) runs until that one completes successfully.
/// Returns the network and b's context, for the callers' checks of memory and packets.
fn unsignaled_writes(
    p: ConnParams,
    n: u64,
    len: u32,
    stride: u64,
    base: u64,
    fill: impl FnOnce(&mut [u8]),
) -> (Network, softverbs_core::ids::CtxId) {
    let mut a = Host::new("10.0.0.1".parse().unwrap(), Mtu::M1024);
    let mut b = Host::new("10.0.0.2".parse().unwrap(), Mtu::M1024);
    let ca = a.context(1, 1 << 20);
    let cb = b.context(2, 1 << 20);
    let pa = a.pd(ca);
    let pb = b.pd(cb);
    let ka = a.mr(pa, 0, 1 << 20, Access::LOCAL_WRITE);
    let kb = b.mr(pb, 0, 1 << 20, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let cqa = a.cq(ca);
    let cqb = b.cq(cb);
    let qa = a.qp(QpType::Rc, pa, cqa, None);
    let qb = b.qp(QpType::Rc, pb, cqb, None);
    let (ga, gb) = (a.gid, b.gid);
    a.connect(qa, gb, qb, p);
    b.connect(qb, ga, qa, p);
    fill(a.mem.space_mut(ca));
    for i in 0..n {
        let mut w = SendWr::new(
            i,
            SendOp::Write {
                remote_addr: base + i * stride,
                rkey: kb,
            },
            Payload::Sges(vec![Sge {
                addr: i * stride,
                length: len,
                lkey: ka,
            }]),
        );
        w.signaled = i == n - 1;
        a.engine.post_send(qa, w).unwrap();
    }
    let mut net = Network::new(vec![a, b], Faults::NONE, 5);
    net.capture = Some(Vec::new());
    assert!(net.run_until(std::time::Duration::from_secs(10), |n| {
        n.hosts[0].completions.len() == 1
    }));
    let wcs = net.hosts[0].take_completions(cqa);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (n - 1, WcStatus::Success));
    (net, cb)
}
