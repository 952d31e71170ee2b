//! Two CMs on a simulated network that loses, duplicates and reorders MADs (seeded, so
//! every run is the same), with scripted consumers. Whatever the network does, each side
//! ends with exactly one connection or one clean failure, and once the ids are destroyed
//! and time-wait has passed nothing is left.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use softverbs_cm::*;
use softverbs_transport::faults::Rng;
use softverbs_wire::cm::msg::SidrRep;
use softverbs_wire::cm::{CmMad, CmMessage, PortSpace, RejReason, ServiceId, SidrStatus};

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
const ALICE: Owner = Owner(1);
const BOB: Owner = Owner(2);
const DELAY: Duration = Duration::from_micros(50);

fn sid(port: u16) -> u64 {
    ServiceId {
        ps: PortSpace::Tcp,
        port,
    }
    .to_u64()
}

#[derive(Clone, Copy, Default)]
struct Faults {
    loss: f64,
    dup: f64,
    reorder: f64,
}

/// What the passive consumer does with a connect request.
#[derive(Clone, Copy, PartialEq)]
enum Answer {
    Accept,
    AcceptAfter(Duration),
    Reject,
    Ignore,
}

struct Sim {
    now: Instant,
    cms: [Cm; 2],
    net: Vec<(Instant, usize, Vec<u8>)>,
    rng: Rng,
    faults: Faults,
    /// MADs each side put on the wire, by attribute.
    sent: [Vec<u16>; 2],
    /// Events each side's owners saw.
    events: [Vec<(CmId, Event)>; 2],
    answer: Answer,
    /// Accepts due later (passive side).
    later: Vec<(Instant, CmId)>,
    /// MADs of this attribute from this side vanish.
    drop_from: Option<(usize, u16)>,
}

fn seed(n: u32) -> [u8; 32] {
    let mut s = [0; 32];
    s[..4].copy_from_slice(&n.to_le_bytes());
    s
}

fn cfg(first_id: u32) -> Config {
    Config {
        local_ca_guid: u64::from(first_id),
        packet_lifetime: Duration::from_micros(100),
        time_wait: Duration::from_millis(50),
        mra_service_timeout: 14, // ~67 ms
        id_seed: seed(first_id),
        listen_grace: Duration::ZERO,
        ..Config::default()
    }
}

impl Sim {
    fn new(seed: u64, faults: Faults) -> Self {
        Self {
            now: Instant(0),
            cms: [Cm::new(cfg(0x100)), Cm::new(cfg(0x9000))],
            net: Vec::new(),
            rng: Rng::new(seed),
            faults,
            sent: [Vec::new(), Vec::new()],
            events: [Vec::new(), Vec::new()],
            answer: Answer::Accept,
            later: Vec::new(),
            drop_from: None,
        }
    }

    fn connect_params(&self, response_timeout: u8, retries: u8) -> ConnectParams {
        ConnectParams {
            peer: B,
            service_id: sid(7174),
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
            response_timeout,
            max_cm_retries: retries,
            private_data: b"from alice".to_vec(),
        }
    }

    /// Moves MADs onto the network and reacts to events, until both CMs are quiet.
    fn pump(&mut self) {
        loop {
            let mut busy = false;
            for side in 0..2 {
                while let Some(t) = self.cms[side].poll_transmit() {
                    busy = true;
                    let attr = u16::from_be_bytes([t.mad[16], t.mad[17]]);
                    self.sent[side].push(attr);
                    if self.drop_from == Some((side, attr)) {
                        continue;
                    }
                    let to = if t.peer == B { 1 } else { 0 };
                    assert_eq!(to, 1 - side, "MADs go to the peer");
                    if self.rng.chance(self.faults.loss) {
                        continue;
                    }
                    let copies = if self.rng.chance(self.faults.dup) {
                        2
                    } else {
                        1
                    };
                    for _ in 0..copies {
                        let extra = if self.rng.chance(self.faults.reorder) {
                            DELAY * (2 + self.rng.below(5) as u32)
                        } else {
                            Duration::ZERO
                        };
                        self.net
                            .push((self.now.after(DELAY + extra), to, t.mad.to_vec()));
                    }
                }
                while let Some((owner, id, ev)) = self.cms[side].poll_event() {
                    busy = true;
                    assert_eq!(owner, if side == 0 { ALICE } else { BOB });
                    self.react(side, id, &ev);
                    self.events[side].push((id, ev));
                }
            }
            if !busy {
                return;
            }
        }
    }

