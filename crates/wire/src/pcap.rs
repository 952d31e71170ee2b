//! Classic libpcap capture files (`LINKTYPE_ETHERNET`) for looking at RoCE v2 traffic in
//! Wireshark/tshark, plus helpers that wrap an IB transport packet in a synthetic
//! `Ethernet | IPv4/IPv6 | UDP 4791` frame with a correct ICRC.
//!
//! File layout (all fields in the writer's native byte order, recognised by the magic):
//!
//! ```text
//! global header, 24 bytes:
//!   magic u32        0xA1B2C3D4 (microsecond timestamps) or 0xA1B23C4D (nanosecond)
//!   version u16,u16  2, 4
//!   thiszone i32     0 (timestamps are UTC)
//!   sigfigs u32      0
//!   snaplen u32      longest record kept
//!   network u32      link type, 1 = Ethernet
//! per frame, 16 bytes + data:
//!   ts_sec u32, ts_frac u32 (micro- or nanoseconds), incl_len u32, orig_len u32, data
//! ```
//!
//! The writer always writes little-endian; the reader accepts either byte order.
//! Nothing here touches a network: the frames are bytes for a file.

use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::time::Duration;

use crate::datagram::{emit_roce_v2, roce_v2_len};
use crate::ip::{self, IpRepr, Ipv4Repr, Ipv6Repr, UdpRepr, IPV6_HEADER_LEN, ROCE_V2_UDP_PORT};
use crate::packet::Headers;
use crate::{icrc, WireError};

/// Magic number of a file with microsecond timestamps.
pub const MAGIC_MICROS: u32 = 0xA1B2_C3D4;
/// Magic number of a file with nanosecond timestamps.
pub const MAGIC_NANOS: u32 = 0xA1B2_3C4D;
/// File format version written (and the only major version read).
pub const VERSION: (u16, u16) = (2, 4);
/// Link type of Ethernet frames (DLT_EN10MB).
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Length of the file's global header.
pub const GLOBAL_HEADER_LEN: usize = 24;
/// Length of each record's header.
pub const RECORD_HEADER_LEN: usize = 16;
/// Snapshot length written by [`PcapWriter::new`]: the largest frame kept whole, as
/// tcpdump's default.
pub const DEFAULT_SNAPLEN: u32 = 262_144;

/// Ethernet header length (no VLAN tag).
pub const ETHERNET_HEADER_LEN: usize = 14;
/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86DD;
/// EtherType of an IEEE 802.1Q VLAN tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;

/// Resolution of record timestamps, fixed per file by the magic number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TsResolution {
    /// Microseconds ([`MAGIC_MICROS`]).
    Micros,
    /// Nanoseconds ([`MAGIC_NANOS`]).
    Nanos,
}

impl TsResolution {
    const fn magic(self) -> u32 {
        match self {
            TsResolution::Micros => MAGIC_MICROS,
            TsResolution::Nanos => MAGIC_NANOS,
        }
    }

    fn fraction(self, ts: Duration) -> u32 {
        match self {
            TsResolution::Micros => ts.subsec_micros(),
            TsResolution::Nanos => ts.subsec_nanos(),
        }
    }

    fn duration(self, secs: u32, frac: u32) -> Duration {
        let frac = match self {
            TsResolution::Micros => Duration::from_micros(u64::from(frac)),
            TsResolution::Nanos => Duration::from_nanos(u64::from(frac)),
        };
        Duration::from_secs(u64::from(secs)) + frac
    }
}

