//! `softverbs run -- CMD` and `softverbs install --prefix DIR`: how unmodified verbs programs
//! meet the drop-in `libibverbs.so.1` (crates/libibverbs).
//!
//! `run` puts a directory holding `libibverbs.so.1` first on `LD_LIBRARY_PATH` (no bookworm
//! binary has an RPATH, so the loader takes ours before rdma-core's), makes sure a daemon
//! answers at the socket, tells the library where it is (`SOFTVERBS_SOCKET`) and which binary
//! may start another one (`SOFTVERBS_DAEMON_BIN`), then replaces itself with the program.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use softverbs_daemon::DeviceSpec;
use softverbs_ipc::private_dir::{self, Owner};

use crate::devnode;
use crate::sysfs_net::{self, DeviceNet};

/// The legacy XRC header users compile against.
const XRC_LEGACY_H: &str = include_str!("../../libibverbs/include/softverbs/xrc_legacy.h");

/// Where the drop-in library is, next to this executable: the cargo target directory
/// (`libibverbs.so`, or `deps/` when only the CLI was built), the Debian package's
/// `/usr/lib/<multiarch>/softverbs/libibverbs.so.1` (`../lib/<multiarch>/softverbs/` from
/// /usr/bin; the triplet is the target's, build.rs) or a `softverbs install` prefix
/// (`../lib/softverbs/libibverbs.so.1`). `$SOFTVERBS_LIBIBVERBS` names it explicitly.
pub fn find_library() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("SOFTVERBS_LIBIBVERBS") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "SOFTVERBS_LIBIBVERBS={}: no such file",
                p.display()
            ))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    for installed in installed_dirs(dir).map(|d| d.join("libibverbs.so.1")) {
        if installed.is_file() {
            return Ok(installed.canonicalize().unwrap_or(installed));
        }
    }
    // In a cargo target directory the library is uplifted next to the binary by builds of
    // its own package and left in deps/ by builds of the CLI: take the newer one.
    [dir.join("libibverbs.so"), dir.join("deps/libibverbs.so")]
        .into_iter()
        .filter_map(|p| {
            let t = std::fs::metadata(&p).and_then(|m| m.modified()).ok()?;
            Some((t, p))
        })
        .max()
        .map(|(_, p)| p.canonicalize().unwrap_or(p))
        .ok_or_else(|| {
            format!(
                "the drop-in libibverbs.so.1 is not next to {} (build it with `cargo build --release -p softverbs-libibverbs`, or set SOFTVERBS_LIBIBVERBS)",
                exe.display()
            )
        })
}

/// The directories an installed `softverbs` in `bin` keeps its drop-ins in, the Debian
/// package's first (docs/guide/install.md).
fn installed_dirs(bin: &Path) -> impl Iterator<Item = PathBuf> + '_ {
    [
        concat!("../lib/", env!("SOFTVERBS_MULTIARCH"), "/softverbs"),
        "../lib/softverbs",
    ]
    .into_iter()
    .map(move |d| bin.join(d))
}

/// The drop-in `librdmacm.so.1` (crates/librdmacm, docs/guide/dropin.md "librdmacm") that goes
/// with `libibverbs`: beside it when installed, else the newer of the target directory's
/// builds; `$SOFTVERBS_LIBRDMACM` names it explicitly. `None` if it was not built.
pub fn find_rdmacm(libibverbs: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SOFTVERBS_LIBRDMACM") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    let beside = libibverbs.with_file_name("librdmacm.so.1");
    if libibverbs
        .file_name()
        .is_some_and(|n| n == "libibverbs.so.1")
        && beside.is_file()
    {
        return Some(beside);
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join("librdmacm.so"), dir.join("deps/librdmacm.so")]
        .into_iter()
        .filter_map(|p| {
            let t = std::fs::metadata(&p).and_then(|m| m.modified()).ok()?;
            Some((t, p))
        })
        .max()
        .map(|(_, p)| p.canonicalize().unwrap_or(p))
}

/// Points `name` in the directory open at `dir` (reached as `path`) at `target`, replaced
/// atomically (rename(2)), through the descriptor so no other directory is written.
fn link_into(dir: &OwnedFd, path: &Path, name: &str, target: &Path) -> Result<(), String> {
    use rustix::fs::{readlinkat, renameat, symlinkat, unlinkat, AtFlags};
    if readlinkat(dir, name, Vec::new())
        .is_ok_and(|t| t.as_bytes() == target.as_os_str().as_bytes())
    {
        return Ok(());
    }
    let tmp = format!(".{name}.{}", std::process::id());
    let _ = unlinkat(dir, tmp.as_str(), AtFlags::empty());
    let at = |n: &str| path.join(n).display().to_string();
    symlinkat(target, dir, tmp.as_str()).map_err(|e| format!("{}: {e}", at(&tmp)))?;
    renameat(dir, tmp.as_str(), dir, name).map_err(|e| format!("{}: {e}", at(name)))
}

