//! Real packets of the kernel's rxe (`rxe_vectors.txt`, captured on the wire between rxe and
//! softverbs): every ICRC checks out exactly over the header the datagram carried, and with
//! the IPv4 identification hidden (as a UDP socket hides it) the solver finds it back
//! (docs/design/roce-wire.md §6).

use softverbs_wire::icrc::{self, Received};
use softverbs_wire::ip::{self, IpRepr, Ipv4Repr, Ipv6Repr, UdpRepr};

/// (description, datagram) of every vector.
fn vectors() -> Vec<(String, Vec<u8>)> {
    let text = include_str!("rxe_vectors.txt");
    let mut out = Vec::new();
    let mut what = String::new();
    for line in text.lines() {
        if let Some(c) = line.strip_prefix("# ") {
            what = c.to_string();
        } else if !line.is_empty() {
            let bytes = (0..line.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&line[i..i + 2], 16).unwrap())
                .collect();
            out.push((what.clone(), bytes));
        }
    }
    out
}

/// The headers a UDP socket would let a receiver rebuild: addresses and ports, no
/// identification (0), TOS/TTL/flow label at the socket defaults (the ICRC masks them).
fn seen_by_a_udp_socket(d: &[u8]) -> (IpRepr, UdpRepr, &[u8]) {
    let (hdr, ib) = ip::split_ip_udp(d).unwrap();
    let ihl = hdr.len() - 8;
    let udp = UdpRepr {
        src_port: u16::from_be_bytes([hdr[ihl], hdr[ihl + 1]]),
        dst_port: u16::from_be_bytes([hdr[ihl + 2], hdr[ihl + 3]]),
    };
    let ip = if d[0] >> 4 == 4 {
        let a = |at: usize| std::net::Ipv4Addr::new(d[at], d[at + 1], d[at + 2], d[at + 3]);
        IpRepr::V4(Ipv4Repr::new(a(12), a(16)))
    } else {
        let a = |at: usize| {
            let mut o = [0u8; 16];
            o.copy_from_slice(&d[at..at + 16]);
            std::net::Ipv6Addr::from(o)
        };
        IpRepr::V6(Ipv6Repr::new(a(8), a(24)))
    };
    (ip, udp, ib)
}

#[test]
fn the_captured_vectors_are_there() {
    let v = vectors();
    assert_eq!(v.len(), 7);
    assert!(v.iter().any(|(_, d)| d[0] >> 4 == 6));
    // Unaligned payload: a READ response with a pad count of 2.
    assert!(v
        .iter()
        .any(|(_, d)| d[0] >> 4 == 4 && d[28] == 0x10 && d[29] >> 4 & 3 == 2));
}

#[test]
fn every_rxe_icrc_checks_out_over_the_header_on_the_wire() {
    for (what, d) in vectors() {
        icrc::verify_datagram(&d).unwrap_or_else(|e| panic!("{what}: {e}"));
        softverbs_wire::parse_roce_v2(&d).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

#[test]
fn hidden_identifications_are_solved_back() {
    let mut hdr = [0u8; 48];
    for (what, d) in vectors() {
        let (ip, udp, ib) = seen_by_a_udp_socket(&d);
        match ip {
            IpRepr::V4(_) => {
                let id = u16::from_be_bytes([d[4], d[5]]);
                let mut hidden = ip::split_ip_udp(&d).unwrap().0.to_vec();
                hidden[4..6].fill(0);
                assert_eq!(
                    icrc::solve_identification(&hidden, ib).unwrap(),
                    Some(id),
                    "{what}"
                );
                let mut with_id = ip;
                if let IpRepr::V4(v4) = &mut with_id {
                    v4.identification = id;
                }
                // softverbs' own READ request has identification 0: the window takes it.
                let window = icrc::check_received(ip, &udp, ib, 0, 64, false, &mut hdr);
                let solve = icrc::check_received(ip, &udp, ib, 0, 64, true, &mut hdr);
                if id < 64 {
                    assert_eq!(
                        window,
                        Received::Window {
                            ip: with_id,
                            searched: id != 0
                        },
                        "{what}"
                    );
                } else {
                    assert_eq!(window, Received::Unseen { id }, "{what}");
                    assert_eq!(solve, Received::Solved { ip: with_id }, "{what}");
                }
                // A corrupted payload byte is not explained by any identification.
                let mut bad = ib.to_vec();
                bad[14] ^= 0x01;
                assert_eq!(icrc::solve_identification(&hidden, &bad).unwrap(), None);
            }
            IpRepr::V6(_) => {
                assert_eq!(
                    icrc::check_received(ip, &udp, ib, 0, 64, true, &mut hdr),
                    Received::Window {
                        ip,
                        searched: false
                    },
                    "{what}"
                );
            }
        }
    }
}
