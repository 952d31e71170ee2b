//! Byte positions checked against IBA 12.6 tables 106–120 on hand-built messages.

use super::msg::*;
use super::*;

fn req() -> Req {
    Req {
        local_comm_id: 0x1122_3344,
        service_id: ServiceId {
            ps: PortSpace::Tcp,
            port: 7174,
        }
        .to_u64(),
        local_ca_guid: 0x0102_0304_0506_0708,
        local_qkey: 0,
        local_qpn: 0x00AB_CDEF,
        responder_resources: 4,
        local_eecn: 0,
        initiator_depth: 8,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport_service_type: 0,
        end_to_end_flow_control: true,
        starting_psn: 0x0012_3456,
        local_cm_response_timeout: 18,
        retry_count: 7,
        pkey: 0xFFFF,
        path_mtu: 5,
        rdc_exists: false,
        rnr_retry_count: 6,
        max_cm_retries: 15,
        srq: true,
        extended_transport_type: 0,
        primary: PathInfo {
            local_lid: 0xFFFF,
            remote_lid: 0xFFFF,
            local_gid: [1; 16],
            remote_gid: [2; 16],
            flow_label: 0xABCDE,
            packet_rate: 0x3F,
            traffic_class: 0x10,
            hop_limit: 64,
            sl: 3,
            subnet_local: true,
            local_ack_timeout: 14,
        },
        alternate: PathInfo::default(),
        sap_supported: true,
        private_data: private_data(b"hello").unwrap(),
    }
}

#[test]
fn req_byte_positions() {
    let mad = CmMad {
        tid: 0xDEAD_BEEF,
        msg: CmMessage::Req(Box::new(req())),
    };
    let b = mad.emit().unwrap();
    assert_eq!(&b[..4], &[1, 0x07, 2, 0x03]);
    assert_eq!(&b[16..18], &[0x00, 0x10], "AttributeID REQ");
    let d = &b[24..];
    assert_eq!(&d[0..4], &[0x11, 0x22, 0x33, 0x44]);
    assert_eq!(&d[8..16], &[0, 0, 0, 0, 0x01, 0x06, 0x1C, 0x06]);
    assert_eq!(&d[32..36], &[0xAB, 0xCD, 0xEF, 4]);
    assert_eq!(d[39], 8);
    assert_eq!(d[43], 20 << 3 | 1);
    assert_eq!(&d[44..48], &[0x12, 0x34, 0x56, 18 << 3 | 7]);
    assert_eq!(d[50], 5 << 4 | 6);
    assert_eq!(d[51], 15 << 4 | 1 << 3);
    assert_eq!(&d[52..56], &[0xFF; 4]);
    assert_eq!(&d[56..72], &[1; 16]);
    assert_eq!(&d[72..88], &[2; 16]);
    assert_eq!(&d[88..92], &[0xAB, 0xCD, 0xE0, 0x3F]);
    assert_eq!(&d[92..96], &[0x10, 64, 3 << 4 | 1 << 3, 14 << 3]);
    assert_eq!(
        d[139],
        1 << 2,
        "SAP Supported lives in the alternate path's last byte"
    );
    assert_eq!(&d[140..145], b"hello");
    assert_eq!(CmMad::parse(&b), Ok(mad));
}

#[test]
fn rep_and_sidr_rep_positions() {
    let rep = Rep {
        local_comm_id: 1,
        remote_comm_id: 2,
        local_qkey: 3,
        local_qpn: 0x0A0B0C,
        local_eecn: 0,
        starting_psn: 0x010203,
        responder_resources: 5,
        initiator_depth: 6,
        target_ack_delay: 31,
        failover_accepted: 2,
        end_to_end_flow_control: true,
        rnr_retry_count: 7,
        srq: true,
        local_ca_guid: 9,
        private_data: private_data(b"rep").unwrap(),
    };
    let mut d = [0u8; CM_DATA_LEN];
    CmMessage::Rep(Box::new(rep)).emit(&mut d).unwrap();
    assert_eq!(&d[12..16], &[0x0A, 0x0B, 0x0C, 0]);
    assert_eq!(
        &d[20..28],
        &[1, 2, 3, 0, 5, 6, 31 << 3 | 2 << 1 | 1, 7 << 5 | 1 << 4]
    );
    assert_eq!(&d[36..39], b"rep");

    let sidr = SidrRep {
        request_id: 7,
        status: SidrStatus::SUCCESS,
        info_length: 0,
        qpn: 0x112233,
        service_id: 0x0111_0001,
        qkey: 0x8001_0000,
        info: [0; SIDR_REP_INFO],
        private_data: [0; SIDR_REP_PRIVATE_DATA],
    };
    CmMessage::SidrRep(Box::new(sidr)).emit(&mut d).unwrap();
    assert_eq!(&d[8..12], &[0x11, 0x22, 0x33, 0]);
    assert_eq!(&d[20..24], &[0x80, 0x01, 0, 0]);
}