fn invalid_input(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn invalid_data(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Writes a pcap file frame by frame to any [`Write`].
///
/// Each [`write_frame`](Self::write_frame) issues one `write_all` of the record header and
/// one of the data; wrap a file in a [`std::io::BufWriter`] when writing many frames.
///
/// ```
/// use std::time::Duration;
/// use softverbs_wire::pcap::{PcapReader, PcapWriter};
/// let mut w = PcapWriter::new(Vec::new()).unwrap();
/// w.write_frame(Duration::from_micros(1_500_000), &[0xAB; 60]).unwrap();
/// let bytes = w.into_inner();
/// let mut r = PcapReader::new(&bytes[..]).unwrap();
/// let rec = r.next_record().unwrap().unwrap();
/// assert_eq!((rec.ts, rec.data.len()), (Duration::from_micros(1_500_000), 60));
/// ```
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    inner: W,
    resolution: TsResolution,
    snaplen: u32,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the global header of an Ethernet capture with microsecond timestamps and
    /// [`DEFAULT_SNAPLEN`].
    pub fn new(inner: W) -> io::Result<Self> {
        Self::with_options(inner, TsResolution::Micros, DEFAULT_SNAPLEN)
    }

    /// Writes the global header of an Ethernet capture with the given timestamp resolution
    /// and snapshot length (frames longer than `snaplen` are cut, keeping their original
    /// length in the record).
    pub fn with_options(mut inner: W, resolution: TsResolution, snaplen: u32) -> io::Result<Self> {
        if snaplen == 0 {
            return Err(invalid_input("pcap snaplen must be positive"));
        }
        let mut h = [0u8; GLOBAL_HEADER_LEN];
        h[0..4].copy_from_slice(&resolution.magic().to_le_bytes());
        h[4..6].copy_from_slice(&VERSION.0.to_le_bytes());
        h[6..8].copy_from_slice(&VERSION.1.to_le_bytes());
        // thiszone (8..12) and sigfigs (12..16) stay 0.
        h[16..20].copy_from_slice(&snaplen.to_le_bytes());
        h[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        inner.write_all(&h)?;
        Ok(Self {
            inner,
            resolution,
            snaplen,
        })
    }

    /// Timestamp resolution of this file.
    pub const fn resolution(&self) -> TsResolution {
        self.resolution
    }

    /// Appends one Ethernet frame (destination MAC first, no FCS) captured at `ts` since
    /// the Unix epoch. Fails with `InvalidInput` for a timestamp past 2106 or a frame of
    /// 4 GiB or more.
    pub fn write_frame(&mut self, ts: Duration, frame: &[u8]) -> io::Result<()> {
        let secs = u32::try_from(ts.as_secs())
            .map_err(|_| invalid_input("pcap timestamp does not fit 32-bit seconds"))?;
        let orig_len =
            u32::try_from(frame.len()).map_err(|_| invalid_input("frame too long for pcap"))?;
        let incl_len = orig_len.min(self.snaplen);
        let mut h = [0u8; RECORD_HEADER_LEN];
        h[0..4].copy_from_slice(&secs.to_le_bytes());
        h[4..8].copy_from_slice(&self.resolution.fraction(ts).to_le_bytes());
        h[8..12].copy_from_slice(&incl_len.to_le_bytes());
        h[12..16].copy_from_slice(&orig_len.to_le_bytes());
        self.inner.write_all(&h)?;
        // `incl_len <= frame.len()`, so the cast and the slice are in range.
        self.inner.write_all(&frame[..incl_len as usize])
    }

    /// Wraps the IB packet `ib_packet` (BTH through the 4-byte ICRC slot) as
    /// [`roce_v2_frame`] does and appends the frame.
    pub fn write_roce_v2(
        &mut self,
        ts: Duration,
        ip: &IpRepr,
        src_port: u16,
        ib_packet: &[u8],
    ) -> io::Result<()> {
        let frame = roce_v2_frame(ip, src_port, ib_packet).map_err(io::Error::other)?;
        self.write_frame(ts, &frame)
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }

    /// The underlying writer.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    /// Gives back the underlying writer (not flushed).
    pub fn into_inner(self) -> W {
        self.inner
    }
}

/// One record read back from a capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcapRecord {
    /// Capture time since the Unix epoch.
    pub ts: Duration,
    /// Length of the frame on the wire (may exceed `data.len()` if cut at the snaplen).
    pub orig_len: u32,
    /// The captured bytes.
    pub data: Vec<u8>,
}

/// Reads classic pcap files of either byte order and timestamp resolution (for tests and
/// tools; no pcapng).
#[derive(Debug)]
pub struct PcapReader<R: Read> {
    inner: R,
    big_endian: bool,
    resolution: TsResolution,
    snaplen: u32,
    linktype: u32,
}

impl<R: Read> PcapReader<R> {
    /// Reads and checks the global header.
    pub fn new(mut inner: R) -> io::Result<Self> {
        let mut h = [0u8; GLOBAL_HEADER_LEN];
        inner.read_exact(&mut h)?;
        let magic_le = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let magic_be = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
        let (big_endian, resolution) = match (magic_le, magic_be) {
            (MAGIC_MICROS, _) => (false, TsResolution::Micros),
            (MAGIC_NANOS, _) => (false, TsResolution::Nanos),
            (_, MAGIC_MICROS) => (true, TsResolution::Micros),
            (_, MAGIC_NANOS) => (true, TsResolution::Nanos),
            _ => return Err(invalid_data("not a classic pcap file (bad magic)")),
        };
        let u16_at = |at: usize| {
            let b = [h[at], h[at + 1]];
            if big_endian {
                u16::from_be_bytes(b)
            } else {
                u16::from_le_bytes(b)
            }
        };
        let u32_at = |at: usize| read_u32(&h[at..at + 4], big_endian);
        if u16_at(4) != VERSION.0 {
            return Err(invalid_data("unsupported pcap major version"));
        }
        Ok(Self {
            inner,
            big_endian,
            resolution,
            snaplen: u32_at(16),
            linktype: u32_at(20),
        })
    }

    /// Link type from the global header ([`LINKTYPE_ETHERNET`] for our files).
    pub const fn linktype(&self) -> u32 {
        self.linktype
    }

    /// Snapshot length from the global header.
    pub const fn snaplen(&self) -> u32 {
        self.snaplen
    }

    /// Timestamp resolution from the magic number.
    pub const fn resolution(&self) -> TsResolution {
        self.resolution
    }

    /// The next record, or `None` at a clean end of file. A file that ends inside a record
    /// is an `UnexpectedEof` error.
    pub fn next_record(&mut self) -> io::Result<Option<PcapRecord>> {
        let mut h = [0u8; RECORD_HEADER_LEN];
        let mut got = 0;
        while got < h.len() {
            match self.inner.read(&mut h[got..]) {
                Ok(0) if got == 0 => return Ok(None),
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let field = |i: usize| read_u32(&h[4 * i..4 * i + 4], self.big_endian);
        let (secs, frac, incl_len, orig_len) = (field(0), field(1), field(2), field(3));
        // Bound the allocation by what the header promises (plus slack for writers that
        // record a too-small snaplen), so a corrupt length cannot ask for gigabytes.
        if incl_len > self.snaplen.max(DEFAULT_SNAPLEN) {
            return Err(invalid_data("pcap record longer than the snaplen"));
        }
        let mut data = vec![0u8; incl_len as usize];
        self.inner.read_exact(&mut data)?;
        Ok(Some(PcapRecord {
            ts: self.resolution.duration(secs, frac),
            orig_len,
            data,
        }))
    }

    /// Gives back the underlying reader.
    pub fn into_inner(self) -> R {
        self.inner
    }
}

impl<R: Read> Iterator for PcapReader<R> {
    type Item = io::Result<PcapRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}

fn read_u32(b: &[u8], big_endian: bool) -> u32 {
    let b = [b[0], b[1], b[2], b[3]];
    if big_endian {
        u32::from_be_bytes(b)
    } else {
        u32::from_le_bytes(b)
    }
}

/// A synthetic, locally administered unicast MAC for an IP address: `02:04:a.b.c.d` for
/// IPv4 and `02:06:` + the last four address bytes for IPv6. Stable, so one host keeps one
/// MAC across a capture.
pub fn synthetic_mac(addr: IpAddr) -> [u8; 6] {
    let (kind, tail) = match addr {
        IpAddr::V4(a) => (0x04, a.octets()),
        IpAddr::V6(a) => {
            let o = a.octets();
            (0x06, [o[12], o[13], o[14], o[15]])
        }
    };
    [0x02, kind, tail[0], tail[1], tail[2], tail[3]]
}

fn ip_addrs(ip: &IpRepr) -> (IpAddr, IpAddr, u16) {
    match ip {
        IpRepr::V4(v4) => (v4.src.into(), v4.dst.into(), ETHERTYPE_IPV4),
        IpRepr::V6(v6) => (v6.src.into(), v6.dst.into(), ETHERTYPE_IPV6),
    }
}

/// Allocates a frame of `ETHERNET_HEADER_LEN + datagram_len` bytes with the Ethernet
/// header filled in.
fn ethernet_frame_for(ip: &IpRepr, datagram_len: usize) -> Vec<u8> {
    let (src, dst, ethertype) = ip_addrs(ip);
    let mut frame = vec![0u8; ETHERNET_HEADER_LEN + datagram_len];
    frame[0..6].copy_from_slice(&synthetic_mac(dst));
    frame[6..12].copy_from_slice(&synthetic_mac(src));
    frame[12..14].copy_from_slice(&ethertype.to_be_bytes());
    frame
}

/// Builds `Ethernet | IP | UDP (src_port → 4791) | ib_packet` where `ib_packet` runs from
/// BTH through a 4-byte ICRC slot; the slot is overwritten with the ICRC computed over the
/// synthesized IP/UDP headers ([`icrc::write`]). Everything else in `ib_packet` (reserved
/// bits, pad bytes) is kept byte for byte. Over IPv6 the UDP checksum is filled in last,
/// as [`emit_roce_v2`] does; over IPv4 it stays 0. MACs come from [`synthetic_mac`].
pub fn roce_v2_frame(ip: &IpRepr, src_port: u16, ib_packet: &[u8]) -> Result<Vec<u8>, WireError> {
    let udp = UdpRepr {
        src_port,
        dst_port: ROCE_V2_UDP_PORT,
    };
    let hdr_len = ip.header_len() + ip::UDP_HEADER_LEN;
    let mut frame = ethernet_frame_for(ip, hdr_len + ib_packet.len());
    let datagram = &mut frame[ETHERNET_HEADER_LEN..];
    ip::emit_ip_udp(ip, &udp, ib_packet.len(), datagram)?;
    let (ip_udp, ib) = datagram.split_at_mut(hdr_len);
    ib.copy_from_slice(ib_packet);
    icrc::write(ip_udp, ib)?;
    if let IpRepr::V6(v6) = ip {
        let csum = ip::udp_checksum_ipv6(v6.src, v6.dst, &datagram[IPV6_HEADER_LEN..]);
        datagram[IPV6_HEADER_LEN + 6..IPV6_HEADER_LEN + 8].copy_from_slice(&csum.to_be_bytes());
    }
    Ok(frame)
}

/// [`roce_v2_frame`] with default IP headers (IPv4: DF, TTL 64; IPv6: hop limit 64) between
/// two addresses of the same family.
pub fn roce_v2_frame_between(
    src: IpAddr,
    dst: IpAddr,
    src_port: u16,
    ib_packet: &[u8],
) -> Result<Vec<u8>, WireError> {
    let ip = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => IpRepr::V4(Ipv4Repr::new(s, d)),
        (IpAddr::V6(s), IpAddr::V6(d)) => IpRepr::V6(Ipv6Repr::new(s, d)),
        _ => {
            return Err(WireError::MalformedIpUdp {
                reason: "source and destination addresses of different IP versions",
            })
        }
    };
    roce_v2_frame(&ip, src_port, ib_packet)
}

/// Builds a whole Ethernet frame from parsed headers and a payload with
/// [`emit_roce_v2`] (which computes pad, ICRC and, over IPv6, the UDP checksum).
pub fn roce_v2_frame_from_headers(
    ip: &IpRepr,
    udp: &UdpRepr,
    headers: &Headers,
    payload: &[u8],
) -> Result<Vec<u8>, WireError> {
    let mut frame = ethernet_frame_for(ip, roce_v2_len(ip, headers, payload.len()));
    emit_roce_v2(ip, udp, headers, payload, &mut frame[ETHERNET_HEADER_LEN..])?;
    Ok(frame)
}

/// Wraps a whole IP datagram (IPv4 or IPv6, as a RoCE v2 sender put it on the wire) in an
/// Ethernet header with [`synthetic_mac`] addresses, for a capture of real traffic.
pub fn ethernet_frame(datagram: &[u8]) -> Result<Vec<u8>, WireError> {
    let bad = WireError::MalformedIpUdp {
        reason: "not an IPv4 or IPv6 header",
    };
    let (src, dst, ethertype): (IpAddr, IpAddr, u16) = match datagram.first().map(|b| b >> 4) {
        Some(4) if datagram.len() >= 20 => {
            let a = |at: usize| {
                IpAddr::from([
                    datagram[at],
                    datagram[at + 1],
                    datagram[at + 2],
                    datagram[at + 3],
                ])
            };
            (a(12), a(16), ETHERTYPE_IPV4)
        }
        Some(6) if datagram.len() >= 40 => {
            let a = |at: usize| {
                let mut o = [0u8; 16];
                o.copy_from_slice(&datagram[at..at + 16]);
                IpAddr::from(o)
            };
            (a(8), a(24), ETHERTYPE_IPV6)
        }
        _ => return Err(bad),
    };
    let mut frame = Vec::with_capacity(ETHERNET_HEADER_LEN + datagram.len());
    frame.extend_from_slice(&synthetic_mac(dst));
    frame.extend_from_slice(&synthetic_mac(src));
    frame.extend_from_slice(&ethertype.to_be_bytes());
    frame.extend_from_slice(datagram);
    Ok(frame)
}

/// The IP datagram in an Ethernet frame carrying IPv4 or IPv6, skipping at most one
/// 802.1Q tag; `None` for anything else. Bytes past the IP length (Ethernet padding) are
/// kept; [`crate::parse_roce_v2`] ignores them.
pub fn ethernet_payload(frame: &[u8]) -> Option<&[u8]> {
    let ethertype = |at: usize| {
        frame
            .get(at..at + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
    };
    let mut at = 12;
    let mut ty = ethertype(at)?;
    if ty == ETHERTYPE_VLAN {
        at += 4;
        ty = ethertype(at)?;
    }
    match ty {
        ETHERTYPE_IPV4 | ETHERTYPE_IPV6 => frame.get(at + 2..),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;
    use crate::{parse_roce_v2, Opcode, PacketBuilder};

    /// §A1.8 vector 1 (IPv4 header onward): XRC SEND_ONLY, srqn 0x123.
    const XRC_VECTOR: &str = "4502004012344000401114750a0000010a000002c00112b7002c0000\
        a400ffff00000011800001000000012368656c6c6f2d7872632d776f726c64216dcf2819";

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn global_and_record_header_layout() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        assert_eq!(
            w.get_ref().as_slice(),
            [
                &[0xD4, 0xC3, 0xB2, 0xA1][..], // magic, little-endian, microseconds
                &[2, 0, 4, 0],                 // version 2.4
                &[0; 8],                       // thiszone, sigfigs
                &[0x00, 0x00, 0x04, 0x00],     // snaplen 262144
                &[1, 0, 0, 0],                 // LINKTYPE_ETHERNET
            ]
            .concat()
        );
        w.write_frame(Duration::new(0x0102_0304, 5_006_000), b"abc")
            .unwrap();
        let bytes = w.into_inner();
        assert_eq!(
            &bytes[GLOBAL_HEADER_LEN..],
            &[
                0x04, 0x03, 0x02, 0x01, // seconds
                0x8E, 0x13, 0x00, 0x00, // 5006 µs
                3, 0, 0, 0, 3, 0, 0, 0, b'a', b'b', b'c'
            ]
        );

        let mut n = PcapWriter::with_options(Vec::new(), TsResolution::Nanos, 4).unwrap();
        n.write_frame(Duration::new(1, 7), b"abcdef").unwrap();
        let bytes = n.into_inner();
        assert_eq!(&bytes[0..4], &MAGIC_NANOS.to_le_bytes());
        assert_eq!(&bytes[16..20], &4u32.to_le_bytes());
        // Cut to the snaplen, original length kept.
        assert_eq!(
            &bytes[GLOBAL_HEADER_LEN..],
            &[1, 0, 0, 0, 7, 0, 0, 0, 4, 0, 0, 0, 6, 0, 0, 0, b'a', b'b', b'c', b'd']
        );
    }

    #[test]
    fn writer_rejects_unrepresentable_input() {
        assert!(PcapWriter::with_options(Vec::new(), TsResolution::Micros, 0).is_err());
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        let e = w
            .write_frame(Duration::from_secs(1 << 32), b"x")
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn round_trip_both_resolutions_and_byte_orders() {
        let frames: Vec<(Duration, Vec<u8>)> = (0..5u8)
            .map(|i| {
                (
                    Duration::new(1_700_000_000 + u64::from(i), u32::from(i) * 123_456_000),
                    vec![i; 14 + usize::from(i) * 7],
                )
            })
            .collect();
        for res in [TsResolution::Micros, TsResolution::Nanos] {
            let mut w = PcapWriter::with_options(Vec::new(), res, DEFAULT_SNAPLEN).unwrap();
            for (ts, f) in &frames {
                w.write_frame(*ts, f).unwrap();
            }
            let bytes = w.into_inner();
            let r = PcapReader::new(&bytes[..]).unwrap();
            assert_eq!(
                (r.linktype(), r.resolution(), r.snaplen()),
                (LINKTYPE_ETHERNET, res, DEFAULT_SNAPLEN)
            );
            let back: Vec<PcapRecord> = r.collect::<io::Result<_>>().unwrap();
            assert_eq!(back.len(), frames.len());
            for (rec, (ts, f)) in back.iter().zip(&frames) {
                assert_eq!(
                    (&rec.ts, &rec.data, rec.orig_len as usize),
                    (ts, f, f.len())
                );
            }

            // The same file with every header field byte-swapped reads the same.
            let mut swapped = bytes.clone();
            for at in [0usize, 16, 20] {
                swapped[at..at + 4].reverse();
            }
            swapped[4..6].reverse();
            swapped[6..8].reverse();
            let mut at = GLOBAL_HEADER_LEN;
            for (_, f) in &frames {
                for i in 0..4 {
                    swapped[at + 4 * i..at + 4 * i + 4].reverse();
                }
                at += RECORD_HEADER_LEN + f.len();
            }
            let back_swapped: Vec<PcapRecord> = PcapReader::new(&swapped[..])
                .unwrap()
                .collect::<io::Result<_>>()
                .unwrap();
            assert_eq!(back_swapped, back);
        }
    }

    #[test]
    fn reader_rejects_bad_input() {
        assert!(PcapReader::new(&[0u8; 24][..]).is_err());
        assert!(PcapReader::new(&[0xD4, 0xC3, 0xB2][..]).is_err());
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_frame(Duration::ZERO, &[1; 10]).unwrap();
        let bytes = w.into_inner();
        let mut r = PcapReader::new(&bytes[..bytes.len() - 1]).unwrap();
        assert_eq!(
            r.next_record().unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        let mut r = PcapReader::new(&bytes[..GLOBAL_HEADER_LEN + 3]).unwrap();
        assert_eq!(
            r.next_record().unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        let mut huge = bytes.clone();
        huge[GLOBAL_HEADER_LEN + 8..GLOBAL_HEADER_LEN + 12]
            .copy_from_slice(&u32::MAX.to_le_bytes());
        let mut r = PcapReader::new(&huge[..]).unwrap();
        assert_eq!(
            r.next_record().unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn frame_matches_reference_vector() {
        let v = hex(XRC_VECTOR);
        // Rebuild it from the raw IB bytes with a zeroed ICRC slot.
        let mut ib = v[28..].to_vec();
        let n = ib.len();
        ib[n - 4..].fill(0);
        let ip = IpRepr::V4(Ipv4Repr {
            tos: 0x02,
            identification: 0x1234,
            ..Ipv4Repr::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2))
        });
        let frame = roce_v2_frame(&ip, 0xC001, &ib).unwrap();
        assert_eq!(&frame[..6], &[0x02, 0x04, 10, 0, 0, 2]);
        assert_eq!(&frame[6..12], &[0x02, 0x04, 10, 0, 0, 1]);
        assert_eq!(&frame[12..14], &[0x08, 0x00]);
        assert_eq!(&frame[ETHERNET_HEADER_LEN..], &v[..]);
        assert_eq!(ethernet_payload(&frame), Some(&v[..]));
    }

    #[test]
    fn raw_and_header_helpers_agree_and_verify() {
        let builder = PacketBuilder::new(Opcode(0xAB), 0x22, 0x33)
            .xrceth(0xABCDE)
            .reth(0x1000, 0x77, 5)
            .imm(0xDEAD_BEEF)
            .payload(b"hello");
        let mut ib = vec![0u8; builder.buffer_len()];
        builder.emit(&mut ib).unwrap();
        let v6 = IpRepr::V6(Ipv6Repr {
            traffic_class: 0x68,
            flow_label: 0x12345,
            ..Ipv6Repr::new(
                "fd00::1".parse::<Ipv6Addr>().unwrap(),
                "fd00::2".parse::<Ipv6Addr>().unwrap(),
            )
        });
        let v4 = IpRepr::V4(Ipv4Repr::new(
            Ipv4Addr::new(192, 168, 1, 1),
            Ipv4Addr::new(192, 168, 1, 2),
        ));
        for ip in [v4, v6] {
            let raw = roce_v2_frame(&ip, 0xC123, &ib).unwrap();
            let udp = UdpRepr {
                src_port: 0xC123,
                dst_port: ROCE_V2_UDP_PORT,
            };
            let built = roce_v2_frame_from_headers(&ip, &udp, builder.headers(), b"hello").unwrap();
            assert_eq!(raw, built);
            let d = parse_roce_v2(ethernet_payload(&raw).unwrap()).unwrap();
            assert_eq!(d.packet.headers.xrceth.unwrap().xrc_srq, 0xABCDE);
            assert_eq!(d.packet.payload, b"hello");
        }
        let (s, d) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        let between = roce_v2_frame_between(s, d, 0xC123, &ib).unwrap();
        assert_eq!(&between[12..14], &ETHERTYPE_IPV6.to_be_bytes());
        assert!(parse_roce_v2(ethernet_payload(&between).unwrap()).is_ok());
        assert!(matches!(
            roce_v2_frame_between(s, IpAddr::V4(Ipv4Addr::LOCALHOST), 1, &ib),
            Err(WireError::MalformedIpUdp { .. })
        ));
        // Too short to hold a BTH and an ICRC.
        assert!(roce_v2_frame(&v4, 1, &ib[..8]).is_err());
    }

    #[test]
    fn ethernet_payload_handles_vlan_and_others() {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x81, 0x00, 0x00, 0x05, 0x86, 0xDD, 0x60]);
        assert_eq!(ethernet_payload(&f), Some(&[0x60][..]));
        f[12..14].copy_from_slice(&[0x08, 0x06]); // ARP
        assert_eq!(ethernet_payload(&f), None);
        assert_eq!(ethernet_payload(&f[..13]), None);
    }

    #[test]
    fn write_roce_v2_appends_a_verifiable_frame() {
        let builder = PacketBuilder::new(Opcode(0x04), 0x11, 0x101)
            .ack_req(true)
            .payload(b"hello-xrc-world!");
        let mut ib = vec![0u8; builder.buffer_len()];
        builder.emit(&mut ib).unwrap();
        let ip = IpRepr::V4(Ipv4Repr::new(
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
        ));
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_roce_v2(Duration::from_secs(3), &ip, 0xC001, &ib)
            .unwrap();
        assert!(w
            .write_roce_v2(Duration::from_secs(3), &ip, 0xC001, &ib[..3])
            .is_err());
        let bytes = w.into_inner();
        let mut r = PcapReader::new(&bytes[..]).unwrap();
        let rec = r.next_record().unwrap().unwrap();
        assert!(r.next_record().unwrap().is_none());
        let d = parse_roce_v2(ethernet_payload(&rec.data).unwrap()).unwrap();
        assert_eq!(d.packet.headers.bth.psn, 0x101);
    }
}
