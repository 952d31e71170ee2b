//! Base Transport Header (IBA 9.2), 12 bytes, present in every IB transport packet.
//!
//! ```text
//! byte 0      OpCode
//! byte 1      SE(7) M(6) PadCnt(5:4) TVer(3:0)
//! bytes 2-3   P_Key
//! byte 4      FECN(7) BECN(6) Resv6a(5:0)   -- variant: masked to 0xFF in the ICRC
//! bytes 5-7   DestQP
//! byte 8      AckReq(7) Resv7(6:0)
//! bytes 9-11  PSN
//! ```

use crate::be::{self, U24_MASK};
use crate::opcode::Opcode;
use crate::view::header_view;
use crate::{HeaderKind, WireError};

mod field {
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const PKEY: usize = 2;
    pub const CONGESTION: usize = 4;
    pub const DEST_QP: usize = 5;
    pub const ACK: usize = 8;
    pub const PSN: usize = 9;

    pub const SE: u8 = 0x80;
    pub const MIG_REQ: u8 = 0x40;
    pub const PAD_SHIFT: u8 = 4;
    pub const PAD_MASK: u8 = 0x30;
    pub const TVER_MASK: u8 = 0x0F;
    pub const FECN: u8 = 0x80;
    pub const BECN: u8 = 0x40;
    pub const RESV6A: u8 = 0x3F;
    pub const ACK_REQ: u8 = 0x80;
    pub const RESV7: u8 = 0x7F;
}

/// Offset of the BTH byte holding FECN/BECN/Resv6a, which RoCE v2 treats as variant and
/// masks in the ICRC (Annex A17).
pub const VARIANT_BYTE: usize = field::CONGESTION;

/// The default partition key, full membership of the default partition (IBA 10.9, partitioning).
pub const DEFAULT_PKEY: u16 = 0xFFFF;

header_view!(
    /// Zero-copy view of a Base Transport Header (IBA 9.2).
    Bth,
    HeaderKind::Bth
);

fn flag(byte: u8, mask: u8) -> bool {
    byte & mask != 0
}

fn with_flag(byte: u8, mask: u8, on: bool) -> u8 {
    if on {
        byte | mask
    } else {
        byte & !mask
    }
}

impl<T: AsRef<[u8]>> Bth<T> {
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// OpCode: transport class in bits 7:5, operation in bits 4:0.
    pub fn opcode(&self) -> Opcode {
        Opcode(self.b()[field::OPCODE])
    }

    /// SE: the responder should raise a solicited-event completion.
    pub fn solicited(&self) -> bool {
        flag(self.b()[field::FLAGS], field::SE)
    }

    /// M: path migration state.
    pub fn mig_req(&self) -> bool {
        flag(self.b()[field::FLAGS], field::MIG_REQ)
    }

    /// PadCnt: pad bytes (0-3) between payload and ICRC.
    pub fn pad_count(&self) -> u8 {
        (self.b()[field::FLAGS] & field::PAD_MASK) >> field::PAD_SHIFT
    }

    /// TVer: transport header version (0 is the only one defined).
    pub fn tver(&self) -> u8 {
        self.b()[field::FLAGS] & field::TVER_MASK
    }

    /// P_Key: partition key.
    pub fn pkey(&self) -> u16 {
        be::u16_at(self.b(), field::PKEY)
    }

