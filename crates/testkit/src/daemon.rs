//! A `softverbs daemon` process of a test's own: its own directory and socket (never the
//! default one), its log, the `softverbs` subcommands a user would run against it, and the
//! client processes it serves. Stopped with SIGTERM on drop, as a user stops it.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};
use serde_json::Value;

use crate::{bins, Actor, WAIT};

/// How to start a [`Daemon`]: [`Daemon::options`], then [`DaemonOptions::start`].
pub struct DaemonOptions {
    name: String,
    bin: Option<PathBuf>,
    device: Option<String>,
    args: Vec<OsString>,
    open_to_all: bool,
    netns: Option<String>,
    max_fds: Option<u64>,
}

impl DaemonOptions {
    /// The `softverbs` binary to run (default: [`bins::softverbs_bin`]).
    pub fn bin(mut self, bin: impl Into<PathBuf>) -> Self {
        self.bin = Some(bin.into());
        self
    }

    /// One device `name` with address `ip`, binding UDP 4791 there: two such daemons on
    /// different loopback addresses talk RoCE v2 to each other, as two hosts would. Without
    /// it the daemon runs `--no-network`: clients of one daemon meet through it alone, and no
    /// UDP port is taken.
    pub fn device(mut self, name: &str, ip: &str) -> Self {
        self.device = Some(format!("{name}={ip}"));
        self
    }

    /// More `softverbs daemon` flags (`--faults ...`, `--capture DIR`).
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(OsString::from));
        self
    }

    /// Runs the daemon inside the network namespace `ns` (`ip netns exec NS softverbs ...`);
    /// clients still reach it by its Unix socket, which namespaces do not separate. Not a
    /// wrapper script: writing an executable and exec'ing it races with the forks of the
    /// other tests in the process (a child that inherited the write descriptor makes the
    /// exec fail with ETXTBSY).
    pub fn netns(mut self, ns: &str) -> Self {
        self.netns = Some(ns.to_string());
        self
    }

    /// Runs the daemon with `RLIMIT_NOFILE` lowered to `n` (`ulimit -n`), the budget its
    /// descriptor limits follow from (docs/guide/limits.md).
    pub fn max_fds(mut self, n: u64) -> Self {
        self.max_fds = Some(n);
        self
    }

    /// Makes the daemon's directory readable and searchable by every uid, for clients that
    /// run as another user.
    pub fn open_to_all(mut self) -> Self {
        self.open_to_all = true;
        self
    }

    /// Starts the daemon and returns once it accepts connections.
    pub fn start(self) -> Daemon {
        let name = self.name;
        let bin = self.bin.unwrap_or_else(bins::softverbs_bin);
        // Tests of one executable run in parallel in one process, so the name keeps their
        // directories apart and the pid keeps executables apart.
        let dir = std::env::temp_dir().join(format!("sv-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the daemon's directory");
        if self.open_to_all {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
                .expect("chmod the daemon's directory");
        }
        let socket = dir.join("sv.sock");
        let mut args: Vec<OsString> =
            vec!["daemon".into(), "--socket".into(), socket.clone().into()];
        match self.device {
            Some(spec) => args.extend(["--device".into(), spec.into()]),
            None => args.push("--no-network".into()),
        }
        args.extend(self.args);
        let (netns, max_fds) = (self.netns, self.max_fds);
        let child = spawn(netns.as_deref(), max_fds, &bin, &args, &dir);
        let mut d = Daemon {
            child,
            dir,
            socket,
            bin,
            name,
            args,
            netns,
            max_fds,
        };
        d.wait_up();
        d
    }
}

/// A running daemon of the test's own.
pub struct Daemon {
    /// The daemon process.
    pub child: Child,
    /// Its directory (socket, log, and whatever the test puts there), removed on drop unless
    /// the test failed.
    pub dir: PathBuf,
    /// Its socket.
    pub socket: PathBuf,
    /// The `softverbs` binary it runs, also used for [`Daemon::cli`].
    pub bin: PathBuf,
    name: String,
    /// What follows the binary on its command line (for [`Daemon::respawn`]).
    args: Vec<OsString>,
    /// The network namespace it runs in, if not the test's own.
    netns: Option<String>,
    /// Its `RLIMIT_NOFILE`, if not the test's.
    max_fds: Option<u64>,
}

/// `[ip netns exec NS] [sh -c 'ulimit -n N && exec ...'] bin ARGS`, logging to
/// `dir/daemon.log` (appended: a respawned daemon adds to its log).
fn spawn(
    netns: Option<&str>,
    max_fds: Option<u64>,
    bin: &Path,
    args: &[OsString],
    dir: &Path,
) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("daemon.log"))
        .expect("the daemon's log");
    let mut prefix: Vec<OsString> = Vec::new();
    if let Some(ns) = netns {
        prefix.extend(["ip", "netns", "exec", ns].map(OsString::from));
    }
    if let Some(n) = max_fds {
        let script = format!("ulimit -n {n} && exec \"$0\" \"$@\"");
        prefix.extend(["sh".into(), "-c".into(), script.into()]);
    }
    let mut cmd = match prefix.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    cmd.args(args)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("start the daemon {}: {e}", bin.display()))
}

