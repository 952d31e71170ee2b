//! BTH opcodes: transport class, operation, and the header layout each one implies.
//!
//! IBA 9.2 (opcode field, table of valid opcodes) gives bits 7:5 the transport service and
//! bits 4:0 the operation. RC, UC, UD and XRC (Annex A14) share the RC operation
//! numbering; UC drops READ, atomics and invalidate, UD keeps only SEND_ONLY(_WITH_IMM),
//! and XRC is RC with an XRCETH after BTH in requests (docs/design/xrc-semantics.md §7).

use core::fmt;

use crate::{HeaderKind, WireError};

/// A BTH opcode byte. Any value can be held; [`Opcode::is_valid`] says whether this crate
/// can parse and emit it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

/// Transport service class, opcode bits 7:5 (IBA 9.2; CNP from RoCE v2 Annex A17).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// `000b` Reliable Connected, 0x00.
    Rc,
    /// `001b` Unreliable Connected, 0x20.
    Uc,
    /// `010b` Reliable Datagram, 0x40 (not implemented here).
    Rd,
    /// `011b` Unreliable Datagram, 0x60.
    Ud,
    /// `100b` Congestion Notification Packet class, 0x80 (RoCE v2 CNP is 0x81; not
    /// implemented here).
    Cnp,
    /// `101b` Extended Reliable Connected, 0xA0 (Annex A14).
    Xrc,
    /// `111b` manufacturer-specific, 0xE0.
    Manufacturer,
}

impl Transport {
    /// The opcode bits 7:5 of this class.
    pub const fn base(self) -> u8 {
        match self {
            Transport::Rc => 0x00,
            Transport::Uc => 0x20,
            Transport::Rd => 0x40,
            Transport::Ud => 0x60,
            Transport::Cnp => 0x80,
            Transport::Xrc => 0xA0,
            Transport::Manufacturer => 0xE0,
        }
    }

    const fn name(self) -> &'static str {
        match self {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Rd => "RD",
            Transport::Ud => "UD",
            Transport::Cnp => "CNP",
            Transport::Xrc => "XRC",
            Transport::Manufacturer => "MANUFACTURER",
        }
    }
}

/// Operation, opcode bits 4:0 in the RC numbering shared by RC, UC, UD and XRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[allow(missing_docs)] // the names are the IBA names
pub enum Operation {
    SendFirst = 0x00,
    SendMiddle = 0x01,
    SendLast = 0x02,
    SendLastWithImmediate = 0x03,
    SendOnly = 0x04,
    SendOnlyWithImmediate = 0x05,
    RdmaWriteFirst = 0x06,
    RdmaWriteMiddle = 0x07,
    RdmaWriteLast = 0x08,
    RdmaWriteLastWithImmediate = 0x09,
    RdmaWriteOnly = 0x0A,
    RdmaWriteOnlyWithImmediate = 0x0B,
    RdmaReadRequest = 0x0C,
    RdmaReadResponseFirst = 0x0D,
    RdmaReadResponseMiddle = 0x0E,
    RdmaReadResponseLast = 0x0F,
    RdmaReadResponseOnly = 0x10,
    Acknowledge = 0x11,
    AtomicAcknowledge = 0x12,
    CompareSwap = 0x13,
    FetchAdd = 0x14,
    SendLastWithInvalidate = 0x16,
    SendOnlyWithInvalidate = 0x17,
}

impl Operation {
    /// Every operation, in numbering order.
    pub const ALL: [Operation; 23] = [
        Operation::SendFirst,
        Operation::SendMiddle,
        Operation::SendLast,
        Operation::SendLastWithImmediate,
        Operation::SendOnly,
        Operation::SendOnlyWithImmediate,
        Operation::RdmaWriteFirst,
        Operation::RdmaWriteMiddle,
        Operation::RdmaWriteLast,
        Operation::RdmaWriteLastWithImmediate,
        Operation::RdmaWriteOnly,
        Operation::RdmaWriteOnlyWithImmediate,
        Operation::RdmaReadRequest,
        Operation::RdmaReadResponseFirst,
        Operation::RdmaReadResponseMiddle,
        Operation::RdmaReadResponseLast,
        Operation::RdmaReadResponseOnly,
        Operation::Acknowledge,
        Operation::AtomicAcknowledge,
        Operation::CompareSwap,
        Operation::FetchAdd,
        Operation::SendLastWithInvalidate,
        Operation::SendOnlyWithInvalidate,
    ];

