//! What the drop-in's tests share. This crate cannot depend on the CLI, so the `softverbs`
//! binary and the drop-in are found next to the test executable (`cargo build -p
//! softverbs-cli` first). Every test talks to daemons of its own, never the default socket, and
//! starts programs with `softverbs run` the way a user would: C files of this crate compiled
//! with gcc (stdout lines read as they come), and unmodified rdma-core tools whose TCP servers
//! accept a single connection.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long any one step may take (debug builds on a loaded machine).
pub const WAIT: Duration = Duration::from_secs(60);

/// `target/<profile>`: the test executable runs from its `deps/` directory.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("test executable has a directory");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().expect("deps has a parent").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

pub fn softverbs_bin() -> PathBuf {
    let profile = profile_dir();
    let bin = profile.join("softverbs");
    assert!(
        bin.is_file(),
        "{} is missing: build the CLI in the same profile first (`cargo build{} -p softverbs-cli`)",
        bin.display(),
        if profile.ends_with("release") {
            " --release"
        } else {
            ""
        }
    );
    bin
}

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

/// A daemon of this test's own (never the default socket), stopped on drop.
pub struct Daemon {
    pub child: Child,
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub bin: PathBuf,
    /// `lib/libibverbs.so.1`: `softverbs run` then puts `lib/` on LD_LIBRARY_PATH as it is.
    pub lib: PathBuf,
    /// The daemon's network arguments (for [`Daemon::respawn`]).
    net: Vec<String>,
    /// Killed by [`Daemon::kill9`] and reaped: its pid is no longer ours to signal.
    killed: bool,
}

impl Daemon {
    /// No network: programs on one daemon meet through it alone, and no UDP port is taken.
    pub fn start(name: &str) -> Daemon {
        Daemon::launch(name, &["--no-network".to_string()])
    }

    /// Its device `softverbs0` has address `ip` (UDP 4791 bound there): two such daemons on
    /// different loopback addresses talk RoCE v2 to each other, as two hosts would.
    pub fn start_with_ip(name: &str, ip: &str) -> Daemon {
        Daemon::launch(name, &["--device".to_string(), format!("softverbs0={ip}")])
    }

    /// [`start`](Self::start) with more `softverbs daemon` arguments (`--limit ...`).
    pub fn start_with_args(name: &str, args: &[&str]) -> Daemon {
        let mut all = vec!["--no-network".to_string()];
        all.extend(args.iter().map(|a| a.to_string()));
        Daemon::launch(name, &all)
    }

