//! What the responder answers when the memory behind a valid key cannot be reached
//! (docs/design/registered-memory.md, "On-demand paging"): for an on-demand-paging MR it is the
//! access error a NIC reports for a page fault that finds no mapping (NAK remote access error,
//! `QP_ACCESS_ERR` on the responder's QP); for a pinned MR whose memory vanished, a WRITE or
//! atomic is a remote operational error (`QP_FATAL`) and a READ a remote access error.
//!
//! The responder's memory is a `VecMemory` of `SPACE` bytes: an MR that runs past it stands
//! for a registration whose pages are not mapped when the request arrives.

use std::time::Duration;

use softverbs_core::types::{Access, EventType, Mtu, QpType};
use softverbs_transport::sim::{ConnParams, Faults, Host, Network};
use softverbs_transport::wr::{Payload, SendOp, SendWr, Sge, WcStatus};

const ALL: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0,
);
const SPACE: usize = 1 << 16;
/// An MR of B over its last page and one page past its memory.
const WIN: u64 = SPACE as u64 - 0x1000;
const WIN_LEN: u64 = 0x2000;
/// Inside the MR, past the memory.
const HOLE: u64 = SPACE as u64 + 0x100;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Write,
    Read,
    FetchAdd,
}

/// Runs `op` at `va` of an MR of B registered with `access`, and returns A's completion
/// status, and the QP failure B's engine reported.
fn run(op: Op, access: Access, va: u64) -> (WcStatus, Vec<(u32, Option<EventType>)>) {
    let mut a = Host::new("10.0.0.1".parse().unwrap(), Mtu::M1024);
    let mut b = Host::new("10.0.0.2".parse().unwrap(), Mtu::M1024);
    let ca = a.context(1, SPACE);
    let cb = b.context(2, SPACE);
    let (pa, pb) = (a.pd(ca), b.pd(cb));
    let ka = a.mr(pa, 0, SPACE as u64, ALL);
    let kb = b.mr(pb, WIN, WIN_LEN, access);
    let (cqa, cqb) = (a.cq(ca), b.cq(cb));
    let qa = a.qp(QpType::Rc, pa, cqa, None);
    let qb = b.qp(QpType::Rc, pb, cqb, None);
    let (ga, gb) = (a.gid, b.gid);
    a.connect(qa, gb, qb, ConnParams::default());
    b.connect(qb, ga, qa, ConnParams::default());
    let mut net = Network::new(vec![a, b], Faults::NONE, 1);
    let (sop, len) = match op {
        Op::Write => (
            SendOp::Write {
                remote_addr: va,
                rkey: kb,
            },
            64,
        ),
        Op::Read => (
            SendOp::Read {
                remote_addr: va,
                rkey: kb,
            },
            64,
        ),
        Op::FetchAdd => (
            SendOp::FetchAdd {
                remote_addr: va,
                rkey: kb,
                add: 1,
            },
            8,
        ),
    };
    let sges = Payload::Sges(vec![Sge {
        addr: 0x1000,
        length: len,
        lkey: ka,
    }]);
    net.hosts[0]
        .engine
        .post_send(qa, SendWr::new(1, sop, sges))
        .expect("post_send");
    let done = net.run_until(Duration::from_secs(1), |n| {
        !n.hosts[0].completions.is_empty()
    });
    assert!(done, "{op:?}: no completion");
    let wc = net.hosts[0].take_completions(cqa);
    (wc[0].status, net.hosts[1].failures.clone())
}

#[test]
fn an_odp_access_that_finds_no_mapping_is_a_remote_access_error() {
    let odp = Access(ALL.0 | Access::ON_DEMAND.0);
    for op in [Op::Write, Op::Read, Op::FetchAdd] {
        let (status, failures) = run(op, odp, HOLE);
        assert_eq!(status, WcStatus::RemAccessErr, "{op:?}");
        // A READ's fault is found while the response is generated, after the request was
        // accepted: the responder NAKs it without failing its own QP (see the other test).
        if op != Op::Read {
            assert_eq!(failures.len(), 1, "{op:?}: {failures:?}");
            assert_eq!(failures[0].1, Some(EventType::QpAccessErr), "{op:?}");
        }
        // The same MR where the memory is there works.
        assert_eq!(run(op, odp, WIN).0, WcStatus::Success, "{op:?}");
    }
}

#[test]
fn pinned_memory_that_vanished_is_an_operational_error_for_writes() {
    for (op, want, event) in [
        (Op::Write, WcStatus::RemOpErr, EventType::QpFatal),
        (Op::FetchAdd, WcStatus::RemOpErr, EventType::QpFatal),
        (Op::Read, WcStatus::RemAccessErr, EventType::QpAccessErr),
    ] {
        let (status, failures) = run(op, ALL, HOLE);
        assert_eq!(status, want, "{op:?}");
        // A READ's failure is found while answering, after the request was accepted: the
        // responder NAKs it without failing its QP (its behaviour before on-demand paging).
        if op == Op::Read {
            assert!(failures.is_empty(), "{op:?}: {failures:?}");
        } else {
            assert_eq!(failures[0].1, Some(event), "{op:?}");
        }
    }
}
