//! The daemon's configuration file (`/etc/softverbs/softverbs.toml`) and the command-line
//! settings that override it, merged into a [`Config`].
//!
//! A key the file does not know is an error that names it: a typo in a root daemon's
//! configuration must not leave a limit silently at its default (serde's
//! `deny_unknown_fields`, and [`Limits::apply`] for the resource names). Every key is
//! described in docs/guide/configuration.md and the example dist/softverbs.toml.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use softverbs_core::types::Mtu;
use softverbs_transport::Faults;

use crate::config::{Config, DeviceSpec};
use crate::netdev::{Cidr, IcrcPolicy, IpHeader};

/// What the file or the command line sets; `None` (or empty) leaves the setting to the
/// next source: command line, then file, then the built-in default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Settings {
    /// The daemon's socket.
    pub socket: Option<PathBuf>,
    /// The devices, each resolved to its addresses.
    pub devices: Option<Vec<DeviceSpec>>,
    /// Whether the devices bind their UDP ports.
    pub network: Option<bool>,
    /// The devices' UDP port.
    pub port: Option<u16>,
    /// The largest IB MTU the devices report (their links may lower it).
    pub mtu: Option<Mtu>,
    /// The directory of the pcap files.
    pub capture: Option<PathBuf>,
    /// Whether the captures keep rejected packets, marked (pcapng).
    pub capture_rejected: Option<bool>,
    /// Faults injected into what the devices send.
    pub faults: Option<Faults>,
    /// `SCOPE.RESOURCE=N` settings, applied in order after the defaults.
    pub limits: Vec<String>,
    /// The ABI level spoken (compatibility tests).
    pub abi_version: Option<u32>,
    /// The retry floor in milliseconds (`transport::time::RETRY_FLOOR`; 0: IBA's plain count).
    pub retry_floor_ms: Option<u64>,
    /// Peers whose IPv4 identification the ICRC check solves for (`[icrc]
    /// solve_ip_id_peers`, `--solve-ip-id`); the command line's list replaces the file's.
    pub solve_ip_id_peers: Option<Vec<Cidr>>,
    /// Where the devices read received IP headers (`[icrc] ip_header`, `--ip-header`).
    pub ip_header: Option<IpHeader>,
}

impl Settings {
    /// `self` (the file's) with every setting `over` (the command line's) makes replacing it;
    /// limits of both apply, `over`'s last so they win.
    pub fn overridden_by(&self, over: &Settings) -> Settings {
        let mut limits = self.limits.clone();
        limits.extend(over.limits.iter().cloned());
        Settings {
            socket: over.socket.clone().or_else(|| self.socket.clone()),
            devices: over.devices.clone().or_else(|| self.devices.clone()),
            network: over.network.or(self.network),
            port: over.port.or(self.port),
            mtu: over.mtu.or(self.mtu),
            capture: over.capture.clone().or_else(|| self.capture.clone()),
            capture_rejected: over.capture_rejected.or(self.capture_rejected),
            faults: over.faults.or(self.faults),
            limits,
            abi_version: over.abi_version.or(self.abi_version),
            retry_floor_ms: over.retry_floor_ms.or(self.retry_floor_ms),
            solve_ip_id_peers: over
                .solve_ip_id_peers
                .clone()
                .or_else(|| self.solve_ip_id_peers.clone()),
            ip_header: over.ip_header.or(self.ip_header),
        }
    }

    /// The daemon configuration: these settings over the defaults, serving `default_socket`
    /// unless a socket is set. Fails on a limit that does not parse, naming it.
    pub fn into_config(self, default_socket: PathBuf) -> Result<Config, String> {
        let mut c = Config::new(self.socket.unwrap_or(default_socket));
        for l in &self.limits {
            c.limits.apply(l).map_err(|e| format!("limit {l}: {e}"))?;
        }
        if let Some(d) = self.devices {
            c.devices = d;
        }
        // `softverbs daemon` binds its devices' ports unless told otherwise (Config::new's
        // default is for embedded test daemons).
        c.net.bind = self.network.unwrap_or(true);
        if let Some(p) = self.port {
            c.net.port = p;
        }
        c.mtu = self.mtu;
        c.net.capture_dir = self.capture;
        if self.capture_rejected == Some(true) {
            c.net.capture_rejected = crate::capture::Rejected::Marked;
        }
        c.net.faults = self.faults;
        if let Some(v) = self.abi_version {
            c.abi_version = v;
        }
        if let Some(ms) = self.retry_floor_ms {
            c.net.retry_floor = std::time::Duration::from_millis(ms);
        }
        c.net.icrc = IcrcPolicy {
            solve_peers: self.solve_ip_id_peers.unwrap_or_default(),
            ip_header: self.ip_header.unwrap_or_default(),
        };
        Ok(c)
    }
}

