//! A CM facing senders that are not its peers (issue 35, items 3 and 4): IDs they cannot
//! predict, MADs that must name both IDs exactly, REPs only from the REQ's destination and
//! only once, and a bounded number of unanswered requests however many arrive.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use softverbs_cm::*;
use softverbs_wire::cm::msg::{Dreq, Rej, Rep};
use softverbs_wire::cm::{CmMad, CmMessage, PortSpace, RejReason, ServiceId, SidrStatus};

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
/// The hostile sender's own address.
const M: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 66));
const ALICE: Owner = Owner(1);
const BOB: Owner = Owner(2);

fn sid(port: u16) -> u64 {
    ServiceId {
        ps: PortSpace::Tcp,
        port,
    }
    .to_u64()
}

fn cfg(seed: u8, guid: u64) -> Config {
    Config {
        local_ca_guid: guid,
        id_seed: [seed; 32],
        time_wait: Duration::from_millis(10),
        // The floods here measure the backlog and the caps, one source at one instant: the
        // per-source rate is tested on its own (`a_sources_excess_requests_are_dropped...`).
        req_rate: 0,
        ..Config::default()
    }
}

fn connect_params(peer: IpAddr, port: u16) -> ConnectParams {
    ConnectParams {
        peer,
        service_id: sid(port),
        local_gid: [1; 16],
        remote_gid: [2; 16],
        qp_kind: QpKind::Rc,
        qpn: 0x11,
        starting_psn: 0x100,
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: false,
        path_mtu: 3,
        hop_limit: 64,
        local_ack_timeout: 14,
        response_timeout: 18,
        max_cm_retries: 3,
        private_data: vec![],
    }
}

fn accept_params() -> AcceptParams {
    AcceptParams {
        qpn: 0x22,
        starting_psn: 0x200,
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        srq: false,
        private_data: vec![],
    }
}

/// Every MAD `from` (at `ip`) has queued, handed to `to`.
fn deliver(from: &mut Cm, ip: IpAddr, to: &mut Cm, now: Instant) -> Vec<CmMessage> {
    let mut v = Vec::new();
    while let Some(t) = from.poll_transmit() {
        to.handle_mad(now, ip, &t.mad).unwrap();
        v.push(CmMad::parse(&t.mad).unwrap().msg);
    }
    v
}

fn events(cm: &mut Cm) -> Vec<(Owner, CmId, Event)> {
    std::iter::from_fn(|| cm.poll_event()).collect()
}

fn mad(msg: CmMessage) -> [u8; 256] {
    CmMad { tid: 7, msg }.emit().unwrap()
}

#[test]
fn ids_are_not_sequential_and_differ_between_seeds() {
    let ids = |seed| {
        let mut cm = Cm::new(cfg(seed, 1));
        (0..64u16)
            .map(|i| {
                cm.connect(Instant(0), ALICE, &connect_params(B, 1000 + i))
                    .unwrap()
                    .0
            })
            .collect::<Vec<u32>>()
    };
    let (a, b) = (ids(1), ids(2));
    let close = a
        .windows(2)
        .filter(|w| w[1].wrapping_sub(w[0]) < 4096)
        .count();
    assert!(close < 3, "IDs follow each other: {a:x?}");
    assert!(
        a.iter().all(|id| !b.contains(id)),
        "two CMs seeded apart share IDs"
    );
    // The TransactionIDs are not a count from a guessable start either.
    let mut cm = Cm::new(cfg(3, 1));
    cm.connect(Instant(0), ALICE, &connect_params(B, 1))
        .unwrap();
    let tid = CmMad::parse(&cm.poll_transmit().unwrap().mad).unwrap().tid;
    assert!(tid >> 32 != 0 && tid >> 32 != 1, "tid {tid:#x}");
}

/// A connects to B, B accepts, the RTU establishes: (A's CM, B's CM, A's id, B's id).
fn established() -> (Cm, Cm, CmId, CmId) {
    let (mut a, mut b) = (Cm::new(cfg(1, 0xA)), Cm::new(cfg(2, 0xB)));
    let now = Instant(0);
    b.listen(BOB, sid(7174)).unwrap();
    let ia = a.connect(now, ALICE, &connect_params(B, 7174)).unwrap();
    deliver(&mut a, A, &mut b, now);
    let ib = match events(&mut b).pop() {
        Some((BOB, id, Event::ConnectRequest { .. })) => id,
        e => panic!("{e:?}"),
    };
    b.accept(now, BOB, ib, &accept_params()).unwrap();
    deliver(&mut b, B, &mut a, now);
    events(&mut a);
    a.establish(now, ALICE, ia).unwrap();
    deliver(&mut a, A, &mut b, now);
    events(&mut b);
    assert_eq!(b.state(BOB, ib), Some(State::Established));
    (a, b, ia, ib)
}

