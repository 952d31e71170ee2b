//! What a cluster is made of, by name, and where its state lives.
//!
//! Every object a cluster `NAME` creates is named from `NAME`, so that `down` (and `up`, after
//! a crash) finds all of them again even when the state file was never written: network
//! namespaces and hosts `NAME-1 .. NAME-N`, veths `NAME-v1 ..` on the bridge `NAME-br`,
//! daemons listening on `STATE/NAME-i/softverbs.sock`. The state directory
//! `/run/softverbs/cluster/NAME/` (tmpfs: a reboot, which also removes every namespace and
//! link, clears it) holds `state.json`, the sockets, the daemons' logs, `/etc/hosts` for the
//! hosts, hostfiles for Open MPI and MPICH and the remote-shell agent link.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::net;

/// Where every cluster's state directory is.
pub const ROOT: &str = "/run/softverbs/cluster";

/// The longest cluster name: `NAME-v99` must fit IFNAMSIZ (15 bytes and a NUL).
pub const MAX_NAME: usize = 10;

/// The most hosts a cluster has (two-digit host numbers keep link names short).
pub const MAX_HOSTS: usize = 99;

/// Checks a cluster name: a lowercase letter, then lowercase letters and digits.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = name.len() <= MAX_NAME
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "cluster name {name:?}: a lowercase letter, then letters and digits, at most {MAX_NAME} characters"
        ))
    }
}

/// One cluster, as named and numbered.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub name: String,
    /// The third octet of 198.18.x.0/24 (net.rs).
    pub subnet: u8,
    pub hosts: usize,
}

impl Cluster {
    pub fn dir_of(name: &str) -> PathBuf {
        Path::new(ROOT).join(name)
    }
    pub fn dir(&self) -> PathBuf {
        Self::dir_of(&self.name)
    }
    pub fn bridge_of(name: &str) -> String {
        format!("{name}-br")
    }
    pub fn bridge(&self) -> String {
        Self::bridge_of(&self.name)
    }
    /// Host `i`, numbered from 1.
    pub fn host(&self, i: usize) -> String {
        format!("{}-{i}", self.name)
    }
    pub fn veth(&self, i: usize) -> String {
        format!("{}-v{i}", self.name)
    }
    pub fn addr(&self, i: usize) -> Ipv4Addr {
        net::subnet_addr(self.subnet, i as u8)
    }
    pub fn bridge_addr(&self) -> Ipv4Addr {
        net::subnet_addr(self.subnet, net::BRIDGE_HOST)
    }
    /// Host `i`'s own directory: its daemon's socket and log.
    pub fn host_dir(&self, i: usize) -> PathBuf {
        self.dir().join(self.host(i))
    }
    pub fn socket(&self, i: usize) -> PathBuf {
        self.host_dir(i).join("softverbs.sock")
    }
    pub fn log(&self, i: usize) -> PathBuf {
        self.host_dir(i).join("daemon.log")
    }
    /// The directory that is, inside each host's mount namespace, that host's [`Self::host_dir`]
    /// (cluster/enter.rs). Commands on every host find their daemon at the same path, so a
    /// launcher that copies its environment to every rank (hydra does) still leaves each
    /// rank with its own host's daemon.
    pub fn this_host_dir(&self) -> PathBuf {
        self.dir().join("this-host")
    }
    pub fn this_host_socket(&self) -> PathBuf {
        self.this_host_dir().join("softverbs.sock")
    }
    /// The link through which launchers call `softverbs cluster exec` (main.rs: a binary
    /// invoked as `softverbs-rsh` is the agent), one path for Open MPI's `plm_rsh_agent` and
    /// hydra's `-launcher-exec`, which takes a path and no arguments.
    pub fn agent(&self) -> PathBuf {
        self.dir().join("softverbs-rsh")
    }
    pub fn hosts_file(&self) -> PathBuf {
        self.dir().join("hosts")
    }
    /// The number of host `name` in this cluster.
    pub fn host_index(&self, name: &str) -> Option<usize> {
        let i: usize = name
            .strip_prefix(&self.name)?
            .strip_prefix('-')?
            .parse()
            .ok()?;
        (1..=self.hosts).contains(&i).then_some(i)
    }

    pub fn to_json(&self) -> Value {
        json!({ "name": self.name, "subnet": self.subnet, "hosts": self.hosts })
    }

