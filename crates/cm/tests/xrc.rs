//! XRC connections through the CM (IBA annex A14.4) as the kernel's ib_cm formats them, so an
//! rdma_cm XRC endpoint (rdma_xclient/rdma_xserver, tests/c/xrc_ep.c in the librdmacm crate)
//! talks to a kernel peer: the REQ says XRC (Transport Service Type 3, Extended Transport
//! Type 1) and leaves what an initiator has no use for zero; the target's REP carries its
//! QP number in Local EE Context Number, with SRQ set.

use std::net::{IpAddr, Ipv4Addr};

use softverbs_cm::*;
use softverbs_wire::cm::{CmMad, CmMessage, PortSpace, ServiceId};

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
const ALICE: Owner = Owner(1);
const BOB: Owner = Owner(2);

fn sid() -> u64 {
    ServiceId {
        ps: PortSpace::Ib,
        port: 7471,
    }
    .to_u64()
}

fn cm(seed: u8) -> Cm {
    Cm::new(Config {
        local_ca_guid: u64::from(seed),
        id_seed: [seed; 32],
        req_rate: 0,
        ..Config::default()
    })
}

fn one(from: &mut Cm, ip: IpAddr, to: &mut Cm) -> CmMessage {
    let t = from.poll_transmit().expect("a MAD");
    to.handle_mad(Instant(0), ip, &t.mad).unwrap();
    assert!(from.poll_transmit().is_none());
    CmMad::parse(&t.mad).unwrap().msg
}

/// A's REQ, B's REP and A's view of it for a connection of `kind`.
fn exchange(kind: QpKind) -> (CmMessage, CmMessage, Event) {
    let (mut a, mut b) = (cm(1), cm(2));
    b.listen(BOB, sid()).unwrap();
    a.connect(
        Instant(0),
        ALICE,
        &ConnectParams {
            peer: B,
            service_id: sid(),
            local_gid: [1; 16],
            remote_gid: [2; 16],
            qp_kind: kind,
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
        },
    )
    .unwrap();
    let req = one(&mut a, A, &mut b);
    let ib = match b.poll_event() {
        Some((BOB, id, Event::ConnectRequest { .. })) => id,
        e => panic!("{e:?}"),
    };
    b.accept(
        Instant(0),
        BOB,
        ib,
        &AcceptParams {
            qpn: 0x22,
            starting_psn: 0x200,
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
            srq: false,
            private_data: vec![0, 0, 0, 5],
        },
    )
    .unwrap();
    let rep = one(&mut b, B, &mut a);
    let (_, _, ev) = a.poll_event().expect("an event");
    (req, rep, ev)
}

#[test]
fn an_xrc_req_and_rep_carry_the_kernels_fields() {
    let (req, rep, ev) = exchange(QpKind::Xrc);
    let CmMessage::Req(req) = req else {
        panic!("{req:?}")
    };
    assert_eq!(
        (req.transport_service_type, req.extended_transport_type),
        (3, 1)
    );
    assert_eq!(req.local_qpn, 0x11);
    assert_eq!(
        (
            req.responder_resources,
            req.retry_count,
            req.rnr_retry_count,
            req.srq
        ),
        (0, 0, 0, false),
        "an initiator's REQ leaves these zero"
    );
    let CmMessage::Rep(rep) = rep else {
        panic!("{rep:?}")
    };
    assert_eq!((rep.local_qpn, rep.local_eecn), (0, 0x22));
    assert!(rep.srq, "a target receives through SRQs");
    assert_eq!(rep.initiator_depth, 0);
    assert!(!rep.end_to_end_flow_control);
    assert_eq!(rep.private_data[..4], [0, 0, 0, 5]);
    match ev {
        Event::ConnectReply { rep } => assert_eq!(rep.local_eecn, 0x22),
        e => panic!("{e:?}"),
    }
}

#[test]
fn an_rc_rep_still_names_its_qp_in_local_qpn() {
    let (req, rep, _) = exchange(QpKind::Rc);
    let (CmMessage::Req(req), CmMessage::Rep(rep)) = (req, rep) else {
        panic!()
    };
    assert_eq!(
        (req.transport_service_type, req.extended_transport_type),
        (0, 0)
    );
    assert_eq!((req.responder_resources, req.retry_count), (1, 7));
    assert_eq!((rep.local_qpn, rep.local_eecn), (0x22, 0));
    assert!(rep.end_to_end_flow_control && !rep.srq);
}
