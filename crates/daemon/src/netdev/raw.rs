//! The raw receive path of an IPv4 device (`[icrc] ip_header = "raw"`, the default `auto`
//! where the daemon has `CAP_NET_RAW`; docs/design/roce-wire.md §6).
//!
//! A UDP socket never shows the IPv4 identification, which the ICRC covers, so a kernel rxe
//! or NIC peer's packets cannot be checked exactly there. A raw `IPPROTO_UDP` socket bound
//! to the device's address gets every UDP datagram to that address with its IP header
//! (raw(7)); a classic BPF filter keeps those to the device's port. The device's UDP socket
//! stays bound, for sending and so that the kernel neither answers with ICMP port
//! unreachable nor lets another socket take the port, with a filter that drops everything
//! (each datagram is then counted in the kernel's UDP `InErrors` and the socket's `drops`,
//! the price of not reading it twice).
//!
//! A GSO send that crossed `lo` or a veth pair whole arrives on a raw socket as one
//! datagram with one header (identification = the base the kernel would have counted up
//! from), its segments back to back. Every segment of a softverbs batch goes to one
//! destination QP (netdev.rs "Batching"), so [`segment_size`] finds the segment size as the
//! first 4-byte boundary where the same destination QP starts again and the first segment's
//! ICRC checks out with that length.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};

use socket2::{Domain, Protocol, SockFilter, Socket, Type};
use softverbs_wire::icrc;

/// Classic BPF (linux/filter.h): `ldxb 4*([0]&0xf)`, `ldh [x+2]`, `jeq #port`, `ret`.
const LDXB_MSH: u16 = 0x01 | 0x10 | 0xa0;
const LDH_IND: u16 = 0x08 | 0x40;
const JEQ_K: u16 = 0x05 | 0x10;
const RET_K: u16 = 0x06;

/// Opens the raw socket for `local`:`port`: nonblocking, filtered to UDP destination port
/// `port` (after any IPv4 options), with the device socket's buffers.
pub(super) fn open(local: Ipv4Addr, port: u16) -> io::Result<UdpSocket> {
    let s = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP))?;
    s.attach_filter(&[
        SockFilter::new(LDXB_MSH, 0, 0, 0),
        SockFilter::new(LDH_IND, 0, 0, 2),
        SockFilter::new(JEQ_K, 0, 1, u32::from(port)),
        SockFilter::new(RET_K, 0, 0, 0x0004_0000),
        SockFilter::new(RET_K, 0, 0, 0),
    ])?;
    s.bind(&SocketAddr::from((local, 0)).into())?;
    s.set_nonblocking(true)?;
    // A UdpSocket only as an owned descriptor with recv/send helpers; it is read with
    // recvmmsg like the device socket.
    let sock: UdpSocket = s.into();
    super::size_socket_buffers(&sock);
    Ok(sock)
}

/// Makes the device's UDP socket take nothing more: its datagrams are read on the raw
/// socket.
pub(super) fn drop_all(sock: &UdpSocket) -> io::Result<()> {
    socket2::SockRef::from(sock).attach_filter(&[SockFilter::new(RET_K, 0, 0, 0)])
}

/// The IPv4 + UDP header of a raw datagram (`d` starts with the IPv4 header): its length,
/// if it is a UDP datagram to `port` with consistent lengths (the IPv4 total length and the
/// UDP length bound what follows; a raw socket sees reassembled datagrams only).
pub(super) fn header_len(d: &[u8], port: u16) -> Option<usize> {
    let ihl = usize::from(*d.first()? & 0x0F) * 4;
    if d[0] >> 4 != 4 || ihl < 20 || d.len() < ihl + 8 || d[9] != 17 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([d[2], d[3]]));
    let udp_len = usize::from(u16::from_be_bytes([d[ihl + 4], d[ihl + 5]]));
    let dport = u16::from_be_bytes([d[ihl + 2], d[ihl + 3]]);
    (dport == port && total == d.len() && udp_len == total - ihl).then_some(ihl + 8)
}

