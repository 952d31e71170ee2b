//! UD multicast through the drop-in (`tests/c/mcast.c`, docs/dropin.md "Multicast"):
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

use support::{c_toolchain_missing, compile, have, Daemon, Proc};

const GROUP: &str = "239.1.2.3";

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
    let oks: Vec<&str> = said.iter().filter_map(|l| l.strip_prefix("ok ")).collect();
    let summary = format!("mcast: {} checks, 0 failed", ERRNO_CHECKS.len());
    assert!(
        oks == ERRNO_CHECKS && said.last() == Some(&summary) && status.success(),
        "{}\n{}",
        said.join("\n"),
        d.log()
    );
    if have("ibv_devinfo", "ibverbs-utils") {
        let o = d.command("ibv_devinfo", &["-v"]).output().expect("ibv_devinfo");
        let text = String::from_utf8_lossy(&o.stdout);
        for want in [
            "max_mcast_grp:\t\t\t8192",
            "max_mcast_qp_attach:\t\t56",
            "max_total_mcast_qp_attach:\t458752",
        ] {
            assert!(text.contains(want), "ibv_devinfo -v lacks {want:?}:\n{text}");
        }
    }
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
            counts.insert(id.parse().unwrap(), n.parse().unwrap());
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

/// Sends `first..first+count` from `s`; the sender must not have received its own datagrams.
fn send(s: &mut Proc, first: u32, count: u32) {
    s.tell(&format!("send {first} {count}"));
    assert_eq!(s.expect("sent "), format!("{count} self 0"), "rxe: no copy to the sender");
}

#[test]
fn every_attached_qp_of_one_daemon_gets_every_datagram_once() {
    let d = Daemon::start("mc-one");
    let Some(prog) = program(&d.dir) else { return };
    let mut s = d.run("send", &prog, &["send", GROUP]);
    let sq = s.expect("qp ");
    let receivers: Vec<Proc> = (0..2)
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
    send(&mut s, 0, 30);
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
