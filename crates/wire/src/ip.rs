//! Minimal IPv4, IPv6 and UDP headers for RoCE v2 (Annex A17): emitters to synthesize
//! datagrams (pcaps, ICRC input) and a splitter for received ones. Not a general IP stack:
//! no options are emitted, no IPv6 extension headers are accepted, fragments are refused.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::be;
use crate::{HeaderKind, WireError};

/// UDP destination port of RoCE v2 (IANA "roce", Annex A17).
pub const ROCE_V2_UDP_PORT: u16 = 4791;

/// IP protocol / IPv6 next-header number of UDP.
pub const IP_PROTO_UDP: u8 = 17;

/// IPv4 header length without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// IPv6 fixed header length.
pub const IPV6_HEADER_LEN: usize = 40;
/// UDP header length.
pub const UDP_HEADER_LEN: usize = 8;

const IPV4_DONT_FRAGMENT: u16 = 0x4000;
const IPV4_MORE_FRAGMENTS: u16 = 0x2000;
const IPV4_FRAGMENT_OFFSET: u16 = 0x1FFF;
const FLOW_LABEL_BITS: u8 = 20;

fn ensure_room(buf: &[u8], needed: usize) -> Result<(), WireError> {
    if buf.len() < needed {
        Err(WireError::BufferTooSmall {
            needed,
            available: buf.len(),
        })
    } else {
        Ok(())
    }
}

fn length_field(field: &'static str, len: usize) -> Result<u16, WireError> {
    u16::try_from(len).map_err(|_| WireError::FieldOutOfRange {
        field,
        value: len as u64,
        bits: 16,
    })
}

/// One's-complement sum of 16-bit big-endian words (RFC 1071), not yet inverted; an odd
/// trailing byte is padded with zero.
fn ones_complement_sum(mut acc: u32, bytes: &[u8]) -> u32 {
    let mut words = bytes.chunks_exact(2);
    for w in &mut words {
        acc += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xFFFF {
        acc = (acc & 0xFFFF) + (acc >> 16);
    }
    // `acc` fits 16 bits after folding.
    acc as u16
}

/// IPv4 header checksum (RFC 791) of `header`, whose checksum field must be zero.
pub fn ipv4_header_checksum(header: &[u8]) -> u16 {
    !fold(ones_complement_sum(0, header))
}

/// UDP checksum over IPv6 (RFC 8200 §8.1), which unlike IPv4 may not be left zero.
/// `segment` is the UDP header (checksum field zero) plus payload.
pub fn udp_checksum_ipv6(src: Ipv6Addr, dst: Ipv6Addr, segment: &[u8]) -> u16 {
    let mut acc = ones_complement_sum(0, &src.octets());
    acc = ones_complement_sum(acc, &dst.octets());
    // Pseudo-header: 32-bit upper-layer length, 3 zero bytes, next header.
    let len = segment.len() as u32;
    acc += (len >> 16) + (len & 0xFFFF) + u32::from(IP_PROTO_UDP);
    acc = ones_complement_sum(acc, segment);
    match !fold(acc) {
        // A computed 0 is sent as all-ones, since 0 means "no checksum" (RFC 768).
        0 => 0xFFFF,
        sum => sum,
    }
}

/// IPv4 header fields a RoCE v2 sender chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// DSCP (bits 7:2) and ECN (bits 1:0).
    pub tos: u8,
    /// Identification.
    pub identification: u16,
    /// DF flag; RoCE v2 senders set it because IB packets must not be fragmented.
    pub dont_fragment: bool,
    /// Time to live.
    pub ttl: u8,
}

impl Ipv4Repr {
    /// A header with DF set, TTL 64, TOS 0, identification 0.
    pub const fn new(src: Ipv4Addr, dst: Ipv4Addr) -> Self {
        Self {
            src,
            dst,
            tos: 0,
            identification: 0,
            dont_fragment: true,
            ttl: 64,
        }
    }

