//! Issue 36, item 8: a device's active MTU follows its link — the largest IB MTU whose RoCE
//! v2 packets fit the link's MTU (crates/daemon/src/link_mtu.rs, as rxe) — also for a daemon
//! entered into a network namespace without a sysfs of its own, as cluster daemons were:
//! they read the host's same-named interface and reported 1024 on 9000-byte links.
//!
//! Root only (network namespaces and links of the test's own); returns at once otherwise.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");

fn root() -> bool {
    rustix::process::geteuid().is_root()
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace of the test's own, deleted on drop.
struct Netns(String);
impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("svmtu-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        ip(&["netns", "add", &name]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        Netns(name)
    }

    /// A link `svmtu0` with `mtu`, up, holding `addr` if given (a veth pair inside the
    /// namespace, as `cluster up` links its hosts; no dummy module needed).
    fn link(&self, mtu: u32, addr: Option<&str>) {
        let n = &self.0;
        let mtu = mtu.to_string();
        ip(&[
            "-n", n, "link", "add", "svmtu0", "type", "veth", "peer", "name", "svmtu1",
        ]);
        for l in ["svmtu0", "svmtu1"] {
            ip(&["-n", n, "link", "set", l, "mtu", &mtu, "up"]);
        }
        if let Some(a) = addr {
            ip(&["-n", n, "addr", "add", a, "dev", "svmtu0"]);
        }
    }
}
impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// `softverbs daemon --device mtu=ADDR`, run by `prefix`, then its `status --json`.
fn active_mtu(prefix: &[&str], addr: &str, tag: &str) -> Value {
    let dir = std::env::temp_dir().join(format!("svmtu-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("sv.sock");
    let mut child = Command::new(prefix[0])
        .args(&prefix[1..])
        .arg(BIN)
        .arg("--socket")
        .arg(&sock)
        .args(["daemon", "--device"])
        .arg(format!("mtu={addr}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("log")).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while softverbs_ipc::connect_seqpacket(&sock).is_err() {
        if let Some(st) = child.try_wait().unwrap() {
            panic!(
                "the daemon exited with {st}: {}",
                std::fs::read_to_string(dir.join("log")).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "the daemon did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = Command::new(BIN)
        .arg("--socket")
        .arg(&sock)
        .args(["status", "--json"])
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["device_status"][0]["ports"][0]["active_mtu"].clone()
}

#[test]
fn the_active_mtu_follows_the_link_in_the_daemons_own_namespace() {
    if !root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    // The daemon's namespace: a 9000-byte link (jumbo frames, the cluster's) and a 1500-byte
    // one. Beside it, a namespace whose same-named interface has 1500: the daemon runs in
    // the first with the second's sysfs (setns alone, as `nsenter --net` does), and both
    // number their interfaces alike (the same links made in the same order).
    let jumbo = Netns::new("jumbo");
    jumbo.link(9000, Some("10.36.9.1/24"));
    let other = Netns::new("other");
    other.link(1500, None);
    let entered = format!("--net=/run/netns/{}", jumbo.0);
    let prefix = ["ip", "netns", "exec", &other.0, "nsenter", &entered];
    // 9000 - 96 bytes of RoCE v2 headers at most leaves room for 4096.
    assert_eq!(active_mtu(&prefix, "10.36.9.1", "entered"), 4096);
    // With a sysfs of its own namespace (`ip netns exec`, what `cluster up` uses).
    let own = ["ip", "netns", "exec", &jumbo.0];
    assert_eq!(active_mtu(&own, "10.36.9.1", "own"), 4096);

    // Ethernet's 1500 carries 1024 (what rxe reports there).
    let plain = Netns::new("plain");
    plain.link(1500, Some("10.36.10.1/24"));
    let own = ["ip", "netns", "exec", &plain.0];
    assert_eq!(active_mtu(&own, "10.36.10.1", "plain"), 1024);
}
