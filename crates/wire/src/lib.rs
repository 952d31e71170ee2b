//! softverbs-wire: the RoCE v2 / InfiniBand transport wire format.
//!
//! * Zero-copy views over each transport header (`Bth<T>`, `Xrceth<T>`, `Reth<T>`, ...)
//!   with getters and setters, plus owned `*Repr` values with `parse`/`emit`, in the style
//!   of smoltcp's `wire` module.
//! * [`Opcode`]: transport class, operation, and which headers follow BTH.
//! * [`Packet::parse`] / [`emit_packet`] / [`PacketBuilder`] for whole
//!   `BTH | ETHs | payload | pad | ICRC` packets.
//! * [`icrc`]: the RoCE v2 invariant CRC; [`ip`]: minimal IPv4/IPv6/UDP headers;
//!   [`emit_roce_v2`] / [`parse_roce_v2`] for whole datagrams.
//! * [`pcap`]: classic pcap writer/reader and Ethernet framing of RoCE v2 packets for
//!   Wireshark (see `tools/wireshark/softverbs.lua`); [`pcapng`]: the same with a comment per
//!   packet (a rejected packet's reason).
//!
//! Parsing never panics; everything malformed is a [`WireError`].
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod be;
mod view;

pub mod aeth;
pub mod atomic;
pub mod bth;
pub mod cm;
pub mod datagram;
pub mod deth;
mod error;
pub mod gso;
pub mod icrc;
pub mod imm;
pub mod ip;
pub mod opcode;
pub mod packet;
pub mod pcap;
pub mod pcapng;
pub mod psn;
pub mod reth;
pub mod xrceth;

pub use aeth::{rnr_timer_micros, Aeth, AethRepr, NakCode, Syndrome};
pub use atomic::{AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr};
pub use bth::{Bth, BthRepr};
pub use datagram::{emit_roce_v2, parse_roce_v2, roce_v2_len, DatagramRef};
pub use deth::{Deth, DethRepr};
pub use error::{HeaderKind, WireError};
pub use imm::{Ieth, IethRepr, ImmDt, ImmDtRepr};
pub use opcode::{Direction, HeaderSet, Opcode, OpcodeInfo, Operation, Position, Transport};
pub use packet::{
    emit_packet, emit_packet_with, packet_len, Headers, Packet, PacketBuilder, PacketRef,
};
pub use reth::{Reth, RethRepr};
pub use xrceth::{Xrceth, XrcethRepr};
