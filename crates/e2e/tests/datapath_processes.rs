//! The data path with real processes: `softverbs daemon` processes (one, or two talking RoCE v2
//! over UDP on loopback addresses) and `softverbs-test-actor dp-*` client processes that post
//! work requests, poll completions and check every byte themselves (they print `OK` lines
//! with digests; see `crates/e2e/src/dp_actor.rs`).
//!
//! The soak test's length comes from `SOFTVERBS_SOAK_MESSAGES` (default 20,000 messages). The
//! full run is one million messages:
//!
//! ```text
//! cargo build --release -p softverbs-cli
//! SOFTVERBS_SOAK_MESSAGES=1000000 CARGO_TARGET_DIR=/work/target-dp \
//!     cargo test --release -p softverbs-e2e --test datapath_processes \
//!     soak_with_loss_duplication_and_reordering -- --nocapture
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use softverbs_testkit::resources::{has_pid, holders};
use softverbs_testkit::{Actor, Daemon};

const ACTOR: &str = env!("CARGO_BIN_EXE_softverbs-test-actor");

/// A daemon process; with `ip`, its one device `sv0` has that address and binds UDP.
fn start(name: &str, ip: Option<&str>, extra: &[&str]) -> Daemon {
    let mut o = Daemon::options(name).args(extra);
    if let Some(ip) = ip {
        o = o.device("sv0", ip);
    }
    o.start()
}

/// The clients these tests start on a daemon.
trait Clients {
    /// A `softverbs-test-actor ROLE ...` process.
    fn actor(&self, args: &[&str]) -> Actor;
}

impl Clients for Daemon {
    fn actor(&self, args: &[&str]) -> Actor {
        self.spawn_actor(ACTOR, args)
    }
}

