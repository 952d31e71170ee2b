//! Whole IB transport packets: `BTH | extension headers | payload | pad | ICRC`.
//!
//! The opcode alone fixes which extension headers follow BTH and in which order (IBA 9.2;
//! XRC requests put XRCETH first, Annex A14), so parsing is a walk over
//! [`OpcodeInfo::headers`]. The ICRC trailer is only split off here; computing and checking
//! it needs the IP/UDP headers too (see [`crate::icrc`]).

use crate::aeth::{Aeth, AethRepr, Syndrome};
use crate::atomic::{AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr};
use crate::bth::{Bth, BthRepr};
use crate::deth::{Deth, DethRepr};
use crate::imm::{Ieth, IethRepr, ImmDt, ImmDtRepr};
use crate::opcode::{HeaderSet, Opcode, OpcodeInfo};
use crate::reth::{Reth, RethRepr};
use crate::xrceth::{Xrceth, XrcethRepr};
use crate::{HeaderKind, WireError};

/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// The parsed headers of a packet: BTH plus whichever extension headers its opcode carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)] // each field is the header of the same name
pub struct Headers {
    pub bth: BthRepr,
    pub xrceth: Option<XrcethRepr>,
    pub deth: Option<DethRepr>,
    pub reth: Option<RethRepr>,
    pub atomic_eth: Option<AtomicEthRepr>,
    pub aeth: Option<AethRepr>,
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    pub imm_dt: Option<ImmDtRepr>,
    pub ieth: Option<IethRepr>,
}

impl Headers {
    /// BTH only; add the extension headers the opcode needs before emitting.
    pub const fn new(bth: BthRepr) -> Self {
        Self {
            bth,
            xrceth: None,
            deth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            imm_dt: None,
            ieth: None,
        }
    }

    /// The opcode in BTH.
    pub const fn opcode(&self) -> Opcode {
        self.bth.opcode
    }

    /// The extension headers that are set.
    pub fn present(&self) -> HeaderSet {
        let mut set = HeaderSet::EMPTY;
        for (kind, on) in [
            (HeaderKind::Xrceth, self.xrceth.is_some()),
            (HeaderKind::Deth, self.deth.is_some()),
            (HeaderKind::Reth, self.reth.is_some()),
            (HeaderKind::AtomicEth, self.atomic_eth.is_some()),
            (HeaderKind::Aeth, self.aeth.is_some()),
            (HeaderKind::AtomicAckEth, self.atomic_ack_eth.is_some()),
            (HeaderKind::ImmDt, self.imm_dt.is_some()),
            (HeaderKind::Ieth, self.ieth.is_some()),
        ] {
            if on {
                set = set.with(kind);
            }
        }
        set
    }

    /// Bytes of BTH plus the extension headers that are set.
    pub fn buffer_len(&self) -> usize {
        HeaderKind::Bth.wire_len() + self.present().wire_len()
    }

    /// Checks that the opcode is known, the version is 0 and exactly the opcode's extension
    /// headers are set; returns the opcode's description.
    pub fn check(&self) -> Result<OpcodeInfo, WireError> {
        let info = self.bth.opcode.info()?;
        if self.bth.tver != 0 {
            return Err(WireError::UnsupportedTver(self.bth.tver));
        }
        let present = self.present();
        let opcode = self.bth.opcode.0;
        for kind in HeaderKind::EXTENSIONS {
            match (info.headers.contains(kind), present.contains(kind)) {
                (true, false) => {
                    return Err(WireError::MissingHeader {
                        opcode,
                        header: kind,
                    })
                }
                (false, true) => {
                    return Err(WireError::UnexpectedHeader {
                        opcode,
                        header: kind,
                    })
                }
                _ => {}
            }
        }
        Ok(info)
    }