    fn react(&mut self, side: usize, id: CmId, ev: &Event) {
        let now = self.now;
        match (side, ev) {
            (0, Event::ConnectReply { .. }) => stale_ok(self.cms[0].establish(now, ALICE, id)),
            (1, Event::ConnectRequest { req, .. }) => {
                assert_eq!(&req.private_data[..10], b"from alice");
                match self.answer {
                    Answer::Accept => self.accept(id),
                    Answer::AcceptAfter(d) => self.later.push((now.after(d), id)),
                    Answer::Reject => stale_ok(self.cms[1].reject(now, BOB, id, b"no thanks")),
                    Answer::Ignore => {}
                }
            }
            (1, Event::SidrRequest { .. }) => self.cms[1]
                .sidr_reply(
                    now,
                    BOB,
                    id,
                    &SidrReplyParams {
                        status: SidrStatus::SUCCESS,
                        qpn: 0x77,
                        qkey: 0x1111,
                        private_data: vec![],
                    },
                )
                .unwrap(),
            _ => {}
        }
    }

    fn accept(&mut self, id: CmId) {
        let p = AcceptParams {
            qpn: 0x22,
            starting_psn: 0x200,
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
            srq: false,
            private_data: b"from bob".to_vec(),
        };
        stale_ok(self.cms[1].accept(self.now, BOB, id, &p));
    }

    /// Runs until nothing is in flight and no timer is due before `until`.
    fn run_until(&mut self, until: Instant) {
        loop {
            self.pump();
            let next = [
                self.net.iter().map(|n| n.0).min(),
                self.cms[0].poll_timeout(),
                self.cms[1].poll_timeout(),
                self.later.iter().map(|l| l.0).min(),
            ]
            .into_iter()
            .flatten()
            .min();
            let Some(next) = next.filter(|&t| t <= until) else {
                self.now = until;
                return;
            };
            self.now = self.now.max(next);
            let now = self.now;
            let (due, rest): (Vec<_>, Vec<_>) = self.net.drain(..).partition(|n| n.0 <= now);
            self.net = rest;
            for (_, to, mad) in due {
                let from = if to == 1 { A } else { B };
                self.cms[to].handle_mad(now, from, &mad).unwrap();
            }
            let (due, rest): (Vec<_>, Vec<_>) = self.later.drain(..).partition(|l| l.0 <= now);
            self.later = rest;
            for (_, id) in due {
                self.accept(id);
            }
            for cm in &mut self.cms {
                cm.handle_timeout(now);
            }
        }
    }

    fn run_for(&mut self, d: Duration) {
        let until = self.now.after(d);
        self.run_until(until);
    }

    fn count(&self, side: usize, f: impl Fn(&Event) -> bool) -> usize {
        self.events[side].iter().filter(|(_, e)| f(e)).count()
    }

    fn ids(&self, side: usize) -> Vec<CmId> {
        let mut v: Vec<CmId> = self.events[side].iter().map(|(id, _)| *id).collect();
        v.sort();
        v.dedup();
        v
    }

    fn destroy_all_and_drain(&mut self) {
        let now = self.now;
        for id in self.ids(1) {
            let _ = self.cms[1].destroy(now, BOB, id);
        }
        for id in self.ids(0) {
            let _ = self.cms[0].destroy(now, ALICE, id);
        }
        self.cms[0].destroy_owner(now, ALICE);
        self.cms[1].destroy_owner(now, BOB);
        self.run_for(Duration::from_secs(120));
        for cm in &self.cms {
            assert_eq!(cm.counts(), Counts::default(), "nothing left: {cm:?}");
        }
    }
}

/// A consumer's answer to an event whose connection the peer ended meanwhile (a REJ that
/// arrived with or after the REQ or REP) is refused as being in time-wait; anything else
/// must succeed.
fn stale_ok(r: Result<(), CmError>) {
    match r {
        Err(CmError::State(State::TimeWait)) => {}
        r => r.unwrap(),
    }
}

