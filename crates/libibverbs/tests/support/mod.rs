//! What the drop-in's tests share, on top of the workspace's harness (`crates/testkit`). This
//! crate cannot depend on the CLI, so the `softverbs` binary and the drop-in are found next to
//! the test executable (`cargo build -p softverbs-cli` first). Every test talks to daemons of
//! its own, never the default socket, and starts programs with `softverbs run` the way a user
//! would: C files of this crate compiled with gcc (stdout lines read as they come), and
//! unmodified rdma-core tools whose TCP servers accept a single connection.
#![allow(dead_code, unused_imports)]

use std::ffi::OsStr;
use std::net::TcpListener;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub use softverbs_testkit::bins::{profile_dir, softverbs_bin};
pub use softverbs_testkit::process::{finish, finish_within, text};
pub use softverbs_testkit::resources::{has_pid, holders, SECTIONS};
pub use softverbs_testkit::WAIT;

/// The drop-in this test was built with.
pub fn library() -> PathBuf {
    let profile = profile_dir();
    [
        profile.join("deps/libibverbs.so"),
        profile.join("libibverbs.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .unwrap_or_else(|| panic!("no libibverbs.so in {} or its deps/", profile.display()))
}

/// Whether `tool` is on PATH. A test without it passes having checked nothing, so it says
/// `SKIP` and which package would make it run.
pub fn have(tool: &str, package: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
    if !found {
        eprintln!("SKIP: {tool} is not installed (apt-get install {package})");
    }
    found
}

/// Why C programs cannot be built here, if they cannot.
pub fn c_toolchain_missing() -> Option<String> {
    if !Path::new("/usr/include/infiniband/verbs.h").is_file() {
        return Some("/usr/include/infiniband/verbs.h is missing (libibverbs-dev)".into());
    }
    match Command::new("gcc").arg("--version").output() {
        Ok(o) if o.status.success() => None,
        _ => Some("gcc is not installed".into()),
    }
}

/// Compiles a C file of this crate against verbs.h, xrc_legacy.h and the drop-in.
pub fn compile(source: &str, out: &Path) {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let o = Command::new("gcc")
        .args(["-Wall", "-Wextra", "-I/usr/include"])
        .arg(format!("-I{}", crate_dir.join("include").display()))
        .arg(crate_dir.join(source))
        .arg("-o")
        .arg(out)
        .arg(library())
        .output()
        .expect("run gcc");
    assert!(
        o.status.success(),
        "gcc {source} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let warnings = String::from_utf8_lossy(&o.stderr);
    assert!(
        warnings.trim().is_empty(),
        "gcc {source} warned:\n{warnings}"
    );
}

/// A daemon named `name` and `source` compiled into its directory (named after the file), or
/// None after saying `SKIP` and why: without gcc and `verbs.h` a C test checks nothing.
pub fn c_program(name: &str, source: &str) -> Option<(Daemon, PathBuf)> {
    if let Some(why) = c_toolchain_missing() {
        eprintln!("SKIP: {why}");
        return None;
    }
    let d = Daemon::start(name);
    let stem = Path::new(source).file_stem().expect("a file name");
    let prog = d.dir.join(stem);
    compile(source, &prog);
    Some((d, prog))
}

/// A daemon of this test's own (never the default socket), stopped on drop: the workspace's
/// [`softverbs_testkit::Daemon`] (its `dir`, `socket`, `bin` and `child`) plus the drop-in
/// that programs run through it load.
pub struct Daemon {
    pub daemon: softverbs_testkit::Daemon,
    /// `lib/libibverbs.so.1`: `softverbs run` then puts `lib/` on LD_LIBRARY_PATH as it is.
    pub lib: PathBuf,
}

impl Deref for Daemon {
    type Target = softverbs_testkit::Daemon;
    fn deref(&self) -> &Self::Target {
        &self.daemon
    }
}

impl DerefMut for Daemon {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.daemon
    }
}

impl Daemon {
    /// No network: programs on one daemon meet through it alone, and no UDP port is taken.
    pub fn start(name: &str) -> Daemon {
        Daemon::with_lib(softverbs_testkit::Daemon::options(name).start())
    }

    /// Its device `softverbs0` has address `ip` (UDP 4791 bound there): two such daemons on
    /// different loopback addresses talk RoCE v2 to each other, as two hosts would.
    pub fn start_with_ip(name: &str, ip: &str) -> Daemon {
        Daemon::with_lib(
            softverbs_testkit::Daemon::options(name)
                .device("softverbs0", ip)
                .start(),
        )
    }

    /// A daemon started from `options` (its own binary, device and flags).
    pub fn start_with_options(options: softverbs_testkit::DaemonOptions) -> Daemon {
        Daemon::with_lib(options.start())
    }

    /// [`start`](Self::start) with more `softverbs daemon` arguments (`--limit ...`).
    pub fn start_with_args(name: &str, args: &[&str]) -> Daemon {
        Daemon::with_lib(softverbs_testkit::Daemon::options(name).args(args).start())
    }

    fn with_lib(daemon: softverbs_testkit::Daemon) -> Daemon {
        std::fs::create_dir_all(daemon.dir.join("lib")).expect("test dir");
        let lib = daemon.dir.join("lib/libibverbs.so.1");
        std::os::unix::fs::symlink(library(), &lib).expect("symlink the drop-in");
        Daemon { daemon, lib }
    }

    pub fn log(&self) -> String {
        self.daemon.log()
    }

    /// SIGKILL, as a crash would end it (its socket file stays behind), and reaped.
    pub fn kill9(&mut self) {
        self.daemon.kill9();
    }

    /// A new daemon on the same socket, with the same arguments, after [`Daemon::kill9`].
    pub fn respawn(&mut self) {
        self.daemon.respawn();
    }

    /// `softverbs ARGS` against this daemon, whatever it exits with.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.daemon.cli_output(args)
    }

    pub fn answers(&self) -> bool {
        self.daemon.answers()
    }

    /// `softverbs resources --json`, as a user would look.
    pub fn resources(&self) -> Value {
        self.daemon.resources()
    }

    /// Waits until the daemon's view satisfies `cond` (it learns of exits asynchronously).
    pub fn wait_until(&self, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
        self.daemon.wait_until(what, cond)
    }

    /// `softverbs run -- PROG ARGS` against this daemon and this test's build of the drop-in
    /// (not whichever `softverbs run` would find), for the caller to add its own stdio.
    pub fn command(&self, prog: impl AsRef<OsStr>, args: &[&str]) -> Command {
        let mut c = self.client(&self.bin);
        c.arg("run")
            .arg("--")
            .arg(prog)
            .args(args)
            .env("SOFTVERBS_LIBIBVERBS", &self.lib);
        c
    }

    /// [`Daemon::command`] started with its output piped, for [`finish`] to collect.
    pub fn spawn(&self, prog: &str, args: &[&str]) -> Child {
        self.command(prog, args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("softverbs run {prog}: {e}"))
    }

    /// [`Daemon::spawn`] for a server (perftest, the pingpongs) that listens on TCP `port`,
    /// returned once it listens: its client gives up if it connects sooner.
    pub fn spawn_server(&self, prog: &str, args: &[&str], port: u16) -> Child {
        let mut server = self.spawn(prog, args);
        let deadline = Instant::now() + WAIT;
        while !listening(port) {
            if server.try_wait().expect("try_wait").is_some() || Instant::now() > deadline {
                let _ = server.kill();
                let o = server.wait_with_output().expect("wait");
                panic!(
                    "{prog} server never listened on {port}: {}\ndaemon log:\n{}",
                    text(&o),
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        server
    }

    /// `softverbs run -- PROG ARGS…` with piped stdin and stdout, read line by line.
    pub fn run(&self, name: &str, prog: &Path, args: &[&str]) -> Proc {
        Proc(softverbs_testkit::Actor::spawn(
            name,
            self.command(prog, args),
        ))
    }
}

/// One role of the C example (`softverbs run` execs it, so its pid is the program's): the
/// workspace's [`softverbs_testkit::Actor`] (its `child`, `stdin`, `lines` and `name`),
/// whose [`Proc::expect`] returns what follows the prefix.
pub struct Proc(pub softverbs_testkit::Actor);

impl Deref for Proc {
    type Target = softverbs_testkit::Actor;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for Proc {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Proc {
    /// The next line, waiting at most [`WAIT`].
    pub fn line(&self) -> String {
        self.0.line()
    }

    /// The next line, which must start with `prefix`; returns the rest.
    pub fn expect(&self, prefix: &str) -> String {
        self.0.expect_rest(prefix)
    }

    /// Writes `line` to the program's stdin.
    pub fn tell(&mut self, line: &str) {
        self.0.send(line);
    }

    pub fn close_stdin(&mut self) {
        self.0.close_stdin();
    }

    pub fn pid(&self) -> u64 {
        self.0.pid()
    }

    pub fn kill9(&mut self) {
        self.0.kill9();
    }

    pub fn exits_zero(&mut self) {
        self.0.exits_zero();
    }

    /// Closes stdin, reads what the program still says until it closes stdout, and reaps it.
    pub fn finish(self) -> (Vec<String>, std::process::ExitStatus) {
        self.0.finish()
    }
}

/// A TCP port nobody listens on now: perftest and the pingpongs exchange QP numbers and keys
/// over TCP, and tests run in parallel.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind a TCP port")
        .local_addr()
        .expect("local address")
        .port()
}

/// Whether something listens on TCP `port`, read from /proc so that no connection is spent
/// (a perftest or pingpong server accepts exactly one).
pub fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && cols[1].ends_with(&want) && cols[3] == "0A"
            })
        })
    })
}

