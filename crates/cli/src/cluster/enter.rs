//! `cluster exec`'s last step: become a process of a host and exec the command.
//!
//! A host is its network namespace plus what this process makes for itself before `execve`:
//! a mount namespace with the UCX device node (devnode.rs), the hosts' `/etc/hosts` (so host
//! names resolve on every host, as a launcher's hostfile needs) and a sysfs that shows the
//! host's own interfaces (as `ip netns exec` remounts it: UCX and hwloc read
//! /sys/class/net), and a UTS namespace whose host name is the host's (so launchers recognise
//! their own host, and UCX's machine id, which hashes the host name, tells hosts apart), and
//! the host's daemon directory at the one path every host uses (state.rs, `this_host_dir`).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::Path;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};

use super::agent::{self, Command as What};
use super::state::Cluster;
use crate::{devnode, dropin};

/// Execs `what` on host `i` of `c`; returns only on failure.
pub fn exec(c: &Cluster, i: usize, what: What, ssh_like: bool) -> String {
    match prepare(c, i) {
        Ok(env) => {
            let mut cmd = match what {
                What::Argv(argv) => {
                    let mut cmd = std::process::Command::new(&argv[0]);
                    cmd.args(&argv[1..]);
                    cmd
                }
                What::Shell(line) => {
                    let mut cmd = std::process::Command::new("/bin/sh");
                    cmd.arg("-c").arg(line);
                    cmd
                }
                What::Login => {
                    let shell = std::env::var_os("SHELL").unwrap_or_else(|| "/bin/sh".into());
                    std::process::Command::new(shell)
                }
            };
            if ssh_like {
                cmd.env_clear();
                cmd.envs(std::env::vars_os().filter(|(k, _)| agent::kept_variable(k)));
            }
            cmd.envs(env);
            let e = cmd.exec();
            format!("exec on {}: {e}", c.host(i))
        }
        Err(e) => e,
    }
}

/// Enters host `i`'s namespaces and returns the environment for the command.
fn prepare(c: &Cluster, i: usize) -> Result<Vec<(String, OsString)>, String> {
    let host = c.host(i);
    let lib = dropin::find_library()?;
    let libdir = dropin::loader_dir(&lib)?;
    let ns_path = Path::new("/run/netns").join(&host);
    let ns = std::fs::File::open(&ns_path).map_err(|e| {
        format!(
            "{}: {e} (the cluster is broken: `softverbs cluster down --name {}`)",
            ns_path.display(),
            c.name
        )
    })?;
    setns(&ns, CloneFlags::CLONE_NEWNET).map_err(|e| format!("setns {host}: {e}"))?;
    let staging = devnode::Staging::new("dev");
    devnode::enter_private_mount_namespace()?;
    unshare(CloneFlags::CLONE_NEWUTS).map_err(|e| format!("unshare(CLONE_NEWUTS): {e}"))?;
    nix::unistd::sethostname(&host).map_err(|e| format!("sethostname {host}: {e}"))?;
    // A sysfs mounted from inside the namespace lists that namespace's interfaces.
    if umount2("/sys", MntFlags::MNT_DETACH).is_ok() {
        mount(
            Some("sysfs"),
            "/sys",
            Some("sysfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None::<&str>,
        )
        .map_err(|e| format!("mount sysfs for {host}: {e}"))?;
    }
    mount(
        Some(&c.hosts_file()),
        "/etc/hosts",
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| format!("bind {} on /etc/hosts: {e}", c.hosts_file().display()))?;
    mount(
        Some(&c.host_dir(i)),
        &c.this_host_dir(),
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| {
        format!(
            "bind {} on {}: {e}",
            c.host_dir(i).display(),
            c.this_host_dir().display()
        )
    })?;
    devnode::provide(1, true, &staging)?;
    drop(staging);
    let mut path = OsString::from(libdir.as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
        path.push(":");
        path.push(old);
    }
    Ok(vec![
        ("LD_LIBRARY_PATH".into(), path),
        ("SOFTVERBS_SOCKET".into(), c.this_host_socket().into()),
        // The host's daemon or none: a client must not quietly start one of its own.
        ("SOFTVERBS_AUTOSTART".into(), "0".into()),
    ])
}