/// `hdr` (an IPv4 + UDP header) rewritten for segment `index` of `len` IB bytes, as the
/// kernel's GSO would have emitted it: lengths for `len`, identification counted up.
pub(super) fn segment_header(hdr: &[u8], len: usize, index: u16, out: &mut [u8]) -> usize {
    let hl = hdr.len();
    let out = &mut out[..hl];
    out.copy_from_slice(hdr);
    let ihl = hl - 8;
    let id = u16::from_be_bytes([hdr[4], hdr[5]]).wrapping_add(index);
    out[2..4].copy_from_slice(&((hl + len) as u16).to_be_bytes());
    out[4..6].copy_from_slice(&id.to_be_bytes());
    out[ihl + 4..ihl + 6].copy_from_slice(&((8 + len) as u16).to_be_bytes());
    hl
}

/// The size of the segments of `pkt`, the UDP payload of a raw datagram with header `hdr`,
/// and whether the first segment's ICRC was found good: its whole length when its ICRC
/// checks out whole (one packet, the usual case), else the first size at which the same
/// destination QP starts again and the first segment's ICRC checks out (a GSO batch
/// delivered whole); the whole length, unchecked, when none does (the check then fails,
/// as it should).
///
/// A datagram longer than any one IB packet (`max_packet`) can only be a batch: its whole
/// check, a CRC pass over up to 64 KiB that must fail, is skipped.
pub(super) fn segment_size(hdr: &[u8], pkt: &[u8], max_packet: usize) -> (usize, bool) {
    if pkt.len() <= max_packet && icrc::verify(hdr, pkt).is_ok() {
        return (pkt.len(), true);
    }
    if pkt.len() < 32 {
        return (pkt.len(), false);
    }
    let mut h = [0u8; 68];
    let qp = &pkt[5..8];
    (16..pkt.len() - 15)
        .step_by(4)
        .find(|&s| {
            &pkt[s + 5..s + 8] == qp && {
                let hl = segment_header(hdr, s, 0, &mut h);
                icrc::verify(&h[..hl], &pkt[..s]).is_ok()
            }
        })
        .map_or((pkt.len(), false), |s| (s, true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use softverbs_wire::ip::{emit_ip_udp, IpRepr, Ipv4Repr, UdpRepr};

    /// A GSO batch of `n` segments of `seg` bytes (the last `last`), as one raw datagram.
    fn batch(seg: usize, n: usize, last: usize, base: u16) -> (Vec<u8>, Vec<u8>) {
        let ip = |id, len| {
            let mut h = [0u8; 28];
            let repr = IpRepr::V4(Ipv4Repr {
                identification: id,
                ..Ipv4Repr::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2))
            });
            let udp = UdpRepr {
                src_port: 4791,
                dst_port: 4791,
            };
            emit_ip_udp(&repr, &udp, len, &mut h).unwrap();
            h
        };
        let mut body = Vec::new();
        for i in 0..n {
            let len = if i + 1 == n { last } else { seg };
            let mut p = vec![0u8; len];
            p[0] = 0x07; // RC RDMA_WRITE_MIDDLE
            p[5..8].copy_from_slice(&[0, 0, 0x42]);
            p[11] = i as u8;
            let h = ip(base.wrapping_add(i as u16), len);
            icrc::write(&h, &mut p).unwrap();
            body.extend(p);
        }
        let whole = ip(base, body.len());
        (whole.to_vec(), body)
    }

    #[test]
    fn finds_the_segments_of_a_whole_gso_batch() {
        for (seg, n, last, base) in [
            (1052, 5, 300, 0u16),
            (20, 64, 20, 0xFFF0),
            (4124, 2, 4124, 7),
        ] {
            let (hdr, body) = batch(seg, n, last, base);
            assert_eq!(segment_size(&hdr, &body, 4200), (seg, true), "{seg} x {n}");
            let mut h = [0u8; 68];
            let hl = segment_header(&hdr, last, (n - 1) as u16, &mut h);
            icrc::verify(&h[..hl], &body[seg * (n - 1)..]).unwrap();
        }
        // One packet: its own length.
        let (hdr, body) = batch(1052, 1, 1052, 9);
        assert_eq!(segment_size(&hdr, &body, 4200), (1052, true));
        // A corrupted one: its own length, not found good.
        let mut bad = body.clone();
        bad[500] ^= 1;
        assert_eq!(segment_size(&hdr, &bad, 4200), (1052, false));
    }

    #[test]
    fn headers_are_checked() {
        let (hdr, body) = batch(100, 1, 100, 1);
        let mut d = hdr.clone();
        d.extend(&body);
        assert_eq!(header_len(&d, 4791), Some(28));
        assert_eq!(header_len(&d, 4792), None);
        assert_eq!(header_len(&d[..d.len() - 1], 4791), None);
    }
}
