//! The fields of softverbs' REQ, REP and DREQ that a Linux kernel peer (`ib_cm`,
//! `drivers/infiniband/core/cm.c`) reads, against a peer that speaks as the kernel does
//! (docs/design/cm.md §2.4, the field table). Each assertion names what the kernel does with
//! the field.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use softverbs_cm::*;
use softverbs_wire::cm::msg::{PathInfo, Req, Rtu};
use softverbs_wire::cm::{CmMad, CmMessage, PortSpace, ServiceId};

const KERNEL: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
const APP: Owner = Owner(1);
const GUID: u64 = 0x0200_00ff_fe00_0001;

fn cm() -> Cm {
    Cm::new(Config {
        local_ca_guid: GUID,
        id_seed: [7; 32],
        time_wait: Duration::from_millis(10),
        ..Config::default()
    })
}

fn sid() -> u64 {
    ServiceId {
        ps: PortSpace::Tcp,
        port: 7174,
    }
    .to_u64()
}

fn gid(ip: [u8; 4]) -> [u8; 16] {
    Ipv4Addr::from(ip).to_ipv6_mapped().octets()
}

fn next(cm: &mut Cm) -> CmMad {
    let t = cm.poll_transmit().expect("a MAD");
    CmMad::parse(&t.mad).unwrap()
}

/// softverbs passive: a kernel REQ in, the REP out, RTU, then softverbs disconnects.
#[test]
fn the_rep_and_dreq_carry_what_a_kernel_active_side_reads() {
    let mut b = cm();
    let t0 = Instant(1_000_000);
    b.listen(APP, sid()).unwrap();
    let req = Req {
        local_comm_id: 0x1122_3344,
        service_id: sid(),
        local_ca_guid: 0x5254_00ff_fe12_3456,
        local_qkey: 0,
        local_qpn: 0x11,
        responder_resources: 1,
        local_eecn: 0,
        initiator_depth: 1,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport_service_type: 0,
        end_to_end_flow_control: true,
        starting_psn: 0x00ab_cdef,
        local_cm_response_timeout: 20,
        retry_count: 7,
        pkey: 0xffff,
        path_mtu: 3,
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        srq: false,
        extended_transport_type: 0,
        primary: PathInfo {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: gid([10, 0, 0, 2]),
            remote_gid: gid([10, 0, 0, 1]),
            hop_limit: 64,
            local_ack_timeout: 17,
            ..PathInfo::default()
        },
        alternate: PathInfo::default(),
        sap_supported: false,
        private_data: [0; 92],
    };
    let mad = CmMad {
        tid: 0x0000_0001_1122_3344,
        msg: CmMessage::Req(Box::new(req)),
    };
    b.handle_mad(t0, KERNEL, &mad.emit().unwrap()).unwrap();
    let Some((APP, id, Event::ConnectRequest { .. })) = b.poll_event() else {
        panic!("no connect request")
    };
    b.accept(
        t0,
        APP,
        id,
        &AcceptParams {
            qpn: 0x22,
            starting_psn: 0x0012_3456,
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
            srq: true,
            private_data: b"rep".to_vec(),
        },
    )
    .unwrap();
    let CmMessage::Rep(rep) = next(&mut b).msg else {
        panic!("not a REP")
    };
    // cm_rep_handler: the REP names the REQ's ID (cm_acquire_id by remote_comm_id).
    assert_eq!(rep.remote_comm_id, 0x1122_3344);
    assert_ne!(rep.local_comm_id, 0);
    // cm_format_rep_event: remote QPN, Starting PSN (its sq_psn), RNR retry, SRQ.
    assert_eq!((rep.local_qpn, rep.starting_psn), (0x22, 0x0012_3456));
    assert_eq!((rep.rnr_retry_count, rep.srq), (7, true));
    // RC: no Q_Key, no EEC, no failover (rdma_cm never asks for it).
    assert_eq!(
        (rep.local_qkey, rep.local_eecn, rep.failover_accepted),
        (0, 0, 0)
    );
    // Target ACK Delay: the device's local_ca_ack_delay (15), which the kernel adds to its
    // ACK timeout (cm_rep_handler: cm_ack_timeout(target_ack_delay, ...)); it was 0.
    assert_eq!(rep.target_ack_delay, 15);
    // Timewait and REJ(Timeout) matching use the CA GUID.
    assert_eq!(rep.local_ca_guid, GUID);
    assert_eq!(&rep.private_data[..3], b"rep");

    let rtu = CmMad {
        tid: 0x0000_0001_1122_3344,
        msg: CmMessage::Rtu(Box::new(Rtu {
            local_comm_id: 0x1122_3344,
            remote_comm_id: rep.local_comm_id,
            private_data: [0; 224],
        })),
    };
    b.handle_mad(t0, KERNEL, &rtu.emit().unwrap()).unwrap();
    assert!(matches!(b.poll_event(), Some((APP, _, Event::Established))));
    b.disconnect(t0, APP, id, b"").unwrap();
    let CmMessage::Dreq(dreq) = next(&mut b).msg else {
        panic!("not a DREQ")
    };
    // cm_dreq_handler drops a DREQ whose Remote QPN is not the QP it connected.
    assert_eq!(
        (dreq.local_comm_id, dreq.remote_comm_id, dreq.remote_qpn),
        (rep.local_comm_id, 0x1122_3344, 0x11)
    );
}

