//! What the engine announces to the memory before reading a message
//! (`Memory::will_read`, docs/design/registered-memory.md, "One system call per work request"): one
//! hint per gather-list piece when a request starts, one when a READ response starts, none
//! again for retransmitted packets, none for atomics or READ requests (which read nothing
//! locally), and never for a piece whose key check fails (the packet's own gather reports
//! that). The process path fetches a hinted range in a few large reads instead of one per
//! packet, so a missing hint costs speed and a wrong one could serve stale bytes.

use std::time::Duration;

use softverbs_core::types::{Access, Mtu, QpType};
use softverbs_transport::sim::{ConnParams, Faults, Host, Network};
use softverbs_transport::wr::{Payload, SendOp, SendWr, Sge, WcStatus};

const ALL: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0,
);
const SPACE: usize = 1 << 20;

struct Pair {
    net: Network,
    qa: u32,
    cqa: u64,
    ka: u32,
    kb: u32,
    ca: softverbs_core::ids::CtxId,
    cb: softverbs_core::ids::CtxId,
}

fn pair(faults: Faults) -> Pair {
    let mut a = Host::new("10.0.0.1".parse().unwrap(), Mtu::M1024);
    let mut b = Host::new("10.0.0.2".parse().unwrap(), Mtu::M1024);
    let ca = a.context(1, SPACE);
    let cb = b.context(2, SPACE);
    let (pa, pb) = (a.pd(ca), b.pd(cb));
    let ka = a.mr(pa, 0, SPACE as u64, ALL);
    let kb = b.mr(pb, 0, SPACE as u64, ALL);
    let (cqa, cqb) = (a.cq(ca), b.cq(cb));
    let qa = a.qp(QpType::Rc, pa, cqa, None);
    let qb = b.qp(QpType::Rc, pb, cqb, None);
    let (ga, gb) = (a.gid, b.gid);
    a.connect(qa, gb, qb, ConnParams::default());
    b.connect(qb, ga, qa, ConnParams::default());
    Pair {
        net: Network::new(vec![a, b], faults, 7),
        qa,
        cqa,
        ka,
        kb,
        ca,
        cb,
    }
}

fn run(p: &mut Pair, id: u64, op: SendOp, sges: Vec<Sge>) -> WcStatus {
    p.net.hosts[0]
        .engine
        .post_send(p.qa, SendWr::new(id, op, Payload::Sges(sges)))
        .expect("post_send");
    let done = p.net.run_until(Duration::from_secs(30), |n| {
        !n.hosts[0].completions.is_empty()
    });
    assert!(done, "no completion");
    p.net.hosts[0].take_completions(p.cqa)[0].status
}

#[test]
fn a_write_announces_each_gather_piece_once() {
    let mut p = pair(Faults::NONE);
    let sges = vec![
        Sge {
            addr: 0x1000,
            length: 40_000,
            lkey: p.ka,
        },
        Sge {
            addr: 0x80_000,
            length: 25_536,
            lkey: p.ka,
        },
    ];
    let op = SendOp::Write {
        remote_addr: 0x2000,
        rkey: p.kb,
    };
    assert_eq!(run(&mut p, 1, op, sges), WcStatus::Success);
    let ca = p.ca;
    assert_eq!(
        p.net.hosts[0].mem.hints(),
        &[(ca, 0x1000, 40_000), (ca, 0x80_000, 25_536)]
    );
    assert!(
        p.net.hosts[1].mem.hints().is_empty(),
        "the responder reads nothing"
    );
}

#[test]
fn a_read_response_is_announced_once_and_the_request_reads_nothing() {
    let mut p = pair(Faults::NONE);
    let sges = vec![Sge {
        addr: 0x4000,
        length: 65_536,
        lkey: p.ka,
    }];
    let op = SendOp::Read {
        remote_addr: 0x10_000,
        rkey: p.kb,
    };
    assert_eq!(run(&mut p, 1, op, sges), WcStatus::Success);
    let cb = p.cb;
    assert!(p.net.hosts[0].mem.hints().is_empty());
    assert_eq!(p.net.hosts[1].mem.hints(), &[(cb, 0x10_000, 65_536)]);
    // An atomic reads through its own path, unannounced.
    let op = SendOp::FetchAdd {
        remote_addr: 0x100,
        rkey: p.kb,
        add: 1,
    };
    let sges = vec![Sge {
        addr: 0x200,
        length: 8,
        lkey: p.ka,
    }];
    assert_eq!(run(&mut p, 2, op, sges), WcStatus::Success);
    assert_eq!(p.net.hosts[1].mem.hints().len(), 1);
}

/// A one-packet READ response is announced too: the hint is also what tells a batching
/// memory that bytes it fetched for an earlier request over the same range are stale (a
/// daemon that served such a READ from an old window gave MPICH an earlier lap's value).
#[test]
fn a_one_packet_read_response_is_announced() {
    let mut p = pair(Faults::NONE);
    let sges = vec![Sge {
        addr: 0x4000,
        length: 512,
        lkey: p.ka,
    }];
    let op = SendOp::Read {
        remote_addr: 0x10_000,
        rkey: p.kb,
    };
    assert_eq!(run(&mut p, 1, op, sges), WcStatus::Success);
    let cb = p.cb;
    assert_eq!(p.net.hosts[1].mem.hints(), &[(cb, 0x10_000, 512)]);
}

#[test]
fn retransmissions_are_not_announced_again() {
    // 20% loss each way: many packets of the 256-packet message are sent again.
    let mut p = pair(Faults {
        loss: 0.2,
        ..Faults::NONE
    });
    let sges = vec![Sge {
        addr: 0,
        length: 262_144,
        lkey: p.ka,
    }];
    let op = SendOp::Write {
        remote_addr: 0,
        rkey: p.kb,
    };
    let status = run(&mut p, 1, op, sges);
    assert!(
        matches!(status, WcStatus::Success | WcStatus::RetryExcErr),
        "{status:?}"
    );
    let ca = p.ca;
    assert_eq!(p.net.hosts[0].mem.hints(), &[(ca, 0, 262_144)]);
}

#[test]
fn a_piece_whose_key_fails_is_not_announced() {
    let mut p = pair(Faults::NONE);
    let sges = vec![
        Sge {
            addr: 0x1000,
            length: 8192,
            lkey: p.ka,
        },
        Sge {
            addr: 0x1000,
            length: 8192,
            lkey: p.ka ^ 0x100,
        },
    ];
    let op = SendOp::Write {
        remote_addr: 0,
        rkey: p.kb,
    };
    assert_eq!(run(&mut p, 1, op, sges), WcStatus::LocProtErr);
    let ca = p.ca;
    assert_eq!(p.net.hosts[0].mem.hints(), &[(ca, 0x1000, 8192)]);
}