    /// Writes a 20-byte header (with checksum) for a UDP datagram of `udp_len` bytes
    /// (header included) and returns 20.
    pub fn emit(&self, buf: &mut [u8], udp_len: usize) -> Result<usize, WireError> {
        ensure_room(buf, IPV4_HEADER_LEN)?;
        let total = length_field("IPv4.TotalLength", IPV4_HEADER_LEN + udp_len)?;
        let b = &mut buf[..IPV4_HEADER_LEN];
        b[0] = 0x45; // version 4, IHL 5 words
        b[1] = self.tos;
        be::put_u16(b, 2, total);
        be::put_u16(b, 4, self.identification);
        be::put_u16(
            b,
            6,
            if self.dont_fragment {
                IPV4_DONT_FRAGMENT
            } else {
                0
            },
        );
        b[8] = self.ttl;
        b[9] = IP_PROTO_UDP;
        be::put_u16(b, 10, 0);
        b[12..16].copy_from_slice(&self.src.octets());
        b[16..20].copy_from_slice(&self.dst.octets());
        let csum = ipv4_header_checksum(b);
        be::put_u16(b, 10, csum);
        Ok(IPV4_HEADER_LEN)
    }
}

/// IPv6 header fields a RoCE v2 sender chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// Traffic class (DSCP and ECN).
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
}

impl Ipv6Repr {
    /// A header with hop limit 64, traffic class and flow label 0.
    pub const fn new(src: Ipv6Addr, dst: Ipv6Addr) -> Self {
        Self {
            src,
            dst,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        }
    }

    /// Writes the 40-byte header for a UDP datagram of `udp_len` bytes and returns 40.
    pub fn emit(&self, buf: &mut [u8], udp_len: usize) -> Result<usize, WireError> {
        ensure_room(buf, IPV6_HEADER_LEN)?;
        be::check_bits("IPv6.FlowLabel", self.flow_label.into(), FLOW_LABEL_BITS)?;
        let payload_len = length_field("IPv6.PayloadLength", udp_len)?;
        let b = &mut buf[..IPV6_HEADER_LEN];
        let first = (6u32 << 28) | (u32::from(self.traffic_class) << 20) | self.flow_label;
        be::put_u32(b, 0, first);
        be::put_u16(b, 4, payload_len);
        b[6] = IP_PROTO_UDP;
        b[7] = self.hop_limit;
        b[8..24].copy_from_slice(&self.src.octets());
        b[24..40].copy_from_slice(&self.dst.octets());
        Ok(IPV6_HEADER_LEN)
    }
}

/// Either IP version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum IpRepr {
    V4(Ipv4Repr),
    V6(Ipv6Repr),
}

impl IpRepr {
    /// The header a Linux UDP socket puts on a datagram from `src` to `dst`: TTL / hop limit
    /// 64, or 1 to a multicast group (the sockets' default; the ICRC masks it, a capture
    /// shows it); `None` across address families.
    pub fn between(src: std::net::IpAddr, dst: std::net::IpAddr) -> Option<IpRepr> {
        use std::net::IpAddr;
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let mut ip = Ipv4Repr::new(s, d);
                if d.is_multicast() {
                    ip.ttl = 1;
                }
                Some(IpRepr::V4(ip))
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let mut ip = Ipv6Repr::new(s, d);
                if d.is_multicast() {
                    ip.hop_limit = 1;
                }
                Some(IpRepr::V6(ip))
            }
            _ => None,
        }
    }

    /// Header length this emits.
    pub const fn header_len(&self) -> usize {
        match self {
            IpRepr::V4(_) => IPV4_HEADER_LEN,
            IpRepr::V6(_) => IPV6_HEADER_LEN,
        }
    }

    /// Writes the header for a UDP datagram of `udp_len` bytes; returns the header length.
    pub fn emit(&self, buf: &mut [u8], udp_len: usize) -> Result<usize, WireError> {
        match self {
            IpRepr::V4(v4) => v4.emit(buf, udp_len),
            IpRepr::V6(v6) => v6.emit(buf, udp_len),
        }
    }
}

/// UDP ports. The source port carries per-QP flow entropy in RoCE v2 (Annex A17), so
/// keep it fixed per QP to keep that QP's packets on one path and in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    /// Source port.
    pub src_port: u16,
    /// Destination port, normally [`ROCE_V2_UDP_PORT`].
    pub dst_port: u16,
}

impl UdpRepr {
    /// Writes the 8-byte header for `payload_len` bytes of payload with checksum 0, which
    /// RoCE v2 over IPv4 allows (the ICRC protects the data); returns 8. Over IPv6, fill
    /// the checksum afterwards with [`udp_checksum_ipv6`].
    pub fn emit(&self, buf: &mut [u8], payload_len: usize) -> Result<usize, WireError> {
        ensure_room(buf, UDP_HEADER_LEN)?;
        let len = length_field("UDP.Length", UDP_HEADER_LEN + payload_len)?;
        let b = &mut buf[..UDP_HEADER_LEN];
        be::put_u16(b, 0, self.src_port);
        be::put_u16(b, 2, self.dst_port);
        be::put_u16(b, 4, len);
        be::put_u16(b, 6, 0);
        Ok(UDP_HEADER_LEN)
    }
}

