//! The RoCE v2 test vectors of docs/design/roce-wire.md §7 (IPv4 header onward, last
//! 4 bytes = ICRC), checked three ways: ICRC verification, parsing, and re-synthesis from
//! our own emitters byte for byte.

use std::net::{Ipv4Addr, Ipv6Addr};

use softverbs_wire::ip::{self, IpRepr, Ipv4Repr, Ipv6Repr, UdpRepr, ROCE_V2_UDP_PORT};
use softverbs_wire::{
    emit_roce_v2, icrc, parse_roce_v2, roce_v2_len, AethRepr, Opcode, PacketBuilder, Syndrome,
    WireError, XrcethRepr,
};

/// XRC SEND_ONLY (0xA4), DestQP 0x11, PSN 0x100, AckReq, XRCETH srqn 0x000123, 16 B payload.
const XRC_SEND_ONLY: &str = "4502004012344000401114750a0000010a000002c00112b7002c0000a400ffff00000011800001000000012368656c6c6f2d7872632d776f726c64216dcf2819";
/// RC SEND_ONLY (0x04), same QP, PSN 0x101.
const RC_SEND_ONLY: &str = "4502003c12344000401114790a0000010a000002c00112b7002800000400ffff000000118000010168656c6c6f2d7872632d776f726c6421a2eae17b";
/// RC ACK (0x11), RNR-NAK syndrome 0x2E (timer 1.28 ms), MSN 5.
const RC_RNR_NAK: &str = "4502003012344000401114850a0000020a000001c00112b7001c00001100ffff00000044000001012e00000563665a7e";

const VECTORS: [&str; 3] = [XRC_SEND_ONLY, RC_SEND_ONLY, RC_RNR_NAK];

