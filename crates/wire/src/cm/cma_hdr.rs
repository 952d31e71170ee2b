//! The address header rdma_cm puts at the start of REQ and SIDR_REQ private data
//! (docs/design/cm.md §2.3; the kernel's `struct cma_hdr`, `cma_format_hdr`).
//!
//! ```text
//! byte 0      CMA version (0)
//! byte 1      IP version in bits 7–4 (4 or 6), bits 3–0 reserved
//! bytes 2-3   source (active side's) port
//! bytes 4-19  source address (IPv4: zero, zero, zero, address)
//! bytes 20-35 destination address
//! ```
//!
//! The listener matches the destination port and address against its bound address
//! (`cma_save_ip_info`); the application's private data follows at [`CMA_HDR_LEN`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use zerocopy::big_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::CmWireError;

/// Bytes of the header.
pub const CMA_HDR_LEN: usize = 36;
/// The only CMA version.
pub const CMA_VERSION: u8 = 0;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct CmaHdrWire {
    cma_version: u8,
    ip_version: u8,
    port: U16,
    src_addr: [u8; 16],
    dst_addr: [u8; 16],
}

const _: () = assert!(core::mem::size_of::<CmaHdrWire>() == CMA_HDR_LEN);

/// The addresses of a connection as the active side states them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHdr {
    /// The active side's port.
    pub src_port: u16,
    /// The active side's address.
    pub src: IpAddr,
    /// The address the active side connects to.
    pub dst: IpAddr,
}

fn addr_bytes(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(v4) => {
            let mut out = [0u8; 16];
            out[12..].copy_from_slice(&v4.octets());
            out
        }
        IpAddr::V6(v6) => v6.octets(),
    }
}

impl CmaHdr {
    /// Reads the header from the start of private data.
    pub fn parse(private_data: &[u8]) -> Result<Self, CmWireError> {
        let (w, _) = CmaHdrWire::read_from_prefix(private_data)
            .map_err(|_| CmWireError::CmaHdr("private data shorter than the header"))?;
        if w.cma_version != CMA_VERSION {
            return Err(CmWireError::CmaHdr("unknown CMA version"));
        }
        let v4 = |b: [u8; 16]| IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15]));
        let (src, dst) = match w.ip_version >> 4 {
            4 => (v4(w.src_addr), v4(w.dst_addr)),
            6 => (
                IpAddr::V6(Ipv6Addr::from(w.src_addr)),
                IpAddr::V6(Ipv6Addr::from(w.dst_addr)),
            ),
            _ => return Err(CmWireError::CmaHdr("IP version is neither 4 nor 6")),
        };
        Ok(Self {
            src_port: w.port.get(),
            src,
            dst,
        })
    }

    /// Writes the header to the start of `out`, which must hold [`CMA_HDR_LEN`] bytes.
    /// Both addresses must be of one family.
    pub fn emit(&self, out: &mut [u8]) -> Result<(), CmWireError> {
        let ip_version = match (self.src, self.dst) {
            (IpAddr::V4(_), IpAddr::V4(_)) => 4u8,
            (IpAddr::V6(_), IpAddr::V6(_)) => 6,
            _ => {
                return Err(CmWireError::CmaHdr(
                    "source and destination families differ",
                ))
            }
        };
        CmaHdrWire {
            cma_version: CMA_VERSION,
            ip_version: ip_version << 4,
            port: U16::new(self.src_port),
            src_addr: addr_bytes(self.src),
            dst_addr: addr_bytes(self.dst),
        }
        .write_to_prefix(out)
        .map_err(|_| CmWireError::CmaHdr("buffer shorter than the header"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_layout() {
        let h = CmaHdr {
            src_port: 0x1234,
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
        };
        let mut b = [0xAAu8; 40];
        h.emit(&mut b).unwrap();
        assert_eq!(&b[..4], &[0, 0x40, 0x12, 0x34]);
        assert_eq!(&b[4..16], &[0; 12]);
        assert_eq!(&b[16..20], &[10, 0, 0, 1]);
        assert_eq!(&b[32..36], &[10, 0, 0, 2]);
        assert_eq!(
            &b[36..],
            &[0xAA; 4],
            "bytes after the header are the caller's"
        );
        assert_eq!(CmaHdr::parse(&b), Ok(h));
    }

    #[test]
    fn bad_headers() {
        assert!(CmaHdr::parse(&[0u8; 35]).is_err());
        let mut b = [0u8; 36];
        b[1] = 0x50;
        assert!(CmaHdr::parse(&b).is_err());
        b[1] = 0x60;
        b[0] = 1;
        assert!(CmaHdr::parse(&b).is_err());
        let mixed = CmaHdr {
            src_port: 1,
            src: "10.0.0.1".parse().unwrap(),
            dst: "::1".parse().unwrap(),
        };
        assert!(mixed.emit(&mut b).is_err());
    }
}
