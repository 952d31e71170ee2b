//! Real processes against a real daemon: the daemon runs as its own process
//! (`softverbs daemon`), clients are the demo's `softverbs demo-actor` processes and the
//! `softverbs-test-actor hoarder`, and every check goes through `softverbs resources --json`,
//! as a user would look.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use softverbs_testkit::resources::{has_pid, holders};
use softverbs_testkit::{Actor, Daemon};

const ACTOR: &str = env!("CARGO_BIN_EXE_softverbs-test-actor");

/// A daemon whose directory clients of other uids can reach.
fn start(name: &str) -> Daemon {
    Daemon::options(name).open_to_all().start()
}

/// The clients these tests start on a daemon.
trait Clients {
    /// One of the demo's processes (`softverbs demo-actor ROLE ...`), as `softverbs demo`
    /// runs them.
    fn actor(&self, args: &[&str]) -> Actor;
    /// [`Clients::actor`] as user `uid` (and its group).
    fn actor_as(&self, args: &[&str], uid: Option<u32>) -> Actor;
    /// A `softverbs-test-actor ROLE ...` process.
    fn test_actor(&self, args: &[&str]) -> Actor;
}

impl Clients for Daemon {
    fn actor(&self, args: &[&str]) -> Actor {
        self.actor_as(args, None)
    }

    fn actor_as(&self, args: &[&str], uid: Option<u32>) -> Actor {
        let bin = match uid {
            Some(_) => private_copy_of(self, &self.bin),
            None => self.bin.clone(),
        };
        let mut cmd = self.client(bin);
        cmd.arg("demo-actor").args(args);
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        Actor::spawn(args[0], cmd)
    }

    fn test_actor(&self, args: &[&str]) -> Actor {
        self.spawn_actor(ACTOR, args)
    }
}

/// A copy of `bin` that another uid can execute (the build tree may not be reachable).
fn private_copy_of(d: &Daemon, bin: &Path) -> PathBuf {
    let p = d.dir.join(bin.file_name().unwrap());
    if !p.exists() {
        softverbs_testkit::bins::copy_executable(bin, &p);
    }
    p
}

/// A worker told to leave.
trait Leave {
    /// Sends `LEAVE` and returns the `LEFT` line once the worker has exited.
    fn leave(&mut self) -> String;
}

impl Leave for Actor {
    fn leave(&mut self) -> String {
        self.send("LEAVE");
        let l = self.expect("LEFT");
        self.child.wait().unwrap();
        l
    }
}

fn qpn_of(line: &str) -> u32 {
    line.rsplit(['=', ' ']).next().unwrap().parse().unwrap()
}

#[test]
fn the_receive_qp_survives_its_creators_sigkill_and_events_reach_exactly_its_holders() {
    let d = start("persist");
    let file = d.domain_file("domain", 0o644);
    let f = file.to_str().unwrap();
    let mut creator = d.actor(&["creator", "--file", f]);
    let qpn = qpn_of(&creator.expect("QPN"));
    let w1 = d.actor(&[
        "worker",
        "--file",
        f,
        "--qpn",
        &qpn.to_string(),
        "--face",
        "legacy",
    ]);
    w1.expect("JOINED registration");
    let w2 = d.actor(&[
        "worker",
        "--file",
        f,
        "--qpn",
        &qpn.to_string(),
        "--face",
        "upstream",
    ]);
    let joined = w2.expect("JOINED handle=");
    // A bystander in the same domain, holding another receive QP.
    let other = d.actor(&["creator", "--file", f]);
    let other_qpn = qpn_of(&other.expect("QPN"));
    let w3 = d.actor(&[
        "worker",
        "--file",
        f,
        "--qpn",
        &other_qpn.to_string(),
        "--face",
        "minimal",
    ]);
    w3.expect("JOINED registration");

    let r = d.resources();
    assert_eq!(holders(&r, qpn).unwrap().len(), 3);
    let creator_pid = creator.pid();
    creator.kill9();
    let r = d.wait_until("the creator's context is gone", |r| {
        !has_pid(r, creator_pid)
    });
    let h = holders(&r, qpn).expect("the QP outlives its creator");
    assert_eq!(
        h,
        vec![
            (w1.pid(), "Registration".into()),
            (w2.pid(), "Opened".into())
        ]
    );

    let out = d.cli(&[
        "inject-event",
        "--qpn",
        &qpn.to_string(),
        "--event",
        "path-mig",
    ]);
    assert!(out.contains("delivered to 2 context(s)"), "{out}");
    assert_eq!(
        w1.expect("EVENT"),
        format!("EVENT PathMig xrc-qpn={qpn} legacy_type=0x80000006")
    );
    let handle = joined.split('=').nth(1).unwrap().split(' ').next().unwrap();
    assert_eq!(
        w2.expect("EVENT"),
        format!("EVENT PathMig qp-handle={handle} legacy_type=0x6")
    );
    // The bystander's first event is the one raised on its own QP afterwards: nothing of the
    // first QP's reached it.
    d.cli(&[
        "inject-event",
        "--qpn",
        &other_qpn.to_string(),
        "--event",
        "comm-est",
    ]);
    assert_eq!(
        w3.expect("EVENT"),
        format!("EVENT CommEst xrc-qpn={other_qpn} legacy_type=0x80000004")
    );
}

