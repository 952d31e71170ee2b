//! Issue 35, items 2 and 9 (docs/design/security.md, "Paths"): no directory another user can change
//! ends up on a program's library path, and a daemon never opens its lock or capture files
//! through a symlink or in a directory others can write.
//!
//! `softverbs run` cases: the library path the program starts with is either refused or names
//! a directory that it and every ancestor keep beyond other users' reach (owned by root or us,
//! not writable by group or others unless sticky, no symlink), and its `libibverbs.so.1` is
//! this build's. Cases needing another uid (chown, a process of uid 65534) run as root only.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use softverbs_testkit::Daemon;

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");
/// A uid other than ours, for the hostile user.
const OTHER: u32 = 65534;

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A directory of the test's own (0755) in the system's temporary directory.
fn dir(name: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("svpaths-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    chmod(&d, 0o755);
    Dir(d)
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn root() -> bool {
    rustix::process::geteuid().is_root()
}

fn chown(p: &Path, uid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(uid)).unwrap();
}

/// `softverbs run` against `daemon` with `env`, the program printing the library directory
/// it was given and the library the loader would take from it.
fn run(daemon: &Daemon, env: &[(&str, &Path)], remove: &[&str]) -> Output {
    let mut c = Command::new(BIN);
    c.arg("--socket")
        .arg(&daemon.socket)
        .args(["run", "--", "sh", "-c"])
        .arg(r#"d="${LD_LIBRARY_PATH%%:*}"; printf '%s\n%s\n' "$d" "$(readlink -f "$d/libibverbs.so.1")""#)
        .env("SOFTVERBS_DEVICE_NODES", "0")
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("SOFTVERBS_LIBIBVERBS");
    for k in remove {
        c.env_remove(k);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// The library this build's `softverbs run` should hand out.
fn our_library() -> PathBuf {
    let exe = Path::new(BIN).parent().unwrap();
    [exe.join("libibverbs.so"), exe.join("deps/libibverbs.so")]
        .into_iter()
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p.canonicalize().unwrap())
        .expect("the drop-in library is built")
}

/// Whether no user but us and root can change what `dir` names: no symlink on the way, every
/// ancestor owned by root or us and not writable by others unless sticky, `dir` ours and
/// writable by no one else.
fn beyond_others(dir: &Path) -> Result<(), String> {
    let me = rustix::process::geteuid().as_raw();
    let mut at = PathBuf::from("/");
    let parts: Vec<_> = dir.components().skip(1).collect();
    for (i, c) in parts.iter().enumerate() {
        at.push(c);
        let m = std::fs::symlink_metadata(&at).map_err(|e| format!("{}: {e}", at.display()))?;
        let last = i + 1 == parts.len();
        if m.file_type().is_symlink() {
            return Err(format!("{} is a symlink", at.display()));
        }
        if m.uid() != me && (last || m.uid() != 0) {
            return Err(format!("{} is owned by uid {}", at.display(), m.uid()));
        }
        if m.mode() & 0o022 != 0 && (last || m.mode() & 0o1000 == 0) {
            return Err(format!("{} has mode {:o}", at.display(), m.mode()));
        }
    }
    Ok(())
}

/// `softverbs run` either refused, or gave the program a directory beyond other users' reach
/// holding this build's library.
fn assert_private_or_refused(o: &Output, case: &str) {
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    if !o.status.success() {
        assert!(
            err.contains("refusing"),
            "{case}: failed, but not with a refusal: {err}"
        );
        return;
    }
    let mut lines = out.lines();
    let libdir = PathBuf::from(lines.next().unwrap_or_default());
    let loaded = PathBuf::from(lines.next().unwrap_or_default());
    assert_eq!(
        loaded,
        our_library(),
        "{case}: a foreign libibverbs.so.1 in {}",
        libdir.display()
    );
    if let Err(e) = beyond_others(&libdir) {
        panic!(
            "{case}: the program's library directory {} is not the user's alone: {e}",
            libdir.display()
        );
    }
}

/// `$XDG_RUNTIME_DIR/softverbs` planted as a symlink to a directory others can write: the
/// library path never goes through it (it was followed).
#[test]
fn run_refuses_a_symlinked_directory_on_the_library_path() {
    let d = Daemon::start("paths-symlink");
    let t = dir("symlink");
    let xdg = t.0.join("xdg");
    let elsewhere = t.0.join("elsewhere");
    std::fs::create_dir(&xdg).unwrap();
    chmod(&xdg, 0o700);
    std::fs::create_dir(&elsewhere).unwrap();
    chmod(&elsewhere, 0o777);
    std::os::unix::fs::symlink(&elsewhere, xdg.join("softverbs")).unwrap();
    let o = run(&d, &[("XDG_RUNTIME_DIR", &xdg)], &[]);
    assert_private_or_refused(&o, "symlinked $XDG_RUNTIME_DIR/softverbs");
    assert!(
        std::fs::read_dir(&elsewhere).unwrap().next().is_none(),
        "something was made in the symlink's target"
    );
}

/// A group- and other-writable directory on the way (taken as it was).
#[test]
fn run_refuses_a_group_writable_directory_on_the_library_path() {
    let d = Daemon::start("paths-gw");
    let t = dir("gw");
    let xdg = t.0.join("xdg");
    std::fs::create_dir_all(xdg.join("softverbs/lib")).unwrap();
    chmod(&xdg, 0o700);
    chmod(&xdg.join("softverbs"), 0o700);
    chmod(&xdg.join("softverbs/lib"), 0o777);
    let o = run(&d, &[("XDG_RUNTIME_DIR", &xdg)], &[]);
    assert_private_or_refused(&o, "group-writable $XDG_RUNTIME_DIR/softverbs/lib");
}

/// A directory of another uid on the way (accepted by `create_dir_all`), and an
/// `XDG_RUNTIME_DIR` of another uid (what `sudo` often leaves): refused or not used.
#[test]
fn run_never_uses_a_directory_of_another_uid() {
    if !root() {
        eprintln!("skipped: needs root to make a directory of another uid");
        return;
    }
    let d = Daemon::start("paths-foreign");
    let t = dir("foreign");
    let xdg = t.0.join("xdg");
    std::fs::create_dir_all(xdg.join("softverbs")).unwrap();
    chmod(&xdg, 0o700);
    chown(&xdg.join("softverbs"), OTHER);
    let o = run(&d, &[("XDG_RUNTIME_DIR", &xdg)], &[]);
    assert_private_or_refused(&o, "$XDG_RUNTIME_DIR/softverbs of another uid");

    let theirs = t.0.join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    chmod(&theirs, 0o700);
    chown(&theirs, OTHER);
    let o = run(&d, &[("XDG_RUNTIME_DIR", &theirs)], &[]);
    assert_private_or_refused(&o, "$XDG_RUNTIME_DIR of another uid");
}

/// Root without `XDG_RUNTIME_DIR` (sudo, cron, CI) and a shared temporary directory in which
/// another user owns `softverbs-0` and keeps swapping the tree below it for one whose
/// `libibverbs.so.1` is theirs (issue 35, item 2): no run may hand the program their library.
#[test]
fn run_as_root_is_not_raced_into_a_foreign_library() {
    if !root() {
        eprintln!("skipped: needs root (the attack is on root's runs)");
        return;
    }
    let d = Daemon::start("paths-race");
    let t = dir("race");
    let shared = t.0.join("tmp");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o1777);
    let evil = t.0.join("evil.so");
    std::fs::write(&evil, b"not a library").unwrap();
    let base = shared.join("softverbs-0");
    std::fs::create_dir(&base).unwrap();
    chmod(&base, 0o777);
    chown(&base, OTHER);
    // The attacker: for every loader directory root made, a copy of the tree whose link is
    // theirs, renamed over root's tree again and again.
    let script = format!(
        r#"cd '{base}' || exit 1
while :; do
  for k in $(ls softverbs/lib 2>/dev/null); do
    mkdir -p "evil/lib/$k" && ln -sfn '{evil}' "evil/lib/$k/libibverbs.so.1"
  done
  if [ -d evil ]; then mv -T softverbs "gone.$$" 2>/dev/null; mv -T evil softverbs; rm -rf "gone.$$"; fi
done"#,
        base = base.display(),
        evil = evil.display()
    );
    let mut attacker: Child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .uid(OTHER)
        .gid(OTHER)
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Every run first, then the verdict: whether the attacker's library was ever handed out
    // (the exploit) is reported before whether the directory was theirs (what allows it).
    let runs: Vec<Output> = (0..RACE_RUNS)
        .map(|_| {
            run(
                &d,
                &[("TMPDIR", &shared)],
                &["XDG_RUNTIME_DIR", "SOFTVERBS_LIBRDMACM"],
            )
        })
        .collect();
    let pgid = rustix::process::Pid::from_raw(attacker.id() as i32).unwrap();
    let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
    let _ = attacker.wait();
    let ours = our_library();
    let foreign = runs
        .iter()
        .filter(|o| o.status.success())
        .filter(|o| {
            String::from_utf8_lossy(&o.stdout).lines().nth(1) != Some(&*ours.to_string_lossy())
        })
        .count();
    assert_eq!(
        foreign, 0,
        "{foreign} of {RACE_RUNS} runs were handed the attacker's library"
    );
    for (i, o) in runs.iter().enumerate() {
        assert_private_or_refused(o, &format!("run {i} against a swapping attacker"));
    }
    let refusals = runs.iter().filter(|o| !o.status.success()).count();
    eprintln!("{refusals} of {RACE_RUNS} runs refused");
}

/// Runs of `softverbs run` against the swapping attacker.
const RACE_RUNS: usize = 20;

/// `softverbs daemon ARGS`: waits until it serves `socket` or exits; returns its exit status
/// (`None`: it serves, and was stopped) and its standard error.
fn daemon_outcome(args: &[&std::ffi::OsStr], socket: &Path) -> (Option<i32>, String) {
    let log = socket.with_extension("stderr");
    let mut child = Command::new(BIN)
        .arg("daemon")
        .args(args)
        .env("SOFTVERBS_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st.code();
        }
        if softverbs_ipc::connect_seqpacket(socket).is_ok() {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        assert!(
            Instant::now() < deadline,
            "the daemon neither served nor exited"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, std::fs::read_to_string(&log).unwrap_or_default())
}

/// The loopback address of this test file's devices (one per test, so none collide).
fn addr(n: u8) -> String {
    format!("127.35.9.{n}")
}

/// A capture file planted as a symlink to another file: the daemon never truncates the
/// target (File::create followed the link).
#[test]
fn a_symlink_in_the_capture_dir_is_never_followed() {
    let t = dir("capsym");
    let cap = t.0.join("cap");
    std::fs::create_dir(&cap).unwrap();
    chmod(&cap, 0o755);
    let victim = t.0.join("victim");
    std::fs::write(&victim, b"keep").unwrap();
    std::os::unix::fs::symlink(&victim, cap.join("capsym.pcap")).unwrap();
    let dangling = t.0.join("created");
    std::os::unix::fs::symlink(&dangling, cap.join("capsym-1.pcap")).unwrap();
    let sock = t.0.join("sv.sock");
    let (status, err) = daemon_outcome(
        &[
            "--socket".as_ref(),
            sock.as_os_str(),
            "--device".as_ref(),
            format!("capsym={}", addr(1)).as_ref(),
            "--capture".as_ref(),
            cap.as_os_str(),
        ],
        &sock,
    );
    assert_eq!(
        std::fs::read(&victim).unwrap(),
        b"keep",
        "the symlink's target was truncated"
    );
    assert!(!dangling.exists(), "the symlink's target was created");
    assert!(
        status.is_some_and(|c| c != 0) && err.contains("symlink"),
        "the daemon should refuse and say why: {status:?} {err}"
    );
}

/// A capture directory others can write is refused (a planted link could appear any time).
#[test]
fn a_group_writable_capture_dir_is_refused() {
    let t = dir("capgw");
    let cap = t.0.join("cap");
    std::fs::create_dir(&cap).unwrap();
    chmod(&cap, 0o777);
    let sock = t.0.join("sv.sock");
    let (status, err) = daemon_outcome(
        &[
            "--socket".as_ref(),
            sock.as_os_str(),
            "--device".as_ref(),
            format!("capgw={}", addr(2)).as_ref(),
            "--capture".as_ref(),
            cap.as_os_str(),
        ],
        &sock,
    );
    assert!(
        status.is_some_and(|c| c != 0) && err.contains("writable by group or others"),
        "a group-writable capture directory was used: {status:?} {err}"
    );
    assert!(std::fs::read_dir(&cap).unwrap().next().is_none());
}

/// The socket's lock file planted as a symlink: never created through it.
#[test]
fn a_symlink_at_the_socket_lock_is_never_followed() {
    let t = dir("socksym");
    let sd = t.0.join("sd");
    std::fs::create_dir(&sd).unwrap();
    chmod(&sd, 0o755);
    let created = t.0.join("created");
    let sock = sd.join("sv.sock");
    std::os::unix::fs::symlink(&created, sd.join("sv.sock.lock")).unwrap();
    let (status, err) = daemon_outcome(
        &[
            "--socket".as_ref(),
            sock.as_os_str(),
            "--no-network".as_ref(),
        ],
        &sock,
    );
    assert!(!created.exists(), "the lock's symlink was followed");
    assert!(
        status.is_some_and(|c| c != 0),
        "the daemon served beside a planted lock: {err}"
    );
}

/// A socket directory others can write is refused.
#[test]
fn a_group_writable_socket_dir_is_refused() {
    let t = dir("sockgw");
    let sd = t.0.join("sd");
    std::fs::create_dir(&sd).unwrap();
    chmod(&sd, 0o777);
    let sock = sd.join("sv.sock");
    let (status, err) = daemon_outcome(
        &[
            "--socket".as_ref(),
            sock.as_os_str(),
            "--no-network".as_ref(),
        ],
        &sock,
    );
    assert!(
        status.is_some_and(|c| c != 0) && err.contains("writable by group or others"),
        "a group-writable socket directory was used: {status:?} {err}"
    );
}

/// The private `/dev` that gives UCX its device node is built on a mount point no other user
/// can take first: files planted at every `.softverbs-dev-<pid>` name the next few thousand
/// processes could get, in the temporary directory `softverbs run` is given, leave the program
/// with its node (the name was the pid's, in `$TMPDIR`; a leftover blocked it).
#[test]
fn run_makes_the_device_node_whatever_others_left_in_tmp() {
    if host_has_a_device_node() {
        eprintln!("skipped: this host has /dev/infiniband/uverbs0 already");
        return;
    }
    let d = Daemon::start("paths-devnode");
    let t = dir("devnode");
    let shared = t.0.join("tmp");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o1777);
    let xdg = t.0.join("xdg");
    std::fs::create_dir(&xdg).unwrap();
    chmod(&xdg, 0o700);
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    for pid in last..last + 4000 {
        std::fs::write(shared.join(format!(".softverbs-dev-{pid}")), b"left over").unwrap();
    }
    let o = Command::new(BIN)
        .arg("--socket")
        .arg(&d.socket)
        .args([
            "run",
            "--",
            "sh",
            "-c",
            "test -c /dev/infiniband/uverbs0 && echo node",
        ])
        .env("TMPDIR", &shared)
        .env("XDG_RUNTIME_DIR", &xdg)
        .env_remove("SOFTVERBS_DEVICE_NODES")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("last pid {last}; softverbs run said: {err}");
    if err.contains("unprivileged user namespaces are off") {
        eprintln!("skipped: no user namespaces here: {err}");
        return;
    }
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("node"),
        "no device node: {err}"
    );
    // Its mount point is gone again.
    let left: Vec<_> = std::fs::read_dir(xdg.join("softverbs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("dev-"))
        .collect();
    assert!(left.is_empty(), "mount points left behind: {left:?}");
}

fn host_has_a_device_node() -> bool {
    std::fs::metadata("/dev/infiniband/uverbs0").is_ok()
}