/// Writes IP and UDP headers for an IB packet of `ib_len` bytes (BTH through ICRC);
/// returns their combined length, where the IB packet starts.
pub fn emit_ip_udp(
    ip: &IpRepr,
    udp: &UdpRepr,
    ib_len: usize,
    buf: &mut [u8],
) -> Result<usize, WireError> {
    let ip_len = ip.emit(buf, UDP_HEADER_LEN + ib_len)?;
    let udp_len = udp.emit(&mut buf[ip_len..], ib_len)?;
    Ok(ip_len + udp_len)
}

/// Splits an IP datagram into (IP + UDP headers, UDP payload), trimming anything past the
/// lengths the headers declare (e.g. Ethernet padding). Refuses non-UDP, IPv4 fragments,
/// IPv4 options beyond what IHL declares, and IPv6 extension headers.
pub fn split_ip_udp(datagram: &[u8]) -> Result<(&[u8], &[u8]), WireError> {
    let malformed = |reason| WireError::MalformedIpUdp { reason };
    let truncated = |header, needed, available| WireError::Truncated {
        header,
        needed,
        available,
    };
    let first = *datagram
        .first()
        .ok_or(truncated(HeaderKind::Ipv4, IPV4_HEADER_LEN, 0))?;
    let (ip_len, ip_total) = match first >> 4 {
        4 => {
            if datagram.len() < IPV4_HEADER_LEN {
                return Err(truncated(HeaderKind::Ipv4, IPV4_HEADER_LEN, datagram.len()));
            }
            let ihl = usize::from(first & 0x0F) * 4;
            if ihl < IPV4_HEADER_LEN {
                return Err(malformed("IPv4 IHL below 5"));
            }
            if datagram.len() < ihl {
                return Err(truncated(HeaderKind::Ipv4, ihl, datagram.len()));
            }
            if datagram[9] != IP_PROTO_UDP {
                return Err(malformed("IPv4 protocol is not UDP"));
            }
            let frag = be::u16_at(datagram, 6);
            if frag & (IPV4_MORE_FRAGMENTS | IPV4_FRAGMENT_OFFSET) != 0 {
                return Err(malformed("IPv4 fragment"));
            }
            (ihl, usize::from(be::u16_at(datagram, 2)))
        }
        6 => {
            if datagram.len() < IPV6_HEADER_LEN {
                return Err(truncated(HeaderKind::Ipv6, IPV6_HEADER_LEN, datagram.len()));
            }
            if datagram[6] != IP_PROTO_UDP {
                return Err(malformed("IPv6 next header is not UDP"));
            }
            (
                IPV6_HEADER_LEN,
                IPV6_HEADER_LEN + usize::from(be::u16_at(datagram, 4)),
            )
        }
        _ => return Err(malformed("IP version is neither 4 nor 6")),
    };
    if ip_total < ip_len || ip_total > datagram.len() {
        return Err(malformed("IP length field disagrees with the datagram"));
    }
    let udp = &datagram[ip_len..ip_total];
    if udp.len() < UDP_HEADER_LEN {
        return Err(truncated(HeaderKind::Udp, UDP_HEADER_LEN, udp.len()));
    }
    let udp_len = usize::from(be::u16_at(udp, 4));
    if udp_len < UDP_HEADER_LEN || udp_len > udp.len() {
        return Err(malformed("UDP length field disagrees with the IP length"));
    }
    let headers_end = ip_len + UDP_HEADER_LEN;
    Ok((
        &datagram[..headers_end],
        &datagram[headers_end..ip_len + udp_len],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_header_matches_reference_vector() {
        // §A1.8 vector 1: TOS 2, id 0x1234, DF, TTL 64, 10.0.0.1 -> 10.0.0.2, 44 UDP bytes.
        let ip = Ipv4Repr {
            tos: 0x02,
            identification: 0x1234,
            ..Ipv4Repr::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2))
        };
        let mut buf = [0u8; 28];
        let n = emit_ip_udp(
            &IpRepr::V4(ip),
            &UdpRepr {
                src_port: 0xC001,
                dst_port: ROCE_V2_UDP_PORT,
            },
            36,
            &mut buf,
        )
        .unwrap();
        assert_eq!(n, 28);
        let expected = [
            0x45, 0x02, 0x00, 0x40, 0x12, 0x34, 0x40, 0x00, 0x40, 0x11, 0x14, 0x75, 0x0a, 0x00,
            0x00, 0x01, 0x0a, 0x00, 0x00, 0x02, 0xc0, 0x01, 0x12, 0xb7, 0x00, 0x2c, 0x00, 0x00,
        ];
        assert_eq!(buf, expected);
        // A header with its checksum in place sums to zero.
        assert_eq!(ipv4_header_checksum(&buf[..20]), 0);
    }

    #[test]
    fn ipv6_udp_checksum_verifies() {
        let src: Ipv6Addr = "fe80::1".parse().unwrap();
        let dst: Ipv6Addr = "fe80::2".parse().unwrap();
        let ip = Ipv6Repr {
            traffic_class: 0xB8,
            flow_label: 0xABCDE,
            ..Ipv6Repr::new(src, dst)
        };
        let mut buf = [0u8; 40 + 8 + 5];
        emit_ip_udp(
            &IpRepr::V6(ip),
            &UdpRepr {
                src_port: 1,
                dst_port: ROCE_V2_UDP_PORT,
            },
            5,
            &mut buf,
        )
        .unwrap();
        assert_eq!(buf[0], 0x6B);
        assert_eq!(buf[1], 0x8A);
        assert_eq!(&buf[2..4], &[0xBC, 0xDE]);
        buf[48..].copy_from_slice(b"hello");
        let csum = udp_checksum_ipv6(src, dst, &buf[40..]);
        buf[46..48].copy_from_slice(&csum.to_be_bytes());
        // Re-summing with the checksum in place gives all-ones (i.e. 0 after inversion).
        let mut acc = ones_complement_sum(0, &src.octets());
        acc = ones_complement_sum(acc, &dst.octets());
        acc += 13 + u32::from(IP_PROTO_UDP);
        assert_eq!(fold(ones_complement_sum(acc, &buf[40..])), 0xFFFF);
    }

    #[test]
    fn split_trims_and_rejects() {
        let mut d = vec![0u8; 28 + 4];
        emit_ip_udp(
            &IpRepr::V4(Ipv4Repr::new(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST)),
            &UdpRepr {
                src_port: 1,
                dst_port: 2,
            },
            4,
            &mut d,
        )
        .unwrap();
        d.extend_from_slice(&[0xEE; 6]); // trailer past IP total length
        let (h, p) = split_ip_udp(&d).unwrap();
        assert_eq!((h.len(), p.len()), (28, 4));

        assert!(matches!(
            split_ip_udp(&[]),
            Err(WireError::Truncated { .. })
        ));
        assert!(matches!(
            split_ip_udp(&d[..10]),
            Err(WireError::Truncated {
                header: HeaderKind::Ipv4,
                ..
            })
        ));
        let mut not_udp = d.clone();
        not_udp[9] = 6;
        assert!(matches!(
            split_ip_udp(&not_udp),
            Err(WireError::MalformedIpUdp { .. })
        ));
        let mut frag = d.clone();
        frag[6] |= 0x20;
        assert!(matches!(
            split_ip_udp(&frag),
            Err(WireError::MalformedIpUdp { .. })
        ));
        let mut v5 = d.clone();
        v5[0] = 0x55;
        assert!(matches!(
            split_ip_udp(&v5),
            Err(WireError::MalformedIpUdp { .. })
        ));
        let mut long = d.clone();
        long[3] = 0xFF;
        assert!(matches!(
            split_ip_udp(&long),
            Err(WireError::MalformedIpUdp { .. })
        ));
    }

    #[test]
    fn emit_errors() {
        let mut small = [0u8; 10];
        let v4 = Ipv4Repr::new(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST);
        assert!(matches!(
            v4.emit(&mut small, 0),
            Err(WireError::BufferTooSmall { needed: 20, .. })
        ));
        let mut buf = [0u8; 40];
        assert!(matches!(
            v4.emit(&mut buf, 70_000),
            Err(WireError::FieldOutOfRange { .. })
        ));
        let v6 = Ipv6Repr {
            flow_label: 1 << 20,
            ..Ipv6Repr::new(Ipv6Addr::LOCALHOST, Ipv6Addr::LOCALHOST)
        };
        assert!(matches!(
            v6.emit(&mut buf, 0),
            Err(WireError::FieldOutOfRange { bits: 20, .. })
        ));
        let udp = UdpRepr {
            src_port: 0,
            dst_port: 0,
        };
        assert!(matches!(
            udp.emit(&mut buf, 65_530),
            Err(WireError::FieldOutOfRange { .. })
        ));
    }
}