#[test]
fn rejects_what_is_not_a_cm_mad() {
    let good = CmMad {
        tid: 1,
        msg: CmMessage::Req(Box::new(req())),
    }
    .emit()
    .unwrap();
    assert_eq!(
        CmMad::parse(&good[..255]),
        Err(CmWireError::Truncated { available: 255 })
    );
    let mut b = good;
    b[0] = 2;
    assert_eq!(CmMad::parse(&b), Err(CmWireError::BaseVersion(2)));
    let mut b = good;
    b[1] = 0x81;
    assert_eq!(CmMad::parse(&b), Err(CmWireError::NotCm(0x81)));
    let mut b = good;
    b[2] = 1;
    assert_eq!(CmMad::parse(&b), Err(CmWireError::ClassVersion(1)));
    let mut b = good;
    b[3] = 0x81;
    assert_eq!(CmMad::parse(&b), Err(CmWireError::Method(0x81)));
    let mut b = good;
    b[17] = 0x19; // LAP
    assert_eq!(CmMad::parse(&b), Err(CmWireError::Attribute(0x19)));
}

#[test]
fn emit_checks_widths() {
    let mut r = req();
    r.local_qpn = 1 << 24;
    assert!(matches!(
        CmMad {
            tid: 0,
            msg: CmMessage::Req(Box::new(r))
        }
        .emit(),
        Err(CmWireError::Field {
            field: "LocalQPN",
            ..
        })
    ));
    assert!(private_data::<4>(b"12345").is_err());
}

/// A MAD header as the kernel's `cm_format_mad_hdr` writes it: base version 1, class CM,
/// class version 2, method Send, the TID, the attribute; `attr_mod` is ECE's (rdma_cm's
/// `ece.attr_mod`, 0 unless the ULP set one).
fn kernel_hdr(attr: u16, tid: u64, attr_mod: u32) -> Vec<u8> {
    let mut b = vec![1, 0x07, 2, 0x03, 0, 0, 0, 0];
    b.extend_from_slice(&tid.to_be_bytes());
    b.extend_from_slice(&attr.to_be_bytes());
    b.extend_from_slice(&[0, 0]);
    b.extend_from_slice(&attr_mod.to_be_bytes());
    b
}

/// Writes `v`'s low `bytes` bytes big-endian at `at` of the message (after the MAD header).
fn put(m: &mut [u8], at: usize, v: u64, bytes: usize) {
    for i in 0..bytes {
        m[24 + at + i] = (v >> (8 * (bytes - 1 - i))) as u8;
    }
}

