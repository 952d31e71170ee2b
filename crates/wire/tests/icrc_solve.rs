//! The IPv4 identification solver (`icrc::solve_identification`, docs/design/roce-wire.md
//! §6): a receiver on a UDP socket never sees the identification a kernel rxe or a NIC gave
//! a packet, which the ICRC covers.

use std::net::{Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use softverbs_wire::icrc::{self, Received};
use softverbs_wire::ip::{self, IpRepr, Ipv4Repr, Ipv6Repr, UdpRepr};

const UDP: UdpRepr = UdpRepr {
    src_port: 0xC123,
    dst_port: ip::ROCE_V2_UDP_PORT,
};

fn v4(id: u16) -> IpRepr {
    IpRepr::V4(Ipv4Repr {
        identification: id,
        ..Ipv4Repr::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2))
    })
}

/// IP + UDP headers for `ip`, and the IB packet `body` + its ICRC computed over them.
fn packet(ip: &IpRepr, body: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut hdr = [0u8; 64];
    let hl = ip::emit_ip_udp(ip, &UDP, body.len() + 4, &mut hdr).unwrap();
    let mut pkt = body.to_vec();
    pkt.extend_from_slice(&[0; 4]);
    icrc::write(&hdr[..hl], &mut pkt).unwrap();
    (hdr[..hl].to_vec(), pkt)
}

/// The same IPv4 + UDP header with identification `id` (the header checksum left stale:
/// the ICRC masks it).
fn with_id(ip_udp: &[u8], id: u16) -> Vec<u8> {
    let mut h = ip_udp.to_vec();
    h[4..6].copy_from_slice(&id.to_be_bytes());
    h
}

/// Deterministic pseudo-random bytes (xorshift), so a failure names its seed.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

proptest! {
    /// Any identification is found back from a header that shows another, for IB packets
    /// of every length from a bare BTH to a 4096-byte payload with headers.
    #[test]
    fn solves_any_identification(id in any::<u16>(), shown in any::<u16>(),
                                 len in 12usize..4200, seed in any::<u64>()) {
        let (hdr, pkt) = packet(&v4(id), &bytes(seed, len));
        prop_assert_eq!(icrc::solve_identification(&with_id(&hdr, shown), &pkt).unwrap(), Some(id));
        icrc::verify(&hdr, &pkt).unwrap();
    }

    /// `check_received`: the window accepts 0..64 exactly, reports anything else as
    /// unseen, and `solve` accepts it.
    #[test]
    fn policy(id in any::<u16>(), len in 12usize..2000, seed in any::<u64>()) {
        let (_, pkt) = packet(&v4(id), &bytes(seed, len));
        let mut buf = [0u8; 48];
        let window = icrc::check_received(v4(0), &UDP, &pkt, 0, 64, false, &mut buf);
        let solve = icrc::check_received(v4(0), &UDP, &pkt, 0, 64, true, &mut buf);
        if id < 64 {
            prop_assert_eq!(window, Received::Window { ip: v4(id), searched: id != 0 });
            prop_assert_eq!(solve, window);
        } else {
            prop_assert_eq!(window, Received::Unseen { id });
            prop_assert_eq!(solve, Received::Solved { ip: v4(id) });
        }
    }
}

/// A corrupted ICRC, or a packet corrupted anywhere, is rejected by the window: the check
/// there keeps all 32 bits (the same 64 ICRC values a loop over 0..64 accepts).
#[test]
fn window_rejects_corruption() {
    let mut buf = [0u8; 48];
    for seed in 1..200u64 {
        let len = 12 + (seed as usize * 37) % 1500;
        let (_, mut pkt) = packet(&v4((seed % 64) as u16), &bytes(seed, len));
        let bit = (seed as usize * 7919) % (pkt.len() * 8);
        pkt[bit / 8] ^= 1 << (bit % 8);
        let got = icrc::check_received(v4(0), &UDP, &pkt, 0, 64, false, &mut buf);
        assert!(
            !matches!(got, Received::Window { .. } | Received::Solved { .. }),
            "seed {seed}: flipped bit {bit} accepted as {got:?}"
        );
    }
}

