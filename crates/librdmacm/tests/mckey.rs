//! rdmacm-utils' `mckey`, unmodified, on the drop-in librdmacm's multicast joins
//! (`rdma_join_multicast`, MULTICAST_JOIN's UD parameters, `rdma_leave_multicast`): a
//! receiver joins a group, a sender joins as well and sends to it, and the receiver gets
//! every message (mckey fails if one does not arrive). On one daemon, and between two daemons
//! in two network namespaces on a bridge (`sv11ma`, `sv11mb`, bridge `sv11mbr` in `sv11mh`,
//! made and removed by the test). The daemon's status shows the group with the receiver's QP while
//! it is joined, and nothing once both have left.
//!
//! Skipped (with a message) when rdmacm-utils is missing; the bridge test also needs root
//! and `ip` (CI has all). Build first: `cargo build -p softverbs-cli -p softverbs-librdmacm`.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use softverbs_testkit::bins::softverbs_bin;
use softverbs_testkit::process::{finish, text};
use softverbs_testkit::Daemon;
use support::{have, lib, ok};

const MESSAGES: &str = "10";

/// A directory of this test's own holding `libibverbs.so.1` and `librdmacm.so.1` of this
/// build, so `softverbs run` puts exactly these on LD_LIBRARY_PATH (not the per-user
/// directory another build may point elsewhere meanwhile).
fn lib_dir(dir: &Path) -> PathBuf {
    let d = dir.join("lib");
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    for (so, link) in [
        ("libibverbs.so", "libibverbs.so.1"),
        ("librdmacm.so", "librdmacm.so.1"),
    ] {
        std::os::unix::fs::symlink(lib(so), d.join(link)).unwrap();
    }
    d.join("libibverbs.so.1")
}

/// `[ip netns exec NS] softverbs --socket S run -- mckey ARGS`.
fn mckey(netns: Option<&str>, socket: &Path, libibverbs: &Path, args: &[&str]) -> Child {
    run(netns, socket, libibverbs, "mckey", args)
}

/// `[ip netns exec NS] softverbs --socket S run -- PROG ARGS`.
fn run(netns: Option<&str>, socket: &Path, libibverbs: &Path, prog: &str, args: &[&str]) -> Child {
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
        .args(["run", "--", prog])
        .args(args)
        .env("SOFTVERBS_AUTOSTART", "0")
        .env("SOFTVERBS_LIBIBVERBS", libibverbs)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("softverbs run {prog}: {e}"))
}

