//! Typed errors of parsing and emitting, and the names of the headers they refer to.

use core::fmt;

/// A header (or trailer) of a RoCE v2 datagram, as named in errors and in the per-opcode
/// header lists.
///
/// The extension headers are declared in the order in which they follow BTH on the wire
/// (IBA 9.2 and its XRC annex A14; RoCE v2 reference §A1.1), which [`crate::HeaderSet`]
/// relies on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HeaderKind {
    /// IPv4 header (RoCE v2 Annex A17).
    Ipv4,
    /// IPv6 header (RoCE v2 Annex A17).
    Ipv6,
    /// UDP header (RoCE v2 Annex A17).
    Udp,
    /// Base Transport Header, IBA 9.2.
    Bth,
    /// XRC Extended Transport Header, IBA Annex A14.
    Xrceth,
    /// Datagram Extended Transport Header, IBA 9.3, DETH.
    Deth,
    /// RDMA Extended Transport Header, IBA 9.3, RETH.
    Reth,
    /// Atomic Extended Transport Header, IBA 9.3, AtomicETH.
    AtomicEth,
    /// ACK Extended Transport Header, IBA 9.3, AETH.
    Aeth,
    /// Atomic ACK Extended Transport Header, IBA 9.3, AtomicAckETH.
    AtomicAckEth,
    /// Immediate Data Extended Transport Header, IBA 9.3, ImmDt.
    ImmDt,
    /// Invalidate Extended Transport Header, IBA 9.3, IETH.
    Ieth,
    /// Invariant CRC trailer, IBA 7.8.1 / RoCE v2 Annex A17.
    Icrc,
}

impl HeaderKind {
    /// Extension headers in wire order (IBA 9.2 packet layout, XRCETH first per Annex A14).
    /// Every valid opcode's header list is a subsequence of this.
    pub const EXTENSIONS: [HeaderKind; 8] = [
        HeaderKind::Xrceth,
        HeaderKind::Deth,
        HeaderKind::Reth,
        HeaderKind::AtomicEth,
        HeaderKind::Aeth,
        HeaderKind::AtomicAckEth,
        HeaderKind::ImmDt,
        HeaderKind::Ieth,
    ];

    /// Fixed on-the-wire length of the header in bytes (IPv4 without options).
    pub const fn wire_len(self) -> usize {
        match self {
            HeaderKind::Ipv4 => 20,
            HeaderKind::Ipv6 => 40,
            HeaderKind::Udp => 8,
            HeaderKind::Bth => 12,
            HeaderKind::Xrceth => 4,
            HeaderKind::Deth => 8,
            HeaderKind::Reth => 16,
            HeaderKind::AtomicEth => 28,
            HeaderKind::Aeth => 4,
            HeaderKind::AtomicAckEth => 8,
            HeaderKind::ImmDt => 4,
            HeaderKind::Ieth => 4,
            HeaderKind::Icrc => 4,
        }
    }

    /// The IBA name of the header.
    pub const fn name(self) -> &'static str {
        match self {
            HeaderKind::Ipv4 => "IPv4",
            HeaderKind::Ipv6 => "IPv6",
            HeaderKind::Udp => "UDP",
            HeaderKind::Bth => "BTH",
            HeaderKind::Xrceth => "XRCETH",
            HeaderKind::Deth => "DETH",
            HeaderKind::Reth => "RETH",
            HeaderKind::AtomicEth => "AtomicETH",
            HeaderKind::Aeth => "AETH",
            HeaderKind::AtomicAckEth => "AtomicAckETH",
            HeaderKind::ImmDt => "ImmDt",
            HeaderKind::Ieth => "IETH",
            HeaderKind::Icrc => "ICRC",
        }
    }
}

impl fmt::Display for HeaderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything that can be wrong with bytes handed to the parser, or with values handed to
/// the emitter. Parsing never panics: each malformed input maps to one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer ends inside a header or trailer.
    #[error("{header} truncated: need {needed} bytes, have {available}")]
    Truncated {
        /// The header being read.
        header: HeaderKind,
        /// Bytes it needs from where it starts.
        needed: usize,
        /// Bytes left from where it starts.
        available: usize,
    },
    /// The opcode is reserved, manufacturer-specific, or of a transport this crate does not
    /// implement (RD, CNP).
    #[error("opcode {0:#04x} is reserved or not supported")]
    UnknownOpcode(u8),
    /// BTH.TVer is not 0, the only transport version IBA 9.2 defines; a receiver drops
    /// packets of a version it does not support.
    #[error("unsupported BTH transport version {0}")]
    UnsupportedTver(u8),
    /// BTH.PadCnt asks for more pad bytes than follow the headers.
    #[error("pad count {pad} larger than the {available} bytes after the headers")]
    PadTooLarge {
        /// BTH.PadCnt.
        pad: u8,
        /// Bytes between the last header and the ICRC.
        available: usize,
    },
    /// Payload plus pad is not a multiple of 4 bytes (IBA 9.2: PadCnt pads the payload to a
    /// 4-byte boundary).
    #[error("payload plus pad is {len} bytes, not a multiple of 4")]
    UnalignedPayload {
        /// Bytes between the last header and the ICRC.
        len: usize,
    },
    /// Bytes (payload or pad) follow the headers of an opcode that carries no payload.
    #[error("opcode {opcode:#04x} carries no payload but {len} bytes follow its headers")]
    UnexpectedPayload {
        /// The BTH opcode.
        opcode: u8,
        /// Bytes found (or given) after the headers.
        len: usize,
    },
    /// The emitter was given no value for a header the opcode requires.
    #[error("opcode {opcode:#04x} requires {header}")]
    MissingHeader {
        /// The BTH opcode.
        opcode: u8,
        /// The header that has to be present.
        header: HeaderKind,
    },
    /// The emitter was given a header the opcode does not carry.
    #[error("opcode {opcode:#04x} does not carry {header}")]
    UnexpectedHeader {
        /// The BTH opcode.
        opcode: u8,
        /// The header that must be absent.
        header: HeaderKind,
    },
    /// A value does not fit its wire field (e.g. a QPN above 24 bits).
    #[error("{field} value {value:#x} does not fit in {bits} bits")]
    FieldOutOfRange {
        /// The IBA field name.
        field: &'static str,
        /// The value given.
        value: u64,
        /// Width of the field on the wire.
        bits: u8,
    },
    /// AETH syndrome with bit 7 set or with the reserved type `10b` (IBA 9.3, AETH syndrome encoding).
    #[error("reserved AETH syndrome {0:#04x}")]
    ReservedSyndrome(u8),
    /// The output buffer is too small for what is to be emitted.
    #[error("output buffer too small: need {needed} bytes, have {available}")]
    BufferTooSmall {
        /// Bytes the emitter needs.
        needed: usize,
        /// Bytes the buffer has.
        available: usize,
    },
    /// The ICRC trailer does not match the computed one.
    #[error("ICRC mismatch: computed {computed:#010x}, packet carries {found:#010x}")]
    IcrcMismatch {
        /// CRC computed over the invariant fields.
        computed: u32,
        /// CRC read (little-endian) from the trailer.
        found: u32,
    },
    /// The IP/UDP header bytes given for the ICRC or for splitting are not one IPv4 or IPv6
    /// header followed by a UDP header.
    #[error("malformed IP/UDP headers: {reason}")]
    MalformedIpUdp {
        /// What was wrong.
        reason: &'static str,
    },
}
