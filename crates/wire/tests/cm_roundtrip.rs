//! Property tests of the CM MAD format: every message with in-range fields emits and parses
//! back to itself, and any bytes that parse re-emit to bytes that parse to the same message.

use proptest::prelude::*;
use softverbs_wire::cm::msg::*;
use softverbs_wire::cm::{CmMad, CmMessage, CmaHdr, PortSpace, ServiceId, MAD_LEN};

fn arr<const N: usize>() -> impl Strategy<Value = [u8; N]> {
    prop::collection::vec(any::<u8>(), N).prop_map(|v| v.try_into().unwrap())
}

fn bits(n: u32) -> impl Strategy<Value = u8> {
    0u8..=((1u16 << n) - 1) as u8
}

fn u24() -> impl Strategy<Value = u32> {
    0u32..(1 << 24)
}

fn path() -> impl Strategy<Value = PathInfo> {
    (
        (any::<u16>(), any::<u16>(), arr::<16>(), arr::<16>()),
        (0u32..(1 << 20), bits(6), any::<u8>(), any::<u8>()),
        (bits(4), any::<bool>(), bits(5)),
    )
        .prop_map(
            |((ll, rl, lg, rg), (fl, pr, tc, hl), (sl, sub, ack))| PathInfo {
                local_lid: ll,
                remote_lid: rl,
                local_gid: lg,
                remote_gid: rg,
                flow_label: fl,
                packet_rate: pr,
                traffic_class: tc,
                hop_limit: hl,
                sl,
                subnet_local: sub,
                local_ack_timeout: ack,
            },
        )
}

fn req() -> impl Strategy<Value = Req> {
    (
        (any::<u32>(), any::<u64>(), any::<u64>(), any::<u32>()),
        (u24(), any::<u8>(), u24(), any::<u8>(), u24()),
        (bits(5), bits(2), any::<bool>(), u24(), bits(5), bits(3)),
        (
            any::<u16>(),
            bits(4),
            any::<bool>(),
            bits(3),
            bits(4),
            any::<bool>(),
            bits(3),
        ),
        (path(), path(), any::<bool>(), arr::<REQ_PRIVATE_DATA>()),
    )
        .prop_map(|(a, b, c, d, e)| Req {
            local_comm_id: a.0,
            service_id: a.1,
            local_ca_guid: a.2,
            local_qkey: a.3,
            local_qpn: b.0,
            responder_resources: b.1,
            local_eecn: b.2,
            initiator_depth: b.3,
            remote_eecn: b.4,
            remote_cm_response_timeout: c.0,
            transport_service_type: c.1,
            end_to_end_flow_control: c.2,
            starting_psn: c.3,
            local_cm_response_timeout: c.4,
            retry_count: c.5,
            pkey: d.0,
            path_mtu: d.1,
            rdc_exists: d.2,
            rnr_retry_count: d.3,
            max_cm_retries: d.4,
            srq: d.5,
            extended_transport_type: d.6,
            primary: e.0,
            alternate: e.1,
            sap_supported: e.2,
            private_data: e.3,
        })
}

fn rep() -> impl Strategy<Value = Rep> {
    (
        (
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            u24(),
            u24(),
            u24(),
        ),
        (
            any::<u8>(),
            any::<u8>(),
            bits(5),
            bits(2),
            any::<bool>(),
            bits(3),
            any::<bool>(),
        ),
        (any::<u64>(), arr::<REP_PRIVATE_DATA>()),
    )
        .prop_map(|(a, b, c)| Rep {
            local_comm_id: a.0,
            remote_comm_id: a.1,
            local_qkey: a.2,
            local_qpn: a.3,
            local_eecn: a.4,
            starting_psn: a.5,
            responder_resources: b.0,
            initiator_depth: b.1,
            target_ack_delay: b.2,
            failover_accepted: b.3,
            end_to_end_flow_control: b.4,
            rnr_retry_count: b.5,
            srq: b.6,
            local_ca_guid: c.0,
            private_data: c.1,
        })
}

