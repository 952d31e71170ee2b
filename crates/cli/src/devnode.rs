//! The device node UCX looks for: `/dev/infiniband/uverbsN`, in a private mount namespace.
//!
//! UCX 1.13 (`uct_ib_device_is_accessible`, src/uct/ib/base/ib_md.c) skips every verbs device
//! unless `"/dev/infiniband/" + ibv_device.dev_name` passes `stat()` as a character device and
//! `access(R_OK | W_OK)`; it never opens the node (docs/guide/mpi.md, "How UCX finds softverbs").
//! The drop-in names its devices `uverbsN` (crates/libibverbs/src/device.rs), so a program
//! started by `softverbs run` or `softverbs cluster exec` needs a character device at that
//! path. This module gives it one without touching the machine's `/dev`:
//!
//! 1. `unshare(CLONE_NEWNS)` — and, when not root, first `CLONE_NEWUSER` with the caller's own
//!    uid and gid mapped to themselves (user_namespaces(7): the creator holds every capability
//!    in the new namespace until it `execve`s a program as a non-zero uid, so the program runs
//!    with exactly the caller's rights);
//! 2. a fresh tmpfs holds one bind mount (or symlink copy) of every entry of the old `/dev`
//!    (nodes stay the originals: the bind keeps the devtmpfs mount, so they keep working);
//! 3. `infiniband/uverbsN` in it is a bind mount of `/dev/null` (a character device every
//!    user may read and write, which is all UCX checks);
//! 4. the tmpfs is moved onto `/dev` (`MS_MOVE`).
//!
//! Nothing outside the program's mount namespace changes, and nothing is left behind when it
//! exits. Where the node already exists (a real `/dev/infiniband`, a container started with
//! `--device /dev/null:/dev/infiniband/uverbs0`) nothing is done.

use std::ffi::OsStr;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};
use softverbs_ipc::private_dir;

/// Where UCX and rdma-core look for verbs device nodes.
const DEV_IB: &str = "/dev/infiniband";

/// What [`provide`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Provided {
    /// Every node was already there.
    AlreadyThere,
    /// The nodes exist in this process's new mount namespace.
    Private,
}

/// The node the drop-in's device `index` is looked up by.
pub fn node_path(index: u32) -> PathBuf {
    Path::new(DEV_IB).join(format!("uverbs{index}"))
}

/// Whether `p` passes UCX's test: a character device this process may read and write.
pub fn usable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.file_type().is_char_device())
        && rustix::fs::access(
            p,
            rustix::fs::Access::READ_OK | rustix::fs::Access::WRITE_OK,
        )
        .is_ok()
}

/// An empty mount point for a new tmpfs: a fresh directory (`private_dir::fresh`) in this
/// user's own directory (`private_dir::user_dir`), never a name in a shared `/tmp` that
/// another user could take first or plant (issue 35, item 2). Made before [`enter_private_mount_namespace`]:
/// inside a new user namespace root's directories show as the overflow uid (user_namespaces(7)),
/// so their ownership can no longer be checked. Removed when dropped.
pub struct Staging(PathBuf);

