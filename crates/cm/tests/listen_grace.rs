//! `Config::listen_grace`: a REQ or SIDR_REQ for a service nobody listens on yet is held,
//! handed to a listener made within the grace, and refused (REJ Invalid Service ID, SIDR_REP
//! status 1) once it ends; copies of a held request change nothing, and nothing is left.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use softverbs_cm::*;
use softverbs_wire::cm::{PortSpace, RejReason, ServiceId, SidrStatus};

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
const ALICE: Owner = Owner(1);
const BOB: Owner = Owner(2);
const GRACE: Duration = Duration::from_millis(250);

fn cms() -> (Cm, Cm) {
    let cfg = |n: u32| Config {
        id_seed: [n as u8 ^ (n >> 8) as u8; 32],
        listen_grace: GRACE,
        time_wait: Duration::from_millis(10),
        ..Config::default()
    };
    (Cm::new(cfg(0x100)), Cm::new(cfg(0x9000)))
}

fn sid(ps: PortSpace, port: u16) -> u64 {
    ServiceId { ps, port }.to_u64()
}

/// Every MAD `from` (at `ip`) has queued, handed to `to`; how many.
fn deliver(from: &mut Cm, ip: IpAddr, to: &mut Cm, now: Instant) -> usize {
    let mut n = 0;
    while let Some(t) = from.poll_transmit() {
        to.handle_mad(now, ip, &t.mad).unwrap();
        n += 1;
    }
    n
}

fn connect(a: &mut Cm, now: Instant) -> CmId {
    let p = ConnectParams {
        peer: B,
        service_id: sid(PortSpace::Tcp, 18601),
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
        response_timeout: 20,
        max_cm_retries: 15,
        private_data: b"early".to_vec(),
    };
    a.connect(now, ALICE, &p).unwrap()
}

#[test]
fn a_req_before_the_listener_reaches_it_within_the_grace() {
    let (mut a, mut b) = cms();
    let t0 = Instant(1_000_000);
    connect(&mut a, t0);
    let req = a.poll_transmit().unwrap();
    b.handle_mad(t0, A, &req.mad).unwrap();
    // A retransmitted copy while it is held.
    b.handle_mad(t0.after(Duration::from_millis(5)), A, &req.mad)
        .unwrap();
    assert!(
        b.poll_transmit().is_none(),
        "a held REQ is not answered yet"
    );
    assert!(b.poll_event().is_none());
    assert_eq!(b.counts().connections, 1);
    assert_eq!(b.poll_timeout(), Some(t0.after(GRACE)));

    let l = b.listen(BOB, sid(PortSpace::Tcp, 18601)).unwrap();
    match b.poll_event() {
        Some((
            BOB,
            _,
            Event::ConnectRequest {
                listener,
                peer,
                req,
            },
        )) => {
            assert_eq!((listener, peer), (l, A));
            assert_eq!(req.private_data[..5], *b"early");
        }
        other => panic!("expected the connect request, got {other:?}"),
    }
    assert!(b.poll_event().is_none(), "one request, whatever its copies");
    // The grace ending later refuses nothing.
    b.handle_timeout(t0.after(GRACE));
    assert!(b.poll_transmit().is_none());
    assert_eq!(b.counts().connections, 1);
}

#[test]
fn a_req_nobody_listens_for_is_refused_when_the_grace_ends() {
    let (mut a, mut b) = cms();
    let t0 = Instant(1_000_000);
    connect(&mut a, t0);
    assert_eq!(deliver(&mut a, A, &mut b, t0), 1);
    b.handle_timeout(t0.after(GRACE - Duration::from_millis(1)));
    assert_eq!(deliver(&mut b, B, &mut a, t0), 0, "refused too early");
    let t1 = t0.after(GRACE);
    b.handle_timeout(t1);
    assert_eq!(deliver(&mut b, B, &mut a, t1), 1);
    match a.poll_event() {
        Some((ALICE, _, Event::Rejected { reason, .. })) => {
            assert_eq!(reason, RejReason::INVALID_SERVICE_ID)
        }
        other => panic!("expected a REJ, got {other:?}"),
    }
    // A listener made afterwards gets nothing.
    b.listen(BOB, sid(PortSpace::Tcp, 18601)).unwrap();
    assert!(b.poll_event().is_none());
    let b_counts = b.counts();
    assert_eq!((b_counts.connections, b_counts.time_wait), (0, 0));
}

#[test]
fn a_sidr_req_is_held_as_a_req_is() {
    let (mut a, mut b) = cms();
    let t0 = Instant(1_000_000);
    let udp = sid(PortSpace::Udp, 18603);
    let p = SidrParams {
        peer: B,
        service_id: udp,
        pkey: 0xFFFF,
        response_timeout: 20,
        max_retries: 15,
        private_data: vec![],
    };
    // One resolved by a listener made within the grace...
    a.sidr_request(t0, ALICE, &p).unwrap();
    assert_eq!(deliver(&mut a, A, &mut b, t0), 1);
    assert!(b.poll_transmit().is_none());
    let l = b.listen(BOB, udp).unwrap();
    let Some((BOB, id, Event::SidrRequest { listener, .. })) = b.poll_event() else {
        panic!("expected the SIDR request");
    };
    assert_eq!(listener, l);
    b.sidr_reply(
        t0,
        BOB,
        id,
        &SidrReplyParams {
            status: SidrStatus::SUCCESS,
            qpn: 0x22,
            qkey: 0x0123_4567,
            private_data: vec![],
        },
    )
    .unwrap();
    assert_eq!(deliver(&mut b, B, &mut a, t0), 1);
    match a.poll_event() {
        Some((ALICE, _, Event::SidrReply { rep })) => {
            assert_eq!((rep.status, rep.qpn), (SidrStatus::SUCCESS, 0x22))
        }
        other => panic!("expected the SIDR reply, got {other:?}"),
    }
    // ... and one for a service nobody listens on, refused once the grace ends.
    let p = SidrParams {
        service_id: udp + 1,
        ..p
    };
    a.sidr_request(t0, ALICE, &p).unwrap();
    assert_eq!(deliver(&mut a, A, &mut b, t0), 1);
    b.handle_timeout(t0.after(GRACE));
    assert_eq!(deliver(&mut b, B, &mut a, t0.after(GRACE)), 1);
    match a.poll_event() {
        Some((ALICE, _, Event::SidrReply { rep })) => {
            assert_eq!(rep.status, SidrStatus::UNSUPPORTED)
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}
