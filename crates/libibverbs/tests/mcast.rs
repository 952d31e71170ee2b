//! UD multicast through the drop-in (`tests/c/mcast.c`, docs/guide/dropin.md "Multicast"):
//! the errnos of `ibv_attach_mcast(3)` / `ibv_detach_mcast(3)` and the limits as `ibv_devinfo
//! -v` shows them; one sender and receivers on one daemon; and, as root, one sender and
//! receivers in three processes over two daemons in two network namespaces joined by a
//! bridge — every attached QP gets every datagram exactly once, a detached QP nothing — and
//! the same with loss and duplication injected by the sending device (then each receiving
//! QP completes each datagram exactly as often as its device received it, never more).
//!
//! Skipped (with a message) without gcc and `verbs.h`, and the namespace tests without root
//! or `ip`. The namespaces, veths and bridge are named `sv2*` and removed by a guard, also
//! when the test fails.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use support::{c_toolchain_missing, compile, have, Daemon, Proc};

const GROUP: &str = "239.1.2.3";
/// An IPv6 group of organisation-local scope (RFC 4291 2.7).
const GROUP6: &str = "ff08::1:2:3";

const ERRNO_CHECKS: &[&str] = &[
    "query_device",
    "max_mcast_grp",
    "max_mcast_qp_attach",
    "max_total_mcast_qp_attach",
    "attach_rc_einval",
    "attach_uc_einval",
    "attach_unicast_einval",
    "attach_ipv6_unicast_einval",
    "detach_rc_einval",
    "attach",
    "attach_twice_ok",
    "attach_ipv6_multicast",
    "detach_ipv6_multicast",
    "detach_not_attached_einval",
    "detach",
    "detach_again_einval",
    "attach_past_max_mcast_qp_attach_enomem",
    "destroy_leaves_group",
];

fn program(dir: &Path) -> Option<PathBuf> {
    if let Some(why) = c_toolchain_missing() {
        eprintln!("SKIP: {why}");
        return None;
    }
    let prog = dir.join("mcast");
    compile("tests/c/mcast.c", &prog);
    Some(prog)
}

#[test]
fn attach_and_detach_refusals_carry_the_kernels_errnos_and_the_limits_are_advertised() {
    let d = Daemon::start("mc-errnos");
    let Some(prog) = program(&d.dir) else { return };
    let (said, status) = d.run("errnos", &prog, &["errnos"]).finish();
    let groups = expected_groups().to_string();
    assert!(
        said.iter()
            .any(|l| l.strip_prefix("max_mcast_grp ") == Some(&groups)),
        "max_mcast_grp is not min(8192, RLIMIT_NOFILE / 8) = {groups}:\n{}",
        said.join("\n")
    );
    let oks: Vec<&str> = said.iter().filter_map(|l| l.strip_prefix("ok ")).collect();
    let summary = format!("mcast: {} checks, 0 failed", ERRNO_CHECKS.len());
    assert!(
        oks == ERRNO_CHECKS && said.last() == Some(&summary) && status.success(),
        "{}\n{}",
        said.join("\n"),
        d.log()
    );
    if have("ibv_devinfo", "ibverbs-utils") {
        let o = d
            .command("ibv_devinfo", &["-v"])
            .output()
            .expect("ibv_devinfo");
        let text = String::from_utf8_lossy(&o.stdout);
        for want in [
            &format!("max_mcast_grp:\t\t\t{groups}") as &str,
            "max_mcast_qp_attach:\t\t56",
            "max_total_mcast_qp_attach:\t458752",
        ] {
            assert!(
                text.contains(want),
                "ibv_devinfo -v lacks {want:?}:\n{text}"
            );
        }
    }
}

/// The daemon's `max_mcast_grp` with one device: rxe's 8192, at most an eighth of its
/// `RLIMIT_NOFILE` (which it inherits from this test).
fn expected_groups() -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").expect("/proc/self/limits");
    let soft: u64 = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .expect("Max open files");
    (soft / 8).clamp(1, 8192)
}

/// A receiver's report after "stop": datagram id → copies, and its bad-completion count.
struct Report {
    counts: BTreeMap<u32, u32>,
    bad: u32,
    src: String,
}

fn stop(mut r: Proc) -> Report {
    r.tell("stop");
    let mut counts = BTreeMap::new();
    let mut bad = u32::MAX;
    let mut src = String::new();
    loop {
        let l = r.line();
        if let Some(rest) = l.strip_prefix("got ") {
            let (id, n) = rest.split_once(' ').expect("got ID COUNT");
            let id: u32 = id.parse().unwrap();
            if id < MARKERS {
                counts.insert(id, n.parse().unwrap());
            }
        } else if let Some(b) = l.strip_prefix("bad ") {
            bad = b.parse().unwrap();
        } else if let Some(s) = l.strip_prefix("src ") {
            src = s.to_string();
        } else if l == "done" {
            break;
        } else {
            panic!("receiver said {l:?}");
        }
    }
    r.exits_zero();
    Report { counts, bad, src }
}