    /// The operation numbered `bits` (opcode bits 4:0), if there is one.
    pub const fn from_bits(bits: u8) -> Option<Operation> {
        // 0x15 and 0x18.. are reserved (0x1C FLUSH / 0x1D ATOMIC_WRITE are later RC
        // additions this crate does not carry).
        Some(match bits {
            0x00 => Operation::SendFirst,
            0x01 => Operation::SendMiddle,
            0x02 => Operation::SendLast,
            0x03 => Operation::SendLastWithImmediate,
            0x04 => Operation::SendOnly,
            0x05 => Operation::SendOnlyWithImmediate,
            0x06 => Operation::RdmaWriteFirst,
            0x07 => Operation::RdmaWriteMiddle,
            0x08 => Operation::RdmaWriteLast,
            0x09 => Operation::RdmaWriteLastWithImmediate,
            0x0A => Operation::RdmaWriteOnly,
            0x0B => Operation::RdmaWriteOnlyWithImmediate,
            0x0C => Operation::RdmaReadRequest,
            0x0D => Operation::RdmaReadResponseFirst,
            0x0E => Operation::RdmaReadResponseMiddle,
            0x0F => Operation::RdmaReadResponseLast,
            0x10 => Operation::RdmaReadResponseOnly,
            0x11 => Operation::Acknowledge,
            0x12 => Operation::AtomicAcknowledge,
            0x13 => Operation::CompareSwap,
            0x14 => Operation::FetchAdd,
            0x16 => Operation::SendLastWithInvalidate,
            0x17 => Operation::SendOnlyWithInvalidate,
            _ => return None,
        })
    }

    /// The IBA name, e.g. `SEND_ONLY_WITH_IMMEDIATE`.
    pub const fn name(self) -> &'static str {
        match self {
            Operation::SendFirst => "SEND_FIRST",
            Operation::SendMiddle => "SEND_MIDDLE",
            Operation::SendLast => "SEND_LAST",
            Operation::SendLastWithImmediate => "SEND_LAST_WITH_IMMEDIATE",
            Operation::SendOnly => "SEND_ONLY",
            Operation::SendOnlyWithImmediate => "SEND_ONLY_WITH_IMMEDIATE",
            Operation::RdmaWriteFirst => "RDMA_WRITE_FIRST",
            Operation::RdmaWriteMiddle => "RDMA_WRITE_MIDDLE",
            Operation::RdmaWriteLast => "RDMA_WRITE_LAST",
            Operation::RdmaWriteLastWithImmediate => "RDMA_WRITE_LAST_WITH_IMMEDIATE",
            Operation::RdmaWriteOnly => "RDMA_WRITE_ONLY",
            Operation::RdmaWriteOnlyWithImmediate => "RDMA_WRITE_ONLY_WITH_IMMEDIATE",
            Operation::RdmaReadRequest => "RDMA_READ_REQUEST",
            Operation::RdmaReadResponseFirst => "RDMA_READ_RESPONSE_FIRST",
            Operation::RdmaReadResponseMiddle => "RDMA_READ_RESPONSE_MIDDLE",
            Operation::RdmaReadResponseLast => "RDMA_READ_RESPONSE_LAST",
            Operation::RdmaReadResponseOnly => "RDMA_READ_RESPONSE_ONLY",
            Operation::Acknowledge => "ACKNOWLEDGE",
            Operation::AtomicAcknowledge => "ATOMIC_ACKNOWLEDGE",
            Operation::CompareSwap => "COMPARE_SWAP",
            Operation::FetchAdd => "FETCH_ADD",
            Operation::SendLastWithInvalidate => "SEND_LAST_WITH_INVALIDATE",
            Operation::SendOnlyWithInvalidate => "SEND_ONLY_WITH_INVALIDATE",
        }
    }
}

/// Where a packet sits in its message (the FIRST/MIDDLE/LAST/ONLY opcodes of IBA 9.2).
/// Single-packet operations (READ request, atomics, ACKs) are `Only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Position {
    First,
    Middle,
    Last,
    Only,
}

/// Whether a requester or a responder sends the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Sent by the requester (SEND, WRITE, READ request, atomics).
    Request,
    /// Sent by the responder (READ responses, ACK, atomic ACK).
    Response,
}

