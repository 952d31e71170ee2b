//! Error scenarios, each checked against the completion statuses (and QP states and async
//! events) a real RDMA NIC reports: RNR, transport retry exhaustion, remote access and
//! invalid-request NAKs, XRC SRQ-number violations, local protection and length errors,
//! flushing on ERR, and at-most-once atomics under packet duplication.

use std::time::Duration;

use softverbs_core::attr::QpAttr;
use softverbs_core::datapath::{PdRef, QpTarget};
use softverbs_core::event::{AsyncEvent, EventElement};
use softverbs_core::ids::{CtxId, Handle};
use softverbs_core::types::{Access, AttrMask, EventType, Mtu, QpState, QpType};
use softverbs_core::HolderRef;
use softverbs_transport::sim::{ConnParams, Faults, Host, Network};
use softverbs_transport::time::{ack_timeout, rnr_delay};
use softverbs_transport::wr::{
    Payload, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};
use softverbs_transport::{CqId, Instant};

const ALL: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0,
);
const SPACE: usize = 1 << 20;
const SRC: u64 = 0x1000;
const DST: u64 = 0x2_0000;
const RBUF: u64 = 0x1_0000;
/// B's window for the access tests: `[WIN, WIN + WIN_LEN)`.
const WIN: u64 = 0x4_0000;
const WIN_LEN: u64 = 0x1000;
const ATOM: u64 = 0x7_0000;

/// Two hosts, one RC QP each (A requests, B responds), both with everything registered.
struct Pair {
    net: Network,
    ca: CtxId,
    cb: CtxId,
    pb: PdRef,
    ka: u32,
    kb: u32,
    cqa: CqId,
    cqb: CqId,
    qa: u32,
    qb: u32,
}

fn fill(space: &mut [u8], mul: usize, add: usize) {
    for (i, x) in space.iter_mut().enumerate() {
        *x = (i.wrapping_mul(mul) + add + (i >> 8) * 3) as u8;
    }
}

impl Pair {
    fn new(t: QpType, pa: ConnParams, pb: ConnParams, faults: Faults, seed: u64) -> Pair {
        let mut a = Host::new("10.0.0.1".parse().unwrap(), Mtu::M1024);
        let mut b = Host::new("10.0.0.2".parse().unwrap(), Mtu::M1024);
        let ca = a.context(1, SPACE);
        let cb = b.context(2, SPACE);
        let pda = a.pd(ca);
        let pdb = b.pd(cb);
        let ka = a.mr(pda, 0, SPACE as u64, ALL);
        let kb = b.mr(pdb, 0, SPACE as u64, ALL);
        let cqa = a.cq(ca);
        let cqb = b.cq(cb);
        let qa = a.qp(t, pda, cqa, None);
        let qb = b.qp(t, pdb, cqb, None);
        let (ga, gb) = (a.gid, b.gid);
        a.connect(qa, gb, qb, pa);
        b.connect(qb, ga, qa, pb);
        fill(a.mem.space_mut(ca), 7, 3);
        fill(b.mem.space_mut(cb), 13, 5);
        Pair {
            net: Network::new(vec![a, b], faults, seed),
            ca,
            cb,
            pb: pdb,
            ka,
            kb,
            cqa,
            cqb,
            qa,
            qb,
        }
    }

    fn rc() -> Pair {
        Pair::new(
            QpType::Rc,
            ConnParams::default(),
            ConnParams::default(),
            Faults::NONE,
            1,
        )
    }

    fn a(&mut self) -> &mut Host {
        &mut self.net.hosts[0]
    }

    fn b(&mut self) -> &mut Host {
        &mut self.net.hosts[1]
    }

    fn send(&mut self, wr_id: u64, op: SendOp, addr: u64, len: u32) {
        let (qa, ka) = (self.qa, self.ka);
        let wr = SendWr::new(wr_id, op, sge(addr, len, ka));
        self.a().engine.post_send(qa, wr).expect("post_send");
    }

    fn recv(&mut self, wr_id: u64, addr: u64, len: u32) {
        let (qb, kb) = (self.qb, self.kb);
        let wr = RecvWr {
            wr_id,
            sges: vec![Sge {
                addr,
                length: len,
                lkey: kb,
            }],
        };
        self.b().engine.post_recv(qb, wr).expect("post_recv");
    }

    /// Runs until A has `n` completions on its CQ (and then until idle, bounded).
    fn run_a(&mut self, ctx: &str, n: usize, limit: Duration) {
        let ok = self
            .net
            .run_until(limit, |net| net.hosts[0].completions.len() >= n);
        assert!(
            ok,
            "{ctx}: timed out at {:?}: A {:?} {:?}, B {:?} {:?}",
            self.net.now,
            self.net.hosts[0].completions,
            self.net.hosts[0].failures,
            self.net.hosts[1].completions,
            self.net.hosts[1].failures
        );
        self.net.run_until(Duration::from_millis(100), |_| false);
    }

    fn a_wcs(&mut self) -> Vec<(u64, WcStatus)> {
        let cqa = self.cqa;
        statuses(&self.a().take_completions(cqa))
    }

    fn b_wcs(&mut self) -> Vec<(u64, WcStatus)> {
        let cqb = self.cqb;
        statuses(&self.b().take_completions(cqb))
    }
}

fn sge(addr: u64, length: u32, lkey: u32) -> Payload {
    Payload::Sges(vec![Sge { addr, length, lkey }])
}

fn statuses(w: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    w.iter().map(|w| (w.wr_id, w.status)).collect()
}

