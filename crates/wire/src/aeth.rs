//! ACK Extended Transport Header (IBA 9.3, AETH), 4 bytes, and its syndrome.
//!
//! ```text
//! byte 0      Syndrome: bit 7 reserved (0), bits 6:5 type, bits 4:0 value
//! bytes 1-3   MSN: 24-bit message sequence number of the last completed message
//! ```

use crate::be::{self, U24_MASK};
use crate::view::header_view;
use crate::{HeaderKind, WireError};

mod field {
    pub const SYNDROME: usize = 0;
    pub const MSN: usize = 1;
}

header_view!(
    /// Zero-copy view of an AETH (IBA 9.3).
    Aeth,
    HeaderKind::Aeth
);

impl<T: AsRef<[u8]>> Aeth<T> {
    /// Raw syndrome byte; decode it with [`Syndrome::decode`].
    pub fn syndrome(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }

    /// MSN: 24-bit message sequence number.
    pub fn msn(&self) -> u32 {
        be::u24_at(self.buffer.as_ref(), field::MSN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Aeth<T> {
    /// Sets the raw syndrome byte.
    pub fn set_syndrome(&mut self, raw: u8) {
        self.buffer.as_mut()[field::SYNDROME] = raw;
    }

    /// Sets MSN; only the low 24 bits are used.
    pub fn set_msn(&mut self, msn: u32) {
        be::put_u24(self.buffer.as_mut(), field::MSN, msn & U24_MASK);
    }
}

/// NAK codes, the value bits of a syndrome of type `11b` (IBA 9.3, AETH; IBA 9.7
/// says when each is sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: PSN sequence error; the requester retries from the NAK'd PSN.
    PsnSeqErr,
    /// 1: invalid request.
    InvalidRequest,
    /// 2: remote access error.
    RemoteAccessError,
    /// 3: remote operational error.
    RemoteOperationalError,
    /// 4: invalid RD request (RD transport only).
    InvalidRdRequest,
    /// 5-31: reserved codes, kept so a peer's unknown NAK still reads as a NAK.
    Reserved(u8),
}

impl NakCode {
    fn from_value(v: u8) -> Self {
        match v {
            0 => NakCode::PsnSeqErr,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            other => NakCode::Reserved(other),
        }
    }

    fn value(self) -> Result<u8, WireError> {
        match self {
            NakCode::PsnSeqErr => Ok(0),
            NakCode::InvalidRequest => Ok(1),
            NakCode::RemoteAccessError => Ok(2),
            NakCode::RemoteOperationalError => Ok(3),
            NakCode::InvalidRdRequest => Ok(4),
            // Codes 0-4 under `Reserved` would decode back as named codes, so the
            // encoding would not be one-to-one.
            NakCode::Reserved(v @ 5..=31) => Ok(v),
            NakCode::Reserved(v) => Err(WireError::FieldOutOfRange {
                field: "AETH NAK code",
                value: v.into(),
                bits: 5,
            }),
        }
    }
}

/// Decoded AETH syndrome (IBA 9.3, AETH syndrome encoding).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Type `00b`: positive acknowledgement carrying a 5-bit end-to-end credit code.
    Ack {
        /// Credit code; [`Syndrome::UNLIMITED_CREDITS`] means "not flow controlled".
        credits: u8,
    },
    /// Type `01b`: receiver not ready; retry after the time named by the 5-bit timer code.
    RnrNak {
        /// RNR timer code, see [`rnr_timer_micros`].
        timer: u8,
    },
    /// Type `11b`: negative acknowledgement.
    Nak {
        /// Why.
        code: NakCode,
    },
}

const TYPE_SHIFT: u8 = 5;
const VALUE_MASK: u8 = 0x1F;
const TYPE_ACK: u8 = 0b00;
const TYPE_RNR_NAK: u8 = 0b01;
const TYPE_NAK: u8 = 0b11;

impl Syndrome {
    /// Credit code for "invalid/unlimited credits", what a responder without end-to-end flow
    /// control (e.g. one using an SRQ) advertises.
    pub const UNLIMITED_CREDITS: u8 = 0x1F;

    /// Decodes a raw syndrome byte. Bit 7 set or type `10b` are reserved encodings.
    pub fn decode(raw: u8) -> Result<Self, WireError> {
        let value = raw & VALUE_MASK;
        match raw >> TYPE_SHIFT {
            TYPE_ACK => Ok(Syndrome::Ack { credits: value }),
            TYPE_RNR_NAK => Ok(Syndrome::RnrNak { timer: value }),
            TYPE_NAK => Ok(Syndrome::Nak {
                code: NakCode::from_value(value),
            }),
            _ => Err(WireError::ReservedSyndrome(raw)),
        }
    }

