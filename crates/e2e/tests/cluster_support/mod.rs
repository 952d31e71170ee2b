//! What the cluster test files share: a cluster of the test's own (`softverbs cluster up`,
//! taken down on drop and checked to leave nothing), its hosts' daemons, and the skip rule.
#![allow(dead_code)] // each test file uses its own part

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;
use softverbs_testkit::bins::softverbs_bin;
use softverbs_testkit::process::text;

/// Where `cluster up` keeps its state (crates/cli/src/cluster/state.rs).
pub const STATE_ROOT: &str = "/run/softverbs/cluster";

/// One job at a time: two daemons and four processes already fill two cores.
pub static JOBS: Mutex<()> = Mutex::new(());

/// The bound on any one command (a hang fails the test instead of stalling it).
pub const JOB_TIMEOUT: &str = "120";

pub fn why_skip(programs: &[&str]) -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("not root (network namespaces need it)".into());
    }
    for p in programs.iter().chain(&["ip", "ss", "timeout", "setpriv"]) {
        let found = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(p).is_file()));
        if !found {
            return Some(format!("{p} is not installed"));
        }
    }
    None
}

#[macro_export]
macro_rules! skip_unless {
    ($($p:expr),*) => {
        if let Some(why) = $crate::cluster_support::why_skip(&[$($p),*]) {
            assert!(std::env::var_os("CI").is_none(), "CI has everything: {why}");
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
}

pub fn softverbs_cmd(args: &[&str]) -> Command {
    let mut c = Command::new("timeout");
    c.args(["--kill-after=5", JOB_TIMEOUT])
        .arg(softverbs_bin())
        .args(args);
    c
}

pub fn softverbs(args: &[&str]) -> Output {
    softverbs_cmd(args).output().expect("run softverbs")
}

/// A cluster of the test's own, taken down on drop.
pub struct Cluster {
    name: String,
    down: bool,
}

impl Cluster {
    pub fn up(name: &str, hosts: usize) -> Cluster {
        assert!(name.starts_with("sv"), "test clusters carry a test prefix");
        let out = softverbs(&[
            "cluster",
            "up",
            "--name",
            name,
            "--hosts",
            &hosts.to_string(),
        ]);
        assert!(out.status.success(), "cluster up: {}", text(&out));
        Cluster {
            name: name.to_string(),
            down: false,
        }
    }

    pub fn dir(&self) -> PathBuf {
        Path::new(STATE_ROOT).join(&self.name)
    }

    pub fn host(&self, i: usize) -> String {
        format!("{}-{i}", self.name)
    }

    pub fn status(&self) -> Value {
        let out = softverbs(&["cluster", "status", "--name", &self.name, "--json"]);
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("cluster status --json: {e}: {}", text(&out)))
    }

    /// `softverbs status --json` of host `i`'s daemon.
    pub fn daemon_status(&self, i: usize) -> Value {
        let sock = self.dir().join(self.host(i)).join("softverbs.sock");
        let out = softverbs(&["--socket", sock.to_str().unwrap(), "status", "--json"]);
        assert!(
            out.status.success(),
            "status of {}: {}",
            self.host(i),
            text(&out)
        );
        serde_json::from_slice(&out.stdout).expect("status JSON")
    }

    pub fn addr(&self, i: usize) -> String {
        let out = softverbs(&["cluster", "status", "--name", &self.name, "--json"]);
        let s: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("cluster status --json: {e}: {}", text(&out)));
        s["hosts"][i - 1]["addr"]
            .as_str()
            .unwrap_or_else(|| panic!("no address for host {i}: {s}"))
            .to_string()
    }

    /// The `cm` object of `softverbs resources --json` from host `i`'s daemon.
    pub fn cm(&self, i: usize) -> Value {
        let sock = self.dir().join(self.host(i)).join("softverbs.sock");
        let out = softverbs(&["--socket", sock.to_str().unwrap(), "resources", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v["cm"].clone()
    }

    /// Waits (bounded) until host `i`'s daemon holds no listener, connection or CM id.
    pub fn assert_cm_drained(&self, i: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let cm = self.cm(i);
            if ["listeners", "connections", "time_wait", "owned"]
                .iter()
                .all(|k| cm[k] == 0)
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "CM state left on {}: {cm}",
                self.host(i)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn exec_cmd(&self, i: usize, args: &[&str]) -> Command {
        let host = self.host(i);
        let mut all = vec!["cluster", "exec", &host, "--"];
        all.extend(args);
        softverbs_cmd(&all)
    }

    pub fn exec(&self, i: usize, args: &[&str]) -> Output {
        self.exec_cmd(i, args).output().expect("cluster exec")
    }

    /// Takes the cluster down and checks that nothing of it is left.
    pub fn down(mut self) {
        self.down = true;
        let out = softverbs(&["cluster", "down", "--name", &self.name]);
        assert!(out.status.success(), "cluster down: {}", text(&out));
        assert_gone(&self.name);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.down {
            let _ = softverbs(&["cluster", "down", "--name", &self.name]);
        }
    }
}

/// Namespaces, links, processes and state of cluster `name` still on the machine.
pub fn leftovers(name: &str) -> Vec<String> {
    let lines = |args: &[&str]| -> Vec<String> {
        let out = Command::new("ip").args(args).output().expect("ip");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    };
    let ours = |s: &str| s.starts_with(&format!("{name}-"));
    let mut left: Vec<String> = lines(&["netns", "list"])
        .into_iter()
        .filter(|l| ours(l))
        .map(|l| format!("namespace {l}"))
        .collect();
    left.extend(
        lines(&["-o", "link", "show"])
            .into_iter()
            .filter_map(|l| {
                l.split(": ")
                    .nth(1)
                    .map(|n| n.split('@').next().unwrap_or(n).to_string())
            })
            .filter(|n| ours(n))
            .map(|n| format!("link {n}")),
    );
    let dir = format!("{STATE_ROOT}/{name}/");
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(&dir) && !cmd.contains("cluster status") {
            left.push(format!("process {pid}: {cmd}"));
        }
    }
    if Path::new(&dir).exists() {
        left.push(format!("state {dir}"));
    }
    left
}

pub fn assert_gone(name: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = leftovers(name);
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "after cluster down: {left:#?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