/// The file as written. Field names are the file's keys.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    socket: Option<PathBuf>,
    network: Option<bool>,
    port: Option<u16>,
    mtu: Option<u32>,
    capture: Option<PathBuf>,
    capture_rejected: Option<bool>,
    faults: Option<FaultsFile>,
    /// Name = interface, address, or a list of them, in the file's order (toml's
    /// `preserve_order`): the first is device 0.
    devices: Option<toml::Table>,
    limits: Option<LimitsFile>,
    retry_floor_ms: Option<u64>,
    icrc: Option<IcrcFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IcrcFile {
    solve_ip_id_peers: Option<Vec<String>>,
    ip_header: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultsFile {
    loss: Option<f64>,
    dup: Option<f64>,
    reorder: Option<f64>,
    corrupt: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    context: Option<toml::Table>,
    uid: Option<toml::Table>,
    daemon: Option<toml::Table>,
}

/// Reads and checks the file at `path`: unknown keys, bad values, interfaces that do not
/// exist or have no address are errors naming what is wrong.
///
/// A file another user could have written is refused (as sshd's `StrictModes` refuses): it
/// would let that user set a root daemon's limits, capture directory and devices. It must
/// be root's or this user's, and writable by neither group nor others.
pub fn load(path: &Path) -> Result<Settings, String> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let mut file = std::fs::File::open(path).map_err(|e| at(&e))?;
    let meta = file.metadata().map_err(|e| at(&e))?;
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != 0 && meta.uid() != me {
        return Err(at(&format!(
            "owned by uid {}, neither root nor this user: refused",
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(at(&format!(
            "mode {:o}: writable by group or others, refused",
            meta.mode() & 0o7777
        )));
    }
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(|e| at(&e))?;
    parse(&text).map_err(|e| at(&e))
}

/// [`load`] of the file's text.
pub fn parse(text: &str) -> Result<Settings, String> {
    let f: File = toml::from_str(text).map_err(|e| e.to_string())?;
    let mut s = Settings {
        socket: f.socket,
        network: f.network,
        port: f.port,
        capture: f.capture,
        capture_rejected: f.capture_rejected,
        retry_floor_ms: f.retry_floor_ms,
        ..Settings::default()
    };
    if let Some(m) = f.mtu {
        s.mtu = Some(mtu_from_bytes(m).map_err(|e| format!("mtu: {e}"))?);
    }
    if let Some(i) = f.icrc {
        if let Some(peers) = i.solve_ip_id_peers {
            s.solve_ip_id_peers = Some(
                peers
                    .iter()
                    .map(|p| p.parse())
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("icrc.solve_ip_id_peers: {e}"))?,
            );
        }
        if let Some(h) = i.ip_header {
            s.ip_header = Some(h.parse().map_err(|e| format!("icrc.ip_header: {e}"))?);
        }
    }
    // An empty [faults] table (the example's) injects nothing: no fault path at all.
    if let Some(ff) = f
        .faults
        .filter(|f| f.loss.or(f.dup).or(f.reorder).or(f.corrupt).is_some())
    {
        let mut faults = no_faults();
        for (key, v, slot) in [
            ("loss", ff.loss, &mut faults.loss),
            ("dup", ff.dup, &mut faults.duplicate),
            ("reorder", ff.reorder, &mut faults.reorder),
            ("corrupt", ff.corrupt, &mut faults.corrupt),
        ] {
            if let Some(p) = v {
                *slot = probability(p).map_err(|e| format!("faults.{key}: {e}"))?;
            }
        }
        s.faults = Some(faults);
    }
    // An empty [devices] table (the example's) keeps the default device.
    if let Some(devs) = f.devices.filter(|d| !d.is_empty()) {
        let mut list = Vec::new();
        for (name, v) in devs {
            let items: Vec<String> = match v {
                toml::Value::String(one) => vec![one],
                toml::Value::Array(a) => a
                    .into_iter()
                    .map(|x| match x {
                        toml::Value::String(one) => Ok(one),
                        _ => Err(format!("devices.{name}: a list of interfaces or addresses")),
                    })
                    .collect::<Result<_, _>>()?,
                _ => {
                    return Err(format!(
                        "devices.{name}: an interface, an address or a list of them"
                    ))
                }
            };
            list.push(device(&name, &items).map_err(|e| format!("devices.{name}: {e}"))?);
        }
        s.devices = Some(list);
    }
    if let Some(l) = f.limits {
        for (scope, table) in [("context", l.context), ("uid", l.uid), ("daemon", l.daemon)] {
            for (resource, v) in table.into_iter().flatten() {
                let amount = match v {
                    toml::Value::Integer(n) if n >= 0 => n.to_string(),
                    toml::Value::String(s) => s,
                    _ => {
                        return Err(format!(
                            "limits.{scope}.{resource}: a count, a size (\"256M\") or \"unlimited\""
                        ))
                    }
                };
                let setting = format!("{scope}.{resource}={amount}");
                // Checked here, so an unknown resource is refused before the daemon starts.
                softverbs_core::limits::Limits::unlimited()
                    .apply(&setting)
                    .map_err(|e| format!("limits.{scope}.{resource}: {e}"))?;
                s.limits.push(setting);
            }
        }
    }
    Ok(s)
}

/// A device named `name` on `items`, each an IP address or a network interface whose
/// addresses it takes (as `rdma link add NAME type rxe netdev IFACE` does).
pub fn device(name: &str, items: &[String]) -> Result<DeviceSpec, String> {
    if name.is_empty() || name.len() > 63 {
        return Err("device name must be 1..=63 bytes".into());
    }
    let mut ips = Vec::new();
    for item in items {
        match item.parse::<IpAddr>() {
            Ok(ip) => ips.push(ip),
            Err(_) => ips.extend(interface_addresses(item)?),
        }
    }
    if ips.is_empty() {
        return Err("no address".into());
    }
    Ok(DeviceSpec {
        name: name.to_string(),
        ips,
    })
}

/// Parses `--device NAME=X[,X...]`, each X an address or an interface.
pub fn device_flag(s: &str) -> Result<DeviceSpec, String> {
    let (name, rest) = s
        .split_once('=')
        .ok_or("expected NAME=IP|INTERFACE[,...]")?;
    let items: Vec<String> = rest.split(',').map(str::to_string).collect();
    device(name, &items).map_err(|e| format!("{s}: {e}"))
}

/// The addresses of interface `ifname`: IPv4 first, then IPv6, each in the kernel's order.
/// IPv6 link-local addresses are left out: a GID carries no scope, so a peer could not
/// route back to one (rxe's link-local GID has the same limit for RoCE v2).
pub fn interface_addresses(ifname: &str) -> Result<Vec<IpAddr>, String> {
    // IFNAMSIZ (16) with its NUL; a name with '/' or whitespace is no interface (netdevice(7)).
    if ifname.is_empty()
        || ifname.len() > 15
        || ifname.contains(['/', ':'])
        || ifname.chars().any(char::is_whitespace)
    {
        return Err(format!(
            "{ifname:?} is neither an IP address nor an interface name"
        ));
    }
    let ifaddrs = nix::ifaddrs::getifaddrs().map_err(|e| format!("getifaddrs: {e}"))?;
    let mut found = false;
    let (mut v4, mut v6) = (Vec::new(), Vec::new());
    for ifa in ifaddrs.filter(|i| i.interface_name == ifname) {
        found = true;
        let Some(addr) = ifa.address else { continue };
        if let Some(sin) = addr.as_sockaddr_in() {
            v4.push(IpAddr::V4(sin.ip()));
        } else if let Some(sin6) = addr.as_sockaddr_in6() {
            let ip = sin6.ip();
            // fe80::/10
            if ip.segments()[0] & 0xffc0 != 0xfe80 {
                v6.push(IpAddr::V6(ip));
            }
        }
    }
    if !found {
        return Err(format!("no interface {ifname}"));
    }
    v4.extend(v6);
    if v4.is_empty() {
        return Err(format!(
            "interface {ifname} has no IPv4 or non-link-local IPv6 address"
        ));
    }
    Ok(v4)
}

/// A fault-free network for a daemon: [`Faults::NONE`] without the simulator's delay (a
/// UDP device has the real one).
fn no_faults() -> Faults {
    let mut f = Faults::NONE;
    f.delay = std::time::Duration::ZERO;
    f
}

fn probability(p: f64) -> Result<f64, String> {
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(format!("{p}: a probability is between 0 and 1"))
    }
}

/// Parses `--faults loss=P,dup=P,reorder=P,corrupt=P`.
pub fn faults_flag(s: &str) -> Result<Faults, String> {
    let mut f = no_faults();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("{part}: expected KEY=PROBABILITY"))?;
        let p: f64 = v.parse().map_err(|e| format!("{part}: {e}"))?;
        let p = probability(p).map_err(|e| format!("{part}: {e}"))?;
        match k {
            "loss" => f.loss = p,
            "dup" => f.duplicate = p,
            "reorder" => f.reorder = p,
            "corrupt" => f.corrupt = p,
            _ => return Err(format!("{k}: unknown fault (loss, dup, reorder, corrupt)")),
        }
    }
    Ok(f)
}