    fn launch(name: &str, net: &[String]) -> Daemon {
        let bin = softverbs_bin();
        let dir = std::env::temp_dir().join(format!("sv-dropin-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("lib")).expect("test dir");
        let lib = dir.join("lib/libibverbs.so.1");
        std::os::unix::fs::symlink(library(), &lib).expect("symlink the drop-in");
        let socket = dir.join("sv.sock");
        let child = spawn_daemon(&bin, net, &socket, &dir);
        let mut d = Daemon {
            child,
            dir,
            socket,
            bin,
            lib,
            net: net.to_vec(),
            killed: false,
        };
        d.wait_up(name);
        d
    }

    fn wait_up(&mut self, name: &str) {
        let deadline = Instant::now() + WAIT;
        while !self.answers() {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("daemon {name} exited with {st}: {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "daemon {name} did not come up:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, as a crash would end it (its socket file stays behind), and reaped.
    pub fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL the daemon");
        self.child.wait().expect("reap the daemon");
        self.killed = true;
    }

    /// A new daemon on the same socket, with the same arguments, after [`Daemon::kill9`].
    pub fn respawn(&mut self) {
        assert!(self.killed, "respawn only a killed daemon");
        self.child = spawn_daemon(&self.bin, &self.net, &self.socket, &self.dir);
        self.killed = false;
        self.wait_up("respawned");
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(&self.bin)
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .env("SOFTVERBS_AUTOSTART", "0")
            .output()
            .expect("run softverbs")
    }

    pub fn answers(&self) -> bool {
        self.socket.exists() && self.cli(&["status"]).status.success()
    }

    /// `softverbs resources --json`, as a user would look.
    pub fn resources(&self) -> Value {
        let o = self.cli(&["resources", "--json"]);
        assert!(
            o.status.success(),
            "softverbs resources: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        serde_json::from_slice(&o.stdout).expect("resources --json is JSON")
    }

    /// Waits until the daemon's view satisfies `cond` (it learns of exits asynchronously).
    pub fn wait_until(&self, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let r = self.resources();
            if cond(&r) {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting until {what}; last view: {r:#}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `softverbs run -- PROG ARGS` against this daemon and this test's build of the drop-in
    /// (not whichever `softverbs run` would find), for the caller to add its own stdio.
    pub fn command(&self, prog: impl AsRef<OsStr>, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--socket")
            .arg(&self.socket)
            .arg("run")
            .arg("--")
            .arg(prog)
            .args(args)
            .env("SOFTVERBS_AUTOSTART", "0")
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
        let mut child = self
            .command(prog, args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("softverbs run");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let stdin = child.stdin.take();
        Proc {
            child,
            stdin,
            lines: rx,
            name: name.to_string(),
        }
    }
}

/// `softverbs daemon NET --socket SOCKET`, logging to `dir/daemon.log` (appended).
fn spawn_daemon(bin: &Path, net: &[String], socket: &Path, dir: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("daemon.log"))
        .expect("daemon log");
    Command::new(bin)
        .arg("daemon")
        .args(net)
        .arg("--socket")
        .arg(socket)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start the daemon")
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SIGTERM: the daemon shuts down cleanly and removes its socket.
        if !self.killed {
            let _ = Command::new("kill")
                .arg(self.child.id().to_string())
                .status();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("daemon log:\n{}", self.log());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One role of the C example (`softverbs run` execs it, so its pid is the program's).
pub struct Proc {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    pub lines: Receiver<String>,
    pub name: String,
}

impl Proc {
    pub fn line(&self) -> String {
        self.lines.recv_timeout(WAIT).unwrap_or_else(|_| {
            panic!(
                "{} (pid {}) said nothing within {WAIT:?}",
                self.name,
                self.child.id()
            )
        })
    }

    /// The next line, which must start with `prefix`; returns the rest.
    pub fn expect(&self, prefix: &str) -> String {
        let l = self.line();
        assert!(
            l.starts_with(prefix),
            "{} (pid {}) said {l:?}, expected {prefix}…",
            self.name,
            self.child.id()
        );
        l[prefix.len()..].trim().to_string()
    }

    pub fn tell(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        writeln!(stdin, "{line}").expect("write to the program");
        stdin.flush().expect("flush");
    }

    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    pub fn pid(&self) -> u64 {
        u64::from(self.child.id())
    }

    pub fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }

    pub fn exits_zero(&mut self) {
        let st = self.child.wait().expect("wait");
        assert!(st.success(), "{} exited with {st}", self.name);
    }

    /// Closes stdin, reads what the program still says until it closes stdout, and reaps it.
    pub fn finish(mut self) -> (Vec<String>, std::process::ExitStatus) {
        self.close_stdin();
        let deadline = Instant::now() + WAIT;
        let mut said = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => said.push(l),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!(
                    "{} (pid {}) did not finish within {WAIT:?}; it said:\n{}",
                    self.name,
                    self.child.id(),
                    said.join("\n")
                ),
            }
        }
        let st = self.child.wait().expect("wait");
        (said, st)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An exit status with everything the program said, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Waits up to [`WAIT`] for a child: a hung program fails the test instead of hanging it.
pub fn finish(c: Child, what: &str) -> Output {
    finish_within(c, what, WAIT)
}

/// [`finish`] for a child that may take longer than one step (a whole test suite).
pub fn finish_within(mut c: Child, what: &str, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        if c.try_wait().expect("try_wait").is_some() {
            return c.wait_with_output().expect("wait");
        }
        if Instant::now() > deadline {
            let _ = c.kill();
            let o = c.wait_with_output().expect("wait");
            panic!("{what} did not finish within {limit:?}: {}", text(&o));
        }
        std::thread::sleep(Duration::from_millis(20));
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

/// Whether `softverbs resources --json` lists a context of process `pid`.
pub fn has_pid(r: &Value, pid: u64) -> bool {
    r["contexts"]
        .as_array()
        .expect("contexts")
        .iter()
        .any(|c| c["pid"] == pid)
}

/// Every section of `softverbs resources --json` that lists objects.
pub const SECTIONS: [&str; 6] = ["contexts", "xrcds", "srqs", "cqs", "qps", "xrc_recv_qps"];