fn once(ids: std::ops::Range<u32>) -> BTreeMap<u32, u32> {
    ids.map(|i| (i, 1)).collect()
}

/// Marker datagrams (ids from `first`, one more each round) until every receiver has one:
/// the path from the sender to each receiver keeps the order of datagrams (one socket,
/// one link, no reordering fault), so a receiver holding a marker holds every datagram sent
/// before it that will ever arrive. Bounded by the harness's wait.
fn settle(s: &mut Proc, receivers: &mut [&mut Proc], first: u32) {
    let deadline = Instant::now() + support::WAIT;
    let mut id = first;
    loop {
        s.tell(&format!("mark {id}"));
        assert_eq!(s.expect("marked "), "self 0", "rxe: no copy to the sender");
        let mut all = true;
        for r in receivers.iter_mut() {
            r.tell(&format!("seen {id}"));
            all &= r.expect("seen ") == "1";
        }
        if all {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "marker {id} never reached every receiver"
        );
        std::thread::sleep(Duration::from_millis(20));
        id += 1;
    }
}

/// Ids below the markers' (`settle`).
const MARKERS: u32 = 90_000;

/// Sends `first..first+count` from `s`; the sender must not have received its own datagrams.
fn send(s: &mut Proc, first: u32, count: u32) {
    s.tell(&format!("send {first} {count}"));
    assert_eq!(
        s.expect("sent "),
        format!("{count} self 0"),
        "rxe: no copy to the sender"
    );
}

#[test]
fn every_attached_qp_of_one_daemon_gets_every_datagram_once() {
    let d = Daemon::start("mc-one");
    let Some(prog) = program(&d.dir) else { return };
    let mut s = d.run("send", &prog, &["send", GROUP]);
    let sq = s.expect("qp ");
    let mut receivers: Vec<Proc> = (0..2)
        .map(|i| {
            let r = d.run(&format!("recv{i}"), &prog, &["recv", GROUP]);
            r.expect("qp ");
            r.expect("ready");
            r
        })
        .collect();
    let mut gone = d.run("detached", &prog, &["recv", GROUP]);
    gone.expect("qp ");
    gone.expect("ready");
    gone.tell("detach");
    gone.expect("detached");
    // What a user sees: the sender and the two receivers attached, the detached QP not.
    d.wait_until("three QPs attached", |v| {
        v["qps"].as_array().is_some_and(|qps| {
            qps.iter()
                .filter(|q| q["mcast_groups"] == serde_json::json!([GROUP]))
                .count()
                == 3
        })
    });
    send(&mut s, 0, 30);
    {
        let mut rs: Vec<&mut Proc> = receivers.iter_mut().collect();
        settle(&mut s, &mut rs, MARKERS);
    }
    for r in receivers {
        let rep = stop(r);
        assert_eq!(rep.counts, once(0..30), "{}", d.log());
        assert_eq!((rep.bad, rep.src), (0, format!("1 {sq}")));
    }
    let rep = stop(gone);
    assert!(rep.counts.is_empty(), "a detached QP receives nothing");
    s.close_stdin();
    s.exits_zero();
}

// ---- two daemons in two network namespaces on a bridge (root) ------------------------------

/// Two namespaces (`sv2<t>a`, `sv2<t>b`), each with a veth whose peer is on a bridge in a
/// third (`sv2<t>h`): two hosts on one Ethernet segment. Removed on drop, whatever happened;
/// a stale set from an earlier crashed run is removed first.
struct Segment {
    tag: char,
    v6: bool,
    dir: PathBuf,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let o = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr)
        ))
    }
}

impl Segment {
    fn ns(&self, host: char) -> String {
        format!("sv2{}{host}", self.tag)
    }

    fn dev(&self, host: char) -> String {
        format!("sv2{}{host}0", self.tag)
    }

    fn addr(&self, host: char) -> String {
        let n = if host == 'a' { 1 } else { 2 };
        if self.v6 {
            format!("fd92::{n}")
        } else {
            format!("10.92.0.{n}")
        }
    }