/// The QPs attached to `group` on the daemon's first device, as `softverbs status` shows.
fn group_qps(socket: &Path, group: &str) -> Vec<u64> {
    let o = Command::new(softverbs_bin())
        .arg("--socket")
        .arg(socket)
        .args(["status", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    v["device_status"][0]["mcast_groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|g| g["group"] == group)
        .flat_map(|g| g["qpns"].as_array().cloned().unwrap_or_default())
        .filter_map(|q| q.as_u64())
        .collect()
}

fn wait_group(socket: &Path, group: &str, joined: bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while group_qps(socket, group).is_empty() == joined {
        assert!(
            Instant::now() < deadline,
            "group {group} never {} on {}",
            if joined { "joined" } else { "left" },
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A receiver at `rx`, then (once its QP is in the group) a sender at `tx`.
fn receive_and_send(
    group: &str,
    rx: (Option<&str>, &Path, &str),
    tx: (Option<&str>, &Path, &str),
    libibverbs: &Path,
) {
    let receiver = mckey(
        rx.0,
        rx.1,
        libibverbs,
        &["-m", group, "-b", rx.2, "-C", MESSAGES],
    );
    wait_group(rx.1, group, true);
    let sender = finish(
        mckey(
            tx.0,
            tx.1,
            libibverbs,
            &["-m", group, "-b", tx.2, "-s", "-C", MESSAGES],
        ),
        "mckey -s",
    );
    let receiver = finish(receiver, "mckey");
    let (r, s) = (ok(receiver, "mckey (receiver)"), ok(sender, "mckey -s"));
    for (who, out) in [("receiver", &r), ("sender", &s)] {
        assert!(out.contains("data transfers complete"), "{who}: {out}");
        assert!(
            out.contains(&format!("joined dgid: ::ffff:{group}")),
            "{who} reports the RoCE MGID of the group: {out}"
        );
    }
    wait_group(rx.1, group, false);
    wait_group(tx.1, group, false);
}

#[test]
fn mckey_on_one_daemon() {
    if !have("mckey") {
        return;
    }
    let d = Daemon::start("sv11-mckey");
    let libibverbs = lib_dir(&d.dir);
    let at = (None, d.socket.as_path(), "127.0.0.1");
    receive_and_send("230.11.0.1", at, at, &libibverbs);
}

/// Two namespaces with a veth each onto a bridge in a third: two hosts on one segment.
/// Named `sv11<tag>a`, `sv11<tag>b` and `sv11<tag>h` (bridge `sv11<tag>br`), so tests that
/// run at once each have their own.
struct Segment {
    tag: char,
    net: u8,
    dir: PathBuf,
}

fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("ip");
    assert!(o.status.success(), "ip {}: {}", args.join(" "), text(&o));
}

impl Segment {
    fn up(tag: char, net: u8) -> Segment {
        let dir = std::env::temp_dir().join(format!("sv11-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let seg = Segment { tag, net, dir };
        seg.remove();
        let hub = seg.ns('h');
        let br = format!("sv11{tag}br");
        for h in ['a', 'b', 'h'] {
            ip(&["netns", "add", &seg.ns(h)]);
            ip(&["-n", &seg.ns(h), "link", "set", "lo", "up"]);
        }
        // No IGMP snooping: the bridge floods the group to both ports, as a small switch.
        let bridge = ["link", "add", &br, "type", "bridge", "mcast_snooping", "0"];
        ip(&[&["-n", hub.as_str()][..], &bridge[..]].concat());
        ip(&["-n", &hub, "link", "set", &br, "up"]);
        for h in ['a', 'b'] {
            let (ns, addr) = (seg.ns(h), seg.addr(h));
            let (dev, peer) = (format!("{ns}0"), format!("{ns}1"));
            let veth = ["type", "veth", "peer", "name", &peer, "netns", &hub];
            ip(&[&["link", "add", &dev, "netns", &ns][..], &veth[..]].concat());
            ip(&["-n", &hub, "link", "set", &peer, "master", &br, "up"]);
            ip(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", &dev]);
            ip(&["-n", &ns, "link", "set", &dev, "up"]);
            ip(&["-n", &ns, "route", "add", "224.0.0.0/4", "dev", &dev]);
        }
        seg
    }

    fn ns(&self, h: char) -> String {
        format!("sv11{}{h}", self.tag)
    }

    fn addr(&self, h: char) -> String {
        format!("10.111.{}.{}", self.net, if h == 'a' { 1 } else { 2 })
    }

    fn remove(&self) {
        for h in ['a', 'b', 'h'] {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.ns(h)])
                .stderr(Stdio::null())
                .status();
        }
    }

    /// A daemon in `ns` whose device is `addr`; its socket.
    fn daemon(&self, ns: &str, addr: &str) -> (KillOnDrop, PathBuf) {
        let sock = self.dir.join(format!("{ns}.sock"));
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(softverbs_bin())
            .arg("daemon")
            .arg("--socket")
            .arg(&sock)
            .arg("--device")
            .arg(format!("softverbs0={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join(format!("{ns}.log"))).unwrap())
            .spawn()
            .unwrap();
        let child = KillOnDrop(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !Command::new(softverbs_bin())
            .arg("--socket")
            .arg(&sock)
            .arg("status")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            assert!(Instant::now() < deadline, "daemon in {ns} did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        (child, sock)
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.remove();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn mckey_between_two_daemons_on_a_bridge() {
    if !have("mckey") || !have("ip") {
        return;
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        eprintln!("SKIP: network namespaces need root");
        return;
    }
    let seg = Segment::up('m', 1);
    let libibverbs = lib_dir(&seg.dir);
    let (na, aa, nb, ab) = (seg.ns('a'), seg.addr('a'), seg.ns('b'), seg.addr('b'));
    let (na, aa, nb, ab) = (na.as_str(), aa.as_str(), nb.as_str(), ab.as_str());
    // Daemons before the segment in drop order: they go first.
    let (_da, sa) = seg.daemon(na, aa);
    let (_db, sb) = seg.daemon(nb, ab);
    receive_and_send(
        "230.11.0.2",
        (Some(nb), &sb, ab),
        (Some(na), &sa, aa),
        &libibverbs,
    );
}
