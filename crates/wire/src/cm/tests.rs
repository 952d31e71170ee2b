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
