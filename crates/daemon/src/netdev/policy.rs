//! How a device checks the ICRC of what it receives (docs/design/roce-wire.md §6): which
//! peers' packets may carry an IPv4 identification the receiver must solve for, and
//! whether the device reads the real IP header (a raw socket) or only the UDP payload.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An address prefix, `10.0.0.0/24` or `fd00::/64`; a bare address is a /32 or /128.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` is inside the prefix (never across address families).
    pub fn contains(&self, ip: IpAddr) -> bool {
        fn head(a: &[u8], b: &[u8], bits: u8) -> bool {
            let (whole, rest) = (usize::from(bits / 8), bits % 8);
            a[..whole] == b[..whole]
                && (rest == 0 || (a[whole] ^ b[whole]) & (0xFFu8 << (8 - rest)) == 0)
        }
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => head(&n.octets(), &a.octets(), self.prefix),
            (IpAddr::V6(n), IpAddr::V6(a)) => head(&n.octets(), &a.octets(), self.prefix),
            _ => false,
        }
    }

    /// Whether the prefix is IPv6: it matches only IPv6 peers, whose packets have no
    /// identification, so it changes nothing (accepted for one list covering both families).
    pub fn is_ipv6(&self) -> bool {
        self.addr.is_ipv6()
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Cidr, String> {
        let (a, p) = s.split_once('/').map_or((s, None), |(a, p)| (a, Some(p)));
        let addr: IpAddr = a
            .parse()
            .map_err(|_| format!("{s}: expected an address or ADDRESS/PREFIX"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|&p| p <= max)
                .ok_or_else(|| format!("{s}: the prefix length is 0 to {max}"))?,
        };
        Ok(Cidr { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Where a device reads the IPv4 header of what it receives (`[icrc] ip_header`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IpHeader {
    /// A raw socket where the daemon may open one (`CAP_NET_RAW`) and the device is IPv4,
    /// the UDP socket otherwise.
    #[default]
    Auto,
    /// A raw socket; a device that cannot open one fails to start.
    Raw,
    /// The UDP socket: the identification is never seen (the window or the solver).
    Udp,
}

impl FromStr for IpHeader {
    type Err = String;

    fn from_str(s: &str) -> Result<IpHeader, String> {
        match s {
            "auto" => Ok(IpHeader::Auto),
            "raw" => Ok(IpHeader::Raw),
            "udp" => Ok(IpHeader::Udp),
            _ => Err(format!("{s}: expected auto, raw or udp")),
        }
    }
}

/// A device's ICRC settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IcrcPolicy {
    /// Peers (kernel rxe, RoCE NICs) whose IPv4 identification, unseen, is solved for and
    /// accepted whatever it is (`[icrc] solve_ip_id_peers`, `--solve-ip-id`).
    pub solve_peers: Vec<Cidr>,
    /// Where the header is read.
    pub ip_header: IpHeader,
}

impl IcrcPolicy {
    /// Whether packets from `peer` may carry any identification.
    pub fn solves(&self, peer: IpAddr) -> bool {
        self.solve_peers.iter().any(|c| c.contains(peer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        let c: Cidr = "10.0.0.0/24".parse().unwrap();
        assert!(c.contains("10.0.0.77".parse().unwrap()));
        assert!(!c.contains("10.0.1.1".parse().unwrap()));
        assert!(!c.contains("::ffff:10.0.0.1".parse().unwrap()));
        let c: Cidr = "10.1.2.3".parse().unwrap();
        assert!(c.contains("10.1.2.3".parse().unwrap()));
        assert!(!c.contains("10.1.2.2".parse().unwrap()));
        let c: Cidr = "10.0.0.0/21".parse().unwrap();
        assert!(c.contains("10.0.7.255".parse().unwrap()));
        assert!(!c.contains("10.0.8.0".parse().unwrap()));
        let c: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(c.contains("192.0.2.1".parse().unwrap()));
        let c: Cidr = "fd00::/64".parse().unwrap();
        assert!(c.is_ipv6() && c.contains("fd00::5".parse().unwrap()));
        assert!(!c.contains("fd00:0:0:1::5".parse().unwrap()));
        assert_eq!(c.to_string(), "fd00::/64");
        for bad in ["10.0.0.0/33", "fd00::/129", "eth0", "10.0.0.0/x", ""] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn modes() {
        assert_eq!("raw".parse::<IpHeader>().unwrap(), IpHeader::Raw);
        assert!("RAW".parse::<IpHeader>().is_err());
    }
}