/// A REQ laid out byte by byte as the kernel's `cm_format_req` lays out an rdma_cm RC
/// connect over RoCE v2 (offsets from `include/rdma/ibta_vol1_c12.h`, IBA table 106),
/// including what softverbs itself never sends: ECE's vendor ID in bytes 5–7 and a nonzero
/// attribute modifier, a flow label (`cma_get_roce_udp_flow_label`), a packet rate, the
/// local ACK timeout of `cm_ack_timeout(15, CMA_IBOE_PACKET_LIFETIME 16)`. Every field must
/// parse to what the kernel meant; the bytes softverbs does not model are ignored.
#[test]
#[allow(clippy::identity_op)] // fields written as the kernel sets them, zeros included
fn a_req_as_the_kernel_lays_it_out_parses_field_by_field() {
    let mut m = kernel_hdr(0x0010, 0x0000_0001_1122_3344, 0x0000_0001);
    m.resize(MAD_LEN, 0);
    put(&mut m, 0, 0x1122_3344, 4); // Local Communication ID
    put(&mut m, 5, 0x02C9, 3); // Vendor ID (ECE)
    put(&mut m, 8, 0x0000_0000_0106_1C06, 8); // ServiceID: RDMA_PS_TCP, port 7174
    put(&mut m, 16, 0x5254_00FF_FE12_3456, 8); // Local CA GUID (rxe: from the MAC)
    put(&mut m, 28, 0, 4); // Local Q_Key: 0 for RC
    put(&mut m, 32, 0x11, 3); // Local QPN
    m[24 + 35] = 1; // Responder Resources
    m[24 + 39] = 2; // Initiator Depth
    m[24 + 43] = 20 << 3 | 0 << 1 | 1; // Remote CM Response Timeout, RC, flow control
    put(&mut m, 44, 0x00AB_CDEF, 3); // Starting PSN
    m[24 + 47] = 20 << 3 | 7; // Local CM Response Timeout, Retry Count
    put(&mut m, 48, 0xFFFF, 2); // P_Key
    m[24 + 50] = 3 << 4 | 7; // MTU 1024, RDC 0, RNR Retry Count 7
    m[24 + 51] = 15 << 4; // Max CM Retries 15, SRQ 0, extended type 0
    put(&mut m, 52, 0xFFFF, 2); // primary local LID: permissive on RoCE
    put(&mut m, 54, 0xFFFF, 2);
    let gid = |a: [u8; 4]| {
        let mut g = [0u8; 16];
        g[10] = 0xFF;
        g[11] = 0xFF;
        g[12..].copy_from_slice(&a);
        g
    };
    m[24 + 56..24 + 72].copy_from_slice(&gid([10, 0, 0, 2]));
    m[24 + 72..24 + 88].copy_from_slice(&gid([10, 0, 0, 1]));
    put(&mut m, 88, 0x1_2345 << 12 | 3, 4); // Flow Label, Packet Rate 3 (10 Gb/s)
    m[24 + 92] = 0x20; // Traffic Class
    m[24 + 93] = 64; // Hop Limit
    m[24 + 94] = 0; // SL 0, not subnet-local (hop limit > 1)
    m[24 + 95] = 17 << 3; // Local ACK Timeout
                          // Private data: rdma_cm's address header, then the application's bytes.
    m[24 + 140] = 0; // CMA version
    m[24 + 141] = 4 << 4; // IP version
    put(&mut m, 142, 40_000, 2); // the active side's port
    m[24 + 144 + 12..24 + 144 + 16].copy_from_slice(&[10, 0, 0, 2]);
    m[24 + 160 + 12..24 + 160 + 16].copy_from_slice(&[10, 0, 0, 1]);
    m[24 + 176..24 + 179].copy_from_slice(b"app");

    let mad = CmMad::parse(&m).unwrap();
    assert_eq!(mad.tid, 0x0000_0001_1122_3344);
    let CmMessage::Req(r) = mad.msg else {
        panic!("{:?}", mad.msg)
    };
    assert_eq!(r.local_comm_id, 0x1122_3344);
    assert_eq!(
        ServiceId::from_u64(r.service_id),
        Some(ServiceId {
            ps: PortSpace::Tcp,
            port: 7174
        })
    );
    assert_eq!(r.local_ca_guid, 0x5254_00FF_FE12_3456);
    assert_eq!((r.local_qkey, r.local_qpn, r.local_eecn), (0, 0x11, 0));
    assert_eq!((r.responder_resources, r.initiator_depth), (1, 2));
    assert_eq!(r.remote_eecn, 0);
    assert_eq!(r.remote_cm_response_timeout, 20);
    assert_eq!(r.transport_service_type, 0);
    assert!(r.end_to_end_flow_control);
    assert_eq!(r.starting_psn, 0x00AB_CDEF);
    assert_eq!((r.local_cm_response_timeout, r.retry_count), (20, 7));
    assert_eq!(r.pkey, 0xFFFF);
    assert_eq!((r.path_mtu, r.rdc_exists, r.rnr_retry_count), (3, false, 7));
    assert_eq!(
        (r.max_cm_retries, r.srq, r.extended_transport_type),
        (15, false, 0)
    );
    let p = r.primary;
    assert_eq!((p.local_lid, p.remote_lid), (0xFFFF, 0xFFFF));
    assert_eq!(p.local_gid, gid([10, 0, 0, 2]));
    assert_eq!(p.remote_gid, gid([10, 0, 0, 1]));
    assert_eq!((p.flow_label, p.packet_rate), (0x1_2345, 3));
    assert_eq!((p.traffic_class, p.hop_limit, p.sl), (0x20, 64, 0));
    assert!(!p.subnet_local);
    assert_eq!(p.local_ack_timeout, 17);
    assert_eq!(r.alternate, PathInfo::default());
    assert!(!r.sap_supported);
    let h = CmaHdr::parse(&r.private_data).unwrap();
    assert_eq!(h.src_port, 40_000);
    assert_eq!(h.src, std::net::IpAddr::from([10, 0, 0, 2]));
    assert_eq!(h.dst, std::net::IpAddr::from([10, 0, 0, 1]));
    assert_eq!(&r.private_data[36..39], b"app");

    // softverbs writes the same bytes back, except what it does not model (vendor ID and
    // attribute modifier, both ECE, which a kernel without ECE leaves zero).
    let mut again = CmMad {
        tid: mad.tid,
        msg: CmMessage::Req(r),
    }
    .emit()
    .unwrap();
    again[24 + 5..24 + 8].copy_from_slice(&[0x00, 0x02, 0xC9]);
    again[20..24].copy_from_slice(&1u32.to_be_bytes());
    assert_eq!(again.to_vec(), m);
}