impl Daemon {
    /// How to start a daemon for the test step `name` (unique among the tests of one file).
    pub fn options(name: &str) -> DaemonOptions {
        DaemonOptions {
            name: name.to_string(),
            bin: None,
            device: None,
            args: Vec::new(),
            open_to_all: false,
            netns: None,
            max_fds: None,
        }
    }

    /// A `--no-network` daemon with the default binary.
    pub fn start(name: &str) -> Daemon {
        Daemon::options(name).start()
    }

    /// Returns once the daemon accepts connections; panics if it exits or takes longer than
    /// [`WAIT`].
    fn wait_up(&mut self) {
        let deadline = Instant::now() + WAIT;
        while softverbs_ipc::connect_seqpacket(&self.socket).is_err() {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("daemon {} exited with {st}: {}", self.name, self.log());
            }
            assert!(
                Instant::now() < deadline,
                "daemon {} did not come up:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL, as a crash would end it (its socket file stays behind), and reaped.
    pub fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL the daemon");
        self.child.wait().expect("reap the daemon");
    }

    /// A new daemon on the same socket, directory and arguments, after [`Daemon::kill9`] (or
    /// any other end).
    pub fn respawn(&mut self) {
        assert!(
            self.child.try_wait().expect("try_wait").is_some(),
            "respawn only a daemon that is gone"
        );
        self.child = spawn(
            self.netns.as_deref(),
            self.max_fds,
            &self.bin,
            &self.args,
            &self.dir,
        );
        self.wait_up();
    }

    /// What the daemon logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    /// `bin --socket <this daemon's socket>`, a client of this daemon that never starts one
    /// of its own, for the caller to add arguments and stdio.
    pub fn client(&self, bin: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new(bin);
        c.arg("--socket")
            .arg(&self.socket)
            .env("SOFTVERBS_AUTOSTART", "0");
        c
    }

    /// `softverbs ARGS` against this daemon, whatever it exits with.
    pub fn cli_output(&self, args: &[&str]) -> Output {
        self.client(&self.bin)
            .args(args)
            .output()
            .expect("run softverbs")
    }

    /// `softverbs ARGS` against this daemon, which must succeed; returns its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = self.cli_output(args);
        assert!(
            out.status.success(),
            "softverbs {args:?}: {}\ndaemon log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8(out.stdout).expect("softverbs prints UTF-8")
    }

    /// Whether `softverbs status` gets an answer.
    pub fn answers(&self) -> bool {
        self.socket.exists() && self.cli_output(&["status"]).status.success()
    }

    /// `softverbs resources --json`, as a user would look.
    pub fn resources(&self) -> Value {
        serde_json::from_str(&self.cli(&["resources", "--json"])).expect("resources --json is JSON")
    }

    /// `softverbs status --json`.
    pub fn status(&self) -> Value {
        serde_json::from_str(&self.cli(&["status", "--json"])).expect("status --json is JSON")
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

    /// The daemon still runs and answers.
    pub fn assert_alive(&mut self) {
        assert!(
            self.child.try_wait().expect("try_wait").is_none(),
            "the daemon died: {}",
            self.log()
        );
        let s = self.status();
        assert!(s["daemon_pid"].as_u64().is_some(), "{s}");
    }

    /// A client process `bin --socket S ARGS` driven line by line, named after `args[0]`.
    pub fn spawn_actor(&self, bin: impl AsRef<OsStr>, args: &[&str]) -> Actor {
        let mut cmd = self.client(bin);
        cmd.args(args);
        Actor::spawn(args.first().copied().unwrap_or("actor"), cmd)
    }

    /// An empty file in the daemon's directory with permissions `mode` (an XRC domain's file).
    pub fn domain_file(&self, name: &str, mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = self.dir.join(name);
        std::fs::write(&p, b"").expect("write the domain file");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
            .expect("chmod the domain file");
        p
    }

    /// SIGTERM, and wait for the clean exit.
    pub fn stop(&mut self) {
        let _ = kill_process(Pid::from_child(&self.child), Signal::TERM);
        assert!(
            self.exited_within(WAIT),
            "the daemon ignored SIGTERM: {}",
            self.log()
        );
    }

    fn exited_within(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            match self.child.try_wait() {
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Ok(None) => return false,
                _ => return true,
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SIGTERM: the daemon shuts down cleanly and removes its socket. One that does not
        // is killed, so a broken daemon fails its test instead of hanging it.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = kill_process(Pid::from_child(&self.child), Signal::TERM);
            if !self.exited_within(WAIT) {
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "daemon {} log:\n{}\ndaemon dir kept: {}",
                self.name,
                self.log(),
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
