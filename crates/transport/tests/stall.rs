//! A local stall (the shell's process stopped or starved of a CPU) does not spend the peer's
//! retries: `Engine::stalled` moves the requester's timers later by the time the shell could
//! not run, without counting a retry (issue 35, item 7; docs/design/net-path.md, "Stalls").
//! Nor does a starved peer fail the requester before the retry floor
//! (`time::RETRY_FLOOR`), while a dead one still fails within a bounded time.
//! Deterministic: time is passed in, packets are moved by hand.

use std::time::Duration;

use softverbs_core::types::{Access, Mtu, QpType};
use softverbs_transport::sim::{ConnParams, Host};
use softverbs_transport::time::{ack_timeout, RETRY_FLOOR};
use softverbs_transport::wr::{Payload, RecvWr, SendOp, SendWr, Sge, WcStatus};
use softverbs_transport::{CqId, Instant, RxMeta, MAX_PACKET};

struct Pair {
    a: Host,
    b: Host,
    qa: u32,
    qb: u32,
    cqa: CqId,
    keys: (u32, u32),
}

/// Two connected RC QPs with one retry-free ACK timeout (4.096 µs · 2^10 ≈ 4 ms,
/// `retry_cnt` 0: the first timeout that counts fails the request).
fn pair() -> Pair {
    let mut a = Host::new("10.0.0.1".parse().unwrap(), Mtu::M1024);
    let mut b = Host::new("10.0.0.2".parse().unwrap(), Mtu::M1024);
    let ca = a.context(1, 1 << 16);
    let cb = b.context(2, 1 << 16);
    let (pa, pb) = (a.pd(ca), b.pd(cb));
    let keys = (
        a.mr(pa, 0, 1 << 16, Access::LOCAL_WRITE),
        b.mr(pb, 0, 1 << 16, Access::LOCAL_WRITE),
    );
    let (cqa, cqb) = (a.cq(ca), b.cq(cb));
    let qa = a.qp(QpType::Rc, pa, cqa, None);
    let qb = b.qp(QpType::Rc, pb, cqb, None);
    let p = ConnParams {
        timeout: 10,
        retry_cnt: 0,
        rnr_retry: 7,
        ..ConnParams::default()
    };
    let (ga, gb) = (a.gid, b.gid);
    a.connect(qa, gb, qb, p);
    b.connect(qb, ga, qa, p);
    Pair {
        a,
        b,
        qa,
        qb,
        cqa,
        keys,
    }
}

/// The packets `h` has ready at `now`.
fn transmit(h: &mut Host, now: Instant) -> Vec<Vec<u8>> {
    let mut buf = vec![0u8; MAX_PACKET];
    let mut out = Vec::new();
    while let Some(tx) = h.engine.poll_transmit(now, &h.core, &mut h.mem, &mut buf) {
        out.push(buf[..tx.len].to_vec());
    }
    out
}

/// Delivers `pkts` from `from` to `to` at `now`.
fn deliver(to: &mut Host, from: &Host, now: Instant, pkts: &[Vec<u8>]) {
    let meta = RxMeta {
        sgid: from.gid,
        dgid: to.gid,
    };
    for p in pkts {
        to.engine.handle_packet(now, &to.core, &mut to.mem, meta, p);
    }
}

fn send(p: &mut Pair) {
    let sge = Payload::Sges(vec![Sge {
        addr: 0,
        length: 32,
        lkey: p.keys.0,
    }]);
    p.a.engine
        .post_send(p.qa, SendWr::new(7, SendOp::Send, sge))
        .unwrap();
}

fn recv(p: &mut Pair) {
    p.b.engine
        .post_recv(
            p.qb,
            RecvWr {
                wr_id: 1,
                sges: vec![Sge {
                    addr: 0,
                    length: 64,
                    lkey: p.keys.1,
                }],
            },
        )
        .unwrap();
}

const T0: Instant = Instant(1_000_000_000);
const STOP: Duration = Duration::from_secs(3);

/// A SEND from A to B, posted and sent at `T0`, B's receive posted: the request packet.
fn start(p: &mut Pair) -> Vec<Vec<u8>> {
    send(p);
    recv(p);
    let req = transmit(&mut p.a, T0);
    assert_eq!(req.len(), 1, "the request left");
    req
}

