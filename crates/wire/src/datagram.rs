//! Whole RoCE v2 datagrams, `IP | UDP | IB packet | ICRC` (Annex A17): one call to build
//! one for a pcap or a test, one to take a received one apart and check it.

use crate::ip::{self, IpRepr, UdpRepr};
use crate::packet::{emit_packet, packet_len, Headers, Packet, PacketRef};
use crate::{icrc, WireError};

/// A parsed, ICRC-checked RoCE v2 datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatagramRef<'a> {
    /// IP and UDP headers as received.
    pub ip_udp: &'a [u8],
    /// The IB packet in the UDP payload.
    pub packet: PacketRef<'a>,
}

/// Bytes [`emit_roce_v2`] writes.
pub fn roce_v2_len(ip: &IpRepr, headers: &Headers, payload_len: usize) -> usize {
    ip.header_len() + ip::UDP_HEADER_LEN + packet_len(headers, payload_len)
}

/// Writes a complete IP datagram with a valid ICRC (and, over IPv6, a valid UDP
/// checksum; over IPv4 the UDP checksum is left 0 as RoCE v2 permits). Returns its length.
pub fn emit_roce_v2(
    ip: &IpRepr,
    udp: &UdpRepr,
    headers: &Headers,
    payload: &[u8],
    buf: &mut [u8],
) -> Result<usize, WireError> {
    let total = roce_v2_len(ip, headers, payload.len());
    if buf.len() < total {
        return Err(WireError::BufferTooSmall {
            needed: total,
            available: buf.len(),
        });
    }
    let ib_len = packet_len(headers, payload.len());
    let hdr_len = ip::emit_ip_udp(ip, udp, ib_len, buf)?;
    let (ip_udp, rest) = buf.split_at_mut(hdr_len);
    let n = emit_packet(headers, payload, rest)?;
    icrc::write(ip_udp, &mut rest[..n])?;
    if let IpRepr::V6(v6) = ip {
        // The UDP checksum covers the ICRC, so it comes last; the ICRC masks the UDP
        // checksum, so filling it does not disturb the ICRC.
        let udp_at = ip::IPV6_HEADER_LEN;
        let csum = ip::udp_checksum_ipv6(v6.src, v6.dst, &buf[udp_at..total]);
        buf[udp_at + 6..udp_at + 8].copy_from_slice(&csum.to_be_bytes());
    }
    Ok(total)
}

/// Splits an IP datagram, parses its IB packet and checks the ICRC.
pub fn parse_roce_v2(datagram: &[u8]) -> Result<DatagramRef<'_>, WireError> {
    let (ip_udp, ib) = ip::split_ip_udp(datagram)?;
    let packet = Packet::parse(ib)?;
    icrc::verify(ip_udp, ib)?;
    Ok(DatagramRef { ip_udp, packet })
}