fn hex(s: &str) -> Vec<u8> {
    assert_eq!(s.len() % 2, 0);
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn ip(src: [u8; 4], dst: [u8; 4]) -> IpRepr {
    IpRepr::V4(Ipv4Repr {
        tos: 0x02,
        identification: 0x1234,
        ..Ipv4Repr::new(Ipv4Addr::from(src), Ipv4Addr::from(dst))
    })
}

const UDP: UdpRepr = UdpRepr {
    src_port: 0xC001,
    dst_port: ROCE_V2_UDP_PORT,
};

fn synthesize(ip: &IpRepr, b: &PacketBuilder<'_>, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; roce_v2_len(ip, b.headers(), payload.len())];
    let n = emit_roce_v2(ip, &UDP, b.headers(), payload, &mut buf).unwrap();
    assert_eq!(n, buf.len());
    buf
}

#[test]
fn every_vector_verifies_and_computes_to_its_trailer() {
    for v in VECTORS {
        let bytes = hex(v);
        icrc::verify_datagram(&bytes).unwrap();
        let (ip_udp, ib) = ip::split_ip_udp(&bytes).unwrap();
        let body = &ib[..ib.len() - 4];
        let wire = u32::from_le_bytes(ib[ib.len() - 4..].try_into().unwrap());
        assert_eq!(icrc::compute(ip_udp, body).unwrap(), wire);
        // The reference's own reading: RC SEND_ONLY's trailer is 0x7be1eaa2 as an LE u32.
        if v == RC_SEND_ONLY {
            assert_eq!(wire, 0x7be1_eaa2);
        }
    }
}

#[test]
fn write_fills_the_trailer() {
    for v in VECTORS {
        let expected = hex(v);
        let mut bytes = expected.clone();
        let n = bytes.len();
        bytes[n - 4..].fill(0);
        let (ip_udp, ib) = bytes.split_at_mut(28);
        icrc::write(ip_udp, ib).unwrap();
        assert_eq!(bytes, expected);
    }
}

#[test]
fn any_flipped_bit_of_an_invariant_byte_is_caught() {
    let good = hex(XRC_SEND_ONLY);
    // Bytes the ICRC deliberately ignores: IPv4 TOS, TTL, checksum; UDP checksum; BTH byte 4.
    let variant = [1usize, 8, 10, 11, 26, 27, 28 + 4];
    for i in 0..good.len() - 4 {
        let mut bad = good.clone();
        bad[i] ^= 0x01;
        let (ip_udp, ib) = bad.split_at(28);
        let result = icrc::verify(ip_udp, ib);
        if variant.contains(&i) {
            assert_eq!(result, Ok(()), "byte {i} is variant");
        } else if i == 0 {
            // Version/IHL: the headers no longer describe themselves, caught before the CRC.
            assert!(matches!(result, Err(WireError::MalformedIpUdp { .. })));
        } else {
            assert!(
                matches!(result, Err(WireError::IcrcMismatch { .. })),
                "byte {i}"
            );
        }
    }
    // A flipped ICRC byte (the reference's "frame 2").
    let mut bad = good.clone();
    let n = bad.len();
    bad[n - 4] ^= 0x5A;
    assert_eq!(
        icrc::verify_datagram(&bad),
        Err(WireError::IcrcMismatch {
            computed: 0x1928_cf6d,
            found: 0x1928_cf37
        })
    );
}

#[test]
fn variant_fields_do_not_change_the_icrc() {
    // The reference's "frame 10": TOS 3, TTL 7, FECN = BECN = 1, same ICRC as frame 1.
    let mut bytes = hex(XRC_SEND_ONLY);
    bytes[1] = 0x03;
    bytes[8] = 0x07;
    bytes[28 + 4] |= 0xC0;
    icrc::verify_datagram(&bytes).unwrap();
    let parsed = parse_roce_v2(&bytes).unwrap();
    assert!(parsed.packet.headers.bth.fecn && parsed.packet.headers.bth.becn);
}

#[test]
fn vectors_parse_to_the_documented_fields() {
    let d = hex(XRC_SEND_ONLY);
    let p = parse_roce_v2(&d).unwrap().packet;
    assert_eq!(p.opcode(), Opcode(0xA4));
    assert_eq!(
        (
            p.headers.bth.dest_qp,
            p.headers.bth.psn,
            p.headers.bth.ack_req
        ),
        (0x11, 0x100, true)
    );
    assert_eq!(p.headers.xrceth, Some(XrcethRepr { xrc_srq: 0x123 }));
    assert_eq!(p.payload, b"hello-xrc-world!");
    assert_eq!(p.icrc, 0x1928_cf6d);

    let d = hex(RC_SEND_ONLY);
    let p = parse_roce_v2(&d).unwrap().packet;
    assert_eq!((p.opcode(), p.headers.bth.psn), (Opcode(0x04), 0x101));
    assert_eq!(p.headers.xrceth, None);
    assert_eq!(p.payload, b"hello-xrc-world!");

    let d = hex(RC_RNR_NAK);
    let p = parse_roce_v2(&d).unwrap().packet;
    assert_eq!(
        (p.opcode(), p.headers.bth.dest_qp, p.headers.bth.psn),
        (Opcode(0x11), 0x44, 0x101)
    );
    assert_eq!(
        p.headers.aeth,
        Some(AethRepr {
            syndrome: Syndrome::RnrNak { timer: 14 },
            msn: 5
        })
    );
    assert_eq!(softverbs_wire::rnr_timer_micros(14), Some(1280));
    assert!(p.payload.is_empty());
}

#[test]
fn vectors_are_resynthesized_byte_for_byte() {
    let payload = b"hello-xrc-world!";
    let xrc = PacketBuilder::new(Opcode(0xA4), 0x11, 0x100)
        .ack_req(true)
        .xrceth(0x123);
    assert_eq!(
        synthesize(&ip([10, 0, 0, 1], [10, 0, 0, 2]), &xrc, payload),
        hex(XRC_SEND_ONLY)
    );

    let rc = PacketBuilder::new(Opcode(0x04), 0x11, 0x101).ack_req(true);
    assert_eq!(
        synthesize(&ip([10, 0, 0, 1], [10, 0, 0, 2]), &rc, payload),
        hex(RC_SEND_ONLY)
    );

    let nak = PacketBuilder::new(Opcode(0x11), 0x44, 0x101).aeth(Syndrome::RnrNak { timer: 14 }, 5);
    assert_eq!(
        synthesize(&ip([10, 0, 0, 2], [10, 0, 0, 1]), &nak, &[]),
        hex(RC_RNR_NAK)
    );
}

#[test]
fn ipv6_datagram_round_trips_and_masks_its_variant_fields() {
    let v6 = Ipv6Repr {
        traffic_class: 0x02,
        flow_label: 0x12345,
        ..Ipv6Repr::new(
            Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1),
            Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2),
        )
    };
    let b = PacketBuilder::new(Opcode(0xAB), 0x11, 0x200)
        .xrceth(0x123)
        .reth(0x1000, 0xABCD, 5)
        .imm(0xFEED_FACE);
    let mut bytes = synthesize(&IpRepr::V6(v6), &b, b"12345");
    let parsed = parse_roce_v2(&bytes).unwrap();
    assert_eq!(parsed.packet.payload, b"12345");
    assert_eq!(parsed.packet.headers.imm_dt.unwrap().imm, 0xFEED_FACE);

    // Traffic class, flow label, hop limit and UDP checksum are variant.
    bytes[0] = 0x6F;
    bytes[1..4].copy_from_slice(&[0xAB, 0xCD, 0xEF]);
    bytes[7] = 1;
    bytes[46] ^= 0xFF;
    icrc::verify_datagram(&bytes).unwrap();
    // Addresses are not.
    bytes[23] ^= 1;
    assert!(matches!(
        icrc::verify_datagram(&bytes),
        Err(WireError::IcrcMismatch { .. })
    ));
}

#[test]
fn icrc_input_errors() {
    let d = hex(RC_SEND_ONLY);
    let (ip_udp, ib) = d.split_at(28);
    assert!(matches!(
        icrc::compute(&ip_udp[..27], ib),
        Err(WireError::MalformedIpUdp { .. })
    ));
    assert!(matches!(
        icrc::compute(&[], ib),
        Err(WireError::Truncated { .. })
    ));
    let mut v7 = ip_udp.to_vec();
    v7[0] = 0x75;
    assert!(matches!(
        icrc::compute(&v7, ib),
        Err(WireError::MalformedIpUdp { .. })
    ));
    assert!(matches!(
        icrc::verify(ip_udp, &ib[..10]),
        Err(WireError::Truncated {
            needed: 12,
            available: 10,
            ..
        })
    ));
    assert!(matches!(
        icrc::verify(ip_udp, &ib[..14]),
        Err(WireError::Truncated {
            needed: 4,
            available: 2,
            ..
        })
    ));
}