#[test]
fn every_object_is_freed_when_every_client_dies() {
    let d = start("cleanup");
    let file = d.domain_file("domain", 0o644);
    let f = file.to_str().unwrap();
    let mut hoarders: Vec<Actor> = (0..3)
        .map(|_| d.test_actor(&["hoarder", "--file", f]))
        .collect();
    let qpns: Vec<u32> = hoarders
        .iter()
        .map(|h| qpn_of(&h.expect("READY")))
        .collect();
    // Cross-registrations, so receive QPs are shared between dying processes.
    let mut joiners: Vec<Actor> = qpns
        .iter()
        .map(|q| {
            let w = d.actor(&[
                "worker",
                "--file",
                f,
                "--qpn",
                &q.to_string(),
                "--face",
                "upstream",
            ]);
            w.expect("JOINED");
            w
        })
        .collect();
    let r = d.resources();
    assert_eq!(r["contexts"].as_array().unwrap().len(), 6);
    assert!(r["qps"].as_array().unwrap().len() >= 15);
    assert_eq!(r["xrcds"].as_array().unwrap().len(), 1);
    for a in hoarders.iter_mut().chain(joiners.iter_mut()) {
        a.kill9();
    }
    let r = d.wait_until("every context is gone", |r| {
        r["contexts"].as_array().unwrap().is_empty()
    });
    for section in ["xrcds", "srqs", "cqs", "qps", "xrc_recv_qps"] {
        assert_eq!(
            r[section].as_array().unwrap().len(),
            0,
            "{section} leaked: {r:#}"
        );
    }
    let status: Value = serde_json::from_str(&d.cli(&["status", "--json"])).unwrap();
    for k in [
        "contexts",
        "xrcds",
        "xrc_recv_qps",
        "qps",
        "srqs",
        "cqs",
        "mrs",
    ] {
        assert_eq!(status[k], 0, "{k} leaked: {status}");
    }
}

#[test]
fn workers_leaving_one_by_one_take_the_qp_and_then_the_domain_with_the_last() {
    let d = start("leave");
    let file = d.domain_file("domain", 0o644);
    let f = file.to_str().unwrap();
    let mut creator = d.actor(&["creator", "--file", f]);
    let qpn = qpn_of(&creator.expect("QPN"));
    let mut crew: Vec<Actor> = ["legacy", "minimal", "upstream"]
        .iter()
        .map(|face| {
            let w = d.actor(&[
                "worker",
                "--file",
                f,
                "--qpn",
                &qpn.to_string(),
                "--face",
                face,
            ]);
            w.expect("JOINED");
            w
        })
        .collect();
    let cp = creator.pid();
    creator.kill9();
    d.wait_until("the creator is gone", |r| !has_pid(r, cp));
    let n = crew.len();
    for (i, w) in crew.iter_mut().enumerate() {
        assert_eq!(w.leave(), "LEFT events_reported=0");
        let pid = w.pid();
        let r = d.wait_until("the worker is gone", |r| !has_pid(r, pid));
        let left = n - i - 1;
        assert_eq!(
            holders(&r, qpn).map(|h| h.len()),
            (left > 0).then_some(left)
        );
        assert_eq!(r["xrcds"].as_array().unwrap().len(), usize::from(left > 0));
    }
}