    fn parse_extension(&mut self, kind: HeaderKind, bytes: &[u8]) -> Result<(), WireError> {
        match kind {
            HeaderKind::Xrceth => {
                self.xrceth = Some(XrcethRepr::parse(&Xrceth::new_checked(bytes)?)?)
            }
            HeaderKind::Deth => self.deth = Some(DethRepr::parse(&Deth::new_checked(bytes)?)?),
            HeaderKind::Reth => self.reth = Some(RethRepr::parse(&Reth::new_checked(bytes)?)?),
            HeaderKind::AtomicEth => {
                self.atomic_eth = Some(AtomicEthRepr::parse(&AtomicEth::new_checked(bytes)?)?)
            }
            HeaderKind::Aeth => self.aeth = Some(AethRepr::parse(&Aeth::new_checked(bytes)?)?),
            HeaderKind::AtomicAckEth => {
                self.atomic_ack_eth =
                    Some(AtomicAckEthRepr::parse(&AtomicAckEth::new_checked(bytes)?)?)
            }
            HeaderKind::ImmDt => self.imm_dt = Some(ImmDtRepr::parse(&ImmDt::new_checked(bytes)?)?),
            HeaderKind::Ieth => self.ieth = Some(IethRepr::parse(&Ieth::new_checked(bytes)?)?),
            // `OpcodeInfo::headers` only ever holds extension headers.
            HeaderKind::Ipv4
            | HeaderKind::Ipv6
            | HeaderKind::Udp
            | HeaderKind::Bth
            | HeaderKind::Icrc => {}
        }
        Ok(())
    }

    fn emit_extension(&self, kind: HeaderKind, buf: &mut [u8]) -> Result<(), WireError> {
        let missing = WireError::MissingHeader {
            opcode: self.bth.opcode.0,
            header: kind,
        };
        match kind {
            HeaderKind::Xrceth => self
                .xrceth
                .ok_or(missing)?
                .emit(&mut Xrceth::new_unchecked(buf)),
            HeaderKind::Deth => self
                .deth
                .ok_or(missing)?
                .emit(&mut Deth::new_unchecked(buf)),
            HeaderKind::Reth => self
                .reth
                .ok_or(missing)?
                .emit(&mut Reth::new_unchecked(buf)),
            HeaderKind::AtomicEth => self
                .atomic_eth
                .ok_or(missing)?
                .emit(&mut AtomicEth::new_unchecked(buf)),
            HeaderKind::Aeth => self
                .aeth
                .ok_or(missing)?
                .emit(&mut Aeth::new_unchecked(buf)),
            HeaderKind::AtomicAckEth => self
                .atomic_ack_eth
                .ok_or(missing)?
                .emit(&mut AtomicAckEth::new_unchecked(buf)),
            HeaderKind::ImmDt => self
                .imm_dt
                .ok_or(missing)?
                .emit(&mut ImmDt::new_unchecked(buf)),
            HeaderKind::Ieth => self
                .ieth
                .ok_or(missing)?
                .emit(&mut Ieth::new_unchecked(buf)),
            HeaderKind::Ipv4
            | HeaderKind::Ipv6
            | HeaderKind::Udp
            | HeaderKind::Bth
            | HeaderKind::Icrc => Ok(()),
        }
    }
}

/// A parsed packet borrowing the buffer it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketRef<'a> {
    /// BTH and extension headers.
    pub headers: Headers,
    /// What the opcode says about the packet.
    pub info: OpcodeInfo,
    /// Payload with the pad removed.
    pub payload: &'a [u8],
    /// ICRC trailer as the 32-bit CRC value (stored little-endian on the wire).
    pub icrc: u32,
    bytes: &'a [u8],
}

impl<'a> PacketRef<'a> {
    /// The opcode.
    pub const fn opcode(&self) -> Opcode {
        self.headers.bth.opcode
    }

    /// The whole packet, BTH through ICRC.
    pub const fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Everything the ICRC covers from BTH on: the packet without its last 4 bytes.
    pub fn without_icrc(&self) -> &'a [u8] {
        &self.bytes[..self.bytes.len() - ICRC_LEN]
    }

    /// The pad bytes between payload and ICRC.
    pub fn pad(&self) -> &'a [u8] {
        let end = self.bytes.len() - ICRC_LEN;
        &self.bytes[end - usize::from(self.headers.bth.pad_count)..end]
    }

    /// Checks the ICRC given the IP and UDP headers the packet arrived under.
    pub fn verify_icrc(&self, ip_udp: &[u8]) -> Result<(), WireError> {
        crate::icrc::verify(ip_udp, self.bytes)
    }
}

/// Entry point of the whole-packet parser; holds no data.
#[derive(Debug)]
pub enum Packet {}