/// A directory whose `libibverbs.so.1` is `lib`: the library's own directory when it already
/// has that name, else a directory of this user's own ([`private_dir::user_dir`]) with a
/// symlink (replaced atomically). The directory is named after the libraries it points to, so
/// that two builds run by one user at the same time (two checkouts, two versions) never
/// repoint each other's programs: with one shared directory a program could load the other
/// build's libraries.
///
/// Its path goes first on the program's `LD_LIBRARY_PATH`, so it and every ancestor must be
/// beyond other users' reach (private_dir.rs): otherwise one could swap the library between
/// this check and the program's loader (issue 35, item 2; docs/design/security.md, "Paths").
pub fn loader_dir(lib: &Path) -> Result<PathBuf, String> {
    if lib.file_name().is_some_and(|n| n == "libibverbs.so.1") {
        return Ok(lib.parent().unwrap_or(Path::new(".")).to_path_buf());
    }
    let base = private_dir::user_dir().map_err(|e| e.to_string())?;
    loader_dir_in(&base, lib, find_rdmacm(lib))
}

/// [`loader_dir`] under `base`, for `lib` and the librdmacm that goes with it.
fn loader_dir_in(base: &Path, lib: &Path, rdmacm: Option<PathBuf>) -> Result<PathBuf, String> {
    let dir = base.join("lib").join(build_key(lib, rdmacm.as_deref()));
    let fd = private_dir::ensure(&dir, 0o700, Owner::Me).map_err(|e| e.to_string())?;
    if let Some(cm) = rdmacm {
        link_into(&fd, &dir, "librdmacm.so.1", &cm)?;
    }
    link_into(&fd, &dir, "libibverbs.so.1", lib)?;
    Ok(dir)
}

/// A name for the pair of libraries a loader directory points to: FNV-1a (64 bits) of their
/// paths, stable across runs and Rust versions.
fn build_key(lib: &Path, rdmacm: Option<&Path>) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    eat(lib.as_os_str().as_bytes());
    eat(&[0]);
    if let Some(cm) = rdmacm {
        eat(cm.as_os_str().as_bytes());
    }
    format!("{h:016x}")
}

/// `NAME=IP[,IP...]`, as `--device` takes it.
fn device_arg(d: &DeviceSpec) -> String {
    let ips: Vec<String> = d.ips.iter().map(ToString::to_string).collect();
    format!("{}={}", d.name, ips.join(","))
}

/// The socket of `softverbs run --device ...`: `explicit` (`--socket`), else one of this
/// user's own directory named after the devices ([`build_key`] of their specs), so every run
/// with the same devices shares one daemon and runs with other devices get another.
pub fn device_socket(explicit: Option<&Path>, devices: &[DeviceSpec]) -> Result<PathBuf, String> {
    if let Some(s) = explicit {
        return Ok(s.to_path_buf());
    }
    let specs: Vec<String> = devices.iter().map(device_arg).collect();
    let key = build_key(Path::new(&specs.join(" ")), None);
    let base = private_dir::user_dir().map_err(|e| e.to_string())?;
    Ok(base.join(format!("devices-{key}")).join("softverbs.sock"))
}

/// Whether the daemon behind `introspect` offers every one of `devices` with its addresses;
/// if not, what it offers instead.
fn offers(introspect: &softverbs::Introspect, devices: &[DeviceSpec]) -> Result<(), String> {
    let rows = introspect
        .resources_json()
        .ok()
        .and_then(|t| serde_json::from_str::<softverbs_core::resources::Resources>(&t).ok())
        .map(|r| r.devices)
        .ok_or("the daemon did not say which devices it offers")?;
    for want in devices {
        let found = rows.iter().any(|r| {
            r.name == want.name
                && r.ports
                    .first()
                    .is_some_and(|p| want.ips.iter().all(|ip| p.addrs.contains(ip)))
        });
        if !found {
            let have: Vec<String> = rows
                .iter()
                .map(|r| {
                    let addrs: Vec<String> = r
                        .ports
                        .first()
                        .map(|p| p.addrs.iter().map(ToString::to_string).collect())
                        .unwrap_or_default();
                    format!("{}={}", r.name, addrs.join(","))
                })
                .collect();
            return Err(format!(
                "the daemon already serving this socket offers {}, not {} (stop it, or give \
                 another --socket)",
                have.join(" "),
                device_arg(want)
            ));
        }
    }
    Ok(())
}

