//! The direct path's channel rings (docs/design/direct-path.md, "Stamped rings"): two libraries of
//! ABI 19 get stamped rings; a library that does not read stamps (here: one opened with
//! `SOFTVERBS_PLAIN_RINGS=1`, as a library of ABI 18 asks) gets plain rings, from either
//! side. In every case the same traffic, through rings that wrap many times in both
//! directions, arrives whole and in order, and `resources` says which layout the pair has.
//!
//! One test in this file: it sets the process's environment between opens.

use std::time::{Duration, Instant};

use softverbs::{
    Access, BorrowedMr, Context, Cq, Introspect, QpCap, QpInit, QpType, SendOp, SendRequest,
    WcOpcode, WcStatus, WorkCompletion,
};

mod common;

const RWR: Access = Access(0x07);

fn open(socket: &std::path::Path, plain: bool) -> Context {
    if plain {
        std::env::set_var("SOFTVERBS_PLAIN_RINGS", "1");
    }
    let c = Context::open_at_direct(socket, 0, true).unwrap();
    std::env::remove_var("SOFTVERBS_PLAIN_RINGS");
    c
}

#[track_caller]
fn one(cq: &Cq<'_>) -> WorkCompletion {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(w) = cq.poll(1).unwrap().pop() {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
            return w;
        }
        assert!(Instant::now() < end, "no completion");
        std::thread::yield_now();
    }
}

/// Rounds of: B posts a receive, A sends a 1,500-byte SEND whose bytes say the round and an
/// inline one, B answers inline; receive rings of 4 entries, so each wraps dozens of times.
/// Returns the layout `resources` reports for the pair.
fn exchange(socket: &std::path::Path, plain_a: bool, plain_b: bool) -> String {
    let (a, b) = (open(socket, plain_a), open(socket, plain_b));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let cap = QpCap {
        max_recv_wr: 4,
        ..common::cap()
    };
    let qa = a
        .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&ca, &ca).cap(cap))
        .unwrap();
    let qb = b
        .create_qp(&QpInit::new(QpType::Rc, &pb).cqs(&cb, &cb).cap(cap))
        .unwrap();
    let (ga, gb) = (a.query_gid(1, 0).unwrap(), b.query_gid(1, 0).unwrap());
    let path = common::RcPath {
        access: RWR,
        ..common::RcPath::default()
    };
    common::connect_with(&qb, ga, qa.qpn(), path);
    common::connect_with(&qa, gb, qb.qpn(), path);
    assert!(qa.is_direct() && qb.is_direct(), "the pair went direct");
    let mut abuf = vec![0u8; 4096];
    let mut bbuf = vec![0u8; 4096];
    let ma: BorrowedMr<'_> = pa.reg_slice(&mut abuf, RWR).unwrap();
    let mb: BorrowedMr<'_> = pb.reg_slice(&mut bbuf, RWR).unwrap();
    for round in 0..200u32 {
        qb.post_recv(u64::from(round), &[mb.sge(0, 2048).unwrap()])
            .unwrap();
        qb.post_recv(u64::from(round) | 1 << 32, &[mb.sge(2048, 64).unwrap()])
            .unwrap();
        qa.post_recv(u64::from(round), &[ma.sge(2048, 64).unwrap()])
            .unwrap();
        let body: Vec<u8> = (0..1500u32).map(|i| (i * 31 + round) as u8).collect();
        ma.write(0, &body).unwrap();
        qa.post_send(&SendRequest::new(
            1,
            SendOp::Send,
            &[ma.sge(0, 1500).unwrap()],
        ))
        .unwrap();
        let tag = round.to_le_bytes();
        let mut w = SendRequest::new(2, SendOp::Send, &[]);
        w.inline = Some(&tag);
        qa.post_send(&w).unwrap();
        let (r1, r2) = (one(&cb), one(&cb));
        assert_eq!(
            (r1.wr_id, r1.byte_len),
            (u64::from(round), 1500),
            "in order"
        );
        assert_eq!(r1.opcode, WcOpcode::Recv);
        assert_eq!((r2.wr_id, r2.byte_len), (u64::from(round) | 1 << 32, 4));
        let mut got = vec![0u8; 1500];
        mb.read(0, &mut got).unwrap();
        assert!(got == body, "round {round}: the SEND's bytes differ");
        let mut t = [0u8; 4];
        mb.read(2048, &mut t).unwrap();
        assert_eq!(t, tag, "round {round}: the inline SEND");
        let mut back = SendRequest::new(3, SendOp::Send, &[]);
        back.inline = Some(&tag);
        qb.post_send(&back).unwrap();
        assert_eq!(one(&ca).wr_id, 1);
        assert_eq!(one(&ca).wr_id, 2);
        let pong = one(&ca);
        assert_eq!((pong.wr_id, pong.byte_len), (u64::from(round), 4));
        assert_eq!(one(&cb).wr_id, 3);
        let mut t2 = [0u8; 4];
        ma.read(2048, &mut t2).unwrap();
        assert_eq!(t2, tag, "round {round}: the answer");
    }
    let res = Introspect::connect_at(socket).unwrap().resources().unwrap();
    let pairs = res["direct_pairs"]
        .as_array()
        .expect("direct_pairs")
        .clone();
    let lo = qa.qpn().min(qb.qpn());
    let pair = pairs
        .iter()
        .find(|p| p["qpns"][0] == lo)
        .unwrap_or_else(|| panic!("pair {lo} in {pairs:?}"));
    assert_eq!(pair["attached"], serde_json::json!([true, true]));
    pair["rings"].as_str().unwrap().to_string()
}

#[test]
fn stamped_rings_only_between_libraries_that_read_stamps_and_both_carry_the_same_traffic() {
    let (d, _dir) = common::daemon("drings", None);
    assert_eq!(exchange(&d.socket, false, false), "stamped");
    assert_eq!(exchange(&d.socket, true, false), "plain");
    assert_eq!(exchange(&d.socket, false, true), "plain");
    assert_eq!(exchange(&d.socket, true, true), "plain");
}