impl Packet {
    /// Parses `BTH | headers | payload | pad | ICRC` (the UDP payload of a RoCE v2
    /// datagram). Reserved header bits are ignored; the ICRC is returned, not checked.
    pub fn parse(bytes: &[u8]) -> Result<PacketRef<'_>, WireError> {
        let bth = BthRepr::parse(&Bth::new_checked(bytes)?)?;
        let info = bth.opcode.info()?;
        if bth.tver != 0 {
            return Err(WireError::UnsupportedTver(bth.tver));
        }
        let mut headers = Headers::new(bth);
        let mut at = HeaderKind::Bth.wire_len();
        for kind in info.headers.iter() {
            headers.parse_extension(kind, &bytes[at..])?;
            at += kind.wire_len();
        }
        let available = bytes.len() - at;
        if available < ICRC_LEN {
            return Err(WireError::Truncated {
                header: HeaderKind::Icrc,
                needed: ICRC_LEN,
                available,
            });
        }
        let icrc_at = bytes.len() - ICRC_LEN;
        let rest = &bytes[at..icrc_at];
        if !info.payload && !rest.is_empty() {
            return Err(WireError::UnexpectedPayload {
                opcode: bth.opcode.0,
                len: rest.len(),
            });
        }
        let pad = usize::from(bth.pad_count);
        if pad > rest.len() {
            return Err(WireError::PadTooLarge {
                pad: bth.pad_count,
                available: rest.len(),
            });
        }
        if rest.len() % 4 != 0 {
            return Err(WireError::UnalignedPayload { len: rest.len() });
        }
        let mut icrc = [0u8; ICRC_LEN];
        icrc.copy_from_slice(&bytes[icrc_at..]);
        Ok(PacketRef {
            headers,
            info,
            payload: &rest[..rest.len() - pad],
            icrc: u32::from_le_bytes(icrc),
            bytes,
        })
    }
}

/// Pad bytes that bring `payload_len` to a multiple of 4 (IBA 9.2, PadCnt).
pub const fn pad_for(payload_len: usize) -> usize {
    payload_len.wrapping_neg() & 3
}

/// Bytes [`emit_packet`] writes for these headers and a payload of `payload_len` bytes.
pub fn packet_len(headers: &Headers, payload_len: usize) -> usize {
    headers.buffer_len() + payload_len + pad_for(payload_len) + ICRC_LEN
}

/// Writes `BTH | headers | payload | zero pad | zero ICRC placeholder` to the front of `buf`
/// and returns the number of bytes written.
///
/// BTH.PadCnt is computed from the payload length; the value in `headers.bth.pad_count` is
/// ignored. Fill the ICRC in afterwards with [`crate::icrc::write`], once the IP/UDP headers
/// are known. On error `buf` may be partly written.
pub fn emit_packet(headers: &Headers, payload: &[u8], buf: &mut [u8]) -> Result<usize, WireError> {
    let written = emit_packet_with(headers, payload.len(), buf, |p| {
        p.copy_from_slice(payload);
        Ok::<(), core::convert::Infallible>(())
    })?;
    match written {
        Ok(n) => Ok(n),
        Err(never) => match never {},
    }
}

/// [`emit_packet`] with the `payload_len` payload bytes written in place by `fill`, so a
/// sender gathering them from registered memory writes them once, into the packet, instead
/// of staging them in a buffer of its own first. `Ok(Err(e))`: `fill` failed with `e` (then
/// `buf` is partly written).
pub fn emit_packet_with<E>(
    headers: &Headers,
    payload_len: usize,
    buf: &mut [u8],
    fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> Result<Result<usize, E>, WireError> {
    let info = headers.check()?;
    if !info.payload && payload_len != 0 {
        return Err(WireError::UnexpectedPayload {
            opcode: headers.bth.opcode.0,
            len: payload_len,
        });
    }
    let pad = pad_for(payload_len);
    let total = packet_len(headers, payload_len);
    if buf.len() < total {
        return Err(WireError::BufferTooSmall {
            needed: total,
            available: buf.len(),
        });
    }
    let buf = &mut buf[..total];

    // `pad` is at most 3, so the cast is lossless.
    let bth = BthRepr {
        pad_count: pad as u8,
        ..headers.bth
    };
    bth.emit(&mut Bth::new_unchecked(&mut buf[..]))?;
    let mut at = HeaderKind::Bth.wire_len();
    for kind in info.headers.iter() {
        headers.emit_extension(kind, &mut buf[at..])?;
        at += kind.wire_len();
    }
    if let Err(e) = fill(&mut buf[at..at + payload_len]) {
        return Ok(Err(e));
    }
    // IBA 9.2 wants pad bytes of 0; the ICRC slot is zeroed so a forgotten `icrc::write`
    // shows up as a mismatch rather than stale data.
    buf[at + payload_len..].fill(0);
    Ok(Ok(total))
}

/// Fluent construction of a packet, mainly for tests and tools.
///
/// ```
/// use softverbs_wire::{Opcode, PacketBuilder, Packet};
/// let payload = b"hello-xrc-world!";
/// let builder = PacketBuilder::new(Opcode(0xA4), 0x11, 0x100)
///     .ack_req(true)
///     .xrceth(0x123)
///     .payload(payload);
/// let mut buf = [0u8; 64];
/// let len = builder.emit(&mut buf).unwrap();
/// assert_eq!(len, builder.buffer_len());
/// let pkt = Packet::parse(&buf[..len]).unwrap();
/// assert_eq!(pkt.payload, payload);
/// assert_eq!(pkt.headers.xrceth.unwrap().xrc_srq, 0x123);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketBuilder<'p> {
    headers: Headers,
    payload: &'p [u8],
}