/// The QP's state as the core (what `ibv_query_qp` reads) has it, and its owner's handle.
fn core_qp(h: &Host, qpn: u32) -> (CtxId, Handle, QpState) {
    let (ctx, handle) = match h.core.qp_target(qpn).expect("QP") {
        QpTarget::Owned { ctx, handle, .. } => (ctx, handle),
        QpTarget::XrcRecv => {
            let holder = h
                .core
                .xrc_rcv_qp_holders(qpn)
                .into_iter()
                .find(|x| matches!(x.via, HolderRef::Handle(_)))
                .expect("a handle holder");
            let HolderRef::Handle(hd) = holder.via else {
                unreachable!()
            };
            (holder.ctx, hd)
        }
    };
    let st = h.core.query_qp(ctx, handle).expect("query").attr.qp_state;
    (ctx, handle, st)
}

fn events(h: &mut Host, ctx: CtxId) -> Vec<AsyncEvent> {
    h.pump();
    let mut v = Vec::new();
    while let Some(e) = h.core.next_event(ctx).expect("context") {
        v.push(e);
    }
    v
}

/// After a QP failed: new work posted to it completes at once with a flush.
fn assert_posts_flush(h: &mut Host, qpn: u32, cq: CqId, lkey: u32) {
    h.engine
        .post_send(qpn, SendWr::new(900, SendOp::Send, sge(SRC, 10, lkey)))
        .expect("posting to a QP in ERR succeeds");
    h.pump();
    let w = h.take_completions(cq);
    assert_eq!(statuses(&w), vec![(900, WcStatus::WrFlushErr)]);
}

// ---- RNR -----------------------------------------------------------------------------------