/// A set of extension headers. Iteration yields them in wire order, which is the same for
/// every opcode ([`HeaderKind::EXTENSIONS`]), so a set says everything about the layout.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HeaderSet(u8);

impl HeaderSet {
    /// No extension header.
    pub const EMPTY: HeaderSet = HeaderSet(0);

    const fn bit(kind: HeaderKind) -> u8 {
        match kind {
            HeaderKind::Xrceth => 1 << 0,
            HeaderKind::Deth => 1 << 1,
            HeaderKind::Reth => 1 << 2,
            HeaderKind::AtomicEth => 1 << 3,
            HeaderKind::Aeth => 1 << 4,
            HeaderKind::AtomicAckEth => 1 << 5,
            HeaderKind::ImmDt => 1 << 6,
            HeaderKind::Ieth => 1 << 7,
            // Not extension headers: never members.
            HeaderKind::Ipv4
            | HeaderKind::Ipv6
            | HeaderKind::Udp
            | HeaderKind::Bth
            | HeaderKind::Icrc => 0,
        }
    }

    /// The set plus `kind` (unchanged if `kind` is not an extension header).
    pub const fn with(self, kind: HeaderKind) -> HeaderSet {
        HeaderSet(self.0 | Self::bit(kind))
    }

    /// Whether `kind` is in the set.
    pub const fn contains(self, kind: HeaderKind) -> bool {
        let bit = Self::bit(kind);
        bit != 0 && self.0 & bit != 0
    }

    /// Number of headers in the set.
    pub const fn count(self) -> u32 {
        self.0.count_ones()
    }

    /// Members in wire order.
    pub fn iter(self) -> impl Iterator<Item = HeaderKind> {
        HeaderKind::EXTENSIONS
            .into_iter()
            .filter(move |k| self.contains(*k))
    }

    /// Total bytes of the headers in the set.
    pub fn wire_len(self) -> usize {
        self.iter().map(HeaderKind::wire_len).sum()
    }
}

impl fmt::Debug for HeaderSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// Everything the opcode says about a packet's shape and role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpcodeInfo {
    /// Transport class.
    pub transport: Transport,
    /// Operation.
    pub operation: Operation,
    /// Extension headers between BTH and payload, in wire order via [`HeaderSet::iter`].
    pub headers: HeaderSet,
    /// Whether a payload may follow the headers (it may still be empty, e.g. a zero-length
    /// SEND_ONLY).
    pub payload: bool,
    /// Place in the message.
    pub position: Position,
    /// Requester or responder packet.
    pub direction: Direction,
    /// Carries ImmDt.
    pub immediate: bool,
    /// Carries IETH.
    pub invalidate: bool,
}

/// Shape of an operation under RC: (headers, payload, position, direction).
const fn rc_shape(op: Operation) -> (HeaderSet, bool, Position, Direction) {
    use Direction::{Request as Req, Response as Resp};
    use HeaderKind as H;
    use Position::{First, Last, Middle, Only};
    let e = HeaderSet::EMPTY;
    match op {
        Operation::SendFirst => (e, true, First, Req),
        Operation::SendMiddle => (e, true, Middle, Req),
        Operation::SendLast => (e, true, Last, Req),
        Operation::SendLastWithImmediate => (e.with(H::ImmDt), true, Last, Req),
        Operation::SendOnly => (e, true, Only, Req),
        Operation::SendOnlyWithImmediate => (e.with(H::ImmDt), true, Only, Req),
        Operation::RdmaWriteFirst => (e.with(H::Reth), true, First, Req),
        Operation::RdmaWriteMiddle => (e, true, Middle, Req),
        Operation::RdmaWriteLast => (e, true, Last, Req),
        Operation::RdmaWriteLastWithImmediate => (e.with(H::ImmDt), true, Last, Req),
        Operation::RdmaWriteOnly => (e.with(H::Reth), true, Only, Req),
        Operation::RdmaWriteOnlyWithImmediate => (e.with(H::Reth).with(H::ImmDt), true, Only, Req),
        Operation::RdmaReadRequest => (e.with(H::Reth), false, Only, Req),
        Operation::RdmaReadResponseFirst => (e.with(H::Aeth), true, First, Resp),
        Operation::RdmaReadResponseMiddle => (e, true, Middle, Resp),
        Operation::RdmaReadResponseLast => (e.with(H::Aeth), true, Last, Resp),
        Operation::RdmaReadResponseOnly => (e.with(H::Aeth), true, Only, Resp),
        Operation::Acknowledge => (e.with(H::Aeth), false, Only, Resp),
        Operation::AtomicAcknowledge => (e.with(H::Aeth).with(H::AtomicAckEth), false, Only, Resp),
        Operation::CompareSwap | Operation::FetchAdd => (e.with(H::AtomicEth), false, Only, Req),
        Operation::SendLastWithInvalidate => (e.with(H::Ieth), true, Last, Req),
        Operation::SendOnlyWithInvalidate => (e.with(H::Ieth), true, Only, Req),
    }
}