/// A REP and a SIDR_REP as the kernel's `cm_format_rep` / `cm_format_sidr_rep` lay them
/// out: ECE's vendor ID in the bytes after the 24-bit QPN, EECN and PSN (REP) and around the
/// QPN (SIDR_REP), Target ACK Delay 15 (rxe's `local_ca_ack_delay`), the UDP port space's
/// Q_Key `RDMA_UDP_QKEY`.
#[test]
#[allow(clippy::identity_op)] // fields written as the kernel sets them, zeros included
fn a_rep_and_a_sidr_rep_as_the_kernel_lays_them_out_parse_field_by_field() {
    let mut m = kernel_hdr(0x0013, 0x0000_0001_1122_3344, 0);
    m.resize(MAD_LEN, 0);
    put(&mut m, 0, 0x5566_7788, 4); // Local Communication ID
    put(&mut m, 4, 0x1122_3344, 4); // Remote Communication ID
    put(&mut m, 12, 0x12, 3); // Local QPN; the Vendor ID high byte follows
    m[24 + 15] = 0xAA;
    m[24 + 19] = 0xBB; // Vendor ID middle byte after the EECN
    put(&mut m, 20, 0x0076_5432, 3); // Starting PSN
    m[24 + 23] = 0xCC; // Vendor ID low byte
    m[24 + 24] = 2; // Responder Resources
    m[24 + 25] = 1; // Initiator Depth
    m[24 + 26] = 15 << 3 | 0 << 1 | 1; // Target ACK Delay 15, Failover 0, flow control
    m[24 + 27] = 7 << 5 | 1 << 4; // RNR Retry Count 7, SRQ
    put(&mut m, 28, 0x5254_00FF_FE12_3456, 8);
    let CmMessage::Rep(r) = CmMad::parse(&m).unwrap().msg else {
        panic!()
    };
    assert_eq!(
        (r.local_comm_id, r.remote_comm_id),
        (0x5566_7788, 0x1122_3344)
    );
    assert_eq!((r.local_qkey, r.local_qpn, r.local_eecn), (0, 0x12, 0));
    assert_eq!(r.starting_psn, 0x0076_5432);
    assert_eq!((r.responder_resources, r.initiator_depth), (2, 1));
    assert_eq!((r.target_ack_delay, r.failover_accepted), (15, 0));
    assert!(r.end_to_end_flow_control);
    assert_eq!((r.rnr_retry_count, r.srq), (7, true));
    assert_eq!(r.local_ca_guid, 0x5254_00FF_FE12_3456);

    let mut m = kernel_hdr(0x0018, 0x0000_0001_0000_0007, 0);
    m.resize(MAD_LEN, 0);
    put(&mut m, 0, 7, 4); // RequestID
    m[24 + 4] = 0; // Status: valid
    m[24 + 5] = 0; // Additional Information Length
    put(&mut m, 6, 0xAABB, 2); // Vendor ID high bytes
    put(&mut m, 8, 0x34, 3); // QPN
    m[24 + 11] = 0xCC; // Vendor ID low byte
    put(&mut m, 12, 0x0000_0000_0111_1C09, 8); // ServiceID: RDMA_PS_UDP, port 7177
    put(&mut m, 20, 0x0123_4567, 4); // Q_Key: RDMA_UDP_QKEY
    let CmMessage::SidrRep(s) = CmMad::parse(&m).unwrap().msg else {
        panic!()
    };
    assert_eq!(
        (s.request_id, s.status, s.info_length),
        (7, SidrStatus::SUCCESS, 0)
    );
    assert_eq!(
        (s.qpn, s.service_id, s.qkey),
        (0x34, 0x0111_1C09, 0x0123_4567)
    );
}
