//! A pcapng writer (and a reader of what it writes), for captures whose packets carry a
//! comment: `softverbs daemon --capture-rejected` marks each packet it dropped with its
//! reason there (docs/guide/capture.md).
//!
//! The format is the PCAP Next Generation capture file format (IETF draft
//! `draft-ietf-opsawg-pcapng`; Wireshark's default since 1.8): a Section Header Block, one
//! Interface Description Block (Ethernet, nanosecond timestamps through `if_tsresol`), then
//! one Enhanced Packet Block per frame, with an `opt_comment` (option code 1) where one is
//! given. Wireshark and tshark show that comment as `frame.comment` (and `pkt_comment` in
//! older versions). Little-endian throughout, as the byte-order magic says.

use std::io::{self, Read, Write};
use std::time::Duration;

use crate::pcap::LINKTYPE_ETHERNET;

/// Section Header Block type (also the file's first four bytes).
pub const BT_SHB: u32 = 0x0A0D_0D0A;
/// Interface Description Block type.
pub const BT_IDB: u32 = 0x0000_0001;
/// Enhanced Packet Block type.
pub const BT_EPB: u32 = 0x0000_0006;
/// The byte-order magic of a section.
pub const BYTE_ORDER_MAGIC: u32 = 0x1A2B_3C4D;
/// `opt_endofopt`.
const OPT_END: u16 = 0;
/// `opt_comment`: UTF-8 text, in any block.
pub const OPT_COMMENT: u16 = 1;
/// `if_tsresol` of an IDB: one byte, 9 = 10^-9 s.
const IF_TSRESOL: u16 = 9;
/// Largest frame recorded whole (the IDB's snaplen).
const SNAPLEN: u32 = 262_144;

fn pad4(n: usize) -> usize {
    (n + 3) & !3
}

/// Appends option `code` with `value`, padded to 32 bits.
fn push_option(b: &mut Vec<u8>, code: u16, value: &[u8]) {
    // A comment longer than an option holds is cut (never the case for softverbs' own).
    let value = &value[..value.len().min(usize::from(u16::MAX) & !3)];
    b.extend_from_slice(&code.to_le_bytes());
    b.extend_from_slice(&(value.len() as u16).to_le_bytes());
    b.extend_from_slice(value);
    b.resize(pad4(b.len()), 0);
}

/// Frames `body` as a block of type `ty`: type, total length, body, total length.
fn block(ty: u32, body: &[u8]) -> Vec<u8> {
    let total = (12 + body.len()) as u32;
    let mut b = Vec::with_capacity(total as usize);
    b.extend_from_slice(&ty.to_le_bytes());
    b.extend_from_slice(&total.to_le_bytes());
    b.extend_from_slice(body);
    b.extend_from_slice(&total.to_le_bytes());
    b
}

/// Writes a pcapng file of Ethernet frames.
///
/// ```
/// use std::time::Duration;
/// use softverbs_wire::pcapng::{PcapngReader, PcapngWriter};
/// let mut w = PcapngWriter::new(Vec::new()).unwrap();
/// w.write_frame(Duration::from_millis(1500), &[0xAB; 60], Some("softverbs: rejected: bad ICRC")).unwrap();
/// let bytes = w.into_inner();
/// let rec = PcapngReader::new(&bytes[..]).unwrap().next_record().unwrap().unwrap();
/// assert_eq!(rec.data.len(), 60);
/// assert_eq!(rec.comment.as_deref(), Some("softverbs: rejected: bad ICRC"));
/// ```
#[derive(Debug)]
pub struct PcapngWriter<W: Write> {
    inner: W,
}

impl<W: Write> PcapngWriter<W> {
    /// Writes the section header and the one interface (Ethernet, nanosecond timestamps).
    pub fn new(mut inner: W) -> io::Result<Self> {
        let mut shb = Vec::with_capacity(16);
        shb.extend_from_slice(&BYTE_ORDER_MAGIC.to_le_bytes());
        shb.extend_from_slice(&1u16.to_le_bytes());
        shb.extend_from_slice(&0u16.to_le_bytes());
        // Section length: not known in advance (-1).
        shb.extend_from_slice(&(-1i64).to_le_bytes());
        push_option(&mut shb, OPT_END, &[]);
        inner.write_all(&block(BT_SHB, &shb))?;
        let mut idb = Vec::with_capacity(20);
        idb.extend_from_slice(&(LINKTYPE_ETHERNET as u16).to_le_bytes());
        idb.extend_from_slice(&0u16.to_le_bytes());
        idb.extend_from_slice(&SNAPLEN.to_le_bytes());
        push_option(&mut idb, IF_TSRESOL, &[9]);
        push_option(&mut idb, OPT_END, &[]);
        inner.write_all(&block(BT_IDB, &idb))?;
        Ok(PcapngWriter { inner })
    }

    /// Appends one Ethernet frame captured at `ts` since the Unix epoch, with `comment` as
    /// its `opt_comment` if given.
    pub fn write_frame(
        &mut self,
        ts: Duration,
        frame: &[u8],
        comment: Option<&str>,
    ) -> io::Result<()> {
        let orig = u32::try_from(frame.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too long"))?;
        let incl = orig.min(SNAPLEN);
        let ns = u64::try_from(ts.as_nanos())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "timestamp too late"))?;
        let mut b = Vec::with_capacity(pad4(frame.len()) + 64);
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&((ns >> 32) as u32).to_le_bytes());
        b.extend_from_slice(&(ns as u32).to_le_bytes());
        b.extend_from_slice(&incl.to_le_bytes());
        b.extend_from_slice(&orig.to_le_bytes());
        b.extend_from_slice(&frame[..incl as usize]);
        b.resize(pad4(b.len()), 0);
        if let Some(c) = comment {
            push_option(&mut b, OPT_COMMENT, c.as_bytes());
            push_option(&mut b, OPT_END, &[]);
        }
        self.inner.write_all(&block(BT_EPB, &b))
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }

    /// Gives back the underlying writer (not flushed).
    pub fn into_inner(self) -> W {
        self.inner
    }
}