/// Moves B's answers to `req` (delivered at `at`) to A at `now`.
fn answer(p: &mut Pair, req: &[Vec<u8>], at: Instant, now: Instant) {
    deliver(&mut p.b, &p.a, at, req);
    let ans = transmit(&mut p.b, at);
    assert!(!ans.is_empty(), "the peer answered");
    let meta = RxMeta {
        sgid: p.b.gid,
        dgid: p.a.gid,
    };
    for x in &ans {
        p.a.engine
            .handle_packet(now, &p.a.core, &mut p.a.mem, meta, x);
    }
}

/// The requester's process is stopped for 3 s right after its request left, and the answer
/// waits in its socket meanwhile. Without the stall reported, the first look at the timers
/// after it resumes finds the ACK timeout long past and, with no retry left, fails the
/// request (`RETRY_EXC_ERR`) before the answer is taken; reported, the timer is moved by
/// the 3 s, nothing is retransmitted, and the answer completes the request.
#[test]
fn a_stall_reported_by_the_shell_spends_no_retry() {
    // Control: not reported, the stall spends the (only) retry.
    let mut p = pair();
    start(&mut p);
    let resumed = T0.after(STOP);
    p.a.engine.handle_timeout(resumed);
    p.a.pump();
    let wcs = p.a.take_completions(p.cqa);
    assert_eq!(
        wcs.iter().map(|w| w.status).collect::<Vec<_>>(),
        [WcStatus::RetryExcErr],
        "without the report the stall counts as the peer's silence"
    );

    // Reported: the timer moves by the stall, and the answer completes the request.
    let mut p = pair();
    let req = start(&mut p);
    let due = p.a.engine.poll_timeout().expect("a timer runs");
    p.a.engine.stalled(STOP);
    assert_eq!(
        p.a.engine.poll_timeout(),
        Some(due.after(STOP)),
        "the ACK timeout moved by the stall"
    );
    p.a.engine.handle_timeout(resumed);
    p.a.pump();
    assert!(
        p.a.completions.is_empty(),
        "no retry was counted: {:?}",
        p.a.completions
    );
    assert!(
        transmit(&mut p.a, resumed).is_empty(),
        "nothing is retransmitted for the stall"
    );
    // The peer answered during the stall; the shell takes the answer now.
    answer(&mut p, &req, T0, resumed);
    p.a.pump();
    let wcs = p.a.take_completions(p.cqa);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(7, WcStatus::Success)]
    );
    assert_eq!(p.a.engine.poll_timeout(), None, "no timer left");
}

/// An RNR wait is moved by a stall too, and the ACK timer it restarts from there.
#[test]
fn a_stall_moves_the_rnr_wait() {
    let mut p = pair();
    send(&mut p);
    // No receive at the peer: it answers with an RNR NAK.
    let req = transmit(&mut p.a, T0);
    answer(&mut p, &req, T0, T0);
    let wait = p.a.engine.poll_timeout().expect("the RNR wait runs");
    assert!(wait > T0);
    p.a.engine.stalled(STOP);
    assert_eq!(p.a.engine.poll_timeout(), Some(wait.after(STOP)));
    // Before the moved wait ends nothing leaves; at its end the request goes again.
    let half = wait.after(STOP / 2);
    p.a.engine.handle_timeout(half);
    assert!(transmit(&mut p.a, half).is_empty());
    let end = wait.after(STOP);
    p.a.engine.handle_timeout(end);
    assert_eq!(transmit(&mut p.a, end).len(), 1, "retried");
    p.a.pump();
    assert!(p.a.completions.is_empty(), "{:?}", p.a.completions);
}