fn is_est(e: &Event) -> bool {
    matches!(e, Event::Established)
}

#[test]
fn connect_and_disconnect_on_a_clean_network() {
    let mut s = Sim::new(1, Faults::default());
    s.cms[1].listen(BOB, sid(7174)).unwrap();
    let id = s.cms[0]
        .connect(s.now, ALICE, &s.connect_params(10, 3))
        .unwrap();
    s.run_for(Duration::from_millis(10));
    assert_eq!(s.count(0, is_est), 1);
    assert_eq!(s.count(1, is_est), 1);
    assert_eq!(s.cms[0].state(ALICE, id), Some(State::Established));
    assert_eq!(s.cms[0].remote_qpn(id), Some(0x22));
    let rep = s.events[0].iter().find_map(|(_, e)| match e {
        Event::ConnectReply { rep } => Some(rep.clone()),
        _ => None,
    });
    assert_eq!(&rep.unwrap().private_data[..8], b"from bob");
    assert_eq!(s.sent[0], vec![0x10, 0x14], "REQ, RTU");
    assert_eq!(s.sent[1], vec![0x13], "REP");

    s.cms[0].disconnect(s.now, ALICE, id, b"bye").unwrap();
    s.run_for(Duration::from_millis(10));
    assert_eq!(s.count(0, |e| matches!(e, Event::Disconnected)), 1);
    assert_eq!(s.count(1, |e| matches!(e, Event::Disconnected)), 1);
    assert_eq!(s.sent[0].last(), Some(&0x15));
    assert_eq!(s.sent[1].last(), Some(&0x16));
    s.destroy_all_and_drain();
}

#[test]
fn lossy_duplicating_reordering_network_ends_in_one_connection() {
    let mut retransmitted = 0;
    for seed in 0..300 {
        let mut s = Sim::new(
            seed,
            Faults {
                loss: 0.25,
                dup: 0.2,
                reorder: 0.2,
            },
        );
        s.cms[1].listen(BOB, sid(7174)).unwrap();
        let id = s.cms[0]
            .connect(s.now, ALICE, &s.connect_params(8, 15))
            .unwrap();
        s.run_for(Duration::from_secs(30));
        let ctx = format!("seed {seed}: A {:?} B {:?}", s.events[0], s.events[1]);
        assert_eq!(s.count(0, is_est), 1, "{ctx}");
        assert_eq!(s.count(1, is_est), 1, "{ctx}");
        assert_eq!(
            s.count(1, |e| matches!(e, Event::ConnectRequest { .. })),
            1,
            "one REQ, however duplicated: {ctx}"
        );
        assert_eq!(s.cms[1].counts().connections, 1, "{ctx}");

        s.cms[0].disconnect(s.now, ALICE, id, &[]).unwrap();
        s.run_for(Duration::from_secs(30));
        assert_eq!(s.count(0, |e| matches!(e, Event::Disconnected)), 1, "{ctx}");
        assert_eq!(s.count(1, |e| matches!(e, Event::Disconnected)), 1, "{ctx}");
        retransmitted += s.sent[0].len() + s.sent[1].len() - 5;
        s.destroy_all_and_drain();
    }
    assert!(
        retransmitted > 300,
        "the faults made the CMs retransmit: {retransmitted}"
    );
}

#[test]
fn every_mad_duplicated_still_one_connection() {
    let mut s = Sim::new(
        7,
        Faults {
            dup: 1.0,
            ..Faults::default()
        },
    );
    s.cms[1].listen(BOB, sid(7174)).unwrap();
    s.cms[0]
        .connect(s.now, ALICE, &s.connect_params(8, 3))
        .unwrap();
    s.run_for(Duration::from_secs(5));
    assert_eq!(s.count(0, is_est), 1);
    assert_eq!(s.count(1, is_est), 1);
    assert_eq!(s.count(1, |e| matches!(e, Event::ConnectRequest { .. })), 1);
    s.destroy_all_and_drain();
}