fn message() -> impl Strategy<Value = CmMessage> {
    prop_oneof![
        req().prop_map(|m| CmMessage::Req(Box::new(m))),
        (
            any::<u32>(),
            any::<u32>(),
            bits(2),
            bits(5),
            arr::<MRA_PRIVATE_DATA>()
        )
            .prop_map(|(l, r, t, s, p)| CmMessage::Mra(Box::new(Mra {
                local_comm_id: l,
                remote_comm_id: r,
                message_mraed: t,
                service_timeout: s,
                private_data: p,
            }))),
        (
            any::<u32>(),
            any::<u32>(),
            bits(2),
            bits(7),
            any::<u16>(),
            arr::<REJ_ARI>(),
            arr::<REJ_PRIVATE_DATA>()
        )
            .prop_map(|(l, r, t, n, why, ari, p)| CmMessage::Rej(Box::new(Rej {
                local_comm_id: l,
                remote_comm_id: r,
                message_rejected: t,
                info_length: n,
                reason: RejReason(why),
                ari,
                private_data: p,
            }))),
        rep().prop_map(|m| CmMessage::Rep(Box::new(m))),
        (any::<u32>(), any::<u32>(), arr::<RTU_PRIVATE_DATA>()).prop_map(|(l, r, p)| {
            CmMessage::Rtu(Box::new(Rtu {
                local_comm_id: l,
                remote_comm_id: r,
                private_data: p,
            }))
        }),
        (
            any::<u32>(),
            any::<u32>(),
            u24(),
            arr::<DREQ_PRIVATE_DATA>()
        )
            .prop_map(|(l, r, q, p)| CmMessage::Dreq(Box::new(Dreq {
                local_comm_id: l,
                remote_comm_id: r,
                remote_qpn: q,
                private_data: p,
            }))),
        (any::<u32>(), any::<u32>(), arr::<DREP_PRIVATE_DATA>()).prop_map(|(l, r, p)| {
            CmMessage::Drep(Box::new(Drep {
                local_comm_id: l,
                remote_comm_id: r,
                private_data: p,
            }))
        }),
        (
            any::<u32>(),
            any::<u16>(),
            any::<u64>(),
            arr::<SIDR_REQ_PRIVATE_DATA>()
        )
            .prop_map(|(id, pkey, sid, p)| CmMessage::SidrReq(Box::new(SidrReq {
                request_id: id,
                pkey,
                service_id: sid,
                private_data: p,
            }))),
        (
            (any::<u32>(), any::<u8>(), any::<u8>(), u24()),
            (
                any::<u64>(),
                any::<u32>(),
                arr::<SIDR_REP_INFO>(),
                arr::<SIDR_REP_PRIVATE_DATA>()
            )
        )
            .prop_map(|(a, b)| CmMessage::SidrRep(Box::new(SidrRep {
                request_id: a.0,
                status: SidrStatus(a.1),
                info_length: a.2,
                qpn: a.3,
                service_id: b.0,
                qkey: b.1,
                info: b.2,
                private_data: b.3,
            }))),
    ]
}

proptest! {
    #[test]
    fn every_message_round_trips(tid in any::<u64>(), msg in message()) {
        let mad = CmMad { tid, msg };
        let bytes = mad.emit().unwrap();
        prop_assert_eq!(bytes.len(), MAD_LEN);
        prop_assert_eq!(CmMad::parse(&bytes).unwrap(), mad);
    }

    #[test]
    fn parsed_bytes_re_emit(mut bytes in prop::collection::vec(any::<u8>(), MAD_LEN..300),
                            attr in 0x10u16..=0x19) {
        // Make the header plausible so most cases reach the message parsers.
        bytes[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
        bytes[16..18].copy_from_slice(&attr.to_be_bytes());
        match CmMad::parse(&bytes) {
            Ok(mad) => {
                let again = mad.emit().unwrap();
                prop_assert_eq!(CmMad::parse(&again).unwrap(), mad);
            }
            Err(e) => prop_assert_eq!(attr, 0x19, "only LAP is refused: {}", e),
        }
    }

    #[test]
    fn service_ids_round_trip(port in any::<u16>(), ps in prop_oneof![
        Just(PortSpace::Ipoib), Just(PortSpace::Tcp), Just(PortSpace::Udp), Just(PortSpace::Ib)]) {
        let sid = ServiceId { ps, port };
        prop_assert_eq!(ServiceId::from_u64(sid.to_u64()), Some(sid));
    }

    #[test]
    fn cma_hdr_round_trips(port in any::<u16>(), v6 in any::<bool>(),
                           a in any::<[u8; 16]>(), b in any::<[u8; 16]>()) {
        let (src, dst) = if v6 {
            (std::net::IpAddr::from(a), std::net::IpAddr::from(b))
        } else {
            (std::net::IpAddr::from([a[0], a[1], a[2], a[3]]),
             std::net::IpAddr::from([b[0], b[1], b[2], b[3]]))
        };
        let h = CmaHdr { src_port: port, src, dst };
        let mut buf = [0u8; REQ_PRIVATE_DATA];
        h.emit(&mut buf).unwrap();
        prop_assert_eq!(CmaHdr::parse(&buf).unwrap(), h);
    }
}