/// Parses `--mtu BYTES`.
pub fn mtu_flag(s: &str) -> Result<Mtu, String> {
    mtu_from_bytes(s.parse().map_err(|e| format!("{s}: {e}"))?)
}

/// The IB MTU of `bytes` (256, 512, 1024, 2048 or 4096: `enum ibv_mtu`, IBA 7.7.3).
pub fn mtu_from_bytes(bytes: u32) -> Result<Mtu, String> {
    [Mtu::M256, Mtu::M512, Mtu::M1024, Mtu::M2048, Mtu::M4096]
        .into_iter()
        .find(|m| m.bytes() == bytes)
        .ok_or_else(|| format!("{bytes}: an IB MTU is 256, 512, 1024, 2048 or 4096"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_named() {
        let e = parse("prot = 4791\n").unwrap_err();
        assert!(e.contains("prot"), "{e}");
        let e = parse("[faults]\nlos = 0.1\n").unwrap_err();
        assert!(e.contains("los"), "{e}");
        let e = parse("[limits.uid]\nmapings = 10\n").unwrap_err();
        assert!(e.contains("limits.uid.mapings"), "{e}");
        let e = parse("[limits.user]\nmappings = 10\n").unwrap_err();
        assert!(e.contains("user"), "{e}");
    }

    #[test]
    fn every_key_parses() {
        let s = parse(
            r#"
socket = "/run/x/s.sock"
network = false
port = 4792
mtu = 2048
capture = "/var/log/softverbs"
capture_rejected = true
retry_floor_ms = 250
[icrc]
solve_ip_id_peers = ["10.0.0.0/24", "192.0.2.7", "fd00::/64"]
ip_header = "udp"
[faults]
loss = 0.25
corrupt = 0.5
[devices]
b = "127.0.0.2"
a = ["lo", "::1"]
[limits.uid]
mappings = 8192
ring-bytes = "256M"
[limits.daemon]
qps = "unlimited"
"#,
        )
        .unwrap();
        assert_eq!(s.port, Some(4792));
        assert_eq!(s.retry_floor_ms, Some(250));
        let peers = s.solve_ip_id_peers.clone().unwrap();
        assert_eq!(peers.len(), 3);
        assert!(peers[1].contains("192.0.2.7".parse().unwrap()));
        assert_eq!(s.ip_header, Some(IpHeader::Udp));
        assert_eq!(s.capture_rejected, Some(true));
        assert_eq!(s.network, Some(false));
        assert_eq!(s.mtu, Some(Mtu::M2048));
        let f = s.faults.unwrap();
        assert_eq!((f.loss, f.duplicate, f.corrupt), (0.25, 0.0, 0.5));
        let devs = s.devices.unwrap();
        // The file's order, not the names'.
        assert_eq!(devs[0].name, "b");
        assert_eq!(devs[1].name, "a");
        assert_eq!(devs[1].ips[0], "127.0.0.1".parse::<IpAddr>().unwrap());
        assert!(devs[1].ips.contains(&"::1".parse().unwrap()));
        assert_eq!(
            s.limits,
            [
                "uid.mappings=8192",
                "uid.ring-bytes=256M",
                "daemon.qps=unlimited"
            ]
        );
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(parse("mtu = 1500\n").unwrap_err().contains("mtu"));
        assert!(parse("[faults]\nloss = 2.0\n")
            .unwrap_err()
            .contains("faults.loss"));
        let e = parse("[devices]\nsoftverbs0 = \"no-such-if9\"\n").unwrap_err();
        assert!(
            e.contains("devices.softverbs0") && e.contains("no-such-if9"),
            "{e}"
        );
        assert!(parse("[limits.uid]\nqps = -1\n").is_err());
        let e = parse("[icrc]\nsolve_ip_id_peers = [\"10.0.0.0/40\"]\n").unwrap_err();
        assert!(e.contains("icrc.solve_ip_id_peers"), "{e}");
        let e = parse("[icrc]\nip_header = \"ip\"\n").unwrap_err();
        assert!(e.contains("icrc.ip_header"), "{e}");
    }

    #[test]
    fn the_command_line_wins() {
        let file = parse("port = 4792\nmtu = 1024\n[limits.uid]\nqps = 5\n").unwrap();
        let flags = Settings {
            port: Some(4793),
            limits: vec!["uid.qps=7".into()],
            ..Settings::default()
        };
        let c = file
            .overridden_by(&flags)
            .into_config("/x/s.sock".into())
            .unwrap();
        assert_eq!(c.net.port, 4793);
        assert_eq!(c.mtu, Some(Mtu::M1024));
        let qps = softverbs_core::limits::Resource::from_name("qps").unwrap();
        assert_eq!(c.limits.get(qps).uid, 7);
        assert!(c.net.bind);
    }
}