#[test]
fn unreachable_peer_fails_after_the_retries() {
    let mut s = Sim::new(
        3,
        Faults {
            loss: 1.0,
            ..Faults::default()
        },
    );
    let t0 = s.now;
    s.cms[0]
        .connect(s.now, ALICE, &s.connect_params(10, 4))
        .unwrap();
    s.run_for(Duration::from_secs(60));
    assert_eq!(s.count(0, |e| matches!(e, Event::Unreachable)), 1);
    assert_eq!(s.events[0].len(), 1);
    // One REQ and four retransmissions, then a REJ (Timeout) for a peer that might listen.
    assert_eq!(s.sent[0], vec![0x10, 0x10, 0x10, 0x10, 0x10, 0x12]);
    let per_try = cm_timeout(10) + Duration::from_micros(200);
    let first = s.events[0].first().unwrap();
    assert!(matches!(first.1, Event::Unreachable));
    assert!(s.now.since(t0) >= per_try * 5);
    s.destroy_all_and_drain();
}

#[test]
fn nobody_listening_gets_a_rej_invalid_service_id() {
    let mut s = Sim::new(4, Faults::default());
    s.cms[1].listen(BOB, sid(1)).unwrap();
    s.cms[0]
        .connect(s.now, ALICE, &s.connect_params(10, 3))
        .unwrap();
    s.run_for(Duration::from_millis(10));
    assert_eq!(
        s.events[0].iter().map(|e| &e.1).collect::<Vec<_>>(),
        vec![&Event::Rejected {
            reason: RejReason::INVALID_SERVICE_ID,
            private_data: vec![0; 148]
        }]
    );
    assert!(s.events[1].is_empty());
    assert_eq!(
        s.cms[1].counts().connections,
        0,
        "a REJ for nobody leaves no state"
    );
    s.destroy_all_and_drain();
}

#[test]
fn consumer_reject_carries_private_data() {
    let mut s = Sim::new(5, Faults::default());
    s.answer = Answer::Reject;
    s.cms[1].listen(BOB, sid(7174)).unwrap();
    s.cms[0]
        .connect(s.now, ALICE, &s.connect_params(10, 3))
        .unwrap();
    s.run_for(Duration::from_millis(10));
    match &s.events[0][..] {
        [(
            _,
            Event::Rejected {
                reason,
                private_data,
            },
        )] => {
            assert_eq!(*reason, RejReason::CONSUMER);
            assert_eq!(&private_data[..9], b"no thanks");
        }
        other => panic!("{other:?}"),
    }
    s.destroy_all_and_drain();
}

#[test]
fn slow_accept_is_covered_by_an_mra() {
    let mut s = Sim::new(6, Faults::default());
    // The active side retransmits its REQ after ~4 ms; Bob takes 40 ms to accept.
    s.answer = Answer::AcceptAfter(Duration::from_millis(40));
    s.cms[1].listen(BOB, sid(7174)).unwrap();
    s.cms[0]
        .connect(s.now, ALICE, &s.connect_params(10, 2))
        .unwrap();
    s.run_for(Duration::from_secs(1));
    assert_eq!(s.count(0, is_est), 1, "{:?}", s.events[0]);
    assert_eq!(s.count(1, is_est), 1);
    assert!(
        s.sent[1].contains(&0x11),
        "Bob sent an MRA: {:?}",
        s.sent[1]
    );
    assert_eq!(
        s.sent[0].iter().filter(|&&a| a == 0x10).count(),
        2,
        "one retransmission, then the MRA stops them: {:?}",
        s.sent[0]
    );
    s.destroy_all_and_drain();
}

#[test]
fn lost_rtus_end_in_failure_on_both_sides() {
    // Every RTU is lost: Bob's REP retries run out, he sends REJ (Timeout), and Alice, who
    // thought she was connected, sees the connection end.
    let mut s = Sim::new(8, Faults::default());
    s.drop_from = Some((0, 0x14));
    s.cms[1].listen(BOB, sid(7174)).unwrap();
    s.cms[0]
        .connect(s.now, ALICE, &s.connect_params(8, 2))
        .unwrap();
    s.run_for(Duration::from_secs(1));
    assert_eq!(
        s.sent[0].iter().filter(|&&a| a == 0x14).count(),
        3,
        "an RTU for the REP and each of its two retransmissions: {:?}",
        s.sent[0]
    );
    assert_eq!(s.count(1, is_est), 0);
    assert_eq!(s.count(1, |e| matches!(e, Event::Unreachable)), 1);
    assert_eq!(
        s.count(0, |e| matches!(e, Event::Disconnected)),
        1,
        "{:?}",
        s.events[0]
    );
    s.destroy_all_and_drain();
}

