//! Socket addresses to and from Rust's.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use libc::{sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage, AF_INET, AF_INET6};

/// A `sockaddr_storage` holding `ip:port`.
pub fn storage(ip: IpAddr, port: u16) -> sockaddr_storage {
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut s: sockaddr_storage = unsafe { std::mem::zeroed() };
    match ip {
        IpAddr::V4(v4) => {
            let sin = sockaddr_in {
                sin_family: AF_INET as u16,
                sin_port: port.to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut s as *mut sockaddr_storage).cast(), sin) };
        }
        IpAddr::V6(v6) => {
            let sin6 = sockaddr_in6 {
                sin6_family: AF_INET6 as u16,
                sin6_port: port.to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.octets(),
                },
                sin6_scope_id: 0,
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&mut s as *mut sockaddr_storage).cast(), sin6) };
        }
    }
    s
}

/// The address and port of a `sockaddr` (IPv4 or IPv6), if it is one.
///
/// # Safety
/// `sa` is NULL or points to a sockaddr of its family's size.
pub unsafe fn parse(sa: *const sockaddr) -> Option<(IpAddr, u16)> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller's promise; sa_family is first in every sockaddr.
    match i32::from(unsafe { (*sa).sa_family }) {
        AF_INET => {
            // SAFETY: an AF_INET sockaddr is a sockaddr_in.
            let sin = unsafe { &*sa.cast::<sockaddr_in>() };
            Some((
                IpAddr::V4(Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes())),
                u16::from_be(sin.sin_port),
            ))
        }
        AF_INET6 => {
            // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6.
            let sin6 = unsafe { &*sa.cast::<sockaddr_in6>() };
            Some((
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)),
                u16::from_be(sin6.sin6_port),
            ))
        }
        _ => None,
    }
}

/// The address in a `sockaddr_storage` of ours.
pub fn of(s: &sockaddr_storage) -> Option<(IpAddr, u16)> {
    // SAFETY: a storage we filled (or zeroed: family 0 gives None).
    unsafe { parse((s as *const sockaddr_storage).cast()) }
}

/// The RoCE v2 GID of an address.
pub fn gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}
