//! Daemon configuration: the socket, the devices it offers, the ABI level it speaks and the
//! limits it holds clients to.

use std::net::IpAddr;
use std::path::PathBuf;

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
    /// Devices to offer; empty means one default device `softverbs0` on 127.0.0.1.
    pub devices: Vec<DeviceSpec>,
    /// ABI level to speak (older levels emulate an older daemon, for compatibility tests).
    pub abi_version: u32,
    /// The devices' network side (UDP binding, fault injection, capture).
    pub net: crate::datapath::NetOptions,
    /// What one context, one uid and the daemon may use (docs/limits.md).
    pub limits: Limits,
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
            },
            limits: Limits::for_budget(&host_budget()),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    /// The core devices this configuration describes. Node GUIDs are derived from the device
    /// index and the first address, so two daemons on different addresses differ.
    pub fn build_devices(&self) -> Vec<Device> {
        let specs = if self.devices.is_empty() {
            vec![DeviceSpec {
                name: "softverbs0".into(),
                ips: vec!["127.0.0.1".parse().expect("literal")],
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
                let mut dev =
                    Device::roce(&d.name, guid, &d.ips, crate::link_mtu::active_mtu(&d.ips));
                dev.attr.max_mcast_grp = dev.attr.max_mcast_grp.min(groups);
                dev
            })
            .collect()
    }
}

/// `max_mcast_grp` of each of `devices` devices: rxe's 8192, but no more than an eighth of
/// the daemon's descriptors over all devices, since a device holds one socket per group it
/// joined (`netdev.rs`) and groups must not starve the clients' connections (docs/limits.md).
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