#[test]
fn a_dead_owner_mid_handshake_rejects_and_leaves_nothing() {
    // Bob dies while deciding: Alice sees a consumer REJ.
    let mut s = Sim::new(9, Faults::default());
    s.answer = Answer::Ignore;
    s.cms[1].listen(BOB, sid(7174)).unwrap();
    s.cms[0]
        .connect(s.now, ALICE, &s.connect_params(10, 3))
        .unwrap();
    s.run_for(Duration::from_millis(1));
    assert_eq!(s.cms[1].owner_counts(BOB), (1, 1));
    s.cms[1].destroy_owner(s.now, BOB);
    assert_eq!(s.cms[1].owner_counts(BOB), (0, 0));
    s.run_for(Duration::from_millis(1));
    assert!(matches!(
        s.events[0][..],
        [(
            _,
            Event::Rejected {
                reason: RejReason::CONSUMER,
                ..
            }
        )]
    ));
    s.destroy_all_and_drain();

    // Alice dies after sending her REQ: Bob's pending request is rejected to him.
    let mut s = Sim::new(10, Faults::default());
    s.answer = Answer::Ignore;
    s.cms[1].listen(BOB, sid(7174)).unwrap();
    s.cms[0]
        .connect(s.now, ALICE, &s.connect_params(10, 3))
        .unwrap();
    s.run_for(Duration::from_millis(1));
    s.cms[0].destroy_owner(s.now, ALICE);
    s.run_for(Duration::from_millis(1));
    assert!(matches!(
        s.events[1][..],
        [
            (_, Event::ConnectRequest { .. }),
            (
                _,
                Event::Rejected {
                    reason: RejReason::TIMEOUT,
                    ..
                }
            )
        ]
    ));
    s.destroy_all_and_drain();

    // Alice dies while connected: Bob sees a disconnect.
    let mut s = Sim::new(11, Faults::default());
    s.cms[1].listen(BOB, sid(7174)).unwrap();
    s.cms[0]
        .connect(s.now, ALICE, &s.connect_params(10, 3))
        .unwrap();
    s.run_for(Duration::from_millis(1));
    assert_eq!(s.count(1, is_est), 1);
    s.cms[0].destroy_owner(s.now, ALICE);
    s.run_for(Duration::from_millis(1));
    assert_eq!(s.count(1, |e| matches!(e, Event::Disconnected)), 1);
    assert!(
        s.events[0]
            .iter()
            .all(|e| !matches!(e.1, Event::Disconnected)),
        "the dead get no events"
    );
    s.destroy_all_and_drain();
}

#[test]
fn a_passive_owner_dying_while_its_rtu_is_lost_disconnects_the_active_side() {
    // Alice has the REP and sent her RTU, which is lost; Bob dies in RepSent. His CM
    // rejects the connection it never saw established (REJ, consumer), and Alice, who
    // thought she was connected, must see it end rather than keep a connection nobody
    // answers (IBA 12.9, the CM state diagram: a REJ in the established state enters
    // time-wait).
    let mut s = Sim::new(12, Faults::default());
    s.drop_from = Some((0, 0x14));
    s.cms[1].listen(BOB, sid(7174)).unwrap();
    s.cms[0]
        .connect(s.now, ALICE, &s.connect_params(10, 3))
        .unwrap();
    s.run_for(Duration::from_millis(1));
    assert_eq!(s.count(0, is_est), 1, "{:?}", s.events[0]);
    assert_eq!(s.count(1, is_est), 0, "{:?}", s.events[1]);
    s.cms[1].destroy_owner(s.now, BOB);
    s.run_for(Duration::from_millis(1));
    assert_eq!(
        s.count(0, |e| matches!(e, Event::Disconnected)),
        1,
        "{:?}",
        s.events[0]
    );
    s.destroy_all_and_drain();
}