/// The daemon answers for a responder that does not run with an RNR NAK at the expected PSN
/// and MSN that responder published (`Engine::rnr_nak_for`, built from the daemon's copy
/// of the QP): the request before it completes (the NAK acknowledges it), the one at it
/// waits the RNR timer without spending a retry (`retry_cnt` 0 here) and goes again; the
/// real responder, running again, takes it.
#[test]
fn an_rnr_nak_on_the_responders_behalf_acknowledges_and_holds_the_requester() {
    let mut p = pair();
    // The daemon's copy of B's QP: same attributes, no state of its own.
    let daemon = pair();
    // Two SENDs; B receives the first and stops.
    send(&mut p);
    p.a.engine
        .post_send(
            p.qa,
            SendWr::new(
                8,
                SendOp::Send,
                Payload::Sges(vec![Sge {
                    addr: 0,
                    length: 32,
                    lkey: p.keys.0,
                }]),
            ),
        )
        .unwrap();
    recv(&mut p);
    recv(&mut p);
    let reqs = transmit(&mut p.a, T0);
    assert_eq!(reqs.len(), 2);
    let meta = RxMeta {
        sgid: p.a.gid,
        dgid: p.b.gid,
    };
    p.b.engine
        .handle_packet(T0, &p.b.core, &mut p.b.mem, meta, &reqs[0]);
    let (epsn, msn) = p.b.engine.responder_psn(p.qb).unwrap();
    assert_eq!((epsn, msn), (1, 1), "B took the first");
    // B stops before it ACKs; the daemon answers the second request for it.
    let mut buf = vec![0u8; MAX_PACKET];
    let tx = daemon
        .b
        .engine
        .rnr_nak_for(daemon.qb, epsn, msn, &mut buf)
        .expect("an RNR NAK");
    assert_eq!(tx.dgid, p.a.gid);
    let back = RxMeta {
        sgid: p.b.gid,
        dgid: p.a.gid,
    };
    p.a.engine
        .handle_packet(T0, &p.a.core, &mut p.a.mem, back, &buf[..tx.len]);
    p.a.pump();
    assert_eq!(
        p.a.take_completions(p.cqa)
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect::<Vec<_>>(),
        [(7, WcStatus::Success)],
        "the NAK acknowledged the first"
    );
    // Long past the ACK timeout: the RNR wait holds the requester, and no retry is spent.
    let wait = p.a.engine.poll_timeout().expect("the RNR wait");
    p.a.engine.handle_timeout(wait);
    let again = transmit(&mut p.a, wait);
    assert_eq!(again.len(), 1, "the second goes again after the wait");
    p.a.pump();
    assert!(p.a.completions.is_empty(), "{:?}", p.a.completions);
    // B runs again and takes it.
    p.b.engine
        .handle_packet(wait, &p.b.core, &mut p.b.mem, meta, &again[0]);
    let acks = transmit(&mut p.b, wait);
    for x in &acks {
        p.a.engine
            .handle_packet(wait, &p.a.core, &mut p.a.mem, back, x);
    }
    p.a.pump();
    assert_eq!(
        p.a.take_completions(p.cqa)
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect::<Vec<_>>(),
        [(8, WcStatus::Success)]
    );
    // Not for a QP the daemon does not have, nor before RTR.
    assert!(daemon
        .b
        .engine
        .rnr_nak_for(0xFFFF, 0, 0, &mut buf)
        .is_none());
}

/// A duplicate of a request the stopped responder received but had not acknowledged gets
/// the daemon's ACK of everything before the published expected PSN (`Engine::ack_for`):
/// an RNR NAK at that PSN would lie past what the requester sent and be dropped there.
#[test]
fn a_duplicate_to_a_stopped_responder_is_acknowledged_on_its_behalf() {
    let mut p = pair();
    let daemon = pair();
    let req = start(&mut p);
    let meta = RxMeta {
        sgid: p.a.gid,
        dgid: p.b.gid,
    };
    // B receives the only request and stops before its ACK leaves.
    p.b.engine
        .handle_packet(T0, &p.b.core, &mut p.b.mem, meta, &req[0]);
    let (epsn, msn) = p.b.engine.responder_psn(p.qb).unwrap();
    assert_eq!((epsn, msn), (1, 1));
    let back = RxMeta {
        sgid: p.b.gid,
        dgid: p.a.gid,
    };
    let mut buf = vec![0u8; MAX_PACKET];
    // An RNR NAK at the expected PSN is outside A's window: nothing happens.
    let nak = daemon
        .b
        .engine
        .rnr_nak_for(daemon.qb, epsn, msn, &mut buf)
        .unwrap();
    p.a.engine
        .handle_packet(T0, &p.a.core, &mut p.a.mem, back, &buf[..nak.len]);
    p.a.pump();
    assert!(p.a.completions.is_empty(), "{:?}", p.a.completions);
    assert_eq!(p.a.engine.drop_stats().outside_window, 1);
    // The ACK for the duplicate completes the request.
    let ack = daemon
        .b
        .engine
        .ack_for(daemon.qb, epsn, msn, &mut buf)
        .unwrap();
    p.a.engine
        .handle_packet(T0, &p.a.core, &mut p.a.mem, back, &buf[..ack.len]);
    p.a.pump();
    assert_eq!(
        p.a.take_completions(p.cqa)
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect::<Vec<_>>(),
        [(7, WcStatus::Success)]
    );
}

/// Runs A's timers while nothing reaches B (B's host does not run, or the wire loses all),
/// until `until` or until A completes something: the packets A sent, and the time of the
/// last timer that ran.
fn silence(p: &mut Pair, until: Instant) -> (Vec<Vec<u8>>, Instant) {
    let mut sent = Vec::new();
    let mut now = T0;
    while p.a.completions.is_empty() {
        let Some(t) = p.a.engine.poll_timeout() else {
            break;
        };
        if t > until {
            break;
        }
        now = t;
        p.a.engine.handle_timeout(now);
        sent.extend(transmit(&mut p.a, now));
        p.a.pump();
    }
    (sent, now)
}