/// `softverbs run [--device ...] -- CMD ARGS…`: returns only if the program could not be
/// started. With `devices`, a daemon this starts offers them, and one already answering must.
pub fn run(socket: &Path, named: &[DeviceSpec], cmd: &[OsString]) -> ExitCode {
    let fail = |e: String| {
        eprintln!("softverbs run: {e}");
        ExitCode::from(127)
    };
    let Some((prog, args)) = cmd.split_first() else {
        return fail("nothing to run (softverbs run -- PROGRAM [ARGS...])".into());
    };
    let lib = match find_library() {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let dir = match loader_dir(&lib) {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("softverbs"));
    // Start the daemon now (the client library's autostart), so its start-up is not charged
    // to the program's first verbs call and a failure is reported here, clearly.
    let daemon_args: Vec<OsString> = named
        .iter()
        .flat_map(|d| ["--device".into(), device_arg(d).into()])
        .collect();
    let introspect = match crate::autostart::connect_starting(socket, &daemon_args) {
        Ok(i) => i,
        Err(e) => return fail(e),
    };
    if let Err(e) = offers(&introspect, named) {
        return fail(e);
    }
    let devices = match introspect.devices() {
        Ok(d) => d.len() as u32,
        Err(e) => return fail(format!("devices: {e}")),
    };
    // The netdev of each device, for sysfs_net.rs (a daemon that cannot say has none).
    let nets = introspect
        .resources_json()
        .ok()
        .and_then(|t| serde_json::from_str::<softverbs_core::resources::Resources>(&t).ok())
        .map(|r| sysfs_net::device_nets(&r.devices))
        .unwrap_or_default();
    drop(introspect);
    let mut path = OsString::from(dir.as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
        path.push(":");
        path.push(old);
    }
    // UCX needs a device node (devnode.rs), RDMA-CM programs the device's netdev in sysfs
    // (sysfs_net.rs). Making them takes a single-threaded process, and this one may have
    // started a daemon (and a thread reaping it): a fresh image of this binary makes them and
    // then execs the program.
    // `SOFTVERBS_DEVICE_NODES=0` leaves the program in this mount namespace (no UCX then).
    let skip_nodes = std::env::var_os("SOFTVERBS_DEVICE_NODES").is_some_and(|v| v == "0");
    let have_all =
        (0..devices).all(|i| devnode::usable(&devnode::node_path(i))) && sysfs_net::present(&nets);
    let mut cmd = if skip_nodes || have_all {
        let mut c = Command::new(prog);
        c.args(args);
        c
    } else {
        let mut c = Command::new(&exe);
        c.arg("with-device-nodes").arg(devices.to_string());
        for n in &nets {
            c.arg("--net").arg(n.arg());
        }
        c.arg("--").arg(prog).args(args);
        c
    };
    cmd.env("LD_LIBRARY_PATH", path)
        .env("SOFTVERBS_SOCKET", socket)
        .env("SOFTVERBS_DAEMON_BIN", &exe);
    // A daemon the program's library starts again (after this one's idle exit) offers the
    // same devices.
    if !named.is_empty() {
        let specs: Vec<String> = named.iter().map(device_arg).collect();
        cmd.env("SOFTVERBS_DEVICES", specs.join(" "));
    }
    let err = cmd.exec();
    fail(format!("{}: {err}", prog.to_string_lossy()))
}

/// `softverbs with-device-nodes COUNT PROGRAM ARGS...` (from [`run`]): makes the device nodes
/// in a mount namespace of this process, then execs the program. Without them the program
/// still runs (only UCX needs them), after a warning that says why and what to do.
pub fn with_device_nodes(count: u32, nets: &[String], cmd: &[OsString]) -> ExitCode {
    let Some((prog, args)) = cmd.split_first() else {
        eprintln!("softverbs run: nothing to run");
        return ExitCode::from(127);
    };
    let nets: Vec<DeviceNet> = match nets.iter().map(|n| DeviceNet::parse(n)).collect() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("softverbs run: {e}");
            return ExitCode::from(127);
        }
    };
    let nodes = (0..count).all(|i| devnode::usable(&devnode::node_path(i)));
    let have_nets = sysfs_net::present(&nets);
    // Mount points are made before the namespace is entered (devnode::Staging says why).
    let stage = |have: bool, prefix: &str| match have {
        true => Err("not needed".to_string()),
        false => devnode::Staging::new(prefix),
    };
    let dev_staging = stage(nodes, "dev");
    let sys_staging = stage(have_nets, "sysclass");
    let private = if nodes && have_nets {
        Ok(())
    } else {
        devnode::enter_private_mount_namespace()
    };
    // Never mount anything outside a private namespace.
    let in_private = private.is_ok();
    if let Err(e) = private.and_then(|()| devnode::provide(count, true, &dev_staging)) {
        eprintln!(
            "softverbs run: warning: no {} for UCX: {e}",
            devnode::node_path(0).display()
        );
    }
    if in_private {
        if let Err(e) = sysfs_net::provide(&nets, &sys_staging) {
            // Only programs that look for the device's netdev in sysfs need it.
            eprintln!("softverbs run: warning: no /sys/class/infiniband/DEVICE/device/net: {e}");
        }
    }
    drop((dev_staging, sys_staging));
    let err = Command::new(prog).args(args).exec();
    eprintln!("softverbs run: {}: {err}", prog.to_string_lossy());
    ExitCode::from(127)
}