/// What "only 16 bits left" means for a single flipped bit: whether the solver takes a
/// flip at a given distance after the identification for another identification depends
/// on that distance alone (x^d mod the CRC polynomial must fall in the identification's
/// span). In an IB packet of up to 4096 bytes of payload plus its largest headers, no
/// single-bit flip after the IPv4 identification is solved: all 35,000-odd positions are
/// rejected, on every packet.
#[test]
fn no_single_bit_flip_is_solved_within_a_4k_packet() {
    let len = 12 + 28 + 4096 + 3;
    for seed in [1u64, 2, 3] {
        let id = bytes(seed, 2);
        let id = u16::from_be_bytes([id[0], id[1]]);
        let (hdr, pkt) = packet(&v4(id), &bytes(seed, len));
        // Bits after the identification: the rest of the IPv4 header (bytes 6..20, the
        // variant TTL and checksum excepted), UDP (its checksum excepted) and the packet.
        let mut solved = Vec::new();
        for at in 6..hdr.len() {
            if matches!(at, 8 | 10 | 11 | 26 | 27) {
                continue;
            }
            for b in 0..8 {
                let mut h = hdr.clone();
                h[at] ^= 1 << b;
                if icrc::solve_identification(&h, &pkt).unwrap().is_some() {
                    solved.push(at * 8 + b);
                }
            }
        }
        for bit in 0..pkt.len() * 8 {
            let mut p = pkt.clone();
            p[bit / 8] ^= 1 << (bit % 8);
            // BTH byte 4 is masked: a flip there changes nothing.
            if bit / 8 == 4 {
                continue;
            }
            if icrc::solve_identification(&hdr, &p).unwrap().is_some() {
                solved.push(hdr.len() * 8 + bit);
            }
        }
        assert_eq!(solved, Vec::<usize>::new(), "seed {seed}");
    }
}

/// A flip inside the identification itself is just another identification.
#[test]
fn identification_flips_solve_to_the_flipped_value() {
    let (hdr, pkt) = packet(&v4(0x7be9), &bytes(9, 300));
    for b in 0..16 {
        let shown = 0x7be9 ^ (1u16 << b);
        assert_eq!(
            icrc::solve_identification(&with_id(&hdr, shown), &pkt).unwrap(),
            Some(0x7be9)
        );
    }
}

/// IPv4 options (IHL > 5) come after the identification and are covered like the rest.
#[test]
fn ipv4_options() {
    let body = bytes(5, 100);
    // IHL 6: four NOP option bytes.
    let mut hdr = vec![0u8; 24 + 8];
    hdr[0] = 0x46;
    let total = (24 + 8 + body.len() + 4) as u16;
    hdr[2..4].copy_from_slice(&total.to_be_bytes());
    hdr[4..6].copy_from_slice(&0xBEEFu16.to_be_bytes());
    hdr[6] = 0x40;
    hdr[8] = 64;
    hdr[9] = 17;
    hdr[12..16].copy_from_slice(&[10, 0, 0, 1]);
    hdr[16..20].copy_from_slice(&[10, 0, 0, 2]);
    hdr[20..24].fill(1);
    hdr[24..26].copy_from_slice(&0xC123u16.to_be_bytes());
    hdr[26..28].copy_from_slice(&4791u16.to_be_bytes());
    hdr[28..30].copy_from_slice(&((8 + body.len() + 4) as u16).to_be_bytes());
    let mut pkt = body.clone();
    pkt.extend_from_slice(&[0; 4]);
    icrc::write(&hdr, &mut pkt).unwrap();
    assert_eq!(
        icrc::solve_identification(&with_id(&hdr, 0), &pkt).unwrap(),
        Some(0xBEEF)
    );
    // An option byte changed is not explained by any identification.
    let mut other = with_id(&hdr, 0);
    other[21] = 0;
    assert_eq!(icrc::solve_identification(&other, &pkt).unwrap(), None);
}

/// IPv6 has no identification: the solver has nothing to solve, the receive check is
/// exact.
#[test]
fn ipv6_is_exact() {
    let ip6 = IpRepr::V6(Ipv6Repr::new(
        Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1),
        Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2),
    ));
    let (hdr, mut pkt) = packet(&ip6, &bytes(3, 500));
    assert_eq!(icrc::solve_identification(&hdr, &pkt).unwrap(), None);
    let mut buf = [0u8; 48];
    assert_eq!(
        icrc::check_received(ip6, &UDP, &pkt, 0, 64, true, &mut buf),
        Received::Window {
            ip: ip6,
            searched: false
        }
    );
    pkt[100] ^= 4;
    assert_eq!(
        icrc::check_received(ip6, &UDP, &pkt, 0, 64, true, &mut buf),
        Received::Bad
    );
}

/// The test vectors of docs/design/roce-wire.md §7 carry identification 0x1234.
#[test]
fn reference_vectors_solve_to_0x1234() {
    let v = "4502003c12344000401114790a0000010a000002c00112b7002800000400ffff000000118000010168656c6c6f2d7872632d776f726c6421a2eae17b";
    let d: Vec<u8> = (0..v.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&v[i..i + 2], 16).unwrap())
        .collect();
    let (hdr, pkt) = ip::split_ip_udp(&d).unwrap();
    assert_eq!(
        icrc::solve_identification(&with_id(hdr, 0), pkt).unwrap(),
        Some(0x1234)
    );
}
