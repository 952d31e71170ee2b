//! CM MADs as the Linux kernel's ib_cm and rdma_cm sent them, captured from rxe (Debian 6.1.0,
//! `rdma_rxe` on virtio, QEMU) on the wire to a softverbs daemon for issue 37
//! (/work/wt/shared/rxe-captures, `tshark -T fields -e udp.payload`: BTH, DETH, the MAD and
//! the ICRC). rxe at 10.37.0.2 / fd00:37::2, softverbs at 10.37.0.1 / fd00:37::1. Each field
//! is asserted as the kernel meant it (docs/design/cm.md §2.4).

use std::net::IpAddr;

use softverbs_wire::cm::{CmMad, CmMessage, CmaHdr, PortSpace, RejReason, ServiceId, SidrStatus};
use softverbs_wire::{Opcode, Packet};

/// rxe's REQ (rping client on rxe to softverbs' `rping -s`, `rping_sv_1024_v4`, frame 1).
const REQ_V4: &str = concat!(
        "6400ffff000000018000000080010000000000010107020300000000000000027fff856400100000000000006485ff7f",
        "000000000000000001061c06505400fffe37000200000000000000000000160100000001000000a0a1e3bba7ffff37f0",
        "ffffffff00000000000000000000ffff0a25000200000000000000000000ffff0a250001b0c500000040009800000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000040de7600000000",
        "00000000000000000a2500020000000000000000000000000a2500010000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000f7561c9e",
    );
/// rxe's REP to softverbs' REQ (`rping_rxe_1024_v4`, frame 2).
const REP_V4: &str = concat!(
        "6400ffff000000018000000580010000000000010107020300000000d2e5064627f57f7000130000000000006685ff7f",
        "eacca9a400000000000017000000000058515a00010178e0505400fffe37000200000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "00000000000000000000000000000000000000000000000000000000000000000000000014b4dbfe",
    );
/// rxe's SIDR_REP to softverbs' SIDR_REQ (udaddy, `udaddy_rxe_1024_v4`, frame 2).
const SIDR_REP_V4: &str = concat!(
        "6400ffff000000018000000b80010000000000010107020300000000a029c6e94fca7bd90018000000000000978600e1",
        "00000000000018000000000001111c060123456700000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000000000008e1c5596",
    );
/// rxe's REQ over IPv6 (`rping_sv_1024_v6`, frame 1).
const REQ_V6: &str = concat!(
        "6400ffff000000018000000d80010000000000010107020300000000000000027fff856900100000000000006985ff7f",
        "000000000000000001061c06505400fffe370002000000000000000000001c0100000001000000a0860b2fa7ffff37f0",
        "fffffffffd000037000000000000000000000002fd000037000000000000000000000001574230000040009800000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000060b043fd000037",
        "000000000000000000000002fd0000370000000000000000000000010000000000000000000000000000000000000000",
        "00000000000000000000000000000000000000000000000000000000000000000000000030785054",
    );
/// rxe's REJ Timeout after softverbs never answered that REQ (frame 5).
const REJ_V6: &str = concat!(
        "6400ffff000000018000001180010000000000010107020300000000000000027fff856900120000000000006985ff7f",
        "0000000080100004505400fffe3700020000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000000000000000000000000000098f6cee",
    );

fn bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

/// The MAD of a GSI packet, after checking what rxe puts around it: UD SEND_ONLY to QP1 with
/// the GSI Q_Key from QP1, P_Key 0xFFFF (AckReq set, which UD ignores).
fn mad(hex: &str) -> (CmMad, Vec<u8>) {
    let b = bytes(hex);
    let p = Packet::parse(&b).unwrap();
    assert_eq!(p.opcode(), Opcode(0x64));
    assert_eq!((p.headers.bth.dest_qp, p.headers.bth.pkey), (1, 0xFFFF));
    let d = p.headers.deth.unwrap();
    assert_eq!((d.qkey, d.src_qp), (0x8001_0000, 1));
    assert_eq!(p.payload.len(), 256);
    // MAD header: base 1, class CM, class version 2, Send, status 0, attribute modifier 0.
    assert_eq!(&p.payload[..4], &[1, 0x07, 2, 0x03]);
    assert_eq!(&p.payload[4..8], &[0; 4]);
    assert_eq!(&p.payload[20..24], &[0; 4]);
    (CmMad::parse(p.payload).unwrap(), p.payload.to_vec())
}