impl Opcode {
    /// The opcode for `operation` on `transport`, if that combination exists.
    pub fn new(transport: Transport, operation: Operation) -> Result<Opcode, WireError> {
        let opcode = Opcode(transport.base() | operation as u8);
        opcode.info().map(|_| opcode)
    }

    /// Transport class from bits 7:5; `None` for the reserved class `110b`.
    pub const fn transport(self) -> Option<Transport> {
        Some(match self.0 >> 5 {
            0b000 => Transport::Rc,
            0b001 => Transport::Uc,
            0b010 => Transport::Rd,
            0b011 => Transport::Ud,
            0b100 => Transport::Cnp,
            0b101 => Transport::Xrc,
            0b111 => Transport::Manufacturer,
            _ => return None,
        })
    }

    /// The operation, `None` unless the opcode [is valid](Self::is_valid).
    pub fn operation(self) -> Option<Operation> {
        self.info().ok().map(|i| i.operation)
    }

    /// Whether this crate knows the opcode's layout (RC, UC, UD, XRC as listed in the
    /// module docs).
    pub fn is_valid(self) -> bool {
        self.info().is_ok()
    }

    /// Layout and role of the opcode, or [`WireError::UnknownOpcode`].
    pub fn info(self) -> Result<OpcodeInfo, WireError> {
        let unknown = WireError::UnknownOpcode(self.0);
        let transport = self.transport().ok_or(unknown)?;
        let operation = Operation::from_bits(self.0 & 0x1F).ok_or(unknown)?;
        let (mut headers, payload, position, direction) = rc_shape(operation);
        match transport {
            Transport::Rc => {}
            // UC has no READ, atomics, or invalidate (IBA 9.2 opcode table).
            Transport::Uc if (operation as u8) <= Operation::RdmaWriteOnlyWithImmediate as u8 => {}
            // UD sends single-packet SENDs only, each addressed by a DETH (IBA 9.3).
            Transport::Ud
                if matches!(
                    operation,
                    Operation::SendOnly | Operation::SendOnlyWithImmediate
                ) =>
            {
                headers = headers.with(HeaderKind::Deth);
            }
            Transport::Xrc => {
                if matches!(direction, Direction::Request) {
                    headers = headers.with(HeaderKind::Xrceth);
                }
            }
            _ => return Err(unknown),
        }
        Ok(OpcodeInfo {
            transport,
            operation,
            headers,
            payload,
            position,
            direction,
            immediate: headers.contains(HeaderKind::ImmDt),
            invalidate: headers.contains(HeaderKind::Ieth),
        })
    }

    /// Every opcode this crate can parse and emit, in numeric order.
    pub fn all_valid() -> impl Iterator<Item = Opcode> {
        (0..=u8::MAX).map(Opcode).filter(|op| op.is_valid())
    }
}

impl From<u8> for Opcode {
    fn from(raw: u8) -> Self {
        Opcode(raw)
    }
}

impl From<Opcode> for u8 {
    fn from(op: Opcode) -> Self {
        op.0
    }
}

