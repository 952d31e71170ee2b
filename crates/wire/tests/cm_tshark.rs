//! Wireshark decodes the crate's CM MADs as InfiniBand CM: one frame of each of the nine
//! messages, sent as UD SENDs to QP1 the way the daemon sends them (IPv4 and IPv6), must show
//! the right AttributeID and fields, the rdma_cm address header, and nothing malformed.
//!
//! Needs `tshark`; skipped with a message without it (failing under CI instead).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::time::Duration;

use softverbs_testkit::{frame_numbers, tshark, tshark_available};
use softverbs_wire::cm::msg::*;
use softverbs_wire::cm::{gsi_headers, CmMad, CmMessage, CmaHdr, PortSpace, ServiceId};
use softverbs_wire::ip::{IpRepr, Ipv4Repr, Ipv6Repr, UdpRepr, ROCE_V2_UDP_PORT};
use softverbs_wire::pcap::{self, PcapWriter};

fn gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn messages(src: IpAddr, dst: IpAddr) -> Vec<CmMessage> {
    let mut pd = [0u8; REQ_PRIVATE_DATA];
    CmaHdr {
        src_port: 40000,
        src,
        dst,
    }
    .emit(&mut pd)
    .unwrap();
    pd[36..41].copy_from_slice(b"hello");
    let sid = ServiceId {
        ps: PortSpace::Tcp,
        port: 7174,
    }
    .to_u64();
    let path = PathInfo {
        local_lid: 0xFFFF,
        remote_lid: 0xFFFF,
        local_gid: gid(src),
        remote_gid: gid(dst),
        hop_limit: 64,
        local_ack_timeout: 14,
        ..PathInfo::default()
    };
    let mut sidr_pd = [0u8; SIDR_REQ_PRIVATE_DATA];
    sidr_pd[..REQ_PRIVATE_DATA].copy_from_slice(&pd);
    vec![
        CmMessage::Req(Box::new(Req {
            local_comm_id: 0x0101,
            service_id: sid,
            local_ca_guid: 0x0200_00ff_fe00_0001,
            local_qkey: 0,
            local_qpn: 0x11,
            responder_resources: 1,
            local_eecn: 0,
            initiator_depth: 1,
            remote_eecn: 0,
            remote_cm_response_timeout: 20,
            transport_service_type: 0,
            end_to_end_flow_control: true,
            starting_psn: 0x1234,
            local_cm_response_timeout: 20,
            retry_count: 7,
            pkey: 0xFFFF,
            path_mtu: 3,
            rdc_exists: false,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: false,
            extended_transport_type: 0,
            primary: path,
            alternate: PathInfo::default(),
            sap_supported: false,
            private_data: pd,
        })),
        CmMessage::Mra(Box::new(Mra {
            local_comm_id: 0x0202,
            remote_comm_id: 0x0101,
            message_mraed: target::REQ,
            service_timeout: 18,
            private_data: [0; MRA_PRIVATE_DATA],
        })),
        CmMessage::Rep(Box::new(Rep {
            local_comm_id: 0x0202,
            remote_comm_id: 0x0101,
            local_qkey: 0,
            local_qpn: 0x22,
            local_eecn: 0,
            starting_psn: 0x5678,
            responder_resources: 1,
            initiator_depth: 1,
            target_ack_delay: 0,
            failover_accepted: 0,
            end_to_end_flow_control: true,
            rnr_retry_count: 7,
            srq: false,
            local_ca_guid: 0x0200_00ff_fe00_0002,
            private_data: [0; REP_PRIVATE_DATA],
        })),
        CmMessage::Rtu(Box::new(Rtu {
            local_comm_id: 0x0101,
            remote_comm_id: 0x0202,
            private_data: [0; RTU_PRIVATE_DATA],
        })),
        CmMessage::Dreq(Box::new(Dreq {
            local_comm_id: 0x0101,
            remote_comm_id: 0x0202,
            remote_qpn: 0x22,
            private_data: [0; DREQ_PRIVATE_DATA],
        })),
        CmMessage::Drep(Box::new(Drep {
            local_comm_id: 0x0202,
            remote_comm_id: 0x0101,
            private_data: [0; DREP_PRIVATE_DATA],
        })),
        CmMessage::Rej(Box::new(Rej {
            local_comm_id: 0,
            remote_comm_id: 0x0303,
            message_rejected: target::REQ,
            info_length: 0,
            reason: RejReason::INVALID_SERVICE_ID,
            ari: [0; REJ_ARI],
            private_data: [0; REJ_PRIVATE_DATA],
        })),
        CmMessage::SidrReq(Box::new(SidrReq {
            request_id: 0x0404,
            pkey: 0xFFFF,
            service_id: ServiceId {
                ps: PortSpace::Udp,
                port: 7174,
            }
            .to_u64(),
            private_data: sidr_pd,
        })),
        CmMessage::SidrRep(Box::new(SidrRep {
            request_id: 0x0404,
            status: SidrStatus::SUCCESS,
            info_length: 0,
            qpn: 0x33,
            service_id: 0x0111_1C06,
            qkey: 0x0111_1C06,
            info: [0; SIDR_REP_INFO],
            private_data: [0; SIDR_REP_PRIVATE_DATA],
        })),
    ]
}