#[test]
fn a_client_of_another_uid_cannot_open_a_domain_whose_file_it_cannot_open() {
    if rustix::process::geteuid().as_raw() != 0 {
        eprintln!("skipped: needs root to run a client as another uid");
        return;
    }
    const NOBODY: u32 = 65534;
    let d = start("uid");
    let file = d.domain_file("private-domain", 0o600);
    let f = file.to_str().unwrap();
    let creator = d.actor(&["creator", "--file", f]);
    let qpn = qpn_of(&creator.expect("QPN")).to_string();
    let intruder = d.actor_as(
        &["worker", "--file", f, "--qpn", &qpn, "--face", "legacy"],
        Some(NOBODY),
    );
    let said = intruder.line();
    assert!(
        said.starts_with("ERROR open domain file") && said.contains("ermission denied"),
        "{said}"
    );
    let r = d.resources();
    assert_eq!(
        holders(&r, qpn.parse().unwrap()).unwrap().len(),
        1,
        "the intruder joined nothing"
    );
    assert_eq!(r["xrcds"][0]["opens"], 1);
    // The file's permissions are the control, not the uid: once the file is readable, the same
    // uid joins.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let guest = d.actor_as(
        &["worker", "--file", f, "--qpn", &qpn, "--face", "legacy"],
        Some(NOBODY),
    );
    guest.expect("JOINED registration");
    let r = d.resources();
    let h = holders(&r, qpn.parse().unwrap()).unwrap();
    assert_eq!(h.len(), 2);
    let guest_ctx = r["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["pid"] == guest.pid())
        .unwrap();
    assert_eq!(guest_ctx["uid"], NOBODY);
}

/// Runs `softverbs demo --workers 4` against `d`, its sender's daemon at `remote_ip`, and
/// checks what a user reads: the story,
/// and that the stream through the shared receive QP reached every worker's SRQ, every
/// message once and intact, across the creator's SIGKILL.
fn run_demo(d: &Daemon, remote_ip: &str) {
    let out = Command::new(&d.bin)
        .arg("--socket")
        .arg(&d.socket)
        .args(["demo", "--workers", "4", "--remote-ip", remote_ip])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("killed with SIGKILL mid-stream"), "{text}");
    assert!(text.contains("the QP outlives its creator with 4 holders"));
    assert!(text.contains("delivered it to 4 context(s)"));
    assert!(text.contains("the last holder is gone, and so is the QP"));
    assert!(text.contains("every step behaved"));
    // "the stream went on: N messages acknowledged, ..." and one line per worker.
    let total: usize = text
        .split("the stream went on: ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no stream total: {text}"));
    let counts: Vec<usize> = text
        .lines()
        .filter(|l| l.ends_with("none lost, duplicated or corrupt"))
        .map(|l| {
            let n = l.split(" received ").nth(1).unwrap();
            n.split_whitespace().next().unwrap().parse().unwrap()
        })
        .collect();
    assert_eq!(counts.len(), 4, "one clean report per worker: {text}");
    assert_eq!(counts.iter().sum::<usize>(), total, "{text}");
    // Message i goes to worker i % 4: the shares differ by at most one.
    assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1);
    assert!(total >= 300, "both halves of the stream: {text}");
}

#[test]
fn the_demo_tells_the_whole_story_and_exits_zero() {
    // The sender's daemon reaches this one over UDP: it needs its device bound. Addresses
    // of their own, as the tests of this file run in parallel.
    let d = Daemon::options("demo")
        .open_to_all()
        .device("softverbs0", "127.0.0.21")
        .start();
    run_demo(&d, "127.0.0.22");
}

/// Lost, duplicated and reordered packets on the receiving daemon's link (its ACKs and NAKs
/// to the sender) cost retransmissions, never a lost or duplicated message.
#[test]
fn the_demo_stream_survives_a_lossy_link() {
    let d = Daemon::options("demo-faults")
        .open_to_all()
        .device("softverbs0", "127.0.0.23")
        .args(&["--faults", "loss=0.05,dup=0.05,reorder=0.05"])
        .start();
    run_demo(&d, "127.0.0.24");
}

/// A daemon without network (`--no-network`) cannot receive the sender's stream: the demo
/// says so and exits non-zero rather than report data it never saw.
#[test]
fn the_demo_fails_when_no_message_gets_through() {
    let d = start("demo-nonet");
    let out = Command::new(&d.bin)
        .arg("--socket")
        .arg(&d.socket)
        .args(["demo", "--workers", "2", "--remote-ip", "127.0.0.25"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("softverbs demo FAILED"), "{err}");
    assert!(err.contains("no message got through"), "{err}");
}