impl<'p> PacketBuilder<'p> {
    /// A packet with a default BTH ([`BthRepr::new`]) and no payload.
    pub const fn new(opcode: Opcode, dest_qp: u32, psn: u32) -> Self {
        Self::from_headers(Headers::new(BthRepr::new(opcode, dest_qp, psn)))
    }

    /// Starts from complete headers.
    pub const fn from_headers(headers: Headers) -> Self {
        Self {
            headers,
            payload: &[],
        }
    }

    /// The headers so far.
    pub const fn headers(&self) -> &Headers {
        &self.headers
    }

    /// Replaces the whole BTH.
    pub const fn bth(mut self, bth: BthRepr) -> Self {
        self.headers.bth = bth;
        self
    }

    /// Sets BTH.SE.
    pub const fn solicited(mut self, on: bool) -> Self {
        self.headers.bth.solicited = on;
        self
    }

    /// Sets BTH.AckReq.
    pub const fn ack_req(mut self, on: bool) -> Self {
        self.headers.bth.ack_req = on;
        self
    }

    /// Sets BTH.P_Key.
    pub const fn pkey(mut self, pkey: u16) -> Self {
        self.headers.bth.pkey = pkey;
        self
    }

    /// Adds an XRCETH naming the target SRQ.
    pub const fn xrceth(mut self, xrc_srq: u32) -> Self {
        self.headers.xrceth = Some(XrcethRepr { xrc_srq });
        self
    }

    /// Adds a DETH.
    pub const fn deth(mut self, qkey: u32, src_qp: u32) -> Self {
        self.headers.deth = Some(DethRepr { qkey, src_qp });
        self
    }

    /// Adds a RETH.
    pub const fn reth(mut self, va: u64, rkey: u32, dma_len: u32) -> Self {
        self.headers.reth = Some(RethRepr { va, rkey, dma_len });
        self
    }

    /// Adds an AtomicETH.
    pub const fn atomic_eth(mut self, va: u64, rkey: u32, swap_add: u64, compare: u64) -> Self {
        self.headers.atomic_eth = Some(AtomicEthRepr {
            va,
            rkey,
            swap_add,
            compare,
        });
        self
    }

    /// Adds an AETH.
    pub const fn aeth(mut self, syndrome: Syndrome, msn: u32) -> Self {
        self.headers.aeth = Some(AethRepr { syndrome, msn });
        self
    }

    /// Adds an AtomicAckETH.
    pub const fn atomic_ack_eth(mut self, orig: u64) -> Self {
        self.headers.atomic_ack_eth = Some(AtomicAckEthRepr { orig });
        self
    }

    /// Adds an ImmDt.
    pub const fn imm(mut self, imm: u32) -> Self {
        self.headers.imm_dt = Some(ImmDtRepr { imm });
        self
    }

    /// Adds an IETH.
    pub const fn ieth(mut self, rkey: u32) -> Self {
        self.headers.ieth = Some(IethRepr { rkey });
        self
    }

    /// Sets the payload.
    pub const fn payload(mut self, payload: &'p [u8]) -> Self {
        self.payload = payload;
        self
    }