fn gid4(a: [u8; 4]) -> [u8; 16] {
    std::net::Ipv4Addr::from(a).to_ipv6_mapped().octets()
}

#[test]
fn rxe_req_over_ipv4() {
    let (m, raw) = mad(REQ_V4);
    // The kernel's TID: hi_tid << 32 | local comm ID's low bits (cm_form_tid).
    assert_eq!(m.tid, 0x0000_0002_7fff_8564);
    let CmMessage::Req(r) = m.msg else {
        panic!("{:?}", m.msg)
    };
    assert_eq!(r.local_comm_id, 0x6485_ff7f);
    assert_eq!(&raw[24 + 4..24 + 8], &[0; 4], "no ECE vendor ID");
    assert_eq!(
        ServiceId::from_u64(r.service_id),
        Some(ServiceId {
            ps: PortSpace::Tcp,
            port: 7174
        })
    );
    assert_eq!(
        r.local_ca_guid, 0x5054_00ff_fe37_0002,
        "from the MAC 52:54:00:37:00:02"
    );
    assert_eq!(
        (r.local_qkey, r.local_qpn, r.local_eecn, r.remote_eecn),
        (0, 0x16, 0, 0)
    );
    assert_eq!((r.responder_resources, r.initiator_depth), (1, 1));
    assert_eq!(
        (r.remote_cm_response_timeout, r.local_cm_response_timeout),
        (20, 20)
    );
    assert_eq!(
        (r.transport_service_type, r.extended_transport_type),
        (0, 0),
        "RC"
    );
    assert!(
        !r.end_to_end_flow_control,
        "rping's conn_param.flow_control"
    );
    assert_eq!(r.starting_psn, 0x00a1_e3bb);
    assert_eq!(
        (r.retry_count, r.rnr_retry_count, r.max_cm_retries),
        (7, 7, 15)
    );
    assert_eq!(
        (r.pkey, r.path_mtu, r.rdc_exists, r.srq),
        (0xFFFF, 3, false, false)
    );
    let p = r.primary;
    assert_eq!((p.local_lid, p.remote_lid), (0xFFFF, 0xFFFF));
    assert_eq!(p.local_gid, gid4([10, 37, 0, 2]));
    assert_eq!(p.remote_gid, gid4([10, 37, 0, 1]));
    // A hashed flow label (cma_get_roce_udp_flow_label); rate "port current".
    assert_eq!((p.flow_label, p.packet_rate), (0xb_0c50, 0));
    assert_eq!(
        (p.traffic_class, p.hop_limit, p.sl, p.subnet_local),
        (0, 64, 0, false)
    );
    // cm_ack_timeout(rxe's ack delay 15, CMA_IBOE_PACKET_LIFETIME 18 in 6.1) = 19.
    assert_eq!(p.local_ack_timeout, 19);
    assert_eq!(r.alternate.local_lid, 0, "no alternate path");
    let h = CmaHdr::parse(&r.private_data).unwrap();
    assert_eq!(
        r.private_data[..2],
        [0x00, 0x40],
        "CMA version 0, IP version 4"
    );
    assert_eq!(h.src_port, 0xde76);
    assert_eq!(h.src, IpAddr::from([10, 37, 0, 2]));
    assert_eq!(h.dst, IpAddr::from([10, 37, 0, 1]));
    // What softverbs writes for the same REQ is the same 256 bytes.
    let again = CmMad {
        tid: m.tid,
        msg: CmMessage::Req(r),
    }
    .emit()
    .unwrap();
    assert_eq!(again.to_vec(), raw);
}

