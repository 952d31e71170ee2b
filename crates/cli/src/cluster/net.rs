//! The cluster's network: one bridge, one network namespace per host, one veth pair each.
//!
//! Built with iproute2's `ip` rather than raw netlink: `ip` is the reference implementation of
//! these rtnetlink requests (bridge and veth creation with the peer placed straight into a
//! namespace, `ip netns`'s bind mounts under /run/netns that every admin tool lists), it is on
//! every machine that has network namespaces, and the workspace has no netlink crate; writing
//! the IFLA_* attribute nesting by hand would be several hundred lines of unsafe-adjacent
//! message building to replace nine commands. Namespaces are *entered* in-process
//! (setns(2) through nix, cluster/enter.rs), because `exec` must combine the network namespace
//! with a mount and UTS namespace of its own before it execs the program.

use std::net::Ipv4Addr;
use std::process::Command;

/// RFC 2544's benchmarking range, 198.18.0.0/15: reserved for lab networks, never routed on
/// the Internet, and unlike the RFC 5737 documentation ranges meant to carry real traffic.
/// Cluster `k` takes 198.18.k.0/24; its hosts are .1 to .N, the bridge (the machine) is .254.
pub fn subnet_addr(subnet: u8, last: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, subnet, last)
}

/// The bridge's address in cluster `subnet`: where launchers that run outside the hosts are
/// reached from them.
pub const BRIDGE_HOST: u8 = 254;

/// The MTU of the cluster's links. A softverbs device's active MTU is the largest IB MTU
/// whose RoCE v2 packets fit its link (crates/daemon/src/link_mtu.rs, as rxe), and each RoCE
/// packet leaves as one UDP datagram with DF set (crates/daemon/src/netdev.rs): jumbo frames
/// give the hosts IB's largest MTU, 4096, as on an RDMA fabric; on Ethernet's 1500 it would
/// be 1024.
pub const LINK_MTU: u32 = 9000;

/// Runs `ip ARGS`, returning its stdout or its stderr as the error.
pub fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip").args(args).output().map_err(|e| {
        format!(
            "ip {}: {e} (the cluster needs iproute2's `ip`)",
            args.join(" ")
        )
    })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Names of the network namespaces `ip netns` knows.
pub fn namespaces() -> Vec<String> {
    ip(&["netns", "list"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// Names of the links of the current network namespace.
pub fn links() -> Vec<String> {
    ip(&["-o", "link", "show"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            // "3: name@peer: <FLAGS> ..."
            let name = l.split(": ").nth(1)?;
            Some(name.split('@').next()?.to_string())
        })
        .collect()
}

/// Creates the bridge `br` with `addr`/24, up.
pub fn add_bridge(br: &str, addr: Ipv4Addr) -> Result<(), String> {
    ip(&["link", "add", br, "type", "bridge"])?;
    ip(&["addr", "add", &format!("{addr}/24"), "dev", br])?;
    ip(&["link", "set", br, "up"])?;
    Ok(())
}

/// Creates namespace `ns` with `lo` up and `eth0` (`addr`/24) the peer of `veth` on `br`.
pub fn add_host(ns: &str, veth: &str, br: &str, addr: Ipv4Addr) -> Result<(), String> {
    ip(&["netns", "add", ns]).map_err(|e| {
        format!("{e} (network namespaces unavailable? the cluster needs CONFIG_NET_NS and a writable /run/netns)")
    })?;
    ip(&[
        "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns,
    ])?;
    let mtu = LINK_MTU.to_string();
    ip(&["link", "set", veth, "mtu", &mtu])?;
    ip(&["-n", ns, "link", "set", "eth0", "mtu", &mtu])?;
    ip(&["link", "set", veth, "master", br, "up"])?;
    ip(&[
        "-n",
        ns,
        "addr",
        "add",
        &format!("{addr}/24"),
        "dev",
        "eth0",
    ])?;
    ip(&["-n", ns, "link", "set", "eth0", "up"])?;
    ip(&["-n", ns, "link", "set", "lo", "up"])?;
    Ok(())
}

/// Pids of the processes in namespace `ns`.
pub fn pids_in(ns: &str) -> Vec<i32> {
    ip(&["netns", "pids", ns])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

pub fn del_namespace(ns: &str) -> Result<(), String> {
    ip(&["netns", "del", ns]).map(|_| ())
}

pub fn del_link(link: &str) -> Result<(), String> {
    ip(&["link", "del", link]).map(|_| ())
}
