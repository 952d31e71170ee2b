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
/// (docs/design/roce-wire.md).
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
    own_sysfs_mtu(&name).or_else(|| sysctl_mtu(&name))
}

/// A number in a sysfs or procfs file.
fn read_number(path: &str) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The MTU of interface `name` from `/sys/class/net/NAME/mtu`, if that sysfs is this network
/// namespace's. sysfs shows the interfaces of the namespace that mounted it, not of the
/// reader (sysfs(5)): a daemon entered into a namespace with setns(2) alone (`nsenter
/// --net`, a launcher) and no sysfs of its own would read the host's `eth0` for the
/// namespace's `eth0` — how cluster daemons on 9000-byte links reported 1024 (issue 36 item
/// 8). The interface's index and hardware address asked of the kernel through a socket and
/// getifaddrs(3), always this namespace's (netdevice(7), `SIOCGIFINDEX`), must be the ones
/// sysfs shows: indexes alone repeat across namespaces (each numbers its own from 1).
fn own_sysfs_mtu(name: &str) -> Option<u32> {
    use rustix::net::{netdevice::name_to_index, socket, AddressFamily, SocketType};
    let sock = socket(AddressFamily::INET, SocketType::DGRAM, None).ok()?;
    let here = name_to_index(&sock, name).ok()?;
    let mac = nix::ifaddrs::getifaddrs().ok()?.find_map(|ifa| {
        let a = ifa.address?;
        (ifa.interface_name == name).then(|| a.as_link_addr().map(|l| l.addr()))?
    });
    let mac_text = mac.flatten().map(|m| {
        m.iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    });
    let shown = read_number(&format!("/sys/class/net/{name}/ifindex"));
    let shown_mac = std::fs::read_to_string(format!("/sys/class/net/{name}/address")).ok();
    let same_mac = match (&mac_text, &shown_mac) {
        (Some(m), Some(s)) => m == s.trim(),
        // No hardware address known on one side: the index decides.
        _ => true,
    };
    if shown != Some(here) || !same_mac {
        tracing::debug!(
            interface = name,
            "/sys/class/net is another network namespace's: its MTU not taken"
        );
        return None;
    }
    read_number(&format!("/sys/class/net/{name}/mtu"))
}

/// The MTU of interface `name` from `/proc/sys/net/ipv6/conf/NAME/mtu`: network sysctls are
/// the reader's own namespace's (unlike sysfs). The IPv6 MTU starts as the link's and follows
/// its changes (a router advertisement may lower it, never raise it): a safe bound. Absent
/// where IPv6 is off on the interface.
fn sysctl_mtu(name: &str) -> Option<u32> {
    let mtu = read_number(&format!("/proc/sys/net/ipv6/conf/{name}/mtu"));
    if mtu.is_none() {
        tracing::warn!(
            interface = name,
            "the link MTU of {name} is unknown (no sysfs of this network namespace, IPv6 off): \
             start the daemon with `ip netns exec`, which mounts one"
        );
    }
    mtu
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