#[test]
fn rxe_req_over_ipv6() {
    let (m, raw) = mad(REQ_V6);
    let CmMessage::Req(r) = m.msg else {
        panic!("{:?}", m.msg)
    };
    let v6 = |h: u16| std::net::Ipv6Addr::new(0xfd00, 0x37, 0, 0, 0, 0, 0, h);
    assert_eq!(r.primary.local_gid, v6(2).octets());
    assert_eq!(r.primary.remote_gid, v6(1).octets());
    assert_eq!(r.primary.hop_limit, 64);
    assert_eq!(r.private_data[1], 0x60, "IP version 6");
    let h = CmaHdr::parse(&r.private_data).unwrap();
    assert_eq!((h.src, h.dst), (IpAddr::V6(v6(2)), IpAddr::V6(v6(1))));
    let again = CmMad {
        tid: m.tid,
        msg: CmMessage::Req(r),
    }
    .emit()
    .unwrap();
    assert_eq!(again.to_vec(), raw);
}

#[test]
fn rxe_rep() {
    let (m, raw) = mad(REP_V4);
    // The REP carries the TID of the REQ it answers (softverbs' random one).
    assert_eq!(m.tid, 0xd2e5_0646_27f5_7f70);
    let CmMessage::Rep(r) = m.msg else {
        panic!("{:?}", m.msg)
    };
    assert_eq!(
        (r.local_comm_id, r.remote_comm_id),
        (0x6685_ff7f, 0xeacc_a9a4)
    );
    assert_eq!((r.local_qkey, r.local_qpn, r.local_eecn), (0, 0x17, 0));
    assert_eq!(&raw[24 + 15..24 + 16], &[0], "no ECE vendor ID");
    assert_eq!(r.starting_psn, 0x0058_515a);
    assert_eq!((r.responder_resources, r.initiator_depth), (1, 1));
    assert_eq!(r.target_ack_delay, 15, "rxe's local_ca_ack_delay");
    assert_eq!((r.failover_accepted, r.end_to_end_flow_control), (0, false));
    assert_eq!((r.rnr_retry_count, r.srq), (7, false));
    assert_eq!(r.local_ca_guid, 0x5054_00ff_fe37_0002);
    let again = CmMad {
        tid: m.tid,
        msg: CmMessage::Rep(r),
    }
    .emit()
    .unwrap();
    assert_eq!(again.to_vec(), raw);
}

#[test]
fn rxe_sidr_rep() {
    let (m, raw) = mad(SIDR_REP_V4);
    let CmMessage::SidrRep(s) = m.msg else {
        panic!("{:?}", m.msg)
    };
    assert_eq!(s.request_id, 0x9786_00e1);
    assert_eq!((s.status, s.info_length), (SidrStatus::SUCCESS, 0));
    assert_eq!(s.qpn, 0x18);
    assert_eq!(
        ServiceId::from_u64(s.service_id),
        Some(ServiceId {
            ps: PortSpace::Udp,
            port: 7174
        })
    );
    assert_eq!(s.qkey, 0x0123_4567, "RDMA_UDP_QKEY");
    let again = CmMad {
        tid: m.tid,
        msg: CmMessage::SidrRep(s),
    }
    .emit()
    .unwrap();
    assert_eq!(again.to_vec(), raw);
}

#[test]
fn rxe_rej_timeout() {
    let (m, raw) = mad(REJ_V6);
    let CmMessage::Rej(r) = m.msg else {
        panic!("{:?}", m.msg)
    };
    // The active side gave up on a REQ nobody answered: no remote ID, "other" message,
    // reason Timeout with its CA GUID as ARI (IBA 12.6.7.2), which is how softverbs' CM finds
    // the request it holds.
    assert_eq!((r.local_comm_id, r.remote_comm_id), (0x6985_ff7f, 0));
    assert_eq!((r.message_rejected, r.reason), (2, RejReason::TIMEOUT));
    assert_eq!(r.info_length, 8);
    assert_eq!(r.ari[..8], 0x5054_00ff_fe37_0002u64.to_be_bytes());
    let again = CmMad {
        tid: m.tid,
        msg: CmMessage::Rej(r),
    }
    .emit()
    .unwrap();
    assert_eq!(again.to_vec(), raw);
}