    pub fn save(&self) -> Result<(), String> {
        let dir = self.dir();
        shared_dir(&dir)?;
        let p = dir.join("state.json");
        std::fs::write(&p, self.to_json().to_string()).map_err(|e| format!("{}: {e}", p.display()))
    }

    /// The cluster whose state is in `ROOT/name`, if any.
    pub fn load(name: &str) -> Option<Cluster> {
        let text = std::fs::read_to_string(Self::dir_of(name).join("state.json")).ok()?;
        let v: Value = serde_json::from_str(&text).ok()?;
        Some(Cluster {
            name: v["name"].as_str()?.to_string(),
            subnet: u8::try_from(v["subnet"].as_u64()?).ok()?,
            hosts: usize::try_from(v["hosts"].as_u64()?).ok()?,
        })
    }

    /// Every cluster with a state directory.
    pub fn all() -> Vec<Cluster> {
        let Ok(dir) = std::fs::read_dir(ROOT) else {
            return Vec::new();
        };
        dir.filter_map(|e| Cluster::load(e.ok()?.file_name().to_str()?))
            .collect()
    }

    /// The cluster that has a host `host` (host names carry their cluster's name).
    pub fn of_host(host: &str) -> Option<(Cluster, usize)> {
        Cluster::all()
            .into_iter()
            .find_map(|c| c.host_index(host).map(|i| (c, i)))
    }

    /// A /24 no other cluster on this machine uses.
    pub fn free_subnet() -> Result<u8, String> {
        let used: Vec<u8> = Cluster::all().iter().map(|c| c.subnet).collect();
        (0..=255u8)
            .find(|s| !used.contains(s))
            .ok_or_else(|| "every 198.18.x.0/24 is taken by another cluster".to_string())
    }
}

/// Makes `dir` (0755: the cluster's host files and daemon sockets are for every user) or
/// checks it: it and its ancestors owned by root or this uid and writable by no one else
/// (private_dir.rs; docs/design/security.md, "Paths"), never an existing directory of another user
/// or a symlink.
pub fn shared_dir(dir: &Path) -> Result<(), String> {
    softverbs_ipc::private_dir::ensure(dir, 0o755, softverbs_ipc::private_dir::Owner::Me)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// An exclusive lock on [`ROOT`] (held while the returned file is open): `up` and `down` of
/// different clusters take turns, so subnets are chosen one at a time.
pub fn lock() -> Result<std::fs::File, String> {
    shared_dir(Path::new(ROOT))?;
    let p = Path::new(ROOT).join(".lock");
    let f = std::fs::File::create(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| format!("lock {}: {e}", p.display()))?;
    Ok(f)
}

/// Whether `name` is a host, veth or bridge of cluster `cluster`: `cluster-N`, `cluster-vN`,
/// `cluster-br`.
pub fn is_member(cluster: &str, name: &str) -> bool {
    let Some(rest) = name.strip_prefix(cluster).and_then(|r| r.strip_prefix('-')) else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    rest == "br" || digits(rest) || rest.strip_prefix('v').is_some_and(digits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_a_cluster_are_recognised_and_nothing_else() {
        assert!(is_member("sv5a", "sv5a-1"));
        assert!(is_member("sv5a", "sv5a-v12"));
        assert!(is_member("sv5a", "sv5a-br"));
        assert!(!is_member("sv5a", "sv5ab-1"));
        assert!(!is_member("sv5a", "sv5a-"));
        assert!(!is_member("sv5a", "sv5a-v"));
        assert!(!is_member("sv5a", "sv5a-x1"));
        assert!(!is_member("sv5", "sv5a-1"));
    }

    #[test]
    fn host_names_map_to_their_index_within_range() {
        let c = Cluster {
            name: "sv5a".into(),
            subnet: 3,
            hosts: 2,
        };
        assert_eq!(c.host_index("sv5a-1"), Some(1));
        assert_eq!(c.host_index("sv5a-2"), Some(2));
        assert_eq!(c.host_index("sv5a-3"), None);
        assert_eq!(c.host_index("sv5a-0"), None);
        assert_eq!(c.host_index("sv5-1"), None);
        assert_eq!(c.addr(2), Ipv4Addr::new(198, 18, 3, 2));
        assert!(check_name("sv5a").is_ok());
        assert!(check_name("5a").is_err());
        assert!(check_name("sv-a").is_err());
        assert!(check_name("abcdefghijk").is_err());
    }
}