    /// FECN: forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        flag(self.b()[field::CONGESTION], field::FECN)
    }

    /// BECN: backward explicit congestion notification.
    pub fn becn(&self) -> bool {
        flag(self.b()[field::CONGESTION], field::BECN)
    }

    /// Resv6a: reserved bits of byte 4; ignored on receive.
    pub fn resv6a(&self) -> u8 {
        self.b()[field::CONGESTION] & field::RESV6A
    }

    /// DestQP: 24-bit destination queue pair number.
    pub fn dest_qp(&self) -> u32 {
        be::u24_at(self.b(), field::DEST_QP)
    }

    /// A: the requester asks for an acknowledgement of this packet.
    pub fn ack_req(&self) -> bool {
        flag(self.b()[field::ACK], field::ACK_REQ)
    }

    /// Resv7: reserved bits of byte 8; ignored on receive.
    pub fn resv7(&self) -> u8 {
        self.b()[field::ACK] & field::RESV7
    }

    /// PSN: 24-bit packet sequence number.
    pub fn psn(&self) -> u32 {
        be::u24_at(self.b(), field::PSN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    fn b_mut(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    fn update(&mut self, at: usize, mask: u8, on: bool) {
        let b = self.b_mut();
        b[at] = with_flag(b[at], mask, on);
    }

    /// Sets OpCode.
    pub fn set_opcode(&mut self, opcode: Opcode) {
        self.b_mut()[field::OPCODE] = opcode.0;
    }

    /// Sets SE.
    pub fn set_solicited(&mut self, on: bool) {
        self.update(field::FLAGS, field::SE, on);
    }

    /// Sets M.
    pub fn set_mig_req(&mut self, on: bool) {
        self.update(field::FLAGS, field::MIG_REQ, on);
    }

    /// Sets PadCnt; only the low 2 bits are used.
    pub fn set_pad_count(&mut self, pad: u8) {
        let b = self.b_mut();
        b[field::FLAGS] =
            (b[field::FLAGS] & !field::PAD_MASK) | ((pad << field::PAD_SHIFT) & field::PAD_MASK);
    }

    /// Sets TVer; only the low 4 bits are used.
    pub fn set_tver(&mut self, tver: u8) {
        let b = self.b_mut();
        b[field::FLAGS] = (b[field::FLAGS] & !field::TVER_MASK) | (tver & field::TVER_MASK);
    }

    /// Sets P_Key.
    pub fn set_pkey(&mut self, pkey: u16) {
        be::put_u16(self.b_mut(), field::PKEY, pkey);
    }

    /// Sets FECN.
    pub fn set_fecn(&mut self, on: bool) {
        self.update(field::CONGESTION, field::FECN, on);
    }

    /// Sets BECN.
    pub fn set_becn(&mut self, on: bool) {
        self.update(field::CONGESTION, field::BECN, on);
    }

    /// Sets DestQP; only the low 24 bits are used.
    pub fn set_dest_qp(&mut self, qpn: u32) {
        be::put_u24(self.b_mut(), field::DEST_QP, qpn & U24_MASK);
    }

    /// Sets the AckReq bit.
    pub fn set_ack_req(&mut self, on: bool) {
        self.update(field::ACK, field::ACK_REQ, on);
    }

    /// Sets PSN; only the low 24 bits are used.
    pub fn set_psn(&mut self, psn: u32) {
        be::put_u24(self.b_mut(), field::PSN, psn & U24_MASK);
    }

    /// Zeroes Resv6a and Resv7, which IBA 9.2 requires senders to transmit as 0.
    pub fn clear_reserved(&mut self) {
        let b = self.b_mut();
        b[field::CONGESTION] &= !field::RESV6A;
        b[field::ACK] &= !field::RESV7;
    }
}

/// Owned, validated content of a BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// OpCode.
    pub opcode: Opcode,
    /// SE bit.
    pub solicited: bool,
    /// M bit.
    pub mig_req: bool,
    /// PadCnt (0-3). [`crate::emit_packet`] overwrites it from the payload length.
    pub pad_count: u8,
    /// TVer (4 bits).
    pub tver: u8,
    /// P_Key.
    pub pkey: u16,
    /// FECN bit.
    pub fecn: bool,
    /// BECN bit.
    pub becn: bool,
    /// DestQP (24 bits).
    pub dest_qp: u32,
    /// AckReq bit.
    pub ack_req: bool,
    /// PSN (24 bits).
    pub psn: u32,
}

impl BthRepr {
    /// A BTH with the defaults a sender uses: default P_Key, version 0, all flags clear.
    pub const fn new(opcode: Opcode, dest_qp: u32, psn: u32) -> Self {
        Self {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }

    /// Reads a BTH. Reserved bits are ignored, as IBA 9.2 asks of receivers; the opcode and
    /// version are not judged here (see [`crate::Packet::parse`]).
    pub fn parse<T: AsRef<[u8]>>(view: &Bth<T>) -> Result<Self, WireError> {
        view.check_len()?;
        Ok(Self {
            opcode: view.opcode(),
            solicited: view.solicited(),
            mig_req: view.mig_req(),
            pad_count: view.pad_count(),
            tver: view.tver(),
            pkey: view.pkey(),
            fecn: view.fecn(),
            becn: view.becn(),
            dest_qp: view.dest_qp(),
            ack_req: view.ack_req(),
            psn: view.psn(),
        })
    }

    /// Writes the header, reserved bits as 0.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, view: &mut Bth<T>) -> Result<(), WireError> {
        view.check_len()?;
        be::check_bits("BTH.PadCnt", self.pad_count.into(), 2)?;
        be::check_bits("BTH.TVer", self.tver.into(), 4)?;
        be::check_bits("BTH.DestQP", self.dest_qp.into(), 24)?;
        be::check_bits("BTH.PSN", self.psn.into(), 24)?;
        let b = view.b_mut();
        b[field::OPCODE] = self.opcode.0;
        b[field::FLAGS] = with_flag(0, field::SE, self.solicited)
            | with_flag(0, field::MIG_REQ, self.mig_req)
            | (self.pad_count << field::PAD_SHIFT)
            | self.tver;
        be::put_u16(b, field::PKEY, self.pkey);
        b[field::CONGESTION] =
            with_flag(0, field::FECN, self.fecn) | with_flag(0, field::BECN, self.becn);
        be::put_u24(b, field::DEST_QP, self.dest_qp);
        b[field::ACK] = with_flag(0, field::ACK_REQ, self.ack_req);
        be::put_u24(b, field::PSN, self.psn);
        Ok(())
    }

    /// Bytes [`Self::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HeaderKind::Bth.wire_len()
    }
}