#[test]
fn sidr_resolves_once_and_refuses_unknown_services() {
    let mut s = Sim::new(
        12,
        Faults {
            dup: 0.5,
            loss: 0.2,
            ..Faults::default()
        },
    );
    let udp = ServiceId {
        ps: PortSpace::Udp,
        port: 7174,
    }
    .to_u64();
    s.cms[1].listen(BOB, udp).unwrap();
    let p = SidrParams {
        peer: B,
        service_id: udp,
        pkey: 0xFFFF,
        response_timeout: 8,
        max_retries: 15,
        private_data: vec![],
    };
    s.cms[0].sidr_request(s.now, ALICE, &p).unwrap();
    s.run_for(Duration::from_secs(5));
    let replies: Vec<&SidrRep> = s.events[0]
        .iter()
        .filter_map(|(_, e)| match e {
            Event::SidrReply { rep } => Some(&**rep),
            _ => None,
        })
        .collect();
    assert_eq!(replies.len(), 1);
    assert_eq!(
        (replies[0].status, replies[0].qpn, replies[0].qkey),
        (SidrStatus::SUCCESS, 0x77, 0x1111)
    );
    assert_eq!(s.count(1, |e| matches!(e, Event::SidrRequest { .. })), 1);

    s.faults = Faults::default();
    let p = SidrParams {
        service_id: udp + 1,
        ..p
    };
    s.cms[0].sidr_request(s.now, ALICE, &p).unwrap();
    s.run_for(Duration::from_secs(1));
    assert!(matches!(
        s.events[0].last(),
        Some((_, Event::SidrReply { rep })) if rep.status == SidrStatus::UNSUPPORTED
    ));
    s.destroy_all_and_drain();
}

#[test]
fn messages_from_another_port_or_malformed_change_nothing() {
    let mut s = Sim::new(13, Faults::default());
    s.answer = Answer::Ignore;
    s.cms[1].listen(BOB, sid(7174)).unwrap();
    s.cms[0]
        .connect(s.now, ALICE, &s.connect_params(10, 3))
        .unwrap();
    s.run_for(Duration::from_millis(1));
    let bob_id = s.ids(1)[0];
    s.cms[1]
        .accept(
            s.now,
            BOB,
            bob_id,
            &AcceptParams {
                qpn: 1,
                starting_psn: 1,
                responder_resources: 0,
                initiator_depth: 0,
                rnr_retry_count: 0,
                srq: false,
                private_data: vec![],
            },
        )
        .unwrap();
    // Capture Bob's REP and replay it to Alice from a third address: ignored.
    let rep = s.cms[1].poll_transmit().unwrap();
    let mallory: IpAddr = "10.0.0.66".parse().unwrap();
    s.cms[0].handle_mad(s.now, mallory, &rep.mad).unwrap();
    s.pump();
    assert!(s.events[0].is_empty());
    // A malformed MAD is refused with its reason.
    assert!(s.cms[0].handle_mad(s.now, B, &rep.mad[..100]).is_err());
    let mut bad = rep.mad;
    bad[1] = 0x81;
    assert!(s.cms[0].handle_mad(s.now, B, &bad).is_err());
    // The genuine REP from Bob still works.
    s.cms[0].handle_mad(s.now, B, &rep.mad).unwrap();
    s.pump();
    assert!(matches!(
        s.events[0][..],
        [(_, Event::ConnectReply { .. }), (_, Event::Established)]
    ));
    match CmMad::parse(&rep.mad).unwrap().msg {
        CmMessage::Rep(r) => assert_eq!(r.local_qpn, 1),
        m => panic!("{m:?}"),
    }
    s.run_for(Duration::from_millis(5));
    s.destroy_all_and_drain();
}