/// softverbs active: the REQ's fields a kernel passive side reads (cm_req_handler,
/// cm_format_paths_from_req, cma_check_req_qp_type, cma_save_net_info).
#[test]
fn the_req_carries_what_a_kernel_passive_side_reads() {
    let mut a = cm();
    let t0 = Instant(1_000_000);
    let p = ConnectParams {
        peer: KERNEL,
        service_id: sid(),
        local_gid: gid([10, 0, 0, 1]),
        remote_gid: gid([10, 0, 0, 2]),
        qp_kind: QpKind::Rc,
        qpn: 0x33,
        starting_psn: 0x0065_4321,
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: false,
        path_mtu: 3,
        hop_limit: 64,
        local_ack_timeout: 17,
        response_timeout: 20,
        max_cm_retries: 15,
        private_data: vec![0; 36],
    };
    a.connect(t0, APP, &p).unwrap();
    let mad = next(&mut a);
    let CmMessage::Req(r) = mad.msg else {
        panic!("not a REQ")
    };
    assert_ne!(r.local_comm_id, 0);
    assert_eq!(r.service_id, sid());
    assert_eq!(r.local_ca_guid, GUID);
    // cma_check_req_qp_type: RC on RDMA_PS_TCP (transport 0, no extended type).
    assert_eq!(
        (r.transport_service_type, r.extended_transport_type),
        (0, 0)
    );
    assert_eq!((r.local_qpn, r.starting_psn), (0x33, 0x0065_4321));
    assert_eq!((r.local_qkey, r.local_eecn, r.remote_eecn), (0, 0, 0));
    // cm_req_handler: timeouts (its REP retransmission) and retries, P_Key (checked against
    // the BTH's by rdma_cm), MTU (its RTR path_mtu: must not exceed rxe's port MTU).
    assert_eq!(
        (r.remote_cm_response_timeout, r.local_cm_response_timeout),
        (20, 20)
    );
    assert_eq!(
        (r.max_cm_retries, r.retry_count, r.rnr_retry_count),
        (15, 7, 7)
    );
    assert_eq!(
        (r.pkey, r.path_mtu, r.rdc_exists, r.srq),
        (0xffff, 3, false, false)
    );
    // cm_format_paths_from_req: its path's SGID is our Remote Port GID, which must be one
    // of its GIDs (else REJ Invalid GID); RoCE LIDs are permissive.
    let pr = r.primary;
    assert_eq!((pr.local_lid, pr.remote_lid), (0xffff, 0xffff));
    assert_eq!(pr.local_gid, gid([10, 0, 0, 1]));
    assert_eq!(pr.remote_gid, gid([10, 0, 0, 2]));
    assert_eq!((pr.hop_limit, pr.sl, pr.subnet_local), (64, 0, false));
    assert_eq!(pr.local_ack_timeout, 17);
    // No alternate path: cm_req_has_alt_path looks at its local LID.
    assert_eq!(r.alternate, PathInfo::default());
}