/// The destination QP of the RoCE v2 packet starting at `packet` (BTH first, IBA 9.2), 0 for
/// one too short to have it: what a receiving daemon forwards a net-path packet by
/// (`crates/daemon/src/netdev/forward.rs`), read without parsing the packet.
pub fn dest_qp_of(packet: &[u8]) -> u32 {
    match packet.get(field::DEST_QP..field::DEST_QP + 3) {
        Some(_) => be::u24_at(packet, field::DEST_QP),
        None => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // BTH of the §A1.8 XRC SEND_ONLY vector: opcode 0xA4, P_Key 0xFFFF, DestQP 0x11,
    // AckReq, PSN 0x100.
    const XRC_SEND_ONLY_BTH: [u8; 12] = [
        0xa4, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x00, 0x01, 0x00,
    ];

    #[test]
    fn reads_reference_vector() {
        let bth = Bth::new_checked(&XRC_SEND_ONLY_BTH[..]).unwrap();
        assert_eq!(bth.opcode(), Opcode(0xA4));
        assert!(!bth.solicited() && !bth.mig_req() && !bth.fecn() && !bth.becn());
        assert_eq!(bth.pad_count(), 0);
        assert_eq!(bth.tver(), 0);
        assert_eq!(bth.pkey(), 0xFFFF);
        assert_eq!(bth.dest_qp(), 0x11);
        assert!(bth.ack_req());
        assert_eq!(bth.psn(), 0x100);
    }

    #[test]
    fn repr_round_trip() {
        let repr = BthRepr {
            opcode: Opcode(0x0B),
            solicited: true,
            mig_req: true,
            pad_count: 3,
            tver: 0,
            pkey: 0x8001,
            fecn: true,
            becn: false,
            dest_qp: 0xABCDEF,
            ack_req: true,
            psn: 0xFFFFFF,
        };
        let mut buf = [0xEEu8; 12];
        repr.emit(&mut Bth::new_unchecked(&mut buf[..])).unwrap();
        let view = Bth::new_checked(&buf[..]).unwrap();
        assert_eq!(view.resv6a(), 0);
        assert_eq!(view.resv7(), 0);
        assert_eq!(BthRepr::parse(&view).unwrap(), repr);
    }

    #[test]
    fn setters_touch_only_their_bits() {
        let mut buf = [0u8; 12];
        let mut bth = Bth::new_unchecked(&mut buf[..]);
        bth.set_fecn(true);
        bth.set_dest_qp(0xFFFF_FFFF);
        bth.set_pad_count(2);
        bth.set_tver(0xF);
        bth.set_ack_req(true);
        bth.set_psn(0x0123_4567);
        assert!(bth.fecn() && !bth.becn());
        assert_eq!(bth.dest_qp(), 0xFF_FFFF);
        assert_eq!(bth.pad_count(), 2);
        assert_eq!(bth.tver(), 0xF);
        assert_eq!(bth.psn(), 0x23_4567);
        bth.set_becn(true);
        bth.set_fecn(false);
        assert!(!bth.fecn() && bth.becn());
        assert_eq!(bth.dest_qp(), 0xFF_FFFF);
    }

    #[test]
    fn short_buffer_is_truncated() {
        assert_eq!(
            Bth::new_checked(&[0u8; 11][..]),
            Err(WireError::Truncated {
                header: HeaderKind::Bth,
                needed: 12,
                available: 11
            })
        );
        assert!(BthRepr::parse(&Bth::new_unchecked(&[0u8; 3][..])).is_err());
    }

    #[test]
    fn out_of_range_fields_are_rejected() {
        let mut buf = [0u8; 12];
        let mut repr = BthRepr::new(Opcode(0x04), 1 << 24, 0);
        let err = repr
            .emit(&mut Bth::new_unchecked(&mut buf[..]))
            .unwrap_err();
        assert!(matches!(
            err,
            WireError::FieldOutOfRange {
                field: "BTH.DestQP",
                ..
            }
        ));
        repr.dest_qp = 0;
        repr.psn = 1 << 24;
        assert!(repr.emit(&mut Bth::new_unchecked(&mut buf[..])).is_err());
        repr.psn = 0;
        repr.pad_count = 4;
        assert!(repr.emit(&mut Bth::new_unchecked(&mut buf[..])).is_err());
    }
}