#[test]
fn rnr_with_no_retries_fails_and_flushes() {
    let mut p = Pair::new(
        QpType::Rc,
        ConnParams {
            rnr_retry: 0,
            ..ConnParams::default()
        },
        ConnParams::default(),
        Faults::NONE,
        1,
    );
    p.send(1, SendOp::Send, SRC, 100);
    p.send(2, SendOp::Send, SRC, 3000);
    p.send(
        3,
        SendOp::Write {
            remote_addr: WIN,
            rkey: p.kb,
        },
        SRC,
        100,
    );
    p.run_a("rnr0", 3, Duration::from_secs(1));
    assert_eq!(
        p.a_wcs(),
        vec![
            (1, WcStatus::RnrRetryExcErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    let qa = p.qa;
    assert_eq!(p.a().failures, vec![(qa, None)], "no async event for RNR");
    assert_eq!(core_qp(p.a(), qa).2, QpState::Err);
    // RNR is not the responder's error.
    let qb = p.qb;
    assert!(p.b().failures.is_empty(), "{:?}", p.b().failures);
    assert_eq!(core_qp(p.b(), qb).2, QpState::Rts);
    let (cqa, ka) = (p.cqa, p.ka);
    assert_posts_flush(p.a(), qa, cqa, ka);
}

/// With unlimited RNR retries (7) the requester waits as long as it takes: after 5 ms of
/// simulated time without a receive WR, one is posted and everything succeeds. `sends` are the
/// lengths of the SENDs posted back to back (each needs a receive WR).
fn rnr_unlimited_case(sends: &[u32]) {
    let ctx = format!("sends {sends:?}");
    let mut p = Pair::rc();
    for (i, &len) in sends.iter().enumerate() {
        p.send(i as u64 + 1, SendOp::Send, SRC, len);
    }
    // Nothing is posted for 5 ms of simulated time: the requester keeps getting RNR NAKs.
    p.net.run_until(Duration::from_millis(5), |_| false);
    assert!(
        p.net.now >= Instant(5_000_000),
        "{ctx}: the network went idle at {:?}: A {:?} {:?}",
        p.net.now,
        p.net.hosts[0].completions,
        p.net.hosts[0].failures
    );
    assert!(
        p.a().completions.is_empty(),
        "{ctx}: {:?}",
        p.a().completions
    );
    assert!(
        p.a().failures.is_empty() && p.b().failures.is_empty(),
        "{ctx}"
    );
    for (i, _) in sends.iter().enumerate() {
        p.recv(100 + i as u64, RBUF + 0x4000 * i as u64, 0x4000);
    }
    let n = sends.len();
    let ok = p.net.run_until(Duration::from_secs(1), |net| {
        net.hosts[0].completions.len() >= n && net.hosts[1].completions.len() >= n
    });
    assert!(ok, "{ctx}: A {:?}", p.net.hosts[0].completions);
    assert_eq!(
        p.a_wcs(),
        (1..=n as u64)
            .map(|i| (i, WcStatus::Success))
            .collect::<Vec<_>>(),
        "{ctx}"
    );
    let cqb = p.cqb;
    let r = p.b().take_completions(cqb);
    assert_eq!(
        r.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
            .collect::<Vec<_>>(),
        sends
            .iter()
            .enumerate()
            .map(|(i, &l)| (100 + i as u64, WcStatus::Success, WcOpcode::Recv, l))
            .collect::<Vec<_>>(),
        "{ctx}"
    );
    let (ca, cb) = (p.ca, p.cb);
    for (i, &len) in sends.iter().enumerate() {
        let want = p.a().mem.space(ca)[SRC as usize..SRC as usize + len as usize].to_vec();
        let at = (RBUF + 0x4000 * i as u64) as usize;
        assert_eq!(
            &p.b().mem.space(cb)[at..at + len as usize],
            &want[..],
            "{ctx}"
        );
    }
}

#[test]
fn rnr_with_unlimited_retries_waits_for_the_receive() {
    rnr_unlimited_case(&[100]);
}

/// The same for a SEND of several packets: the MIDDLE/LAST packets behind the RNR-NAKed FIRST
/// must not use up the transport retry count (`retry_cnt`), which is a different budget.
#[test]
fn rnr_with_unlimited_retries_waits_for_a_multi_packet_send() {
    rnr_unlimited_case(&[3000]);
}

/// The same with several SENDs in flight behind the one that is RNR-NAKed.
#[test]
fn rnr_with_unlimited_retries_waits_with_a_pipeline() {
    rnr_unlimited_case(&[100, 100, 100]);
}

#[test]
fn rnr_retry_count_is_honoured() {
    let code = 14; // 1.28 ms
    let delay = rnr_delay(code);
    for retries in [1u8, 3, 6] {
        let mut p = Pair::new(
            QpType::Rc,
            ConnParams {
                rnr_retry: retries,
                ..ConnParams::default()
            },
            ConnParams {
                min_rnr_timer: code,
                ..ConnParams::default()
            },
            Faults::NONE,
            1,
        );
        p.net.capture = Some(Vec::new());
        p.send(1, SendOp::Send, SRC, 100);
        p.run_a("rnr-n", 1, Duration::from_secs(2));
        assert_eq!(p.a_wcs(), vec![(1, WcStatus::RnrRetryExcErr)], "{retries}");
        let from_a = p
            .net
            .capture
            .as_ref()
            .unwrap()
            .iter()
            .filter(|(_, d)| d[12..16] == [10, 0, 0, 1])
            .count();
        assert_eq!(
            from_a,
            usize::from(retries) + 1,
            "rnr_retry={retries}: the first try and {retries} retries"
        );
        let took = p.net.now.since(Instant(0));
        assert!(
            took >= delay * u32::from(retries) && took < delay * (u32::from(retries) + 1),
            "rnr_retry={retries}: failed after {took:?} (RNR delay {delay:?})"
        );
    }
}

/// An XRC SRQ with no receive WR answers with an RNR NAK, as RC does (docs/design/xrc-semantics.md §5).
#[test]
fn xrc_empty_srq_is_rnr() {
    let mut x = Xrc::new(ConnParams {
        rnr_retry: 0,
        ..ConnParams::default()
    });
    let srqn = x.srqn;
    x.send(1, SendOp::Send, srqn);
    x.send(2, SendOp::Send, srqn);
    x.run("xrc rnr", 2);
    let cqa = x.cqa;
    assert_eq!(
        statuses(&x.net.hosts[0].take_completions(cqa)),
        vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert!(x.net.hosts[1].failures.is_empty());
}

// ---- transport retries ----------------------------------------------------------------------

fn retry_case(retry_cnt: u8, timeout: u8, peer_gone: bool) {
    let ctx = format!("retry_cnt={retry_cnt} timeout={timeout} peer_gone={peer_gone}");
    let faults = if peer_gone {
        Faults::NONE
    } else {
        Faults {
            loss: 1.0,
            ..Faults::NONE
        }
    };
    let mut p = Pair::new(
        QpType::Rc,
        ConnParams {
            retry_cnt,
            timeout,
            ..ConnParams::default()
        },
        ConnParams::default(),
        faults,
        3,
    );
    if peer_gone {
        let qb = p.qb;
        p.b().engine.destroy_qp(qb);
    }
    // IBA's plain count, without the software NIC's retry floor (`time::RETRY_FLOOR`,
    // tested in stall.rs).
    p.a().engine.set_retry_floor(Duration::ZERO);
    p.send(1, SendOp::Send, SRC, 100);
    p.send(
        2,
        SendOp::Write {
            remote_addr: WIN,
            rkey: p.kb,
        },
        SRC,
        100,
    );
    p.send(
        3,
        SendOp::Read {
            remote_addr: WIN,
            rkey: p.kb,
        },
        DST,
        100,
    );
    p.run_a(&ctx, 3, Duration::from_secs(10));
    assert_eq!(
        p.a_wcs(),
        vec![
            (1, WcStatus::RetryExcErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ],
        "{ctx}"
    );
    let t = ack_timeout(timeout).unwrap();
    let took = p.net.now.since(Instant(0));
    let want = t * (u32::from(retry_cnt) + 1);
    assert!(
        took >= want && took < want + t / 2,
        "{ctx}: failed after {took:?}, want about {want:?}"
    );
    // The three requests went out once and then again on each of retry_cnt retries.
    assert_eq!(
        p.net.stats.sent,
        3 * (u64::from(retry_cnt) + 1),
        "{ctx}: packets sent"
    );
    let qa = p.qa;
    assert_eq!(p.a().failures, vec![(qa, None)], "{ctx}");
    assert_eq!(core_qp(p.a(), qa).2, QpState::Err, "{ctx}");
    let (cqa, ka) = (p.cqa, p.ka);
    assert_posts_flush(p.a(), qa, cqa, ka);
}

#[test]
fn retry_exceeded_when_the_peer_qp_is_gone() {
    retry_case(3, 12, true);
    retry_case(0, 10, true);
}

#[test]
fn retry_exceeded_when_the_network_loses_everything() {
    retry_case(7, 10, false);
    retry_case(2, 14, false);
}

// ---- remote access --------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bad {
    WrongKey,
    PastEnd,
    BeforeStart,
    MrLacksFlag,
    OtherPd,
    QpLacksFlag,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RemOp {
    Write,
    Read,
    CmpSwap,
    FetchAdd,
}

fn remote_access_case(op: RemOp, bad: Bad) {
    let ctx = format!("{op:?} {bad:?}");
    let needed = match op {
        RemOp::Write => Access::REMOTE_WRITE,
        RemOp::Read => Access::REMOTE_READ,
        RemOp::CmpSwap | RemOp::FetchAdd => Access::REMOTE_ATOMIC,
    };
    let without = Access(ALL.0 & !needed.0);
    let qp_access = (bad == Bad::QpLacksFlag).then_some(without);
    let mut p = Pair::new(
        QpType::Rc,
        ConnParams::default(),
        ConnParams {
            access: qp_access,
            ..ConnParams::default()
        },
        Faults::NONE,
        1,
    );
    let (cb, pb) = (p.cb, p.pb);
    // The window, registered with everything; the same window without the needed flag; the
    // same window in another PD.
    let kwin = p.b().mr(pb, WIN, WIN_LEN, ALL);
    let klack = p.b().mr(pb, WIN, WIN_LEN, without);
    let other = p.b().pd(cb);
    let kother = p.b().mr(other, WIN, WIN_LEN, ALL);
    let wrong = 0x00DE_AD00;
    assert!(![p.kb, kwin, klack, kother].contains(&wrong));
    let atomic = matches!(op, RemOp::CmpSwap | RemOp::FetchAdd);
    let len: u32 = if atomic { 8 } else { 64 };
    let (rkey, va) = match bad {
        Bad::WrongKey => (wrong, WIN),
        Bad::PastEnd if atomic => (kwin, WIN + WIN_LEN),
        Bad::PastEnd => (kwin, WIN + WIN_LEN - u64::from(len) + 8),
        Bad::BeforeStart => (kwin, WIN - 8),
        Bad::MrLacksFlag => (klack, WIN),
        Bad::OtherPd => (kother, WIN),
        Bad::QpLacksFlag => (kwin, WIN),
    };
    let sop = match op {
        RemOp::Write => SendOp::Write {
            remote_addr: va,
            rkey,
        },
        RemOp::Read => SendOp::Read {
            remote_addr: va,
            rkey,
        },
        RemOp::CmpSwap => SendOp::CompareSwap {
            remote_addr: va,
            rkey,
            compare: 0,
            swap: 1,
        },
        RemOp::FetchAdd => SendOp::FetchAdd {
            remote_addr: va,
            rkey,
            add: 1,
        },
    };
    p.recv(50, RBUF, 4096);
    let (ca, cb) = (p.ca, p.cb);
    let a_before = p.a().mem.space(ca).to_vec();
    let b_before = p.b().mem.space(cb).to_vec();
    let local = if op == RemOp::Write { SRC } else { DST };
    p.send(1, sop, local, len);
    p.send(2, SendOp::Send, SRC, 10);
    p.run_a(&ctx, 2, Duration::from_secs(1));
    assert_eq!(
        p.a_wcs(),
        vec![(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)],
        "{ctx}"
    );
    let (qa, qb) = (p.qa, p.qb);
    assert_eq!(p.a().failures, vec![(qa, None)], "{ctx}: requester");
    assert_eq!(
        p.b().failures,
        vec![(qb, Some(EventType::QpAccessErr))],
        "{ctx}: responder"
    );
    let (_, hb, st) = core_qp(p.b(), qb);
    assert_eq!(st, QpState::Err, "{ctx}: responder QP state");
    assert_eq!(
        events(p.b(), cb),
        vec![AsyncEvent {
            event_type: EventType::QpAccessErr,
            element: EventElement::Qp(hb),
        }],
        "{ctx}: responder async events"
    );
    // The responder's receive queue was flushed with the QP.
    assert_eq!(p.b_wcs(), vec![(50, WcStatus::WrFlushErr)], "{ctx}");
    assert!(
        p.a().mem.space(ca) == &a_before[..],
        "{ctx}: requester memory changed"
    );
    assert!(
        p.b().mem.space(cb) == &b_before[..],
        "{ctx}: responder memory changed"
    );
}

#[test]
fn remote_access_errors() {
    for op in [RemOp::Write, RemOp::Read, RemOp::CmpSwap, RemOp::FetchAdd] {
        for bad in [
            Bad::WrongKey,
            Bad::PastEnd,
            Bad::BeforeStart,
            Bad::MrLacksFlag,
            Bad::OtherPd,
            Bad::QpLacksFlag,
        ] {
            remote_access_case(op, bad);
        }
    }
}

// ---- XRC SRQ numbers -----------------------------------------------------------------------

/// An XRC_SEND QP on A and, on B, an XRC receive QP of domain 1 held by three contexts: its
/// creator (handle), a second context through `open_qp` (handle), and a third through the
/// legacy `reg_xrc_rcv_qp` (registration). Domain 1 has an XRC SRQ; domain 2 (opened by the
/// creator too) has another.
struct Xrc {
    net: Network,
    ka: u32,
    cqa: CqId,
    qa: u32,
    qb: u32,
    kb: u32,
    srq: (CtxId, Handle),
    srqn: u32,
    other_srq: (CtxId, Handle),
    other_srqn: u32,
    holders: Vec<(CtxId, EventElement)>,
    cb1: CtxId,
}

impl Xrc {
    fn new(pa: ConnParams) -> Xrc {
        let mut a = Host::new("10.0.0.1".parse().unwrap(), Mtu::M1024);
        let mut b = Host::new("10.0.0.2".parse().unwrap(), Mtu::M1024);
        let ca = a.context(1, SPACE);
        let pda = a.pd(ca);
        let ka = a.mr(pda, 0, SPACE as u64, ALL);
        let cqa = a.cq(ca);
        let qa = a.qp(QpType::XrcSend, pda, cqa, None);

        let cb1 = b.context(2, SPACE);
        let x1 = b.xrcd(cb1, 1);
        let x2 = b.xrcd(cb1, 2);
        let pb = b.pd(cb1);
        let kb = b.mr(pb, 0, SPACE as u64, ALL);
        let srq_cq = b.cq(cb1);
        let (srq, srqn) = b.xrc_srq(pb, x1, srq_cq, 16);
        let (other_srq, other_srqn) = b.xrc_srq(pb, x2, srq_cq, 16);
        let (h1, qb) = b.xrc_recv_qp(cb1, x1);

        let cb2 = b.context(3, 4096);
        let x1_2 = b.xrcd(cb2, 1);
        let h2 = b
            .core
            .open_qp(cb2, x1_2, qb, QpType::XrcRecv)
            .expect("open_qp");
        let cb3 = b.context(4, 4096);
        let x1_3 = b.xrcd(cb3, 1);
        b.core
            .reg_xrc_rcv_qp(cb3, x1_3, qb)
            .expect("reg_xrc_rcv_qp");

        let (ga, gb) = (a.gid, b.gid);
        a.connect(qa, gb, qb, pa);
        b.connect(qb, ga, qa, ConnParams::default());
        fill(b.mem.space_mut(cb1), 13, 5);
        Xrc {
            net: Network::new(vec![a, b], Faults::NONE, 5),
            ka,
            cqa,
            qa,
            qb,
            kb,
            srq,
            srqn,
            other_srq,
            other_srqn,
            holders: vec![
                (cb1, EventElement::Qp(h1)),
                (cb2, EventElement::Qp(h2)),
                (cb3, EventElement::XrcRecvQpNum(qb)),
            ],
            cb1,
        }
    }

    fn send(&mut self, wr_id: u64, op: SendOp, srqn: u32) {
        let mut wr = SendWr::new(wr_id, op, sge(SRC, 100, self.ka));
        wr.remote_srqn = srqn;
        let qa = self.qa;
        self.net.hosts[0].engine.post_send(qa, wr).unwrap();
    }

    fn post_srq(&mut self, key: (CtxId, Handle), wr_id: u64) {
        let kb = self.kb;
        self.net.hosts[1]
            .engine
            .post_srq_recv(
                key,
                RecvWr {
                    wr_id,
                    sges: vec![Sge {
                        addr: RBUF,
                        length: 4096,
                        lkey: kb,
                    }],
                },
            )
            .unwrap();
    }

    fn run(&mut self, ctx: &str, n: usize) {
        let ok = self.net.run_until(Duration::from_secs(1), |net| {
            net.hosts[0].completions.len() >= n
        });
        assert!(
            ok,
            "{ctx}: A {:?}, B {:?} {:?}",
            self.net.hosts[0].completions,
            self.net.hosts[1].completions,
            self.net.hosts[1].failures
        );
        self.net.run_until(Duration::from_millis(100), |_| false);
    }
}

fn xrc_bad_srqn_case(bad_srqn: Option<u32>, write: bool) {
    let mut x = Xrc::new(ConnParams::default());
    let bad = bad_srqn.unwrap_or(x.other_srqn);
    let ctx = format!("srqn {bad:#x} write={write}");
    assert_ne!(bad, x.srqn);
    let (srq, other) = (x.srq, x.other_srq);
    x.post_srq(srq, 10);
    x.post_srq(other, 20);
    let cb1 = x.cb1;
    let b_before = x.net.hosts[1].mem.space(cb1).to_vec();
    let op = if write {
        SendOp::Write {
            remote_addr: WIN,
            rkey: x.kb,
        }
    } else {
        SendOp::Send
    };
    x.send(1, op, bad);
    let good = x.srqn;
    x.send(2, SendOp::Send, good);
    x.run(&ctx, 2);
    let cqa = x.cqa;
    assert_eq!(
        statuses(&x.net.hosts[0].take_completions(cqa)),
        vec![(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)],
        "{ctx}"
    );
    let qb = x.qb;
    let b = &mut x.net.hosts[1];
    assert_eq!(
        b.failures,
        vec![(qb, Some(EventType::QpAccessErr))],
        "{ctx}"
    );
    // Nothing was delivered into either SRQ, and nothing completed on B.
    assert_eq!(b.engine.srq_len(srq), 1, "{ctx}");
    assert_eq!(b.engine.srq_len(other), 1, "{ctx}");
    assert!(b.completions.is_empty(), "{ctx}: {:?}", b.completions);
    assert!(b.mem.space(cb1) == &b_before[..], "{ctx}: B memory changed");
    // The receive QP is in ERR for every holder, and each holder got QP_ACCESS_ERR once.
    assert_eq!(core_qp(b, qb).2, QpState::Err, "{ctx}");
    for &(ctx_id, element) in &x.holders {
        if let EventElement::Qp(h) = element {
            let st = b.core.query_qp(ctx_id, h).expect("query").attr.qp_state;
            assert_eq!(st, QpState::Err, "{ctx}: state via {ctx_id:?}/{h:?}");
        }
        assert_eq!(
            events(b, ctx_id),
            vec![AsyncEvent {
                event_type: EventType::QpAccessErr,
                element,
            }],
            "{ctx}: events of holder {ctx_id:?}"
        );
    }
}

#[test]
fn xrc_srqn_of_another_domain_is_an_access_error_for_every_holder() {
    xrc_bad_srqn_case(None, false);
    xrc_bad_srqn_case(None, true);
}

#[test]
fn xrc_nonexistent_srqn_is_an_access_error_for_every_holder() {
    xrc_bad_srqn_case(Some(0x00AB_CDEF), false);
    xrc_bad_srqn_case(Some(0x00AB_CDEF), true);
}

// ---- local errors ---------------------------------------------------------------------------

#[test]
fn send_with_a_bad_lkey_is_a_local_protection_error() {
    for t in [QpType::Rc, QpType::Uc] {
        let mut p = Pair::new(
            t,
            ConnParams::default(),
            ConnParams::default(),
            Faults::NONE,
            1,
        );
        p.recv(50, RBUF, 4096);
        let qa = p.qa;
        let wr = SendWr::new(1, SendOp::Send, sge(SRC, 100, 0x00BA_D000));
        p.a().engine.post_send(qa, wr).unwrap();
        p.send(2, SendOp::Send, SRC, 10);
        p.run_a(&format!("{t:?}"), 2, Duration::from_secs(1));
        assert_eq!(
            p.a_wcs(),
            vec![(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)],
            "{t:?}"
        );
        assert_eq!(p.a().failures, vec![(qa, None)], "{t:?}");
        assert!(p.b().completions.is_empty(), "{t:?}: nothing was sent");
        assert!(p.b().failures.is_empty(), "{t:?}");
    }
}

/// The error completion names the work request that failed, even when earlier ones are still
/// waiting for their ACKs: those complete successfully or are flushed, never with the error.
#[test]
fn local_protection_error_is_reported_on_the_failing_request() {
    let mut p = Pair::rc();
    p.recv(50, RBUF, 4096);
    p.recv(51, RBUF, 4096);
    p.send(1, SendOp::Send, SRC, 100);
    let qa = p.qa;
    let wr = SendWr::new(2, SendOp::Send, sge(SRC, 100, 0x00BA_D000));
    p.a().engine.post_send(qa, wr).unwrap();
    p.send(3, SendOp::Send, SRC, 10);
    p.run_a("lkey after good", 3, Duration::from_secs(1));
    let w = p.a_wcs();
    assert_eq!(w.len(), 3, "{w:?}");
    assert_eq!(w[0].0, 1, "{w:?}");
    assert!(
        matches!(w[0].1, WcStatus::Success | WcStatus::WrFlushErr),
        "the good SEND must not carry the error: {w:?}"
    );
    assert_eq!(
        &w[1..],
        &[(2, WcStatus::LocProtErr), (3, WcStatus::WrFlushErr)],
        "{w:?}"
    );
}

/// A READ whose local buffer's key is wrong fails with a local protection error.
#[test]
fn read_into_a_bad_lkey_is_a_local_protection_error() {
    let mut p = Pair::rc();
    let (qa, kb) = (p.qa, p.kb);
    let wr = SendWr::new(
        1,
        SendOp::Read {
            remote_addr: WIN,
            rkey: kb,
        },
        sge(DST, 100, 0x00BA_D000),
    );
    p.a().engine.post_send(qa, wr).unwrap();
    p.send(2, SendOp::Send, SRC, 10);
    p.run_a("read lkey", 2, Duration::from_secs(1));
    assert_eq!(
        p.a_wcs(),
        vec![(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]
    );
}

#[test]
fn receive_buffer_too_small() {
    // (message, receive buffer): one packet, and a 3-packet message that overflows in the
    // second packet.
    for (len, room) in [(200u32, 100u32), (3000, 1500)] {
        let ctx = format!("{len} into {room}");
        let mut p = Pair::rc();
        p.recv(50, RBUF, room);
        p.recv(51, RBUF, 8192);
        p.send(1, SendOp::Send, SRC, len);
        p.send(2, SendOp::Send, SRC, 10);
        p.run_a(&ctx, 2, Duration::from_secs(1));
        assert_eq!(
            p.a_wcs(),
            vec![(1, WcStatus::RemInvReqErr), (2, WcStatus::WrFlushErr)],
            "{ctx}: requester"
        );
        assert_eq!(
            p.b_wcs(),
            vec![(50, WcStatus::LocLenErr), (51, WcStatus::WrFlushErr)],
            "{ctx}: receiver"
        );
        let qb = p.qb;
        assert_eq!(core_qp(p.b(), qb).2, QpState::Err, "{ctx}");
        assert_eq!(p.b().failures.len(), 1, "{ctx}");
        // Nothing beyond the receive buffer was written.
        let cb = p.cb;
        let end = (RBUF + u64::from(room)) as usize;
        let mut fresh = vec![0u8; SPACE];
        fill(&mut fresh, 13, 5);
        assert_eq!(
            &p.b().mem.space(cb)[end..end + 4096],
            &fresh[end..end + 4096],
            "{ctx}: overflow past the receive buffer"
        );
    }
}

// ---- responder resources -------------------------------------------------------------------

#[test]
fn max_dest_rd_atomic_is_enforced() {
    let mut p = Pair::new(
        QpType::Rc,
        ConnParams {
            max_rd_atomic: 4,
            ..ConnParams::default()
        },
        ConnParams {
            max_dest_rd_atomic: 1,
            ..ConnParams::default()
        },
        Faults::NONE,
        1,
    );
    for i in 0..4u64 {
        p.send(
            i + 1,
            SendOp::Read {
                remote_addr: WIN + i * 256,
                rkey: p.kb,
            },
            DST + i * 4096,
            2000,
        );
    }
    p.run_a("rd_atomic", 4, Duration::from_secs(1));
    let w = p.a_wcs();
    assert_eq!(
        w.iter().map(|w| w.0).collect::<Vec<_>>(),
        vec![1, 2, 3, 4],
        "{w:?}"
    );
    assert_eq!(w[0].1, WcStatus::Success, "{w:?}");
    // The first READ beyond the responder's resources is NAKed "invalid request"; everything
    // after it is flushed; nothing before it fails.
    let first_bad = w
        .iter()
        .position(|x| x.1 != WcStatus::Success)
        .expect("a READ beyond max_dest_rd_atomic must fail");
    assert_eq!(w[first_bad].1, WcStatus::RemInvReqErr, "{w:?}");
    assert!(
        w[first_bad + 1..]
            .iter()
            .all(|x| x.1 == WcStatus::WrFlushErr),
        "{w:?}"
    );
    let qb = p.qb;
    assert_eq!(
        p.b().failures,
        vec![(qb, Some(EventType::QpReqErr))],
        "responder: invalid request"
    );
    // The successful READ's data is right.
    let (ca, cb) = (p.ca, p.cb);
    let want = p.b().mem.space(cb)[WIN as usize..WIN as usize + 2000].to_vec();
    assert_eq!(
        &p.a().mem.space(ca)[DST as usize..DST as usize + 2000],
        &want[..]
    );
}

// ---- ERR state --------------------------------------------------------------------------------

#[test]
fn modify_to_err_flushes_everything() {
    // The network loses everything and the ACK timeout is long (about 4.3 s), so all of A's
    // requests stay outstanding, sent but unacknowledged.
    let mut p = Pair::new(
        QpType::Rc,
        ConnParams {
            timeout: 20,
            ..ConnParams::default()
        },
        ConnParams::default(),
        Faults {
            loss: 1.0,
            ..Faults::NONE
        },
        1,
    );
    let (qa, ka) = (p.qa, p.ka);
    p.send(1, SendOp::Send, SRC, 3000);
    p.send(
        2,
        SendOp::Write {
            remote_addr: WIN,
            rkey: p.kb,
        },
        SRC,
        100,
    );
    p.send(
        3,
        SendOp::Read {
            remote_addr: WIN,
            rkey: p.kb,
        },
        DST,
        100,
    );
    p.send(
        4,
        SendOp::FetchAdd {
            remote_addr: ATOM,
            rkey: p.kb,
            add: 1,
        },
        DST,
        8,
    );
    for id in [11, 12, 13] {
        let wr = RecvWr {
            wr_id: id,
            sges: vec![Sge {
                addr: RBUF,
                length: 100,
                lkey: ka,
            }],
        };
        p.a().engine.post_recv(qa, wr).unwrap();
    }
    p.net.run_until(Duration::from_millis(1), |_| false);
    assert!(p.a().completions.is_empty(), "{:?}", p.a().completions);
    assert_eq!(p.a().engine.send_queue_len(qa), 4);
    assert!(
        p.net.stats.sent >= 6,
        "the requests were sent: {:?}",
        p.net.stats
    );
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    p.a().modify(qa, &err, AttrMask::STATE).expect("to ERR");
    p.a().pump();
    let cqa = p.cqa;
    let w = p.a().take_completions(cqa);
    assert_eq!(
        w.iter()
            .map(|w| (w.wr_id, w.status, w.qp_num))
            .collect::<Vec<_>>(),
        vec![
            (1, WcStatus::WrFlushErr, qa),
            (2, WcStatus::WrFlushErr, qa),
            (3, WcStatus::WrFlushErr, qa),
            (4, WcStatus::WrFlushErr, qa),
            (11, WcStatus::WrFlushErr, qa),
            (12, WcStatus::WrFlushErr, qa),
            (13, WcStatus::WrFlushErr, qa),
        ]
    );
    assert_eq!(p.a().engine.send_queue_len(qa), 0);
    // Work posted in ERR completes at once with a flush, sends and receives alike.
    p.send(5, SendOp::Send, SRC, 10);
    let wr = RecvWr {
        wr_id: 14,
        sges: vec![Sge {
            addr: RBUF,
            length: 100,
            lkey: ka,
        }],
    };
    p.a().engine.post_recv(qa, wr).unwrap();
    p.a().pump();
    assert_eq!(
        p.a_wcs(),
        vec![(5, WcStatus::WrFlushErr), (14, WcStatus::WrFlushErr)]
    );
    // Nothing more happens: no retransmission, no late completion.
    let sent = p.net.stats.sent;
    p.net.run_until(Duration::from_secs(10), |_| false);
    assert!(p.a().completions.is_empty(), "{:?}", p.a().completions);
    assert_eq!(p.net.stats.sent, sent, "no retransmission after ERR");
    let cb = p.cb;
    assert_eq!(
        p.b().mem.space(cb)[ATOM as usize..ATOM as usize + 8],
        {
            let mut f = vec![0u8; SPACE];
            fill(&mut f, 13, 5);
            f[ATOM as usize..ATOM as usize + 8].to_vec()
        }[..],
        "the atomic that was flushed was never executed"
    );
}

// ---- atomics are at most once ----------------------------------------------------------------

fn atomics_under_faults(faults: Faults, seed: u64) {
    let ctx = format!("{faults:?} seed {seed}");
    let mut p = Pair::new(
        QpType::Rc,
        ConnParams {
            timeout: 8,
            ..ConnParams::default()
        },
        ConnParams::default(),
        faults,
        seed,
    );
    let cb = p.cb;
    let start = 1000u64;
    p.b().mem.space_mut(cb)[ATOM as usize..ATOM as usize + 8].copy_from_slice(&start.to_ne_bytes());
    let adds: Vec<u64> = (1..=50).map(|i| i * 3 + (i % 7)).collect();
    for (i, &add) in adds.iter().enumerate() {
        p.send(
            i as u64,
            SendOp::FetchAdd {
                remote_addr: ATOM,
                rkey: p.kb,
                add,
            },
            DST + 8 * i as u64,
            8,
        );
    }
    p.run_a(&ctx, 50, Duration::from_secs(60));
    let w = p.a_wcs();
    assert_eq!(
        w,
        (0..50).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>(),
        "{ctx}"
    );
    let total: u64 = adds.iter().sum();
    let got = u64::from_ne_bytes(
        p.b().mem.space(cb)[ATOM as usize..ATOM as usize + 8]
            .try_into()
            .unwrap(),
    );
    assert_eq!(got, start + total, "{ctx}: each add applied exactly once");
    let ca = p.ca;
    let originals: Vec<u64> = (0..50)
        .map(|i| {
            let at = (DST + 8 * i) as usize;
            u64::from_ne_bytes(p.a().mem.space(ca)[at..at + 8].try_into().unwrap())
        })
        .collect();
    let prefix: Vec<u64> = adds
        .iter()
        .scan(start, |s, &a| {
            let before = *s;
            *s += a;
            Some(before)
        })
        .collect();
    assert_eq!(
        originals, prefix,
        "{ctx}: originals are the prefix sums, in order"
    );
    assert!(p.net.stats.duplicated > 0, "{ctx}: the faults did happen");
}

#[test]
fn duplicated_atomics_are_applied_once() {
    for seed in 1..=5 {
        atomics_under_faults(
            Faults {
                duplicate: 0.5,
                ..Faults::NONE
            },
            seed,
        );
    }
}

#[test]
fn atomics_survive_loss_duplication_and_reordering() {
    for seed in 1..=5 {
        atomics_under_faults(
            Faults {
                loss: 0.1,
                duplicate: 0.3,
                reorder: 0.2,
                ..Faults::NONE
            },
            seed,
        );
    }
}

/// A multi-packet RDMA WRITE whose target MR is deregistered after its first packet landed:
/// the rest is refused (every packet is checked against the memory key, as a NIC does), so
/// nothing reaches memory no longer registered, and the requester gets `REM_ACCESS_ERR`.
/// Packets are handed from engine to engine one by one, so the deregistration falls between
/// the first and the second.
#[test]
fn a_write_into_an_mr_deregistered_mid_message_is_refused_for_the_rest() {
    let mut p = Pair::rc();
    let (ca, cb, qa) = (p.ca, p.cb, p.qa);
    let pb = p.pb;
    let keys = p
        .b()
        .core
        .reg_mr(cb, pb.pd, WIN, 0x4000, WIN, ALL)
        .expect("mr");
    let before = p.b().mem.space(cb).to_vec();
    let wr = SendWr::new(
        7,
        SendOp::Write {
            remote_addr: WIN,
            rkey: keys.rkey,
        },
        sge(SRC, 4096, p.ka),
    );
    p.a().engine.post_send(qa, wr).expect("post");
    let now = Instant(0);
    let (ga, gb) = (p.net.hosts[0].gid, p.net.hosts[1].gid);
    let mut buf = vec![0u8; softverbs_transport::MAX_PACKET];
    let mut pkts = Vec::new();
    {
        let a = &mut p.net.hosts[0];
        while let Some(tx) = a.engine.poll_transmit(now, &a.core, &mut a.mem, &mut buf) {
            pkts.push(buf[..tx.len].to_vec());
        }
    }
    assert_eq!(pkts.len(), 4, "4 KiB at MTU 1024");
    let to_b = softverbs_transport::RxMeta { sgid: ga, dgid: gb };
    let to_a = softverbs_transport::RxMeta { sgid: gb, dgid: ga };
    for (i, pkt) in pkts.iter().enumerate() {
        let b = &mut p.net.hosts[1];
        b.engine.handle_packet(now, &b.core, &mut b.mem, to_b, pkt);
        if i == 0 {
            b.core.dereg_mr(cb, keys.handle).expect("dereg");
        }
    }
    let mut replies = Vec::new();
    {
        let b = &mut p.net.hosts[1];
        while let Some(tx) = b.engine.poll_transmit(now, &b.core, &mut b.mem, &mut buf) {
            replies.push(buf[..tx.len].to_vec());
        }
    }
    for r in &replies {
        let a = &mut p.net.hosts[0];
        a.engine.handle_packet(now, &a.core, &mut a.mem, to_a, r);
    }
    p.a().pump();
    assert_eq!(p.a_wcs(), vec![(7, WcStatus::RemAccessErr)]);
    let src = p.a().mem.space(ca)[SRC as usize..SRC as usize + 1024].to_vec();
    let after = p.b().mem.space(cb);
    let w = WIN as usize;
    assert_eq!(after[w..w + 1024], src[..], "the first packet landed");
    assert_eq!(after[w + 1024..], before[w + 1024..], "nothing after it");
}