/// One packet of a pcapng file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PcapngRecord {
    /// Since the Unix epoch (nanosecond resolution, as [`PcapngWriter`] writes).
    pub ts: Duration,
    /// The frame as captured.
    pub data: Vec<u8>,
    /// Its `opt_comment`, if any.
    pub comment: Option<String>,
}

/// Reads the packets of a little-endian pcapng file with nanosecond timestamps, as
/// [`PcapngWriter`] writes it (other blocks are skipped).
pub struct PcapngReader<R: Read> {
    inner: R,
}

impl<R: Read> PcapngReader<R> {
    /// Checks the file starts with a little-endian section header.
    pub fn new(mut inner: R) -> io::Result<Self> {
        let mut h = [0u8; 12];
        inner.read_exact(&mut h)?;
        let ty = u32::from_le_bytes(h[0..4].try_into().unwrap_or_default());
        let magic = u32::from_le_bytes(h[8..12].try_into().unwrap_or_default());
        if ty != BT_SHB || magic != BYTE_ORDER_MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a little-endian pcapng file",
            ));
        }
        let total = u32::from_le_bytes(h[4..8].try_into().unwrap_or_default()) as usize;
        let mut rest = vec![0u8; total.saturating_sub(12)];
        inner.read_exact(&mut rest)?;
        Ok(PcapngReader { inner })
    }

    /// The next packet, or `None` at the end of the file (a block cut short included: a
    /// file being written ends so).
    pub fn next_record(&mut self) -> io::Result<Option<PcapngRecord>> {
        loop {
            let mut h = [0u8; 8];
            if read_full(&mut self.inner, &mut h)? < 8 {
                return Ok(None);
            }
            let ty = u32::from_le_bytes(h[0..4].try_into().unwrap_or_default());
            let total = u32::from_le_bytes(h[4..8].try_into().unwrap_or_default()) as usize;
            if total < 12 || total % 4 != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "bad pcapng block length",
                ));
            }
            let mut body = vec![0u8; total - 8];
            if read_full(&mut self.inner, &mut body)? < body.len() {
                return Ok(None);
            }
            body.truncate(total - 12);
            if ty != BT_EPB {
                continue;
            }
            return parse_epb(&body).map(Some);
        }
    }
}

fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

fn parse_epb(b: &[u8]) -> io::Result<PcapngRecord> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "bad enhanced packet block");
    let u32_at = |o: usize| -> io::Result<u32> {
        Ok(u32::from_le_bytes(
            b.get(o..o + 4)
                .ok_or_else(bad)?
                .try_into()
                .map_err(|_| bad())?,
        ))
    };
    let ns = (u64::from(u32_at(4)?) << 32) | u64::from(u32_at(8)?);
    let incl = u32_at(12)? as usize;
    let data = b.get(20..20 + incl).ok_or_else(bad)?.to_vec();
    let mut o = 20 + pad4(incl);
    let mut comment = None;
    while o + 4 <= b.len() {
        let code = u16::from_le_bytes([b[o], b[o + 1]]);
        let len = usize::from(u16::from_le_bytes([b[o + 2], b[o + 3]]));
        if code == OPT_END {
            break;
        }
        let v = b.get(o + 4..o + 4 + len).ok_or_else(bad)?;
        if code == OPT_COMMENT {
            comment = Some(String::from_utf8_lossy(v).into_owned());
        }
        o += 4 + pad4(len);
    }
    Ok(PcapngRecord {
        ts: Duration::from_nanos(ns),
        data,
        comment,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_with_and_without_a_comment_read_back() {
        let mut w = PcapngWriter::new(Vec::new()).unwrap();
        w.write_frame(Duration::new(1_700_000_000, 123), &[1, 2, 3, 4, 5], None)
            .unwrap();
        w.write_frame(
            Duration::new(1_700_000_001, 0),
            &[9; 61],
            Some("softverbs: rejected: unknown QP"),
        )
        .unwrap();
        let bytes = w.into_inner();
        assert_eq!(bytes.len() % 4, 0);
        let mut r = PcapngReader::new(&bytes[..]).unwrap();
        let a = r.next_record().unwrap().unwrap();
        assert_eq!(
            (a.ts, a.data, a.comment),
            (Duration::new(1_700_000_000, 123), vec![1, 2, 3, 4, 5], None)
        );
        let b = r.next_record().unwrap().unwrap();
        assert_eq!(b.data, vec![9; 61]);
        assert_eq!(
            b.comment.as_deref(),
            Some("softverbs: rejected: unknown QP")
        );
        assert!(r.next_record().unwrap().is_none());
        // A file cut inside a block (being written) ends there.
        let cut = &bytes[..bytes.len() - 10];
        let mut r = PcapngReader::new(cut).unwrap();
        assert!(r.next_record().unwrap().is_some());
        assert!(r.next_record().unwrap().is_none());
    }
}
