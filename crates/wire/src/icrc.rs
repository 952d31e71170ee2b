//! RoCE v2 Invariant CRC (IBA 7.8.1 as adapted by RoCE v2 Annex A17;
//! docs/design/roce-wire.md §6).
//!
//! The ICRC is the plain CRC-32 of Ethernet/zlib (reflected 0xEDB88320, init and final
//! xor all-ones) over
//!
//! ```text
//! 8 x 0xFF | IP header | UDP header | BTH | extension headers | payload | pad
//! ```
//!
//! where the 8 bytes of 0xFF stand for the LRH that RoCE v2 does not carry, and every field
//! a router or switch may rewrite is replaced by all-ones first: IPv4 TOS, TTL and header
//! checksum; IPv6 traffic class, flow label and hop limit; the UDP checksum; BTH byte 4
//! (FECN, BECN, Resv6a). The 32-bit result goes on the wire little-endian.

use crate::bth::VARIANT_BYTE;
use crate::ip::{IPV4_HEADER_LEN, IPV6_HEADER_LEN, UDP_HEADER_LEN};
use crate::packet::ICRC_LEN;
use crate::{HeaderKind, WireError};

mod ipid;

/// Stand-in for the absent LRH.
const LRH_MASK: [u8; 8] = [0xFF; 8];
/// IPv4 header with the longest options, plus UDP.
const MAX_IP_UDP: usize = 60 + UDP_HEADER_LEN;
const BTH_LEN: usize = 12;
/// Everything that needs masking is copied here and hashed in one call, so the per-packet
/// fixed cost is a single extra `update`.
const PREFIX_CAP: usize = LRH_MASK.len() + MAX_IP_UDP + BTH_LEN;

/// Copies `ip_udp` (one IP header and one UDP header, nothing else) into `out` with the
/// variant fields set to all-ones; returns the number of bytes written.
fn mask_ip_udp(ip_udp: &[u8], out: &mut [u8]) -> Result<usize, WireError> {
    let malformed = |reason| WireError::MalformedIpUdp { reason };
    let first = *ip_udp.first().ok_or(WireError::Truncated {
        header: HeaderKind::Ipv4,
        needed: IPV4_HEADER_LEN,
        available: 0,
    })?;
    let ip_len = match first >> 4 {
        4 => {
            let ihl = usize::from(first & 0x0F) * 4;
            if ihl < IPV4_HEADER_LEN {
                return Err(malformed("IPv4 IHL below 5"));
            }
            ihl
        }
        6 => IPV6_HEADER_LEN,
        _ => return Err(malformed("IP version is neither 4 nor 6")),
    };
    if ip_udp.len() != ip_len + UDP_HEADER_LEN {
        return Err(malformed(
            "expected exactly one IP header and one UDP header",
        ));
    }
    let out = &mut out[..ip_udp.len()];
    out.copy_from_slice(ip_udp);
    if first >> 4 == 6 {
        // Version stays; traffic class (8 bits) and flow label (20 bits) fill the rest of
        // the first word.
        out[0] |= 0x0F;
        out[1..4].fill(0xFF);
        out[7] = 0xFF; // hop limit
    } else {
        out[1] = 0xFF; // TOS (DSCP + ECN)
        out[8] = 0xFF; // TTL
        out[10..12].fill(0xFF); // header checksum
    }
    out[ip_len + 6..ip_len + 8].fill(0xFF); // UDP checksum
    Ok(ip_udp.len())
}

/// Computes the ICRC of an IB packet.
///
/// `ip_udp` is the IPv4 (with any options) or IPv6 header followed by the UDP header, as
/// sent: lengths must already count the ICRC. `ib` runs from BTH to the end of the pad,
/// *without* the ICRC.
pub fn compute(ip_udp: &[u8], ib: &[u8]) -> Result<u32, WireError> {
    if ib.len() < BTH_LEN {
        return Err(WireError::Truncated {
            header: HeaderKind::Bth,
            needed: BTH_LEN,
            available: ib.len(),
        });
    }
    let mut prefix = [0u8; PREFIX_CAP];
    prefix[..LRH_MASK.len()].copy_from_slice(&LRH_MASK);
    let mut at = LRH_MASK.len();
    at += mask_ip_udp(ip_udp, &mut prefix[at..])?;
    prefix[at..at + BTH_LEN].copy_from_slice(&ib[..BTH_LEN]);
    prefix[at + VARIANT_BYTE] = 0xFF;
    at += BTH_LEN;

    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&prefix[..at]);
    hasher.update(&ib[BTH_LEN..]);
    Ok(hasher.finalize())
}

fn split_trailer(packet: &[u8]) -> Result<(&[u8], u32), WireError> {
    let len = packet.len();
    if len < BTH_LEN {
        return Err(WireError::Truncated {
            header: HeaderKind::Bth,
            needed: BTH_LEN,
            available: len,
        });
    }
    if len < BTH_LEN + ICRC_LEN {
        return Err(WireError::Truncated {
            header: HeaderKind::Icrc,
            needed: ICRC_LEN,
            available: len - BTH_LEN,
        });
    }
    let (body, trailer) = packet.split_at(len - ICRC_LEN);
    let mut raw = [0u8; ICRC_LEN];
    raw.copy_from_slice(trailer);
    Ok((body, u32::from_le_bytes(raw)))
}

/// Computes the ICRC of `packet` (BTH through a 4-byte ICRC slot) and stores it in the
/// slot, little-endian. Returns the value.
pub fn write(ip_udp: &[u8], packet: &mut [u8]) -> Result<u32, WireError> {
    split_trailer(packet)?;
    let body_len = packet.len() - ICRC_LEN;
    let icrc = compute(ip_udp, &packet[..body_len])?;
    packet[body_len..].copy_from_slice(&icrc.to_le_bytes());
    Ok(icrc)
}