/// Runs a C program written against `tests/c/check.h` and asserts that it passed: exactly the
/// checks `checks` said "ok", in order, nothing else but `info` lines and the summary of
/// `prog` ("<prog>: N checks, 0 failed"), and a zero exit status. Returns what it printed (for
/// its `info` lines).
pub fn run_checks(mut cmd: Command, prog: &str, checks: &[&str]) -> Vec<String> {
    let out = cmd.output().expect("run the C program");
    let said: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    let text = format!(
        "{}\n{}",
        said.join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    let failed: Vec<&String> = said
        .iter()
        .filter(|l| !l.starts_with("ok ") && !l.starts_with("info "))
        .collect();
    let ok: Vec<&str> = said.iter().filter_map(|l| l.strip_prefix("ok ")).collect();
    let summary = format!("{prog}: {} checks, 0 failed", checks.len());
    assert_eq!(failed, vec![&summary], "{text}");
    assert_eq!(ok, checks, "{text}");
    assert!(
        out.status.success(),
        "{prog} exited with {}:\n{text}",
        out.status
    );
    said
}

/// Waits until the daemon holds no context, then asserts no object of any kind is left.
pub fn assert_nothing_left(d: &Daemon) {
    let r = d.wait_until("the program's context is gone", |r| {
        r["contexts"].as_array().is_some_and(Vec::is_empty)
    });
    for section in SECTIONS {
        assert_eq!(
            r[section].as_array().map(Vec::len),
            Some(0),
            "{section} left over: {r:#}"
        );
    }
}

/// Whether the tests run as root (where registration always shares pages in place).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
    })
}

/// A loopback address of this test process's own, `127.<pid-derived>.<last>`: daemons of
/// two test binaries running at once never bind the same one (each binary picks its own
/// range of `last`).
pub fn loopback_addr(last: u8) -> String {
    let pid = std::process::id();
    format!("127.{}.{}.{}", 128 + (pid >> 8) % 100, pid & 0xff, last)
}