    fn group(&self) -> &'static str {
        if self.v6 {
            GROUP6
        } else {
            GROUP
        }
    }

    /// The segment, or None after saying `SKIP` and why (not root, no `ip`).
    fn new(tag: char, v6: bool) -> Option<Segment> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIP: network namespaces need root (CI runs as root)");
            return None;
        }
        if !have("ip", "iproute2") {
            return None;
        }
        let dir = std::env::temp_dir().join(format!("sv2-mcast-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("segment dir");
        let seg = Segment { tag, v6, dir };
        seg.remove();
        seg.build()
            .unwrap_or_else(|e| panic!("building the segment: {e}"));
        Some(seg)
    }

    fn build(&self) -> Result<(), String> {
        let hub = self.ns('h');
        let br = format!("sv2{}br", self.tag);
        for h in ['a', 'b', 'h'] {
            ip(&["netns", "add", &self.ns(h)])?;
            ip(&["-n", &self.ns(h), "link", "set", "lo", "up"])?;
        }
        // No IGMP snooping: the bridge floods the group to both ports, as a small switch.
        ip(&[
            "-n",
            &hub,
            "link",
            "add",
            &br,
            "type",
            "bridge",
            "mcast_snooping",
            "0",
        ])?;
        ip(&["-n", &hub, "link", "set", &br, "up"])?;
        for h in ['a', 'b'] {
            let (ns, dev) = (self.ns(h), self.dev(h));
            let peer = format!("sv2{}{h}1", self.tag);
            ip(&[
                "link", "add", &dev, "netns", &ns, "type", "veth", "peer", "name", &peer, "netns",
                &hub,
            ])?;
            ip(&["-n", &hub, "link", "set", &peer, "master", &br, "up"])?;
            if self.v6 {
                // nodad: the address is usable at once, not tentative for a second.
                let a = format!("{}/64", self.addr(h));
                ip(&["-n", &ns, "addr", "add", &a, "dev", &dev, "nodad"])?;
                ip(&["-n", &ns, "link", "set", &dev, "up"])?;
                // The kernel routes ff00::/8 on every IPv6 interface by itself.
            } else {
                let a = format!("{}/24", self.addr(h));
                ip(&["-n", &ns, "addr", "add", &a, "dev", &dev])?;
                ip(&["-n", &ns, "link", "set", &dev, "up"])?;
                ip(&["-n", &ns, "route", "add", "224.0.0.0/4", "dev", &dev])?;
            }
        }
        Ok(())
    }

    fn remove(&self) {
        for h in ['a', 'b', 'h'] {
            let _ = ip(&["netns", "del", &self.ns(h)]);
        }
    }

    /// A daemon whose device `softverbs0` is host `h`'s veth address, running in `h`'s
    /// namespace (clients reach it by its Unix socket, which namespaces do not separate).
    fn daemon(&self, h: char, args: &[&str]) -> Daemon {
        let name = format!("mc-{}{h}", self.tag);
        Daemon::start_with_options(
            softverbs_testkit::Daemon::options(&name)
                .netns(&self.ns(h))
                .device("softverbs0", &self.addr(h))
                .args(args),
        )
    }

    /// The multicast addresses host `h`'s interface has joined (`ip maddr`).
    fn joined(&self, h: char) -> String {
        let o = Command::new("ip")
            .args(["-n", &self.ns(h), "maddr", "show", "dev", &self.dev(h)])
            .output()
            .expect("ip maddr");
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn wait_joined(&self, h: char, want: bool) {
        let deadline = Instant::now() + support::WAIT;
        let group = self.group();
        while self.joined(h).contains(group) != want {
            assert!(
                Instant::now() < deadline,
                "host {h} {} {group}:\n{}",
                if want { "never joined" } else { "never left" },
                self.joined(h)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.remove();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn receiver(d: &Daemon, prog: &Path, name: &str, group: &str) -> Proc {
    let r = d.run(name, prog, &["recv", group]);
    r.expect("qp ");
    r.expect("ready");
    r
}

#[test]
fn across_two_daemons_on_a_bridge_every_attached_qp_gets_every_datagram_once() {
    across_two_daemons('e', false);
}

#[test]
fn ipv6_multicast_across_two_daemons_on_a_bridge() {
    across_two_daemons('6', true);
}

fn across_two_daemons(tag: char, v6: bool) {
    let Some(seg) = Segment::new(tag, v6) else {
        return;
    };
    let g = seg.group();
    let a = seg.daemon('a', &[]);
    let b = seg.daemon('b', &[]);
    let Some(prog) = program(&seg.dir) else {
        return;
    };
    let mut s = a.run("send", &prog, &["send", g]);
    let sq = s.expect("qp ");
    let mut r1 = receiver(&a, &prog, "r1", g);
    let mut r2 = receiver(&b, &prog, "r2", g);
    let mut r3 = receiver(&b, &prog, "r3", g);
    let mut gone = receiver(&b, &prog, "gone", g);
    gone.tell("detach");
    gone.expect("detached");
    // The devices joined the group on their own interfaces with their first QP.
    seg.wait_joined('a', true);
    seg.wait_joined('b', true);
    send(&mut s, 0, 40);
    // A detach takes effect at once, also for datagrams still in daemon b's socket: detach
    // once r3 has everything before the marker.
    settle(&mut s, &mut [&mut r1, &mut r2, &mut r3], 90_000);
    r3.tell("detach");
    r3.expect("detached");
    send(&mut s, 40, 40);
    settle(&mut s, &mut [&mut r1, &mut r2], 91_000);
    let logs = || format!("daemon a:\n{}\ndaemon b:\n{}", a.log(), b.log());
    for (r, want, who) in [
        (r1, once(0..80), "r1 (the sender's daemon)"),
        (r2, once(0..80), "r2 (the other daemon)"),
        (r3, once(0..40), "r3 (detached after 40)"),
    ] {
        let rep = stop(r);
        assert_eq!(rep.counts, want, "{who}\n{}", logs());
        assert_eq!((rep.bad, rep.src), (0, format!("1 {sq}")), "{who}");
    }
    assert!(stop(gone).counts.is_empty(), "a detached QP gets nothing");
    // Its last QP gone, daemon b's device left the group.
    seg.wait_joined('b', false);
    s.close_stdin();
    s.exits_zero();
}

/// Datagram id → frames in a pcap file that carry it (payload "mc" + 5 digits), markers
/// left out.
fn pcap_counts(path: &Path) -> BTreeMap<u32, u32> {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(data.len() >= 24, "pcap header");
    let mut counts = BTreeMap::new();
    let mut at = 24;
    while at + 16 <= data.len() {
        let len = u32::from_le_bytes(data[at + 8..at + 12].try_into().unwrap()) as usize;
        let frame = &data[at + 16..(at + 16 + len).min(data.len())];
        at += 16 + len;
        if let Some(p) = frame
            .windows(7)
            .position(|w| w.starts_with(b"mc") && w[2..].iter().all(u8::is_ascii_digit))
        {
            let id: u32 = std::str::from_utf8(&frame[p + 2..p + 7])
                .unwrap()
                .parse()
                .unwrap();
            if id < MARKERS {
                *counts.entry(id).or_default() += 1;
            }
        }
    }
    counts
}

/// UD is unreliable: the sending device's injected faults (loss 20 %, duplication 20 %)
/// lose some datagrams and put some on the wire twice, and nothing above the link removes
/// or restores any. What the test asserts, per receiving QP on the other daemon and per
/// datagram id: the QP completed it exactly as many times as that daemon's device received
/// it from the link (its capture), so never more; the receiver on the sender's own daemon,
/// reached without the link, completed each exactly once; and the capture shows at least one
/// loss and one duplicate, so the comparison is not vacuous.
#[test]
fn with_loss_and_duplication_no_receiver_sees_a_datagram_more_often_than_the_link_gave_it() {
    let Some(seg) = Segment::new('f', false) else {
        return;
    };
    let a = seg.daemon('a', &["--faults", "loss=0.2,dup=0.2"]);
    let cap = seg.dir.join("capture-b");
    std::fs::create_dir_all(&cap).unwrap();
    let mut b = seg.daemon('b', &["--capture", cap.to_str().unwrap()]);
    let Some(prog) = program(&seg.dir) else {
        return;
    };
    let mut s = a.run("send", &prog, &["send", GROUP]);
    let sq = s.expect("qp ");
    let mut local = receiver(&a, &prog, "local", GROUP);
    let mut r2 = receiver(&b, &prog, "r2", GROUP);
    let mut r3 = receiver(&b, &prog, "r3", GROUP);
    seg.wait_joined('b', true);
    send(&mut s, 0, 200);
    // Lost markers are sent again; the capture's count of 0..200 is final once one arrived.
    settle(&mut s, &mut [&mut local, &mut r2, &mut r3], MARKERS);
    let rl = stop(local);
    let (rep2, rep3) = (stop(r2), stop(r3));
    b.stop();
    let link = pcap_counts(&cap.join("softverbs0.pcap"));
    assert_eq!(
        rl.counts,
        once(0..200),
        "in-process delivery sees no link faults"
    );
    for (rep, who) in [(&rep2, "r2"), (&rep3, "r3")] {
        assert_eq!(
            (rep.bad, rep.src.as_str()),
            (0, format!("1 {sq}").as_str()),
            "{who}"
        );
        for id in 0..200 {
            let (got, wire) = (
                rep.counts.get(&id).copied().unwrap_or(0),
                link.get(&id).copied().unwrap_or(0),
            );
            assert!(
                got <= wire,
                "{who}: datagram {id} completed {got}x, the link gave {wire}"
            );
            assert_eq!(got, wire, "{who}: datagram {id} (receives to spare)");
        }
    }
    assert!(
        (0..200).any(|id| !link.contains_key(&id)),
        "no datagram was lost: {link:?}"
    );
    assert!(link.values().any(|&n| n >= 2), "no datagram was duplicated");
    s.close_stdin();
    s.exits_zero();
}