impl Staging {
    /// A new staging directory named `prefix-RANDOM`.
    pub fn new(prefix: &str) -> Result<Staging, String> {
        private_dir::user_dir()
            .and_then(|d| private_dir::fresh(&d, prefix))
            .map(Staging)
            .map_err(|e| format!("a staging directory: {e}"))
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // Empty again once its tmpfs has moved away (or was never mounted).
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Makes `/dev/infiniband/uverbs0 .. uverbs{count-1}` exist for this process and the programs
/// it `exec`s. Must run while the process has one thread (unshare(2): `CLONE_NEWUSER` and
/// `CLONE_NEWNS` fail with EINVAL in a process with threads).
/// With `in_private_namespace` the caller has already called [`enter_private_mount_namespace`].
/// `staging` is the mount point the new `/dev` is built on ([`Staging`]).
pub fn provide(
    count: u32,
    in_private_namespace: bool,
    staging: &Result<Staging, String>,
) -> Result<Provided, String> {
    if (0..count).all(|i| usable(&node_path(i))) {
        return Ok(Provided::AlreadyThere);
    }
    let staging = staging.as_ref().map_err(Clone::clone)?;
    if !in_private_namespace {
        enter_private_mount_namespace()?;
    }
    rebuild_dev(count, staging.path())?;
    Ok(Provided::Private)
}

/// `unshare` into a mount namespace of our own whose mounts do not propagate back.
pub fn enter_private_mount_namespace() -> Result<(), String> {
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    if uid == 0 {
        unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("unshare(CLONE_NEWNS): {e}"))?;
    } else {
        unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS).map_err(|e| {
            format!(
                "unshare(CLONE_NEWUSER|CLONE_NEWNS): {e} (unprivileged user namespaces are off: \
                 sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces, or create \
                 the node as root; docs/guide/mpi.md)"
            )
        })?;
        // user_namespaces(7): setgroups must be denied before an unprivileged gid_map write.
        let write = |file: &str, text: String| {
            std::fs::write(file, text).map_err(|e| format!("{file}: {e}"))
        };
        write("/proc/self/setgroups", "deny".into())?;
        write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
        write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    }
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("make / private: {e}"))
}

/// A new `/dev`: the old one's entries plus `infiniband/uverbsN` (see the module comment).
fn rebuild_dev(count: u32, staging: &Path) -> Result<(), String> {
    let result = populate(staging, count).and_then(|()| {
        mount(
            Some(staging),
            "/dev",
            None::<&str>,
            MsFlags::MS_MOVE,
            None::<&str>,
        )
        .map_err(|e| format!("move the new /dev into place: {e}"))
    });
    if result.is_err() {
        let _ = umount2(staging, MntFlags::MNT_DETACH);
    }
    result
}

fn populate(staging: &Path, count: u32) -> Result<(), String> {
    let err =
        |what: &str, p: &Path, e: &dyn std::fmt::Display| format!("{what} {}: {e}", p.display());
    mount(
        Some("softverbs-dev"),
        staging,
        Some("tmpfs"),
        MsFlags::MS_NOSUID,
        Some("mode=755"),
    )
    .map_err(|e| err("tmpfs on", staging, &e))?;
    let entries = std::fs::read_dir("/dev").map_err(|e| err("read", Path::new("/dev"), &e))?;
    for entry in entries {
        let entry = entry.map_err(|e| err("read", Path::new("/dev"), &e))?;
        let from = entry.path();
        let to = staging.join(entry.file_name());
        let Ok(meta) = std::fs::symlink_metadata(&from) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&from).map_err(|e| err("readlink", &from, &e))?;
            std::os::unix::fs::symlink(target, &to).map_err(|e| err("symlink", &to, &e))?;
            continue;
        }
        if meta.is_dir() {
            std::fs::create_dir(&to).map_err(|e| err("mkdir", &to, &e))?;
        } else {
            std::fs::File::create(&to).map_err(|e| err("create", &to, &e))?;
        }
        bind(&from, &to, meta.is_dir())?;
    }
    let ib = staging.join("infiniband");
    std::fs::create_dir_all(&ib).map_err(|e| err("mkdir", &ib, &e))?;
    // Entries a real /dev/infiniband already had were bound above, with it.
    for i in 0..count {
        let node = ib.join(format!("uverbs{i}"));
        if usable(&node) {
            continue;
        }
        std::fs::File::create(&node).map_err(|e| err("create", &node, &e))?;
        bind(Path::new("/dev/null"), &node, false)?;
    }
    Ok(())
}

/// Binds `from` onto `to` (recursively for directories, so /dev/pts, /dev/shm and /dev/mqueue
/// keep their own file systems).
fn bind(from: &Path, to: &Path, recursive: bool) -> Result<(), String> {
    let flags = if recursive {
        MsFlags::MS_BIND | MsFlags::MS_REC
    } else {
        MsFlags::MS_BIND
    };
    mount(Some(from), to, None::<&OsStr>, flags, None::<&str>)
        .map_err(|e| format!("bind {} on {}: {e}", from.display(), to.display()))
}
