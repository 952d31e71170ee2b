//! The CM MADs two daemons exchange for unmodified rdma_cm programs decode in tshark (with
//! the project's plugin loaded, which adds nothing for them) as InfiniBand CM to QP1, none
//! malformed: REQ, REP, RTU, DREQ, DREP (tests/c/cmsteps.c, a whole handshake), REJ (a
//! connect to a port nobody listens on), SIDR_REQ / SIDR_REP (`udaddy`) and MRA (a REQ
//! duplicated by the client's daemon, `--faults dup=1.0`, while the server holds the
//! CONNECT_REQUEST), between two daemons with `--capture` in two network namespaces joined
//! by veth (`sv2ca`/`sv2cb`, made and removed by the test).
//!
//! Skipped (with a message) without tshark, rdmacm-utils, gcc or librdmacm-dev, or root (CI
//! has all). Build `softverbs-cli` first.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use softverbs_testkit::process::finish;
use softverbs_testkit::{tshark, tshark_available, Actor};
use support::{command, have, ok, run, wait_cm, Netns, NsDaemon};

unsafe extern "C" {
    #[link_name = "getuid"]
    fn libc_getuid() -> u32;
}

fn cmsteps(dir: &Path) -> Option<PathBuf> {
    support::build_c("cmsteps", dir)
}

/// SIGTERM, as a user stops it: the daemon writes out its capture before it exits.
fn stop(mut d: NsDaemon) {
    let _ = Command::new("kill")
        .args(["-TERM", &d.0.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(20);
    while d.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "daemon did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn cm_mads_between_two_daemons_decode_as_infiniband_cm() {
    if tshark_available().is_none() || !have("udaddy") {
        assert!(
            std::env::var_os("CI").is_none(),
            "tshark is required under CI"
        );
        eprintln!("SKIP: tshark or udaddy missing");
        return;
    }
    // SAFETY: getuid has no preconditions.
    if unsafe { libc_getuid() } != 0 {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        eprintln!("SKIP: network namespaces need root");
        return;
    }
    let dir = std::env::temp_dir().join(format!("sv2c-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for sub in ["a", "b", "home"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    let Some(exe) = cmsteps(&dir) else {
        return;
    };
    let Some(_ns) = Netns::up("sv2c", 54) else {
        panic!("could not create the sv2ca/sv2cb namespaces and their veth pair");
    };
    let cap_a = dir.join("a").display().to_string();
    let cap_b = dir.join("b").display().to_string();
    let a = NsDaemon::start(&dir, "sv2ca", "10.54.0.1", &["--capture", &cap_a]);
    let b = NsDaemon::start(&dir, "sv2cb", "10.54.0.2", &["--capture", &cap_b]);
    let server = (Some("sv2ca"), a.1.as_path());
    let client = (Some("sv2cb"), b.1.as_path());

    // REQ, REP, RTU, DREQ, DREP.
    let s = run(
        server.0,
        server.1,
        &exe,
        &["server", "10.54.0.1", "7861", "qp"],
    );
    wait_cm(server.1, "listening", |cm| cm["listeners"] == 1);
    let c = run(
        client.0,
        client.1,
        &exe,
        &["client", "10.54.0.1", "7861", "qp"],
    );
    let out = ok(finish(c, "cmsteps client"), "cmsteps client");
    assert!(out.ends_with("DONE\n"), "{out}");
    ok(finish(s, "cmsteps server"), "cmsteps server");
    // REJ: nobody listens on 7862.
    let c = run(
        client.0,
        client.1,
        &exe,
        &["client", "10.54.0.1", "7862", "qp"],
    );
    let o = finish(c, "cmsteps client, nobody listening");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("EVENT RDMA_CM_EVENT_REJECTED 8"), "{out}");
    // SIDR_REQ, SIDR_REP.
    let s = run(server.0, server.1, "udaddy", &[]);
    wait_cm(server.1, "udaddy listening", |cm| cm["listeners"] != 0);
    let c = run(client.0, client.1, "udaddy", &["-s", "10.54.0.1"]);
    let out = ok(finish(c, "udaddy client"), "udaddy client");
    assert!(out.contains("data transfers complete"), "{out}");
    ok(finish(s, "udaddy server"), "udaddy server");
    // MRA: the client's daemon again, now sending every packet twice, so a duplicate REQ
    // reaches the server's daemon while its program holds the CONNECT_REQUEST (IBA 12.6.6).
    stop(b);
    let cap_b2 = dir.join("b2");
    std::fs::create_dir_all(&cap_b2).unwrap();
    let cap_b2 = cap_b2.display().to_string();
    let b = NsDaemon::start(
        &dir,
        "sv2cb",
        "10.54.0.2",
        &["--faults", "dup=1.0", "--capture", &cap_b2],
    );
    let client = (Some("sv2cb"), b.1.as_path());
    let mut s = Actor::spawn(
        "cmsteps server",
        command(
            server.0,
            server.1,
            &exe,
            &["server", "10.54.0.1", "7863", "qp", "connect-request"],
        ),
    );
    wait_cm(server.1, "listening", |cm| cm["listeners"] == 1);
    let c = run(
        client.0,
        client.1,
        &exe,
        &["client", "10.54.0.1", "7863", "qp"],
    );
    while s.line() != "STEP connect-request" {}
    // Both copies of the REQ were in before the program could see the first one's event;
    // now it accepts.
    s.send("go");
    let out = ok(finish(c, "cmsteps client"), "cmsteps client");
    assert!(out.ends_with("DONE\n"), "{out}");
    let (said, st) = s.finish();
    assert!(st.success(), "{said:?} {st}");
    stop(a);
    stop(b);

    let pcap = dir.join("a").join("softverbs0.pcap");
    assert!(pcap.is_file(), "no capture at {}", pcap.display());
    let home = dir.join("home");
    let fields = tshark(
        &pcap,
        &home,
        &[
            "-Y",
            "infiniband.mad.mgmtclass == 0x07",
            "-T",
            "fields",
            "-e",
            "infiniband.bth.destqp",
            "-e",
            "infiniband.mad.attributeid",
        ],
    );
    let rows: Vec<Vec<&str>> = fields.lines().map(|l| l.split('\t').collect()).collect();
    let attrs: BTreeSet<&str> = rows.iter().map(|r| r[1]).collect();
    for (a, name) in [
        ("0x0010", "REQ"),
        ("0x0011", "MRA"),
        ("0x0012", "REJ"),
        ("0x0013", "REP"),
        ("0x0014", "RTU"),
        ("0x0015", "DREQ"),
        ("0x0016", "DREP"),
        ("0x0017", "SIDR_REQ"),
        ("0x0018", "SIDR_REP"),
    ] {
        assert!(
            attrs.contains(a),
            "no {name} ({a}) in the capture: {fields}"
        );
    }
    for r in &rows {
        assert_eq!(r[0], "0x000001", "a CM MAD not to QP1: {r:?}");
    }
    let malformed = tshark(
        &pcap,
        &home,
        &[
            "-Y",
            "_ws.malformed || _ws.expert.severity >= error",
            "-T",
            "fields",
            "-e",
            "frame.number",
        ],
    );
    assert!(malformed.trim().is_empty(), "malformed frames: {malformed}");
    let _ = std::fs::remove_dir_all(&dir);
}