#[test]
fn a_dreq_or_rej_naming_no_peer_id_ends_nothing() {
    let (_a, mut b, _ia, ib) = established();
    let now = Instant(1);
    // Even from the peer's own address (what a spoofer on its host sends), a DREQ or a REJ
    // that names our ID but 0 (or a wrong one) as the peer's matches no connection.
    for local in [0, 1, 0xdead_beef] {
        let dreq = Dreq {
            local_comm_id: local,
            remote_comm_id: ib.0,
            remote_qpn: 0x11,
            private_data: [0; 220],
        };
        b.handle_mad(now, A, &mad(CmMessage::Dreq(Box::new(dreq))))
            .unwrap();
        let rej = Rej {
            local_comm_id: local,
            remote_comm_id: ib.0,
            message_rejected: 2,
            info_length: 0,
            reason: RejReason::CONSUMER,
            ari: [0; 72],
            private_data: [0; 148],
        };
        b.handle_mad(now, A, &mad(CmMessage::Rej(Box::new(rej))))
            .unwrap();
    }
    assert!(events(&mut b).is_empty());
    assert_eq!(b.state(BOB, ib), Some(State::Established));
}

#[test]
fn a_timeout_rej_without_our_id_must_carry_the_requesters_guid() {
    let (mut a, mut b) = (Cm::new(cfg(1, 0xA)), Cm::new(cfg(2, 0xB)));
    let now = Instant(0);
    b.listen(BOB, sid(7174)).unwrap();
    let ia = a.connect(now, ALICE, &connect_params(B, 7174)).unwrap();
    deliver(&mut a, A, &mut b, now);
    let ib = events(&mut b)[0].1;
    let forged = |reason, guid: u64| {
        let mut ari = [0; 72];
        ari[..8].copy_from_slice(&guid.to_be_bytes());
        mad(CmMessage::Rej(Box::new(Rej {
            local_comm_id: ia.0,
            remote_comm_id: 0,
            message_rejected: 2,
            info_length: 8,
            reason,
            ari,
            private_data: [0; 148],
        })))
    };
    b.handle_mad(now, A, &forged(RejReason::CONSUMER, 0xA))
        .unwrap();
    b.handle_mad(now, A, &forged(RejReason::TIMEOUT, 0x666))
        .unwrap();
    assert!(events(&mut b).is_empty());
    assert_eq!(b.state(BOB, ib), Some(State::ReqRcvd));
    // The requester's own REJ Timeout (its owner went) still ends the request.
    a.destroy(now, ALICE, ia).unwrap();
    deliver(&mut a, A, &mut b, now);
    assert!(matches!(
        &events(&mut b)[..],
        [(BOB, id, Event::Rejected { reason: RejReason::TIMEOUT, .. })] if *id == ib
    ));
}

#[test]
fn a_rep_is_taken_only_from_the_reqs_destination_and_only_once() {
    let (mut a, mut b) = (Cm::new(cfg(1, 0xA)), Cm::new(cfg(2, 0xB)));
    let now = Instant(0);
    b.listen(BOB, sid(7174)).unwrap();
    let ia = a.connect(now, ALICE, &connect_params(B, 7174)).unwrap();
    deliver(&mut a, A, &mut b, now);
    let ib = events(&mut b)[0].1;
    let rep = |local| Rep {
        local_comm_id: local,
        remote_comm_id: ia.0,
        local_qkey: 0,
        local_qpn: 0x666,
        local_eecn: 0,
        starting_psn: 0x666,
        responder_resources: 1,
        initiator_depth: 1,
        target_ack_delay: 0,
        failover_accepted: 0,
        end_to_end_flow_control: true,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 0x666,
        private_data: [0; 196],
    };
    // From another address: nothing.
    a.handle_mad(now, M, &mad(CmMessage::Rep(Box::new(rep(0x1234)))))
        .unwrap();
    assert!(events(&mut a).is_empty());
    assert_eq!(a.state(ALICE, ia), Some(State::ReqSent));
    // The real one, then a second one naming another peer ID from the right address.
    b.accept(now, BOB, ib, &accept_params()).unwrap();
    deliver(&mut b, B, &mut a, now);
    a.handle_mad(now, B, &mad(CmMessage::Rep(Box::new(rep(0x1234)))))
        .unwrap();
    let evs = events(&mut a);
    assert_eq!(evs.len(), 1, "{evs:?}");
    match &evs[0].2 {
        Event::ConnectReply { rep } => assert_eq!(rep.local_qpn, 0x22),
        e => panic!("{e:?}"),
    }
    assert_eq!(a.remote_qpn(ia), Some(0x22));
}

