//! Daemon configuration: the socket, the devices it offers, the ABI level it speaks and the
//! limits it holds clients to.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use softverbs_core::device::Device;
use softverbs_core::limits::{Budget, Limits};

/// One device to offer: a name and the IP addresses whose RoCE v2 GIDs fill its port's table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSpec {
    /// Device name (`ibv_get_device_name`).
    pub name: String,
    /// Addresses of port 1.
    pub ips: Vec<IpAddr>,
}

impl std::str::FromStr for DeviceSpec {
    type Err = String;

    /// Parses `NAME=IP[,IP...]`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, ips) = s.split_once('=').ok_or("expected NAME=IP[,IP...]")?;
        if name.is_empty() || name.len() > 63 {
            return Err("device name must be 1..=63 bytes".into());
        }
        let ips = ips
            .split(',')
            .map(|ip| ip.parse::<IpAddr>().map_err(|e| format!("{ip}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(DeviceSpec {
            name: name.to_string(),
            ips,
        })
    }
}

/// How a daemon runs.
#[derive(Clone, Debug)]
pub struct Config {
    /// The socket to serve.
    pub socket: PathBuf,
    /// Devices to offer; empty means one default device `softverbs0` on 127.0.0.1
    /// ([`DEFAULT_ADDRESS`]).
    pub devices: Vec<DeviceSpec>,
    /// ABI level to speak (older levels emulate an older daemon, for compatibility tests).
    pub abi_version: u32,
    /// The devices' network side (UDP binding, fault injection, capture).
    pub net: crate::datapath::NetOptions,
    /// What one context, one uid and the daemon may use (docs/guide/limits.md).
    pub limits: Limits,
    /// The largest IB MTU the devices report; `None`: what their links allow
    /// (`link_mtu::active_mtu`). A link still lowers it: packets larger than the link
    /// would leave with DF set and vanish.
    pub mtu: Option<softverbs_core::types::Mtu>,
    /// Exit after this long without a client connection (an autostarted daemon); `None`:
    /// run until stopped (a system daemon, one started by hand).
    pub idle_exit: Option<Duration>,
    /// With no devices named: when another daemon holds the default device's address, take
    /// one of [`own_addresses`] instead, and run without a network when all are taken
    /// (an autostarted per-user daemon, which must never collide with another user's).
    pub own_address: bool,
    /// The version `softverbs status` reports for this daemon (the CLI sets its own, with the
    /// git revision; the crate's version otherwise).
    pub version: String,
}

impl Config {
    /// Defaults for `socket`.
    pub fn new(socket: PathBuf) -> Config {
        Config {
            socket,
            devices: Vec::new(),
            abi_version: softverbs_abi::ABI_VERSION,
            // Tests and embedded daemons stay off the network unless asked; `softverbs daemon`
            // binds its devices' UDP ports.
            net: crate::datapath::NetOptions {
                bind: false,
                port: softverbs_wire::ip::ROCE_V2_UDP_PORT,
                faults: None,
                capture_dir: None,
                capture_rejected: Default::default(),
                retry_floor: softverbs_transport::time::RETRY_FLOOR,
                icrc: Default::default(),
            },
            limits: Limits::for_budget(&host_budget()),
            mtu: None,
            idle_exit: None,
            own_address: false,
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    /// The core devices this configuration describes. Node GUIDs are derived from the device
    /// index and the first address, so two daemons on different addresses differ.
    pub fn build_devices(&self) -> Vec<Device> {
        let specs = if self.devices.is_empty() {
            vec![DeviceSpec {
                name: DEFAULT_DEVICE.into(),
                ips: vec![IpAddr::V4(DEFAULT_ADDRESS)],
            }]
        } else {
            self.devices.clone()
        };
        let groups = mcast_groups_per_device(&host_budget(), specs.len());
        specs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let seed = d.ips.first().map_or(0u64, |ip| match ip {
                    IpAddr::V4(v4) => u64::from(u32::from(*v4)),
                    IpAddr::V6(v6) => (u128::from(*v6) & u128::from(u64::MAX)) as u64,
                });
                let guid = 0x0200_5eff_fe00_0000 ^ (seed << 8) ^ i as u64;
                let link = crate::link_mtu::active_mtu(&d.ips);
                let mtu = match self.mtu {
                    Some(m) if m.bytes() < link.bytes() => m,
                    _ => link,
                };
                let mut dev = Device::roce(&d.name, guid, &d.ips, mtu);
                dev.attr.max_mcast_grp = dev.attr.max_mcast_grp.min(groups);
                dev
            })
            .collect()
    }
}

