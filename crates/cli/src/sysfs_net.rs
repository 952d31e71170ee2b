//! The sysfs link from a RoCE device to its network interface:
//! `/sys/class/infiniband/<dev>/device/net/<ifname>`, in a private mount namespace.
//!
//! On Linux a RoCE device's GIDs come from the IP addresses of the netdev it sits on, and
//! sysfs shows that netdev under the device's parent (`device/net/<ifname>`). Programs that
//! want the device's IP address read it there: rdma-core's test suite (tests/base.py,
//! `_get_ip_mac`: `ls /sys/class/infiniband/<dev>/device/net/`, then `ip -j addr show
//! <ifname>`) skips every RDMA-CM test with "Device <dev> doesn't have net interface"
//! without it. A softverbs device's port addresses are IP addresses of this host, so the
//! interface holding its first address is exactly what the kernel would show there.
//!
//! As devnode.rs does for `/dev`, this module builds a new `/sys/class` for the program only:
//! a tmpfs holding a bind mount (or symlink copy) of every entry of the old one, plus
//! `infiniband/<dev>/device/net/<ifname>`, a symlink to `/sys/class/net/<ifname>` (the
//! netdev's own sysfs directory), moved onto `/sys/class` (`MS_MOVE`). A device that already
//! has an entry (real RDMA hardware, a host that made one) is left as it is.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use softverbs_core::resources::DeviceRow;

use crate::devnode::Staging;

const SYS_CLASS: &str = "/sys/class";

/// One device and the interface holding its first address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceNet {
    pub device: String,
    pub ifname: String,
}

impl DeviceNet {
    /// `DEV=IFNAME`, as `softverbs with-device-nodes --net` takes it.
    pub fn parse(s: &str) -> Result<DeviceNet, String> {
        match s.split_once('=') {
            Some((d, i)) if valid_name(d) && valid_name(i) => Ok(DeviceNet {
                device: d.into(),
                ifname: i.into(),
            }),
            _ => Err(format!("--net {s}: expected DEVICE=IFNAME")),
        }
    }

    pub fn arg(&self) -> String {
        format!("{}={}", self.device, self.ifname)
    }

    fn dir(&self) -> PathBuf {
        Path::new(SYS_CLASS)
            .join("infiniband")
            .join(&self.device)
            .join("device/net")
    }
}

/// A name that is one path component.
fn valid_name(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('\0')
}

/// For each device whose first port address is held by an interface of this host, that
/// interface (getifaddrs(3)). Devices whose addresses no interface holds get no entry: there
/// is no interface to show.
pub fn device_nets(devices: &[DeviceRow]) -> Vec<DeviceNet> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut holder: BTreeMap<IpAddr, String> = BTreeMap::new();
    for a in addrs {
        let Some(sa) = a.address else { continue };
        let ip = if let Some(v4) = sa.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = sa.as_sockaddr_in6() {
            IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        holder.entry(ip).or_insert(a.interface_name);
    }
    devices
        .iter()
        .filter_map(|d| {
            let ip = d.ports.first()?.addrs.first()?;
            let ifname = holder.get(ip)?;
            Some(DeviceNet {
                device: d.name.clone(),
                ifname: ifname.clone(),
            })
        })
        .filter(|n| valid_name(&n.device) && valid_name(&n.ifname))
        .collect()
}

/// Whether every device already shows a net interface.
pub fn present(nets: &[DeviceNet]) -> bool {
    nets.iter().all(|n| n.dir().is_dir())
}

/// Makes the entries of `nets` exist, in this process's mount namespace, which must be a
/// private one already (devnode::enter_private_mount_namespace).
/// `staging` is the mount point the new class directory is built on (devnode::Staging).
pub fn provide(nets: &[DeviceNet], staging: &Result<Staging, String>) -> Result<(), String> {
    if present(nets) {
        return Ok(());
    }
    let staging = staging.as_ref().map_err(Clone::clone)?.path();
    let result = populate(staging, nets).and_then(|()| {
        mount(
            Some(staging),
            SYS_CLASS,
            None::<&str>,
            MsFlags::MS_MOVE,
            None::<&str>,
        )
        .map_err(|e| format!("move the new {SYS_CLASS} into place: {e}"))
    });
    if result.is_err() {
        let _ = umount2(staging, MntFlags::MNT_DETACH);
    }
    result
}

fn populate(staging: &Path, nets: &[DeviceNet]) -> Result<(), String> {
    mount(
        Some("softverbs-sysclass"),
        staging,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=755"),
    )
    .map_err(|e| format!("tmpfs on {}: {e}", staging.display()))?;
    let old_ib = Path::new(SYS_CLASS).join("infiniband");
    mirror(Path::new(SYS_CLASS), staging, |name| name == "infiniband")?;
    let ib = staging.join("infiniband");
    std::fs::create_dir_all(&ib).map_err(|e| format!("mkdir {}: {e}", ib.display()))?;
    if old_ib.is_dir() {
        mirror(&old_ib, &ib, |_| false)?;
    }
    for n in nets {
        let dev = ib.join(&n.device);
        if std::fs::symlink_metadata(&dev).is_ok() {
            // A real device of that name: its sysfs is the truth.
            continue;
        }
        let net = dev.join("device/net");
        std::fs::create_dir_all(&net).map_err(|e| format!("mkdir {}: {e}", net.display()))?;
        let link = net.join(&n.ifname);
        let target = Path::new(SYS_CLASS).join("net").join(&n.ifname);
        std::os::unix::fs::symlink(&target, &link)
            .map_err(|e| format!("symlink {}: {e}", link.display()))?;
    }
    Ok(())
}

/// Every entry of `from` appears in `to`: symlinks copied (sysfs' class links are relative
/// to `/sys/class/<class>`, which they stay under), directories and files bind-mounted.
fn mirror(from: &Path, to: &Path, skip: impl Fn(&OsStr) -> bool) -> Result<(), String> {
    let err =
        |what: &str, p: &Path, e: &dyn std::fmt::Display| format!("{what} {}: {e}", p.display());
    for entry in std::fs::read_dir(from).map_err(|e| err("read", from, &e))? {
        let entry = entry.map_err(|e| err("read", from, &e))?;
        if skip(&entry.file_name()) {
            continue;
        }
        let src = entry.path();
        let dst = to.join(entry.file_name());
        let Ok(meta) = std::fs::symlink_metadata(&src) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&src).map_err(|e| err("readlink", &src, &e))?;
            std::os::unix::fs::symlink(target, &dst).map_err(|e| err("symlink", &dst, &e))?;
            continue;
        }
        if meta.is_dir() {
            std::fs::create_dir(&dst).map_err(|e| err("mkdir", &dst, &e))?;
        } else {
            std::fs::File::create(&dst).map_err(|e| err("create", &dst, &e))?;
        }
        let flags = if meta.is_dir() {
            MsFlags::MS_BIND | MsFlags::MS_REC
        } else {
            MsFlags::MS_BIND
        };
        mount(Some(&src), &dst, None::<&OsStr>, flags, None::<&str>)
            .map_err(|e| format!("bind {} on {}: {e}", src.display(), dst.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_equals_ifname() {
        assert_eq!(
            DeviceNet::parse("softverbs0=lo").unwrap(),
            DeviceNet {
                device: "softverbs0".into(),
                ifname: "lo".into()
            }
        );
        assert!(DeviceNet::parse("softverbs0").is_err());
        assert!(DeviceNet::parse("a=../x").is_err());
        assert!(DeviceNet::parse("=lo").is_err());
    }
}