#[test]
fn commands_in_the_wrong_state_or_of_another_owner_are_refused() {
    let mut s = Sim::new(14, Faults::default());
    let l = s.cms[1].listen(BOB, sid(7174)).unwrap();
    assert_eq!(
        s.cms[1].listen(ALICE, sid(7174)),
        Err(CmError::ServiceInUse(sid(7174)))
    );
    assert_eq!(s.cms[1].unlisten(ALICE, l), Err(CmError::UnknownId));
    let id = s.cms[0]
        .connect(s.now, ALICE, &s.connect_params(10, 3))
        .unwrap();
    assert_eq!(
        s.cms[0].establish(s.now, ALICE, id),
        Err(CmError::State(State::ReqSent))
    );
    assert_eq!(s.cms[0].establish(s.now, BOB, id), Err(CmError::UnknownId));
    let mut p = s.connect_params(10, 3);
    p.private_data = vec![0; 93];
    assert!(matches!(
        s.cms[0].connect(s.now, ALICE, &p),
        Err(CmError::Wire(_))
    ));
    s.run_for(Duration::from_millis(1));
    s.destroy_all_and_drain();
}

/// What one side's owner saw, checked against the legal outcomes of one connection attempt:
/// at most one of each event, Established excluding a failure, a failure excluding a
/// disconnect. A Disconnected without Established is legal: a DREQ reaching a side in
/// RepSent or RepRcvd ends it (IBA 12.9; the kernel's rdma_cm reports it the same way).
/// Returns whether the attempt reached an end (established, failed or disconnected).
fn check_outcome(events: &[(CmId, Event)], active: bool, ctx: &str) -> bool {
    let n = |f: fn(&Event) -> bool| events.iter().filter(|(_, e)| f(e)).count();
    let est = n(is_est);
    let failed = n(|e| matches!(e, Event::Rejected { .. } | Event::Unreachable));
    let disc = n(|e| matches!(e, Event::Disconnected));
    let first = if active {
        n(|e| matches!(e, Event::ConnectReply { .. }))
    } else {
        n(|e| matches!(e, Event::ConnectRequest { .. }))
    };
    assert!(first <= 1, "one REQ/REP however duplicated: {ctx}");
    assert!(est <= 1, "never two connections: {ctx}");
    assert!(disc <= 1, "one disconnect: {ctx}");
    assert!(failed <= 1 && est + failed <= 1, "one outcome: {ctx}");
    assert!(failed + disc <= 1, "nothing after a failure: {ctx}");
    let ids: std::collections::BTreeSet<CmId> = events.iter().map(|(id, _)| *id).collect();
    assert!(ids.len() <= 1, "one id per side: {ctx}");
    est + failed + disc > 0
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]

    /// Any seeded schedule of loss, duplication and reordering, any consumer answer, and an
    /// owner that may die at any moment: each side ends in one connection or one clean
    /// failure, never two, the attempt ends unless the passive consumer sits on the request
    /// (IBA 12.6.6: its CM has no timer of its own in that state), without loss both ends
    /// agree on whether they are connected, and once everything is destroyed and time-wait
    /// has passed, both CMs hold nothing.
    #[test]
    fn any_fault_schedule_ends_in_one_outcome_and_leaves_nothing(
        seed in proptest::prelude::any::<u64>(),
        lossless in proptest::prelude::any::<bool>(),
        loss in 0.0f64..0.4,
        dup in 0.0f64..0.5,
        reorder in 0.0f64..0.5,
        answer in 0u8..4,
        // Half the deaths inside the first millisecond, where the handshake is.
        death in proptest::option::of((0usize..2, proptest::prop_oneof![0u64..1_000, 0u64..40_000])),
    ) {
        let loss = if lossless { 0.0 } else { loss };
        let mut s = Sim::new(seed, Faults { loss, dup, reorder });
        s.answer = match answer {
            0 => Answer::Accept,
            1 => Answer::AcceptAfter(Duration::from_millis(30)),
            2 => Answer::Reject,
            _ => Answer::Ignore,
        };
        s.cms[1].listen(BOB, sid(7174)).unwrap();
        s.cms[0].connect(s.now, ALICE, &s.connect_params(8, 15)).unwrap();
        let mut dead = [false; 2];
        // Microseconds: a handshake takes a few hundred, so a death lands in any phase.
        if let Some((side, us)) = death {
            s.run_for(Duration::from_micros(us));
            let owner = if side == 0 { ALICE } else { BOB };
            s.cms[side].destroy_owner(s.now, owner);
            if side == 1 {
                s.later.clear();
            }
            dead[side] = true;
        }
        s.run_for(Duration::from_secs(30));
        let ctx = format!("A {:?} B {:?}", s.events[0], s.events[1]);
        let a_ended = check_outcome(&s.events[0], true, &ctx);
        let b_ended = check_outcome(&s.events[1], false, &ctx);
        if !dead[0] {
            proptest::prop_assert!(a_ended, "the active side's attempt ended: {}", ctx);
        }
        let b_asked = s.count(1, |e| matches!(e, Event::ConnectRequest { .. })) == 1;
        // A consumer's own reject is its end; one that ignores the request waits for it.
        if !dead[1] && b_asked && !matches!(s.answer, Answer::Ignore | Answer::Reject) {
            proptest::prop_assert!(b_ended, "the passive side's attempt ended: {}", ctx);
        }
        // Without loss nothing can keep the two ends apart: each is established exactly
        // when the other is (a dead owner's side never is).
        let est = |side: usize, owner| {
            s.events[side].first().is_some_and(|&(id, _)| {
                s.cms[side].state(owner, id) == Some(State::Established)
            })
        };
        if lossless {
            proptest::prop_assert_eq!(est(0, ALICE), est(1, BOB), "both ends agree: {}", ctx);
        }
        // The live owners disconnect what they hold; both sides see it end.
        for side in 0..2 {
            let owner = if side == 0 { ALICE } else { BOB };
            if let Some((id, _)) = s.events[side].first().cloned() {
                if s.cms[side].state(owner, id) == Some(State::Established) {
                    s.cms[side].disconnect(s.now, owner, id, &[]).unwrap();
                }
            }
        }
        s.run_for(Duration::from_secs(30));
        for side in 0..2 {
            check_outcome(&s.events[side], side == 0, &ctx);
        }
        s.destroy_all_and_drain();
    }
}