/// A REQ as `from` would send it, with the Local Communication ID to be replaced.
fn req_template(port: u16) -> CmMad {
    let mut m = Cm::new(cfg(9, 0x99));
    m.connect(Instant(0), Owner(9), &connect_params(B, port))
        .unwrap();
    CmMad::parse(&m.poll_transmit().unwrap().mad).unwrap()
}

fn flood(b: &mut Cm, now: Instant, port: u16, n: u32) -> (usize, usize) {
    let mut t = req_template(port);
    let (mut rej_no_res, mut sent) = (0, 0);
    // Distinct Local Communication IDs for every call: the same (sender, ID) again would
    // be a duplicate of an earlier request, not a new one.
    let base = u32::from(port) << 20;
    for i in 1..=n {
        if let CmMessage::Req(r) = &mut t.msg {
            r.local_comm_id = base + i;
        }
        b.handle_mad(now, M, &t.emit().unwrap()).unwrap();
        while let Some(tx) = b.poll_transmit() {
            sent += 1;
            if let CmMessage::Rej(r) = CmMad::parse(&tx.mad).unwrap().msg {
                rej_no_res += usize::from(r.reason == RejReason::NO_RESOURCES);
            }
        }
    }
    (rej_no_res, sent)
}

#[test]
fn a_req_flood_fills_the_backlog_and_the_rest_is_refused() {
    let mut b = Cm::new(cfg(2, 0xB));
    let now = Instant(0);
    b.listen_backlog(BOB, sid(1), 16).unwrap();
    b.listen(BOB, sid(2)).unwrap();
    let (refused, _) = flood(&mut b, now, 1, 1000);
    assert_eq!(refused, 1000 - 16);
    assert_eq!(events(&mut b).len(), 16);
    assert_eq!(b.counts().connections, 16);
    // The default backlog (rdma_listen backlog 0) is the kernel's 1024.
    let (refused, _) = flood(&mut b, now, 2, 20_000);
    assert_eq!(refused, 20_000 - 1024);
    assert_eq!(b.counts().connections, 16 + 1024);
    // Answering one makes room for one more.
    let (_, id, _) = events(&mut b).pop().unwrap();
    b.reject(now, BOB, id, &[]).unwrap();
    let mut t = req_template(2);
    if let CmMessage::Req(r) = &mut t.msg {
        r.local_comm_id = 0x7777_7777;
    }
    b.handle_mad(now, A, &t.emit().unwrap()).unwrap();
    assert!(matches!(
        events(&mut b)[..],
        [(BOB, _, Event::ConnectRequest { .. })]
    ));
}

#[test]
fn the_cm_wide_cap_bounds_every_listener_together() {
    let mut b = Cm::new(Config {
        max_pending_requests: 100,
        ..cfg(2, 0xB)
    });
    let now = Instant(0);
    for port in 1..=4 {
        b.listen(BOB, sid(port)).unwrap();
    }
    let mut refused = 0;
    for port in 1..=4 {
        refused += flood(&mut b, now, port, 50).0;
    }
    assert_eq!(refused, 200 - 100);
    assert_eq!(b.counts().connections, 100);
}

#[test]
fn a_sidr_flood_is_bounded_too() {
    let mut b = Cm::new(Config {
        max_pending_requests: 64,
        ..cfg(2, 0xB)
    });
    let now = Instant(0);
    b.listen(BOB, sid(5)).unwrap();
    let mut m = Cm::new(cfg(9, 0x99));
    let p = SidrParams {
        peer: B,
        service_id: sid(5),
        pkey: 0xFFFF,
        response_timeout: 18,
        max_retries: 3,
        private_data: vec![],
    };
    let (mut rejected, mut asked) = (0, 0);
    for _ in 0..5000 {
        m.sidr_request(now, Owner(9), &p).unwrap();
        while let Some(t) = m.poll_transmit() {
            b.handle_mad(now, M, &t.mad).unwrap();
        }
        while let Some(t) = b.poll_transmit() {
            if let CmMessage::SidrRep(r) = CmMad::parse(&t.mad).unwrap().msg {
                rejected += usize::from(r.status == SidrStatus::REJECT);
            }
        }
        asked += 1;
    }
    assert_eq!(asked - rejected, 64);
    assert_eq!(b.counts().connections, 64);
    // Unanswered, they end by themselves (Config::sidr_req_wait) and make room.
    b.handle_timeout(now.after(Config::default().sidr_req_wait));
    assert_eq!(b.counts().connections, 0);
}