/// Issue 35, item 7: the responder's host gives it no CPU for 900 ms (its request and every
/// retransmission wait unread) and then answers. With IBA's plain count the requester
/// (`retry_cnt` 0) fails at its first timeout, 4 ms in; with the retry floor it keeps
/// resending, at a doubling interval, and the late answer completes the request.
#[test]
fn a_responder_starved_for_less_than_the_floor_fails_nothing() {
    // Control: no floor, the first timeout fails the request.
    let mut p = pair();
    p.a.engine.set_retry_floor(Duration::ZERO);
    start(&mut p);
    let (_, at) = silence(&mut p, T0.after(Duration::from_millis(900)));
    assert_eq!(
        p.a.take_completions(p.cqa)
            .iter()
            .map(|w| w.status)
            .collect::<Vec<_>>(),
        [WcStatus::RetryExcErr]
    );
    assert_eq!(
        at,
        T0.after(ack_timeout(10).unwrap()),
        "at the first timeout"
    );

    // The floor (the default, 1 s): nothing fails in 900 ms of silence.
    let mut p = pair();
    assert_eq!(p.a.engine.retry_floor(), RETRY_FLOOR);
    let req = start(&mut p);
    let starved = T0.after(Duration::from_millis(900));
    let (resent, at) = silence(&mut p, starved);
    assert!(p.a.completions.is_empty(), "{:?}", p.a.completions);
    // Resent at 4, 8, 16, ... ms after each: a handful of packets, not one per 4 ms.
    assert!(
        (5..=10).contains(&resent.len()),
        "{} retransmissions",
        resent.len()
    );
    // B runs again: it takes the request that waited first, and its ACK completes it.
    answer(&mut p, &req, starved, starved);
    p.a.pump();
    assert_eq!(
        p.a.take_completions(p.cqa)
            .iter()
            .map(|w| (w.wr_id, w.status))
            .collect::<Vec<_>>(),
        [(7, WcStatus::Success)],
        "after the last timer at {at:?}"
    );
    assert_eq!(p.a.engine.poll_timeout(), None, "no timer left");
}

/// A dead peer still fails: at the first timer at or past the floor, which comes at most
/// one ACK timeout after it — for the default floor and for one a shell configured.
#[test]
fn a_dead_peer_fails_within_the_floor_and_one_timeout() {
    let t = ack_timeout(10).unwrap();
    for floor in [RETRY_FLOOR, Duration::from_millis(200)] {
        let mut p = pair();
        p.a.engine.set_retry_floor(floor);
        start(&mut p);
        let (resent, at) = silence(&mut p, T0.after(Duration::from_secs(60)));
        assert_eq!(
            p.a.take_completions(p.cqa)
                .iter()
                .map(|w| w.status)
                .collect::<Vec<_>>(),
            [WcStatus::RetryExcErr],
            "{floor:?}"
        );
        let took = at.since(T0);
        assert!(
            took >= floor && took <= floor + t,
            "{floor:?}: failed after {took:?}"
        );
        assert!(resent.len() <= 12, "{floor:?}: {} resent", resent.len());
        assert_eq!(p.a.engine.poll_timeout(), None, "{floor:?}");
    }
}

/// Progress restarts the floor: a responder that answers each request, however late within
/// the floor, never fails the requester, though each wait spends the whole retry budget.
#[test]
fn each_late_answer_restarts_the_floor() {
    let mut p = pair();
    let mut now = T0;
    for i in 0..3u64 {
        send(&mut p);
        recv(&mut p);
        let req = transmit(&mut p.a, now);
        assert_eq!(req.len(), 1);
        // 900 ms of silence (more than the floor in all, counted from the first request).
        let until = now.after(Duration::from_millis(900));
        loop {
            let t = p.a.engine.poll_timeout().expect("a timer");
            if t > until {
                break;
            }
            p.a.engine.handle_timeout(t);
            transmit(&mut p.a, t);
            p.a.pump();
        }
        now = until;
        answer(&mut p, &req, now, now);
        p.a.pump();
        assert_eq!(
            p.a.take_completions(p.cqa)
                .iter()
                .map(|w| w.status)
                .collect::<Vec<_>>(),
            [WcStatus::Success],
            "request {i}"
        );
    }
}
