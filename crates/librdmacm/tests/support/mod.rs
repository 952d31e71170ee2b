//! What the librdmacm test files share: tool checks, this build's drop-ins, `softverbs run`
//! of a program (in a network namespace or not), and the daemon's CM state.
#![allow(dead_code)] // each test file uses its own part

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use softverbs_testkit::bins::{profile_dir, softverbs_bin};
use softverbs_testkit::process::text;

/// Compiles `tests/c/NAME.c` against the system's librdmacm headers (linked to our drop-ins
/// at run time by `softverbs run`) into `dir`; `None`, with a SKIP line, without gcc or
/// librdmacm-dev (which CI has, so there it is a failure).
pub fn build_c(name: &str, dir: &Path) -> Option<PathBuf> {
    if !Path::new("/usr/include/rdma/rdma_cma.h").is_file()
        || Command::new("gcc").arg("--version").output().is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "gcc and librdmacm-dev are required under CI"
        );
        eprintln!("SKIP: gcc or /usr/include/rdma/rdma_cma.h (librdmacm-dev) missing");
        return None;
    }
    let exe = dir.join(format!("{name}-{}", std::process::id()));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let o = Command::new("gcc")
        .args(["-Wall", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(src)
        .args(["-lrdmacm", "-libverbs"])
        .output()
        .expect("run gcc");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    Some(exe)
}

pub fn have(tool: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "{tool} is required under CI"
        );
        eprintln!("SKIP: {tool} is not installed (apt-get install rdmacm-utils)");
    }
    found
}

pub fn lib(name: &str) -> PathBuf {
    let p = profile_dir();
    [p.join("deps").join(name), p.join(name)]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} not built in {}", p.display()))
}

/// `[ip netns exec NS] softverbs --socket S run -- PROG ARGS` with this build's drop-ins.
pub fn run(netns: Option<&str>, socket: &Path, prog: impl AsRef<OsStr>, args: &[&str]) -> Child {
    let prog = prog.as_ref();
    command(netns, socket, prog, args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("softverbs run {}: {e}", Path::new(prog).display()))
}

/// The command [`run`] starts, for a test that sets up its pipes itself.
pub fn command(
    netns: Option<&str>,
    socket: &Path,
    prog: impl AsRef<OsStr>,
    args: &[&str],
) -> Command {
    let mut c = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(softverbs_bin());
            c
        }
        None => Command::new(softverbs_bin()),
    };
    c.arg("--socket")
        .arg(socket)
        .arg("run")
        .arg("--")
        .arg(prog.as_ref())
        .args(args)
        .env("SOFTVERBS_AUTOSTART", "0")
        .env("SOFTVERBS_LIBIBVERBS", lib("libibverbs.so"))
        .env("SOFTVERBS_LIBRDMACM", lib("librdmacm.so"));
    c
}

pub fn cm_of(socket: &Path) -> serde_json::Value {
    let o = Command::new(softverbs_bin())
        .arg("--socket")
        .arg(socket)
        .args(["resources", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    v["cm"].clone()
}

pub fn wait_cm(socket: &Path, what: &str, cond: impl Fn(&serde_json::Value) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let cm = cm_of(socket);
        if cond(&cm) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: CM state {cm}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn ok(o: Output, what: &str) -> String {
    assert!(o.status.success(), "{what}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Two network namespaces `{prefix}a` and `{prefix}b` joined by a veth pair
/// (`{prefix}a0`/`{prefix}b0`, 10.`net`.0.1 and .2/24); removed on drop, also on failure.
pub struct Netns(&'static str);
impl Netns {
    pub fn up(prefix: &'static str, net: u8) -> Option<Netns> {
        let sh = |c: &str| {
            Command::new("sh")
                .args(["-c", c])
                .status()
                .is_ok_and(|s| s.success())
        };
        let (a, b) = (format!("{prefix}a"), format!("{prefix}b"));
        let _ = sh(&format!(
            "ip netns del {a} 2>/dev/null; ip netns del {b} 2>/dev/null"
        ));
        let ok = sh(&format!(
            "ip netns add {a} && ip netns add {b} \
            && ip link add {a}0 netns {a} type veth peer name {b}0 netns {b} \
            && ip -n {a} addr add 10.{net}.0.1/24 dev {a}0 && ip -n {b} addr add 10.{net}.0.2/24 dev {b}0 \
            && ip -n {a} link set {a}0 up && ip -n {b} link set {b}0 up \
            && ip -n {a} link set lo up && ip -n {b} link set lo up"
        ));
        let n = Netns(prefix);
        ok.then_some(n)
    }
}
impl Drop for Netns {
    fn drop(&mut self) {
        let p = self.0;
        let _ = Command::new("sh")
            .args(["-c", &format!("ip netns del {p}a; ip netns del {p}b")])
            .status();
    }
}

/// A `softverbs daemon` in network namespace `ns` with one device on `ip` (its socket is
/// `.1`), killed on drop.
pub struct NsDaemon(pub Child, pub PathBuf);
impl NsDaemon {
    /// Started with `extra` daemon flags (`--faults ...`); its log goes to `dir/NS.log`.
    pub fn start(dir: &Path, ns: &str, ip: &str, extra: &[&str]) -> NsDaemon {
        let sock = dir.join(format!("{ns}.sock"));
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(softverbs_bin())
            .arg("daemon")
            .arg("--socket")
            .arg(&sock)
            .arg("--device")
            .arg(format!("softverbs0={ip}"))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("{ns}.log"))).unwrap())
            .spawn()
            .unwrap();
        let d = NsDaemon(child, sock);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cm_of(&d.1).is_object() {
            assert!(Instant::now() < deadline, "daemon in {ns} did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }
}
impl Drop for NsDaemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