#[test]
fn an_unanswered_req_ends_when_its_sender_has_given_up() {
    let (mut a, mut b) = (Cm::new(cfg(1, 0xA)), Cm::new(cfg(2, 0xB)));
    let now = Instant(0);
    b.listen(BOB, sid(7174)).unwrap();
    // Response timeout 18 (~1.07 s), 3 retries: the requester waits 4 tries, each at most
    // its timeout plus our MRA service timeout (20, ~4.3 s) plus the round trip.
    let ia = a.connect(now, ALICE, &connect_params(B, 7174)).unwrap();
    deliver(&mut a, A, &mut b, now);
    let ib = events(&mut b)[0].1;
    let per_try = cm_timeout(18) + cm_timeout(20) + 2 * Config::default().packet_lifetime;
    b.handle_timeout(now.after(per_try * 4 - Duration::from_millis(1)));
    assert_eq!(b.state(BOB, ib), Some(State::ReqRcvd));
    let end = now.after(per_try * 4);
    b.handle_timeout(end);
    assert_eq!(b.state(BOB, ib), Some(State::TimeWait));
    assert!(matches!(
        &events(&mut b)[..],
        [(
            BOB,
            _,
            Event::Rejected {
                reason: RejReason::TIMEOUT,
                ..
            }
        )]
    ));
    // The requester hears it (REJ Timeout) if it is still there.
    let sent = deliver(&mut b, B, &mut a, end);
    assert!(matches!(&sent[..], [CmMessage::Rej(r)] if r.reason == RejReason::TIMEOUT));
    assert!(matches!(
        &events(&mut a)[..],
        [(ALICE, id, Event::Rejected { .. })] if *id == ia
    ));
    assert_eq!(b.counts().connections, 0);
}

/// Issue 35, item 4: one source's requests past its rate (`Config::req_rate`, after a burst
/// of `req_burst`) are dropped unanswered and counted, while another source's REQ at the
/// same instant is still answered, and the first source is answered again once its bucket
/// has refilled.
#[test]
fn a_sources_excess_requests_are_dropped_and_counted_while_another_source_is_answered() {
    let mut b = Cm::new(Config {
        req_rate: 100,
        req_burst: 8,
        ..cfg(2, 0xB)
    });
    let now = Instant(1_000_000_000);
    b.listen(BOB, sid(1)).unwrap();
    // The flooder's 1000 REQs at one instant: the burst and one get through.
    let (refused, _) = flood(&mut b, now, 1, 1000);
    assert_eq!(
        refused, 0,
        "nothing over the backlog: the rest never got that far"
    );
    assert_eq!(events(&mut b).len(), 9);
    assert_eq!(b.counts().connections, 9);
    assert_eq!(b.counts().rate_dropped, 1000 - 9);
    // SIDR_REQs from it count against the same bucket.
    b.listen(BOB, sid(2)).unwrap();
    let sidr = {
        let mut m = Cm::new(cfg(9, 0x99));
        m.sidr_request(
            now,
            Owner(9),
            &SidrParams {
                peer: B,
                service_id: sid(2),
                pkey: 0xFFFF,
                response_timeout: 18,
                max_retries: 3,
                private_data: vec![],
            },
        )
        .unwrap();
        m.poll_transmit().unwrap().mad
    };
    b.handle_mad(now, M, &sidr).unwrap();
    assert!(b.poll_transmit().is_none() && events(&mut b).is_empty());
    assert_eq!(b.counts().rate_dropped, 1000 - 9 + 1);
    // Another source, same instant: answered.
    let mut t = req_template(1);
    if let CmMessage::Req(r) = &mut t.msg {
        r.local_comm_id = 0x7777_7777;
    }
    b.handle_mad(now, A, &t.emit().unwrap()).unwrap();
    assert!(matches!(
        events(&mut b)[..],
        [(BOB, _, Event::ConnectRequest { .. })]
    ));
    // 10 ms later (one request's worth at 100 a second), the flooder gets one more through.
    let later = now.after(Duration::from_millis(10));
    if let CmMessage::Req(r) = &mut t.msg {
        r.local_comm_id = 0x7777_7778;
    }
    b.handle_mad(later, M, &t.emit().unwrap()).unwrap();
    assert_eq!(events(&mut b).len(), 1);
    b.handle_mad(later, M, &sidr).unwrap();
    assert_eq!(b.counts().rate_dropped, 1000 - 9 + 2);
}