impl fmt::Display for Opcode {
    /// `XRC SEND_ONLY (0xa4)`, or `reserved (0x..)` for opcodes without a layout.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.info() {
            Ok(i) => write!(
                f,
                "{} {} ({:#04x})",
                i.transport.name(),
                i.operation.name(),
                self.0
            ),
            Err(_) => write!(f, "reserved ({:#04x})", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_transport() {
        let count = |t: Transport| {
            Opcode::all_valid()
                .filter(|o| o.transport() == Some(t))
                .count()
        };
        assert_eq!(count(Transport::Rc), 23);
        assert_eq!(count(Transport::Uc), 12);
        assert_eq!(count(Transport::Ud), 2);
        assert_eq!(count(Transport::Xrc), 23);
        assert_eq!(Opcode::all_valid().count(), 60);
    }

    #[test]
    fn reference_table_rows() {
        use HeaderKind as H;
        let layout = |op: u8| {
            Opcode(op)
                .info()
                .unwrap()
                .headers
                .iter()
                .collect::<Vec<_>>()
        };
        assert_eq!(layout(0x04), vec![]);
        assert_eq!(layout(0x24), vec![]);
        assert_eq!(layout(0x64), vec![H::Deth]);
        assert_eq!(layout(0x65), vec![H::Deth, H::ImmDt]);
        assert_eq!(layout(0x0B), vec![H::Reth, H::ImmDt]);
        assert_eq!(layout(0xAB), vec![H::Xrceth, H::Reth, H::ImmDt]);
        assert_eq!(layout(0xA4), vec![H::Xrceth]);
        assert_eq!(layout(0xA1), vec![H::Xrceth]);
        assert_eq!(layout(0xAC), vec![H::Xrceth, H::Reth]);
        assert_eq!(layout(0xB3), vec![H::Xrceth, H::AtomicEth]);
        assert_eq!(layout(0xB7), vec![H::Xrceth, H::Ieth]);
        // XRC responses carry no XRCETH.
        assert_eq!(layout(0xAD), vec![H::Aeth]);
        assert_eq!(layout(0xAE), vec![]);
        assert_eq!(layout(0xB1), vec![H::Aeth]);
        assert_eq!(layout(0xB2), vec![H::Aeth, H::AtomicAckEth]);
        assert_eq!(layout(0x12), vec![H::Aeth, H::AtomicAckEth]);
    }

    #[test]
    fn flags() {
        let i = Opcode(0x09).info().unwrap();
        assert!(i.immediate && !i.invalidate && i.payload);
        assert_eq!(
            (i.position, i.direction),
            (Position::Last, Direction::Request)
        );
        let i = Opcode(0x16).info().unwrap();
        assert!(i.invalidate && !i.immediate);
        let i = Opcode(0x11).info().unwrap();
        assert!(!i.payload);
        assert_eq!(
            (i.position, i.direction),
            (Position::Only, Direction::Response)
        );
        assert_eq!(Opcode(0x0E).info().unwrap().position, Position::Middle);
        assert_eq!(Opcode(0xAC).info().unwrap().direction, Direction::Request);
        assert!(!Opcode(0xAC).info().unwrap().payload);
    }

    #[test]
    fn transports_and_reserved() {
        assert_eq!(Opcode(0x81).transport(), Some(Transport::Cnp));
        assert_eq!(Opcode(0x44).transport(), Some(Transport::Rd));
        assert_eq!(Opcode(0xC4).transport(), None);
        assert_eq!(Opcode(0xE4).transport(), Some(Transport::Manufacturer));
        for raw in [
            0x15, 0x18, 0x1C, 0x1D, 0x1F, 0x2C, 0x36, 0x44, 0x60, 0x66, 0x81, 0xB5, 0xB8, 0xC4,
            0xE4,
        ] {
            assert_eq!(
                Opcode(raw).info(),
                Err(WireError::UnknownOpcode(raw)),
                "{raw:#04x}"
            );
            assert_eq!(Opcode(raw).operation(), None);
        }
        assert_eq!(
            Opcode(0xB7).operation(),
            Some(Operation::SendOnlyWithInvalidate)
        );
    }

    #[test]
    fn new_and_display() {
        assert_eq!(
            Opcode::new(Transport::Xrc, Operation::SendOnly),
            Ok(Opcode(0xA4))
        );
        assert_eq!(
            Opcode::new(Transport::Ud, Operation::SendOnlyWithImmediate),
            Ok(Opcode(0x65))
        );
        assert_eq!(
            Opcode::new(Transport::Uc, Operation::RdmaReadRequest),
            Err(WireError::UnknownOpcode(0x2C))
        );
        assert_eq!(Opcode(0xA4).to_string(), "XRC SEND_ONLY (0xa4)");
        assert_eq!(Opcode(0xC0).to_string(), "reserved (0xc0)");
        for op in Operation::ALL {
            assert_eq!(Operation::from_bits(op as u8), Some(op));
        }
    }
}