/// The REJs a vanished owner leaves, as a peer's CM (the kernel's included) must read them:
/// a REQ_SENT side gives up with reason Timeout, rejecting no message, its CA GUID in the
/// additional rejection information (IBA 12.6.7.2, table 109: how the peer finds the
/// connection when the REJ names no remote ID); a REP_SENT side rejects with reason
/// consumer, no message either (its REP already answered the REQ).
#[test]
fn rejs_of_a_vanished_owner_say_what_they_reject_and_who_sent_them() {
    // Alice dies with her REQ outstanding (Bob ignores it).
    let mut a = Cm::new(cfg(0x100));
    let p = Sim::new(0, Faults::default()).connect_params(10, 3);
    a.connect(Instant(0), ALICE, &p).unwrap();
    assert!(a.poll_transmit().is_some(), "the REQ");
    a.destroy_owner(Instant(0), ALICE);
    let t = a.poll_transmit().expect("a REJ");
    let CmMessage::Rej(rej) = CmMad::parse(&t.mad).unwrap().msg else {
        panic!("not a REJ");
    };
    assert_eq!(rej.reason, RejReason::TIMEOUT);
    assert_eq!(rej.message_rejected, 2, "no message");
    assert_eq!(rej.info_length, 8);
    assert_eq!(rej.ari[..8], 0x100u64.to_be_bytes(), "the sender's CA GUID");

    // Bob dies after his REP, before the RTU.
    let mut s = Sim::new(13, Faults::default());
    s.drop_from = Some((0, 0x14));
    s.cms[1].listen(BOB, sid(7174)).unwrap();
    s.cms[0]
        .connect(s.now, ALICE, &s.connect_params(10, 3))
        .unwrap();
    s.run_for(Duration::from_millis(1));
    s.cms[1].destroy_owner(s.now, BOB);
    let t = s.cms[1].poll_transmit().expect("a REJ");
    let CmMessage::Rej(rej) = CmMad::parse(&t.mad).unwrap().msg else {
        panic!("not a REJ");
    };
    assert_eq!(rej.reason, RejReason::CONSUMER);
    assert_eq!(rej.message_rejected, 2, "no message: the REQ had its REP");
    assert_eq!(rej.info_length, 0);
}