#[test]
fn tshark_decodes_cm_mads() {
    let Some(version) = tshark_available() else {
        return;
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("softverbs-wire-cm-tshark-{}", std::process::id()));
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let cap = dir.join("cm.pcap");

    let v4 = (
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
    );
    let v6 = (
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1)),
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2)),
    );
    let mut attrs = Vec::new();
    {
        let mut w = PcapWriter::new(std::fs::File::create(&cap).unwrap()).unwrap();
        let mut n = 0u32;
        for (src, dst) in [v4, v6] {
            let ip = match (src, dst) {
                (IpAddr::V4(s), IpAddr::V4(d)) => IpRepr::V4(Ipv4Repr::new(s, d)),
                (IpAddr::V6(s), IpAddr::V6(d)) => IpRepr::V6(Ipv6Repr::new(s, d)),
                _ => unreachable!(),
            };
            for msg in messages(src, dst) {
                attrs.push(msg.attr_id() as u16);
                let mad = CmMad {
                    tid: 0x1000 + u64::from(n),
                    msg,
                }
                .emit()
                .unwrap();
                let udp = UdpRepr {
                    src_port: 0xC000 + n as u16,
                    dst_port: ROCE_V2_UDP_PORT,
                };
                let frame =
                    pcap::roce_v2_frame_from_headers(&ip, &udp, &gsi_headers(n), &mad).unwrap();
                w.write_frame(Duration::from_secs(1_764_000_000 + u64::from(n)), &frame)
                    .unwrap();
                n += 1;
            }
        }
    }

    let fields = tshark(
        &cap,
        &home,
        &[
            "-T",
            "fields",
            "-E",
            "separator=/t",
            "-e",
            "frame.number",
            "-e",
            "_ws.malformed",
            "-e",
            "infiniband.bth.destqp",
            "-e",
            "infiniband.deth.q_key",
            "-e",
            "infiniband.mad.mgmtclass",
            "-e",
            "infiniband.mad.attributeid",
            "-e",
            "softverbs.icrc.status",
        ],
    );
    eprintln!("{version}\n{fields}");
    let rows: Vec<Vec<&str>> = fields.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(rows.len(), attrs.len());
    for (row, attr) in rows.iter().zip(&attrs) {
        assert_eq!(row[1], "", "malformed: {row:?}");
        assert_eq!(row[2], "0x000001", "DestQP: {row:?}");
        assert_eq!(row[3], "0x0000000080010000", "Q_Key: {row:?}");
        assert_eq!(row[4], "0x07", "CM class: {row:?}");
        assert_eq!(
            u16::from_str_radix(row[5].trim_start_matches("0x"), 16).unwrap(),
            *attr
        );
        assert_eq!(row[6], "good", "ICRC: {row:?}");
    }

    let frames_where = |filter: &str| {
        frame_numbers(&tshark(
            &cap,
            &home,
            &["-Y", filter, "-T", "fields", "-e", "frame.number"],
        ))
    };
    assert_eq!(
        frames_where("_ws.malformed || _ws.expert.severity >= error || _ws.lua.error"),
        Vec::<usize>::new()
    );
    // Wireshark reads rdma_cm's address header out of the REQ's private data.
    assert_eq!(
        frames_where("infiniband.cm.req.ip_cm.sip4 == 10.0.0.1 && infiniband.cm.req.ip_cm.dip4 == 10.0.0.2 && infiniband.cm.req.ip_cm.sport == 40000"),
        vec![1]
    );
    assert_eq!(
        frames_where("infiniband.cm.req.ip_cm.dip6 == fd00::2"),
        vec![10]
    );
    assert_eq!(
        frames_where("infiniband.cm.req.serviceid.dport == 7174"),
        vec![1, 10]
    );
    assert_eq!(frames_where("infiniband.cm.rej.reason == 8"), vec![7, 16]);
    assert_eq!(
        frames_where("infiniband.cm.rep.localqpn == 0x22"),
        vec![3, 12]
    );
    std::fs::remove_dir_all(&dir).ok();
}