/// `softverbs install --prefix DIR`: bin/softverbs, lib/softverbs/libibverbs.so.1 (and
/// librdmacm.so.1 when built) and include/softverbs/xrc_legacy.h.
pub fn install(prefix: &Path) -> Result<(), String> {
    let lib = find_library()?;
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let put = |from: Option<&Path>, text: Option<&str>, to: PathBuf, mode: u32| {
        use std::os::unix::fs::PermissionsExt;
        if let Some(d) = to.parent() {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        // Write beside and rename, so a running program never sees a half-written file.
        let tmp = to.with_extension("softverbs-new");
        match (from, text) {
            (Some(f), _) => std::fs::copy(f, &tmp).map(|_| ()),
            (None, Some(t)) => std::fs::write(&tmp, t),
            (None, None) => Ok(()),
        }
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &to).map_err(|e| format!("{}: {e}", to.display()))?;
        outln!("installed {}", to.display());
        Ok::<(), String>(())
    };
    put(Some(&exe), None, prefix.join("bin/softverbs"), 0o755)?;
    put(
        Some(&lib),
        None,
        prefix.join("lib/softverbs/libibverbs.so.1"),
        0o755,
    )?;
    if let Some(cm) = find_rdmacm(&lib) {
        put(
            Some(&cm),
            None,
            prefix.join("lib/softverbs/librdmacm.so.1"),
            0o755,
        )?;
    }
    put(
        None,
        Some(XRC_LEGACY_H),
        prefix.join("include/softverbs/xrc_legacy.h"),
        0o644,
    )?;
    outln!(
        "run programs with `{} run -- PROGRAM`, or LD_LIBRARY_PATH={}",
        prefix.join("bin/softverbs").display(),
        prefix.join("lib/softverbs").display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two builds' programs started by one user at the same time each load their own
    /// build's libraries (a shared directory was repointed by whichever started last).
    #[test]
    fn two_builds_get_separate_loader_dirs() {
        let base = std::env::temp_dir().join(format!("sv3-loader-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let builds: Vec<(PathBuf, PathBuf)> = ["a", "b"]
            .iter()
            .map(|b| {
                (
                    PathBuf::from(format!("/builds/{b}/libibverbs.so")),
                    PathBuf::from(format!("/builds/{b}/librdmacm.so")),
                )
            })
            .collect();
        let dirs: Vec<PathBuf> = builds
            .iter()
            .map(|(lib, cm)| loader_dir_in(&base, lib, Some(cm.clone())).unwrap())
            .collect();
        assert_ne!(dirs[0], dirs[1]);
        for ((lib, cm), dir) in builds.iter().zip(&dirs) {
            assert_eq!(
                &std::fs::read_link(dir.join("libibverbs.so.1")).unwrap(),
                lib
            );
            assert_eq!(&std::fs::read_link(dir.join("librdmacm.so.1")).unwrap(), cm);
        }
        // The same build again finds its directory as it left it.
        let again = loader_dir_in(&base, &builds[0].0, Some(builds[0].1.clone())).unwrap();
        assert_eq!(again, dirs[0]);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