    /// Bytes [`Self::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        packet_len(&self.headers, self.payload.len())
    }

    /// Writes the packet with a zero ICRC placeholder; see [`emit_packet`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        emit_packet(&self.headers, self.payload, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aeth::NakCode;

    fn emit(b: &PacketBuilder<'_>) -> Vec<u8> {
        let mut buf = vec![0u8; b.buffer_len()];
        let n = b.emit(&mut buf).unwrap();
        assert_eq!(n, buf.len());
        buf
    }

    #[test]
    fn xrc_send_only_matches_reference_bytes() {
        // §A1.8 vector 1 from BTH on, ICRC slot still zero.
        let bytes = emit(
            &PacketBuilder::new(Opcode(0xA4), 0x11, 0x100)
                .ack_req(true)
                .xrceth(0x123)
                .payload(b"hello-xrc-world!"),
        );
        let mut expected = vec![
            0xa4, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x00, 0x01, 0x00, 0x00, 0x00,
            0x01, 0x23,
        ];
        expected.extend_from_slice(b"hello-xrc-world!");
        expected.extend_from_slice(&[0; 4]);
        assert_eq!(bytes, expected);
    }

    #[test]
    fn pad_is_added_and_removed() {
        for len in 0..9usize {
            let payload: Vec<u8> = (0..len as u8).map(|i| i + 1).collect();
            let bytes = emit(&PacketBuilder::new(Opcode(0x04), 7, 9).payload(&payload));
            assert_eq!(bytes.len(), 12 + len + pad_for(len) + 4);
            assert_eq!((12 + len + pad_for(len)) % 4, 0);
            let pkt = Packet::parse(&bytes).unwrap();
            assert_eq!(pkt.payload, &payload[..]);
            assert_eq!(usize::from(pkt.headers.bth.pad_count), pad_for(len));
            assert!(pkt.pad().iter().all(|&b| b == 0));
            assert_eq!(pkt.without_icrc().len(), bytes.len() - 4);
        }
    }

    #[test]
    fn a_payload_filled_in_place_gives_the_same_packet() {
        let payload: Vec<u8> = (0..37u8).collect();
        let headers = Headers::new(BthRepr::new(Opcode(0x04), 7, 9));
        // Stale bytes where pad and ICRC go: both must come out zero.
        let mut a = vec![0xEEu8; 128];
        let mut b = vec![0xEEu8; 128];
        let n = emit_packet(&headers, &payload, &mut a).unwrap();
        let m = emit_packet_with(&headers, payload.len(), &mut b, |p| {
            p.copy_from_slice(&payload);
            Ok::<(), ()>(())
        })
        .unwrap()
        .unwrap();
        assert_eq!((n, &a[..n]), (m, &b[..m]));
        let failed = emit_packet_with(&headers, 8, &mut b, |_| Err("gather failed")).unwrap();
        assert_eq!(failed, Err("gather failed"), "the fill's error comes back");
        // RC RDMA READ request: no payload allowed.
        let read = PacketBuilder::new(Opcode(0x0C), 7, 9).reth(0x1000, 0x22, 64);
        assert!(
            matches!(
                emit_packet_with(read.headers(), 4, &mut b, |_| Ok::<(), ()>(())),
                Err(WireError::UnexpectedPayload { .. })
            ),
            "an opcode without payload refuses one"
        );
    }

    #[test]
    fn ack_round_trip() {
        let bytes = emit(&PacketBuilder::new(Opcode(0x11), 0x44, 0x101).aeth(
            Syndrome::Nak {
                code: NakCode::PsnSeqErr,
            },
            5,
        ));
        let pkt = Packet::parse(&bytes).unwrap();
        assert_eq!(
            pkt.headers.aeth,
            Some(AethRepr {
                syndrome: Syndrome::Nak {
                    code: NakCode::PsnSeqErr
                },
                msn: 5
            })
        );
        assert!(pkt.payload.is_empty());
        assert_eq!(pkt.info.headers.count(), 1);
    }

    #[test]
    fn emitter_errors() {
        let mut buf = [0u8; 128];
        // XRC request without XRCETH.
        assert_eq!(
            PacketBuilder::new(Opcode(0xA4), 1, 1).emit(&mut buf),
            Err(WireError::MissingHeader {
                opcode: 0xA4,
                header: HeaderKind::Xrceth
            })
        );
        // XRC response with one.
        assert_eq!(
            PacketBuilder::new(Opcode(0xB1), 1, 1)
                .xrceth(1)
                .aeth(Syndrome::Ack { credits: 0x1F }, 0)
                .emit(&mut buf),
            Err(WireError::UnexpectedHeader {
                opcode: 0xB1,
                header: HeaderKind::Xrceth
            })
        );
        assert_eq!(
            PacketBuilder::new(Opcode(0x0C), 1, 1)
                .reth(0, 0, 8)
                .payload(b"x")
                .emit(&mut buf),
            Err(WireError::UnexpectedPayload {
                opcode: 0x0C,
                len: 1
            })
        );
        assert_eq!(
            PacketBuilder::new(Opcode(0x15), 1, 1).emit(&mut buf),
            Err(WireError::UnknownOpcode(0x15))
        );
        let mut bth = BthRepr::new(Opcode(0x04), 1, 1);
        bth.tver = 1;
        assert_eq!(
            PacketBuilder::new(Opcode(0x04), 1, 1)
                .bth(bth)
                .emit(&mut buf),
            Err(WireError::UnsupportedTver(1))
        );
        assert_eq!(
            PacketBuilder::new(Opcode(0x04), 1, 1)
                .payload(&[0; 5])
                .emit(&mut buf[..20]),
            Err(WireError::BufferTooSmall {
                needed: 24,
                available: 20
            })
        );
        assert!(matches!(
            PacketBuilder::new(Opcode(0x04), 1 << 24, 1).emit(&mut buf),
            Err(WireError::FieldOutOfRange {
                field: "BTH.DestQP",
                ..
            })
        ));
    }

    #[test]
    fn parser_errors() {
        let good = emit(
            &PacketBuilder::new(Opcode(0x0A), 3, 4)
                .reth(1, 2, 3)
                .payload(b"abcdef"),
        );
        assert!(Packet::parse(&good).is_ok());

        assert_eq!(
            Packet::parse(&good[..5]),
            Err(WireError::Truncated {
                header: HeaderKind::Bth,
                needed: 12,
                available: 5
            })
        );
        assert_eq!(
            Packet::parse(&good[..20]),
            Err(WireError::Truncated {
                header: HeaderKind::Reth,
                needed: 16,
                available: 8
            })
        );

        let ack =
            emit(&PacketBuilder::new(Opcode(0x11), 3, 4).aeth(Syndrome::Ack { credits: 1 }, 2));
        assert_eq!(
            Packet::parse(&ack[..18]),
            Err(WireError::Truncated {
                header: HeaderKind::Icrc,
                needed: 4,
                available: 2
            })
        );
        let mut long_ack = ack.clone();
        long_ack.extend_from_slice(&[0; 4]);
        assert_eq!(
            Packet::parse(&long_ack),
            Err(WireError::UnexpectedPayload {
                opcode: 0x11,
                len: 4
            })
        );
        let mut padded_ack = ack.clone();
        padded_ack[1] |= 0x10;
        assert_eq!(
            Packet::parse(&padded_ack),
            Err(WireError::PadTooLarge {
                pad: 1,
                available: 0
            })
        );
        let mut reserved_syndrome = ack.clone();
        reserved_syndrome[12] = 0x5F;
        assert_eq!(
            Packet::parse(&reserved_syndrome),
            Err(WireError::ReservedSyndrome(0x5F))
        );

        let mut bad_op = good.clone();
        bad_op[0] = 0xC4;
        assert_eq!(Packet::parse(&bad_op), Err(WireError::UnknownOpcode(0xC4)));
        // A UC opcode number that exists only for RC.
        bad_op[0] = 0x2C;
        assert_eq!(Packet::parse(&bad_op), Err(WireError::UnknownOpcode(0x2C)));

        let mut tver = good.clone();
        tver[1] |= 0x01;
        assert_eq!(Packet::parse(&tver), Err(WireError::UnsupportedTver(1)));

        // 2 bytes of payload+pad: not a 4-byte multiple.
        let mut unaligned = good.clone();
        unaligned.truncate(good.len() - 6);
        assert_eq!(
            Packet::parse(&unaligned),
            Err(WireError::UnalignedPayload { len: 2 })
        );

        // 8 bytes of payload+pad with PadCnt 2 is fine; with only 0 bytes it is too large.
        let mut empty = emit(&PacketBuilder::new(Opcode(0x04), 3, 4));
        empty[1] |= 0x30;
        assert_eq!(
            Packet::parse(&empty),
            Err(WireError::PadTooLarge {
                pad: 3,
                available: 0
            })
        );
    }

    #[test]
    fn reserved_bits_are_ignored_on_receive() {
        let mut bytes = emit(
            &PacketBuilder::new(Opcode(0xA1), 3, 4)
                .xrceth(0x55)
                .payload(&[9; 8]),
        );
        bytes[4] |= 0x3F; // Resv6a
        bytes[8] |= 0x7F; // Resv7
        bytes[12] = 0xFF; // XRCETH reserved byte
        let pkt = Packet::parse(&bytes).unwrap();
        assert_eq!(pkt.headers.bth.psn, 4);
        assert_eq!(pkt.headers.xrceth, Some(XrcethRepr { xrc_srq: 0x55 }));
    }
}
