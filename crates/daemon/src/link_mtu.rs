//! The active MTU of a device's port, from the Ethernet link its address lives on.
//!
//! A RoCE NIC reports as `active_mtu` the largest IB MTU whose packets fit its link
//! (IBA A16/A17, RoCE v2 annex: the IB payload rides in UDP/IP; rxe does the same from its
//! netdev's MTU). Reporting 4096 on a 1500-byte link made every full-size RC packet leave with
//! DF set and vanish, so RC between namespace hosts on ordinary veth links never completed.

use std::net::IpAddr;

use softverbs_core::types::Mtu;

/// Bytes a RoCE v2 packet adds around its IB payload, at most: an IPv6 header (40, larger
/// than IPv4's 20), UDP (8), BTH (12), the largest extended headers one packet can carry
/// (XRCETH 4 + AtomicETH 28, which exceeds RETH 16 + ImmDt 4) and the ICRC (4)
/// (docs/roce-wire.md).
const ROCE_OVERHEAD: u32 = 40 + 8 + 12 + 4 + 28 + 4;

/// The largest IB MTU whose packets fit a link of `link_mtu` bytes; 256 when even that does
/// not fit (IB's smallest MTU: the link will fragment or drop, as it would for a NIC).
pub fn mtu_for_link(link_mtu: u32) -> Mtu {
    let room = link_mtu.saturating_sub(ROCE_OVERHEAD);
    [Mtu::M4096, Mtu::M2048, Mtu::M1024, Mtu::M512]
        .into_iter()
        .find(|m| m.bytes() <= room)
        .unwrap_or(Mtu::M256)
}

/// The MTU of the interface that holds `ip` (loopback addresses: `lo`), or `None` when no
/// interface has it (a daemon configured for an address not yet up keeps 4096).
pub fn link_mtu_of(ip: IpAddr) -> Option<u32> {
    let want = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    let name = if want.is_loopback() {
        "lo".to_string()
    } else {
        nix::ifaddrs::getifaddrs().ok()?.find_map(|ifa| {
            let addr = ifa.address?;
            let got = if let Some(sin) = addr.as_sockaddr_in() {
                IpAddr::V4(sin.ip())
            } else {
                IpAddr::V6(addr.as_sockaddr_in6()?.ip())
            };
            (got == want).then_some(ifa.interface_name)
        })?
    };
    std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The active MTU for a device on `ips`: the smallest over the links they live on, 4096 when
/// none is found.
pub fn active_mtu(ips: &[IpAddr]) -> Mtu {
    ips.iter()
        .filter_map(|ip| link_mtu_of(*ip))
        .map(mtu_for_link)
        .min_by_key(|m| m.bytes())
        .unwrap_or(Mtu::M4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ethernet_link_gets_what_rxe_reports() {
        assert_eq!(mtu_for_link(1500), Mtu::M1024);
        assert_eq!(mtu_for_link(9000), Mtu::M4096);
        assert_eq!(mtu_for_link(65536), Mtu::M4096);
        assert_eq!(mtu_for_link(4096 + ROCE_OVERHEAD - 1), Mtu::M2048);
        assert_eq!(mtu_for_link(68), Mtu::M256);
    }

    #[test]
    fn loopback_has_room_for_4096() {
        assert_eq!(active_mtu(&["127.0.0.1".parse().unwrap()]), Mtu::M4096);
    }
}