/// The value of `key=value` in `line`.
fn kv(line: &str, key: &str) -> String {
    line.split_whitespace()
        .find_map(|t| t.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
        .to_string()
}

/// An RC actor and what its READY line told.
struct Rc {
    a: Actor,
    qpn: u32,
    gid: String,
    addr: u64,
    rkey: u32,
}

fn rc(d: &Daemon, extra: &[&str]) -> Rc {
    let mut args = vec!["dp-rc"];
    args.extend_from_slice(extra);
    let a = d.actor(&args);
    let r = a.expect("READY");
    Rc {
        qpn: kv(&r, "qpn").parse().unwrap(),
        gid: kv(&r, "gid"),
        addr: kv(&r, "addr").parse().unwrap(),
        rkey: kv(&r, "rkey").parse().unwrap(),
        a,
    }
}

fn connect(x: &mut Rc, y: &mut Rc) {
    let (xq, xg, yq, yg) = (x.qpn, x.gid.clone(), y.qpn, y.gid.clone());
    x.a.ok(&format!("CONNECT {yg} {yq}"));
    y.a.ok(&format!("CONNECT {xg} {xq}"));
}

/// Replaces both QPs with fresh ones and connects them.
fn reconnect(x: &mut Rc, y: &mut Rc) {
    for r in [&mut *x, &mut *y] {
        let l = r.a.ok("NEWQP");
        r.qpn = kv(&l, "qpn").parse().unwrap();
    }
    connect(x, y);
}

const SEED_I: u64 = 0x1111_2222;
const SEED_T: u64 = 0x3333_4444;

/// Every RC operation from `i` to `t`, each side checking its own bytes.
fn rc_battery(i: &mut Rc, t: &mut Rc) {
    t.a.ok(&format!("FILL 0 65536 {SEED_T}"));
    t.a.ok("SETU64 0x20000 40");
    t.a.ok("POSTRECV 2 0x10000 8192");
    i.a.ok(&format!("FILL 0 65536 {SEED_I}"));
    i.a.ok(&format!("OPS {} {} {SEED_I} {SEED_T}", t.addr, t.rkey));
    t.a.send("WAITRECV 2");
    let w1 = t.a.expect("WC");
    let w2 = t.a.expect("WC");
    t.a.expect("OK got=2");
    assert_eq!(
        (
            kv(&w1, "wr_id"),
            kv(&w1, "status"),
            kv(&w1, "opcode"),
            kv(&w1, "len")
        ),
        ("0".into(), "Success".into(), "Recv".into(), "6000".into()),
        "{w1}"
    );
    assert_eq!(kv(&w1, "qpn"), t.qpn.to_string());
    assert_eq!(
        (
            kv(&w2, "wr_id"),
            kv(&w2, "status"),
            kv(&w2, "len"),
            kv(&w2, "imm")
        ),
        ("1".into(), "Success".into(), "100".into(), "0xabcd".into()),
        "{w2}"
    );
    // SEND, SEND with immediate and WRITE landed byte for byte; the atomics left 7.
    t.a.ok(&format!("CHECK 0x10000 6000 {SEED_I} 0"));
    t.a.ok(&format!("CHECK 0x12000 100 {SEED_I} 0x1000"));
    t.a.ok(&format!("CHECK 0x30000 20000 {SEED_I} 0"));
    assert_eq!(t.a.cmd("GETU64 0x20000"), "OK 7");
    // And the target's own pattern (what READ fetched) is untouched.
    t.a.ok(&format!("CHECK 0 65536 {SEED_T} 0"));
}

fn rc_pair_battery(di: &Daemon, dt: &Daemon) {
    let mut i = rc(di, &[]);
    let mut t = rc(dt, &[]);
    connect(&mut i, &mut t);
    rc_battery(&mut i, &mut t);
}

#[test]
fn rc_operations_between_two_processes_on_one_daemon() {
    let d = start("rc-one", None, &[]);
    rc_pair_battery(&d, &d);
}

#[test]
fn rc_operations_between_processes_on_two_daemons_over_udp() {
    let d1 = start("rc-a", Some("127.93.1.1"), &[]);
    let d2 = start("rc-b", Some("127.93.1.2"), &[]);
    rc_pair_battery(&d1, &d2);
    // Both directions, on the same daemons.
    rc_pair_battery(&d2, &d1);
}

// ---- XRC ---------------------------------------------------------------------------------

fn xrc_holders(r: &Value, qpn: u32) -> Option<usize> {
    holders(r, qpn).map(|h| h.len())
}

#[test]
fn xrc_stream_over_several_srq_owners_survives_the_creators_sigkill() {
    const MESSAGES: u64 = 3000;
    const SIZE: usize = 700;
    let d = start("xrc", None, &[]);
    let file = d.dir.join("domain");
    std::fs::write(&file, b"").unwrap();
    let f = file.to_str().unwrap();
    let mut creator = d.actor(&["dp-xrc-creator", "--file", f, "--face", "upstream"]);
    let qpn: u32 = creator
        .expect("QPN")
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let q = qpn.to_string();
    let size = SIZE.to_string();
    let mut owners: Vec<Actor> = ["legacy", "upstream", "minimal", "legacy"]
        .iter()
        .map(|face| {
            d.actor(&[
                "dp-xrc-owner",
                "--file",
                f,
                "--qpn",
                &q,
                "--face",
                face,
                "--size",
                &size,
            ])
        })
        .collect();
    let srqns: Vec<String> = owners
        .iter()
        .map(|o| kv(&o.expect("READY"), "srqn"))
        .collect();
    let mut sender = d.actor(&["dp-xrc-sender"]);
    let ready = sender.expect("READY");
    creator.ok(&format!(
        "CONNECT {} {}",
        kv(&ready, "gid"),
        kv(&ready, "qpn")
    ));
    let gid = kv(&ready, "gid");
    sender.ok(&format!("CONNECT {gid} {qpn}"));
    assert_eq!(xrc_holders(&d.resources(), qpn), Some(5));

    sender.send(&format!(
        "STREAM {MESSAGES} {SIZE} {} {} 100",
        srqns.join(","),
        MESSAGES / 2
    ));
    sender.expect("MID");
    let creator_pid = creator.pid();
    creator.kill9();
    let r = d.wait_until("the creator's context is gone", |r| {
        !has_pid(r, creator_pid)
    });
    assert_eq!(
        xrc_holders(&r, qpn),
        Some(4),
        "the receive QP outlives its creator"
    );
    let done = sender.line_within(Duration::from_secs(120));
    assert_eq!(done, format!("OK sent={MESSAGES}"));

    // Merge what the owners got: every number exactly once, each at the SRQ it was aimed at.
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    for (k, o) in owners.iter_mut().enumerate() {
        o.send("DONE");
        let got = o.expect("GOT");
        assert_eq!(kv(&got, "bad"), "0", "owner {k}: {got}");
        let list = kv(&got, "seqs");
        for s in list.split(',').filter(|s| !s.is_empty()) {
            let s: u64 = s.parse().unwrap();
            assert_eq!(
                s % srqns.len() as u64,
                k as u64,
                "message {s} reached owner {k}"
            );
            *seen.entry(s).or_default() += 1;
        }
    }
    let dups: Vec<_> = seen.iter().filter(|(_, &n)| n > 1).collect();
    assert!(dups.is_empty(), "received more than once: {dups:?}");
    let missing: Vec<u64> = (0..MESSAGES).filter(|s| !seen.contains_key(s)).collect();
    assert!(missing.is_empty(), "never received: {missing:?}");
    assert_eq!(seen.len() as u64, MESSAGES);

    // The holders leave one by one; the QP goes with the last.
    let n = owners.len();
    for (k, o) in owners.iter_mut().enumerate() {
        o.send("LEAVE");
        o.expect("LEFT");
        o.child.wait().unwrap();
        let pid = o.pid();
        let r = d.wait_until("the owner is gone", |r| !has_pid(r, pid));
        let left = n - k - 1;
        assert_eq!(xrc_holders(&r, qpn), (left > 0).then_some(left), "{r:#}");
    }
    let r = d.resources();
    assert!(
        r["xrc_recv_qps"].as_array().unwrap().is_empty(),
        "the receive QP is gone: {r:#}"
    );
    d.cli(&["resources"]);
}

// ---- soak ----------------------------------------------------------------------------------

fn soak_messages() -> u64 {
    std::env::var("SOFTVERBS_SOAK_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

/// Two daemons dropping 5 %, duplicating 1 % and reordering 1 % of what they send; an RC
/// stream in each direction at once arrives complete, once, in order and intact.
#[test]
fn soak_with_loss_duplication_and_reordering() {
    let n = soak_messages();
    let faults = ["--faults", "loss=0.05,dup=0.01,reorder=0.01"];
    let d1 = start("soak-a", Some("127.93.3.1"), &faults);
    let d2 = start("soak-b", Some("127.93.3.2"), &faults);
    let opts = ["--depth", "64"];
    let mut a = rc(&d1, &opts);
    let mut b = rc(&d2, &opts);
    connect(&mut a, &mut b);
    let mut a2 = rc(&d1, &opts);
    let mut b2 = rc(&d2, &opts);
    connect(&mut a2, &mut b2);
    let start = Instant::now();
    // 1500 bytes: two packets a message at MTU 1024.
    b.a.send(&format!("STREAM-RECV {n} 1500 77"));
    a.a.send(&format!("STREAM-SEND {n} 1500 77"));
    a2.a.send(&format!("STREAM-RECV {n} 300 78"));
    b2.a.send(&format!("STREAM-SEND {n} 300 78"));
    // Allow ~10 ms a message on a slow machine, at least 3 minutes.
    let limit = Duration::from_millis(n * 10).max(Duration::from_secs(180));
    let sent = a.a.line_within(limit);
    let got = b.a.line_within(limit);
    let sent2 = b2.a.line_within(limit);
    let got2 = a2.a.line_within(limit);
    eprintln!("soak of {n} messages each way took {:?}", start.elapsed());
    assert!(sent.starts_with(&format!("OK sent={n} ")), "sender: {sent}");
    assert!(
        got.starts_with(&format!("OK received={n} ")),
        "receiver: {got}"
    );
    assert_eq!(kv(&sent, "digest"), kv(&got, "digest"));
    assert!(
        sent2.starts_with(&format!("OK sent={n} ")),
        "sender 2: {sent2}"
    );
    assert!(
        got2.starts_with(&format!("OK received={n} ")),
        "receiver 2: {got2}"
    );
    assert_eq!(kv(&sent2, "digest"), kv(&got2, "digest"));
    // The full battery still works over the faulty link.
    let mut i = rc(&d1, &opts);
    let mut t = rc(&d2, &opts);
    connect(&mut i, &mut t);
    rc_battery(&mut i, &mut t);
}

// ---- capture -------------------------------------------------------------------------------

#[test]
fn captures_decode_in_tshark_with_good_icrcs() {
    if softverbs_testkit::tshark_available().is_none() {
        return;
    }
    let cap1 = std::env::temp_dir().join(format!("sv-dpp-cap1-{}", std::process::id()));
    let cap2 = std::env::temp_dir().join(format!("sv-dpp-cap2-{}", std::process::id()));
    for c in [&cap1, &cap2] {
        let _ = std::fs::remove_dir_all(c);
        std::fs::create_dir_all(c).unwrap();
    }
    let mut d1 = start(
        "cap-a",
        Some("127.93.4.1"),
        &["--capture", cap1.to_str().unwrap()],
    );
    let mut d2 = start(
        "cap-b",
        Some("127.93.4.2"),
        &["--capture", cap2.to_str().unwrap()],
    );
    rc_pair_battery(&d1, &d2);
    {
        let mut a = rc(&d1, &[]);
        let mut b = rc(&d2, &[]);
        connect(&mut a, &mut b);
        b.a.send("STREAM-RECV 300 2500 5");
        a.a.send("STREAM-SEND 300 2500 5");
        assert!(a.a.line().starts_with("OK sent=300"));
        assert!(b.a.line().starts_with("OK received=300"));
    }
    d1.stop();
    d2.stop();
    let home = cap1.join("home");
    std::fs::create_dir_all(&home).unwrap();
    for dir in [&cap1, &cap2] {
        let pcap = dir.join("sv0.pcap");
        assert!(pcap.exists(), "no capture at {}", pcap.display());
        let out = softverbs_testkit::tshark(
            &pcap,
            &home,
            &[
                "-T",
                "fields",
                "-e",
                "frame.number",
                "-e",
                "_ws.malformed",
                "-e",
                "_ws.expert.severity",
                "-e",
                "softverbs.icrc.status",
            ],
        );
        let lines: Vec<&str> = out.lines().collect();
        // The battery and 300 three-packet messages, with their ACKs: hundreds of frames.
        assert!(
            lines.len() >= 900,
            "{}: {} frames",
            pcap.display(),
            lines.len()
        );
        for l in &lines {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), 4, "{l}");
            assert!(f[1].is_empty(), "{}: malformed frame: {l}", pcap.display());
            assert_eq!(f[3], "good", "{}: frame {l}", pcap.display());
        }
    }
    for c in [&cap1, &cap2] {
        let _ = std::fs::remove_dir_all(c);
    }
}

// ---- bad input -----------------------------------------------------------------------------

#[test]
fn garbage_work_requests_get_errors_and_the_daemon_carries_on() {
    let mut d = start("garbage", None, &[]);
    let g = d.actor(&["dp-garbage"]);
    let mut cases = BTreeMap::new();
    loop {
        let l = g.line();
        if l == "DONE" {
            break;
        }
        assert!(l.starts_with("CASE "), "garbage actor: {l}");
        let mut parts = l.splitn(3, ' ');
        parts.next();
        let name = parts.next().unwrap().to_string();
        cases.insert(name, parts.next().unwrap_or("").to_string());
    }
    let einval = "errno=22";
    let mut failures = Vec::new();
    let mut want = |name: &str, ok: &dyn Fn(&str) -> bool, what: &str| {
        let got = cases.get(name).map_or("(missing)", String::as_str);
        if !ok(got) {
            failures.push(format!("{name}: got {got:?}, want {what}"));
        }
    };
    let is_err = |s: &str| s.starts_with("errno=") && s != "errno=0";
    // Another context's handles are not yours: refused, and nothing moved.
    want("foreign-qp-send", &|s| is_err(s), "an errno");
    want("foreign-qp-recv", &|s| is_err(s), "an errno");
    want("foreign-cq-poll", &|s| is_err(s), "an errno");
    want(
        "foreign-effects",
        &|s| s == "completions=0",
        "completions=0",
    );
    // Requests the typed client cannot even build.
    for name in [
        "opcode-0x55",
        "opcode-local-inv",
        "opcode-bind-mw",
        "opcode-tso",
        "opcode-huge",
        "num-sge-17",
        "num-sge-max",
        "num-sge-over-cap",
        "inline-len-huge",
        "inline-over-cap",
        "recv-num-sge-max",
        "unknown-qp-handle",
        "destroyed-qp-handle",
    ] {
        want(
            name,
            &|s| s == einval || s == "errno=95",
            "EINVAL (or EOPNOTSUPP)",
        );
    }
    want(
        "raw-control",
        &|s| s == "108:0,7:0",
        "both completions successful",
    );
    // The typed client's garbage.
    want("post-in-reset", &|s| s == einval, einval);
    want("send-sges-over-cap", &|s| s == einval, einval);
    want("recv-sges-over-cap", &|s| s == einval, einval);
    want("atomic-len-4", &|s| s == einval, einval);
    want(
        "send-2gib",
        &|s| is_err(s) || (s.starts_with("wc=") && s != "wc=Success"),
        "an errno or an error completion",
    );
    want(
        "send-bad-lkey",
        &|s| s == "wc=LocProtErr" || s == einval,
        "LocProtErr (or EINVAL)",
    );
    want(
        "send-sge-past-mr",
        &|s| s == "wc=LocProtErr" || s == "wc=LocLenErr" || s == einval,
        "LocProtErr",
    );
    want(
        "read-bad-local-lkey",
        &|s| s == "wc=LocProtErr" || s == einval,
        "LocProtErr (or EINVAL)",
    );
    want(
        "write-bad-rkey",
        &|s| s == "wc=RemAccessErr",
        "RemAccessErr",
    );
    want("write-past-mr", &|s| s == "wc=RemAccessErr", "RemAccessErr");
    want(
        "read-before-mr",
        &|s| s == "wc=RemAccessErr",
        "RemAccessErr",
    );
    want(
        "atomic-unaligned",
        &|s| s == "wc=RemInvReqErr" || s == "wc=RemAccessErr" || s == einval,
        "an error (IBA: atomics need 8-byte aligned addresses)",
    );
    want(
        "send-no-recv",
        &|s| s == "ok completions=[]",
        "accepted and pending (RNR retried forever)",
    );
    want(
        "recv-bad-lkey",
        &|s| s.starts_with("wc=") && s != "wc=Success" && s.contains("LocProtErr"),
        "the sender fails and the receive completes with LocProtErr",
    );
    want("control", &|s| s == "ok", "ok");
    drop(g);
    d.assert_alive();
    // Other clients are unaffected.
    rc_pair_battery(&d, &d);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn rdma_into_freed_memory_completes_with_an_error_and_others_carry_on() {
    let mut d = start("freed", None, &[]);
    let mut victim = rc(&d, &["--buf-len", "16777216"]);
    let mut peer = rc(&d, &[]);
    connect(&mut peer, &mut victim);
    let l = victim.a.ok("FREE");
    assert_eq!(
        l, "OK unmapped=true",
        "the buffer must really be gone for this test"
    );
    let w = peer
        .a
        .ok(&format!("WRITE {} {} 0 4096", victim.addr, victim.rkey));
    eprintln!("WRITE into freed memory: {w}");
    let st = kv(&w, "status");
    assert!(
        st != "Success" && st != "WrFlushErr",
        "WRITE into unmapped memory: {w}"
    );
    reconnect(&mut peer, &mut victim);
    let r = peer.a.ok(&format!(
        "READ {} {} 0 4096",
        victim.addr + 8192,
        victim.rkey
    ));
    eprintln!("READ of freed memory: {r}");
    let st = kv(&r, "status");
    assert!(
        st != "Success" && st != "WrFlushErr",
        "READ of unmapped memory: {r}"
    );
    // The victim process lives on, and so do the daemon and everybody else.
    d.assert_alive();
    let l = victim.a.ok("NEWQP");
    assert!(l.starts_with("OK qpn="));
    rc_pair_battery(&d, &d);
}

#[test]
fn a_client_killed_mid_stream_is_cleaned_up_and_its_peer_gets_errors() {
    let mut d = start("midkill", None, &[]);
    // The default retry budget: 8 tries of ~17 ms before RETRY_EXC_ERR.
    let opts: [&str; 0] = [];
    let mut a = rc(&d, &opts);
    let mut b = rc(&d, &opts);
    connect(&mut a, &mut b);
    let mut c1 = rc(&d, &[]);
    let mut c2 = rc(&d, &[]);
    connect(&mut c1, &mut c2);
    b.a.send("STREAM-RECV 100000000 1024 9 2000");
    a.a.send("STREAM-SEND 100000000 1024 9");
    b.a.expect("PROGRESS 2000");
    let bpid = b.a.pid();
    b.a.kill9();
    let end = a.a.line_within(Duration::from_secs(60));
    eprintln!("sender of the killed receiver: {end}");
    // Which error the sender sees depends on what the daemon learns first: the dead
    // process's memory faulting under a packet (its QP NAKs: remote operational error) or
    // the end of its connection (the QP is destroyed: no answer, retries exhausted).
    assert!(
        end.starts_with("ERR first=RetryExcErr")
            || end.starts_with("ERR first=WrFlushErr")
            || end.starts_with("ERR first=RemOpErr"),
        "the sender of a dead receiver: {end}"
    );
    assert_eq!(kv(&end, "success_after"), "0", "{end}");
    let r = d.wait_until("the killed client is gone", |r| !has_pid(r, bpid));
    assert_eq!(r["contexts"].as_array().unwrap().len(), 3, "{r:#}");
    // The third client keeps working.
    rc_battery(&mut c1, &mut c2);
    c2.a.send("STREAM-RECV 2000 1024 10");
    c1.a.send("STREAM-SEND 2000 1024 10");
    assert!(c1.a.line().starts_with("OK sent=2000"));
    assert!(c2.a.line().starts_with("OK received=2000"));

    // Now the sender dies mid-stream: the receiver simply stops hearing, the daemon cleans up.
    let mut e = rc(&d, &opts);
    let mut f = rc(&d, &opts);
    connect(&mut e, &mut f);
    f.a.send("STREAM-RECV 100000000 1024 11 2000");
    e.a.send("STREAM-SEND 100000000 1024 11");
    f.a.expect("PROGRESS 2000");
    let epid = e.a.pid();
    e.a.kill9();
    d.wait_until("the killed sender is gone", |r| !has_pid(r, epid));
    d.assert_alive();
    rc_battery(&mut c2, &mut c1);
}