/// Checks the ICRC at the end of `packet` (BTH through ICRC).
pub fn verify(ip_udp: &[u8], packet: &[u8]) -> Result<(), WireError> {
    let (body, found) = split_trailer(packet)?;
    let computed = compute(ip_udp, body)?;
    if computed == found {
        Ok(())
    } else {
        Err(WireError::IcrcMismatch { computed, found })
    }
}

/// Checks the ICRC of a whole IP datagram carrying a RoCE v2 packet.
pub fn verify_datagram(datagram: &[u8]) -> Result<(), WireError> {
    let (ip_udp, packet) = crate::ip::split_ip_udp(datagram)?;
    verify(ip_udp, packet)
}

/// Offset of the IPv4 identification in the ICRC's input: after the LRH stand-in, at byte
/// 4 of the IPv4 header (options come later and do not move it).
const ID_AT: usize = LRH_MASK.len() + 4;

/// The IPv4 identification under which the ICRC at the end of `packet` (BTH through ICRC)
/// checks out, whatever identification `ip_udp` (an IPv4 header, with any options, and a
/// UDP header) carries: `Some(id)` when one exists (it is then unique), `None` when none
/// does or the header is IPv6, which has no identification. One CRC pass over the packet
/// with the identification `ip_udp` shows, which is the answer when it checks out; else a
/// few hundred word operations (`ipid.rs`).
///
/// Only 16 of the ICRC's 32 bits are left as a check: a corrupted packet is taken for
/// one with another identification with probability 2^-16 (docs/design/roce-wire.md §6).
pub fn solve_identification(ip_udp: &[u8], packet: &[u8]) -> Result<Option<u16>, WireError> {
    let (body, found) = split_trailer(packet)?;
    if ip_udp.first().map(|b| b >> 4) == Some(6) {
        return Ok(None);
    }
    let computed = compute(ip_udp, body)?;
    // compute() accepted it as an IPv4 + UDP header: at least 28 bytes.
    let shown = u16::from_be_bytes([ip_udp[4], ip_udp[5]]);
    if computed == found {
        return Ok(Some(shown));
    }
    let after = LRH_MASK.len() + ip_udp.len() + body.len() - ID_AT - 2;
    Ok(ipid::solve(computed ^ found, after).map(|x| shown ^ x))
}

/// How a packet received on a UDP socket, which never shows the IPv4 identification,
/// passed or failed its ICRC check ([`check_received`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// The ICRC checks out with an identification a softverbs sender uses (below `ids`; or
    /// IPv6, which has none): the header, with it, and whether it differs from the index
    /// the caller expected first.
    Window {
        /// The header, with the identification found.
        ip: crate::ip::IpRepr,
        /// Whether it is not the one expected first.
        searched: bool,
    },
    /// The ICRC checks out with another identification, and the caller asked to accept
    /// any (a kernel rxe or NIC peer): the header, with it.
    Solved {
        /// The header, with the identification found.
        ip: crate::ip::IpRepr,
    },
    /// The ICRC would check out with identification `id`, outside the window, and the
    /// caller did not ask to accept that: rejected, but most likely a kernel rxe or NIC
    /// peer's good packet rather than a corrupt one.
    Unseen {
        /// The identification that would make the ICRC check out.
        id: u16,
    },
    /// No identification makes the ICRC check out (or the headers are malformed).
    Bad,
}

/// Checks the ICRC of a packet received on a UDP socket. `ip` and `udp` are the headers
/// the datagram had, except for the IPv4 identification; `first` is the one expected (its
/// index in a GRO-coalesced datagram, what a GSO batch delivered whole has).
///
/// A softverbs sender uses identifications `0..ids` (docs/design/roce-wire.md §6): such a
/// packet is [`Received::Window`] with the full 32-bit check, exactly as if each of those
/// identifications were tried in turn (the solved identification is unique, so "the
/// solution is below `ids`" accepts the same `ids` ICRC values), for one CRC pass. With
/// `solve`, any other identification is accepted too ([`Received::Solved`]). IPv6 has no
/// identification: one exact check. `hdr` holds the IP and UDP headers while they are
/// built (at least 48 bytes).
pub fn check_received(
    mut ip: crate::ip::IpRepr,
    udp: &crate::ip::UdpRepr,
    packet: &[u8],
    first: u16,
    ids: u16,
    solve: bool,
    hdr: &mut [u8],
) -> Received {
    use crate::ip::IpRepr;
    // The expected identification first: when it is the one, a single CRC pass decides.
    if let IpRepr::V4(v4) = &mut ip {
        v4.identification = first;
    }
    let Ok(hl) = crate::ip::emit_ip_udp(&ip, udp, packet.len(), hdr) else {
        return Received::Bad;
    };
    let v4 = match &mut ip {
        IpRepr::V6(_) => {
            return match verify(&hdr[..hl], packet) {
                Ok(()) => Received::Window {
                    ip,
                    searched: false,
                },
                Err(_) => Received::Bad,
            };
        }
        IpRepr::V4(v4) => v4,
    };
    let Ok(Some(id)) = solve_identification(&hdr[..hl], packet) else {
        return Received::Bad;
    };
    v4.identification = id;
    if id < ids {
        Received::Window {
            ip,
            searched: id != first,
        }
    } else if solve {
        Received::Solved { ip }
    } else {
        Received::Unseen { id }
    }
}