/// The device a daemon offers when none is named.
pub const DEFAULT_DEVICE: &str = "softverbs0";

/// The default device's address when no device is named.
pub const DEFAULT_ADDRESS: Ipv4Addr = Ipv4Addr::LOCALHOST;

/// How many addresses of its own a daemon tries before running without a network.
pub const OWN_ADDRESS_TRIES: u32 = 16;

/// The addresses a daemon without named devices tries for its default device, in order:
/// [`DEFAULT_ADDRESS`], then [`OWN_ADDRESS_TRIES`] addresses of 127.0.0.0/8 (every one is
/// this host's own on Linux's `lo`, which carries 127.0.0.1/8) derived from the daemon's uid
/// and socket path. They are stable (the same user's daemon gets the same address again,
/// which helps reading logs and captures), differ between users and between jobs with their
/// own sockets, and stay out of 127.0.0.0/16, where the demo and tests name addresses by hand.
/// Which one is free is settled by bind(2) itself, never by a check before it.
pub fn own_addresses(uid: u32, socket: &Path) -> Vec<IpAddr> {
    use std::os::unix::ffi::OsStrExt as _;
    let mut out = vec![IpAddr::V4(DEFAULT_ADDRESS)];
    for k in 0..OWN_ADDRESS_TRIES {
        // FNV-1a (64 bits): stable across runs and Rust versions, unlike the std hasher.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let bytes = uid
            .to_le_bytes()
            .into_iter()
            .chain(k.to_le_bytes())
            .chain(socket.as_os_str().as_bytes().iter().copied());
        for b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        let [a, b, c, ..] = h.to_le_bytes();
        // 127.1.0.1 ..= 127.255.255.254: never 127.0.x.x, never a .0 or .255 host byte.
        let ip = Ipv4Addr::new(127, a.max(1), b, c.clamp(1, 254));
        if !out.contains(&IpAddr::V4(ip)) {
            out.push(IpAddr::V4(ip));
        }
    }
    out
}

/// `max_mcast_grp` of each of `devices` devices: rxe's 8192, but no more than an eighth of
/// the daemon's descriptors over all devices, since a device holds one socket per group it
/// joined (`netdev.rs`) and groups must not starve the clients' connections (docs/guide/limits.md).
pub fn mcast_groups_per_device(budget: &Budget, devices: usize) -> u32 {
    let share = budget.max_fds / 8 / devices.max(1) as u64;
    share.clamp(1, softverbs_core::device::MAX_MCAST_GRP) as u32
}

/// The budget of a daemon on this host: the kernel's `vm.max_map_count`, physical memory and
/// this process's `RLIMIT_NOFILE`; a value that cannot be read takes the kernel's default
/// (65530 mappings, 1024 descriptors) or 1 GiB.
pub fn host_budget() -> Budget {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let max_map_count = read("/proc/sys/vm/max_map_count")
        .trim()
        .parse()
        .unwrap_or(65530);
    let mem_total = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(1 << 30, |kib| kib * 1024);
    let max_fds = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(1024);
    Budget {
        max_map_count,
        mem_total,
        max_fds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_addresses_start_at_the_default_and_differ_between_users_and_sockets() {
        let a = own_addresses(1000, Path::new("/run/user/1000/softverbs/softverbs.sock"));
        let b = own_addresses(1001, Path::new("/run/user/1001/softverbs/softverbs.sock"));
        let c = own_addresses(1000, Path::new("/home/u/job2/softverbs/softverbs.sock"));
        assert_eq!(a[0], IpAddr::V4(DEFAULT_ADDRESS));
        assert_eq!(
            a,
            own_addresses(1000, Path::new("/run/user/1000/softverbs/softverbs.sock"))
        );
        assert!(a.len() > OWN_ADDRESS_TRIES as usize / 2);
        for ip in &a[1..] {
            let IpAddr::V4(v4) = ip else { panic!("{ip}") };
            let [x, y, _, z] = v4.octets();
            assert!(x == 127 && y != 0 && z != 0 && z != 255, "{ip}");
        }
        assert_ne!(a[1], b[1]);
        assert_ne!(a[1], c[1]);
    }
}