    /// Encodes to the raw byte; fails if a value does not fit its 5 bits.
    pub fn encode(self) -> Result<u8, WireError> {
        let (kind, value, field) = match self {
            Syndrome::Ack { credits } => (TYPE_ACK, credits, "AETH ACK credits"),
            Syndrome::RnrNak { timer } => (TYPE_RNR_NAK, timer, "AETH RNR timer"),
            Syndrome::Nak { code } => (TYPE_NAK, code.value()?, "AETH NAK code"),
        };
        be::check_bits(field, value.into(), 5)?;
        Ok((kind << TYPE_SHIFT) | value)
    }
}

/// RNR NAK timer codes in microseconds (IBA 9.7 RNR timer encoding; the values tshark prints,
/// docs/design/roce-wire.md §3). Code 0 is the longest, 655.36 ms.
const RNR_TIMER_MICROS: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// Minimum back-off in microseconds for an RNR timer code, `None` above 31.
pub fn rnr_timer_micros(code: u8) -> Option<u32> {
    RNR_TIMER_MICROS.get(usize::from(code)).copied()
}

/// Owned content of an AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// Decoded syndrome.
    pub syndrome: Syndrome,
    /// MSN (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// Reads an AETH; a reserved syndrome is an error because its meaning is unknown.
    pub fn parse<T: AsRef<[u8]>>(view: &Aeth<T>) -> Result<Self, WireError> {
        view.check_len()?;
        Ok(Self {
            syndrome: Syndrome::decode(view.syndrome())?,
            msn: view.msn(),
        })
    }

    /// Writes an AETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, view: &mut Aeth<T>) -> Result<(), WireError> {
        view.check_len()?;
        let raw = self.syndrome.encode()?;
        be::check_bits("AETH.MSN", self.msn.into(), 24)?;
        view.set_syndrome(raw);
        view.set_msn(self.msn);
        Ok(())
    }

    /// Bytes [`Self::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HeaderKind::Aeth.wire_len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_decodes_or_is_reserved_and_round_trips() {
        for raw in 0..=u8::MAX {
            match Syndrome::decode(raw) {
                Ok(s) => assert_eq!(s.encode(), Ok(raw), "{raw:#04x}"),
                Err(e) => {
                    assert_eq!(e, WireError::ReservedSyndrome(raw));
                    assert!(raw & 0x80 != 0 || raw >> 5 == 0b10);
                }
            }
        }
    }

    #[test]
    fn reference_syndromes() {
        // §A1.4 / §A1.8: rxe's ACK 0x1F, the vector's RNR NAK 0x2E (1.28 ms), NAK 0x60-0x64.
        assert_eq!(
            Syndrome::decode(0x1F),
            Ok(Syndrome::Ack {
                credits: Syndrome::UNLIMITED_CREDITS
            })
        );
        assert_eq!(Syndrome::decode(0x2E), Ok(Syndrome::RnrNak { timer: 14 }));
        assert_eq!(rnr_timer_micros(14), Some(1_280));
        assert_eq!(rnr_timer_micros(0), Some(655_360));
        assert_eq!(rnr_timer_micros(32), None);
        let naks = [
            (0x60, NakCode::PsnSeqErr),
            (0x61, NakCode::InvalidRequest),
            (0x62, NakCode::RemoteAccessError),
            (0x63, NakCode::RemoteOperationalError),
            (0x64, NakCode::InvalidRdRequest),
            (0x65, NakCode::Reserved(5)),
        ];
        for (raw, code) in naks {
            assert_eq!(Syndrome::decode(raw), Ok(Syndrome::Nak { code }));
        }
    }

    #[test]
    fn encode_rejects_values_that_do_not_fit() {
        assert!(Syndrome::Ack { credits: 32 }.encode().is_err());
        assert!(Syndrome::RnrNak { timer: 0xFF }.encode().is_err());
        assert!(Syndrome::Nak {
            code: NakCode::Reserved(2)
        }
        .encode()
        .is_err());
        assert!(Syndrome::Nak {
            code: NakCode::Reserved(32)
        }
        .encode()
        .is_err());
    }

    #[test]
    fn repr_round_trip_and_errors() {
        let repr = AethRepr {
            syndrome: Syndrome::RnrNak { timer: 14 },
            msn: 5,
        };
        let mut buf = [0u8; 4];
        repr.emit(&mut Aeth::new_unchecked(&mut buf[..])).unwrap();
        assert_eq!(buf, [0x2E, 0, 0, 5]);
        assert_eq!(
            AethRepr::parse(&Aeth::new_checked(&buf[..]).unwrap()),
            Ok(repr)
        );

        buf[0] = 0x40; // type 10b
        assert_eq!(
            AethRepr::parse(&Aeth::new_unchecked(&buf[..])),
            Err(WireError::ReservedSyndrome(0x40))
        );
        assert!(matches!(
            Aeth::new_checked(&buf[..2]),
            Err(WireError::Truncated {
                header: HeaderKind::Aeth,
                ..
            })
        ));
        let bad_msn = AethRepr {
            msn: 1 << 24,
            ..repr
        };
        assert!(bad_msn
            .emit(&mut Aeth::new_unchecked(&mut buf[..]))
            .is_err());
    }
}
