//! A test's own RoCE v2 sender socket.

use std::net::{ToSocketAddrs, UdpSocket};

/// A UDP socket bound to `addr` that sends IPv4 as a softverbs device socket does: DF set with
/// `IP_PMTUDISC_DO`, for which Linux gives a datagram of an unconnected socket identification
/// 0, the one a test's hand-computed ICRC covers (docs/design/roce-wire.md §6). A socket left
/// at the default (`IP_PMTUDISC_WANT`) gets a counted identification instead (seen on 6.18),
/// which a daemon that reads the real IP header (root: the raw receive path) rightly rejects.
pub fn roce_udp_socket(addr: impl ToSocketAddrs) -> std::io::Result<UdpSocket> {
    let sock = UdpSocket::bind(addr)?;
    if sock.local_addr()?.is_ipv4() {
        rustix::net::sockopt::set_ip_mtu_discover(
            &sock,
            rustix::net::sockopt::Ipv4PathMtuDiscovery::DO,
        )?;
    }
    Ok(sock)
}
