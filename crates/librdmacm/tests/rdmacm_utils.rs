//! Unmodified rdmacm-utils on the drop-in librdmacm.so.1 and libibverbs.so.1, started with
//! `softverbs run`: `rping -v` (which checks its data), `ucmatose`, `rdma_server` /
//! `rdma_client` on one daemon; `rping -v` between two daemons in two network namespaces
//! joined by veth (`sv4a`/`sv4b`, made and removed by the test); and a connect to a port
//! nobody listens on, which rping reports as `RDMA_CM_EVENT_REJECTED`. After each, the
//! daemon's CM holds nothing (`resources --json`, key `cm`).
//!
//! Skipped (with a message) when rdmacm-utils is missing; the namespace test also needs root
//! and `ip` (CI has all). The `softverbs` binary must be built in the same profile
//! (`cargo build -p softverbs-cli`, which builds both drop-ins too).

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use softverbs_testkit::bins::softverbs_bin;
use softverbs_testkit::process::{finish, text};
use softverbs_testkit::Daemon;
use support::{cm_of, have, ok, run, wait_cm, Netns};

fn cm_empty(cm: &serde_json::Value) -> bool {
    ["listeners", "connections", "time_wait", "owned"]
        .iter()
        .all(|k| cm[k] == 0)
}

/// A server and a client; the client starts once the server's listener is in the daemon.
fn pair(
    srv: (Option<&str>, &Path),
    cli: (Option<&str>, &Path),
    s: (&str, &[&str]),
    c: (&str, &[&str]),
) -> (String, String) {
    let server = run(srv.0, srv.1, s.0, s.1);
    wait_cm(srv.1, "server listening", |cm| cm["listeners"] != 0);
    let client = finish(run(cli.0, cli.1, c.0, c.1), c.0);
    let server = finish(server, s.0);
    (ok(server, s.0), ok(client, c.0))
}

#[test]
fn rping_checks_its_data_on_one_daemon() {
    if !have("rping") {
        return;
    }
    let d = Daemon::start("rping");
    let at = (None, d.socket.as_path());
    let (_, out) = pair(
        at,
        at,
        (
            "rping",
            &["-s", "-v", "-a", "127.0.0.1", "-p", "7471", "-C", "20"],
        ),
        (
            "rping",
            &["-c", "-v", "-a", "127.0.0.1", "-p", "7471", "-C", "20"],
        ),
    );
    assert_eq!(out.matches("ping data: rdma-ping-").count(), 20, "{out}");
    wait_cm(&d.socket, "nothing left", cm_empty);
}

#[test]
fn ucmatose_and_rdma_server_client_on_one_daemon() {
    if !have("ucmatose") || !have("rdma_server") {
        return;
    }
    let d = Daemon::start("ucmatose");
    let at = (None, d.socket.as_path());
    let (srv, cli) = pair(
        at,
        at,
        ("ucmatose", &["-c", "2", "-C", "5"]),
        ("ucmatose", &["-s", "127.0.0.1", "-c", "2", "-C", "5"]),
    );
    assert!(
        srv.contains("test complete") && cli.contains("test complete"),
        "{srv}\n{cli}"
    );
    wait_cm(&d.socket, "nothing left after ucmatose", cm_empty);
    let (srv, cli) = pair(
        at,
        at,
        ("rdma_server", &["-p", "7472"]),
        ("rdma_client", &["-s", "127.0.0.1", "-p", "7472"]),
    );
    assert!(srv.contains("rdma_server: end 0"), "{srv}");
    assert!(cli.contains("rdma_client: end 0"), "{cli}");
    wait_cm(&d.socket, "nothing left after rdma_server", cm_empty);
}

#[test]
fn connecting_to_nobody_is_rejected() {
    if !have("rping") {
        return;
    }
    let d = Daemon::start("rej");
    let o = finish(
        run(
            None,
            &d.socket,
            "rping",
            &["-c", "-a", "127.0.0.1", "-p", "7473", "-C", "1"],
        ),
        "rping",
    );
    assert!(!o.status.success());
    let t = text(&o);
    assert!(t.contains("RDMA_CM_EVENT_REJECTED"), "{t}");
    wait_cm(&d.socket, "nothing left", cm_empty);
}

#[test]
fn rping_between_two_daemons_in_two_namespaces() {
    if !have("rping") {
        return;
    }
    // SAFETY: getuid has no preconditions.
    let root = unsafe { libc_getuid() } == 0;
    if !root {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        eprintln!("SKIP: network namespaces need root");
        return;
    }
    let Some(_ns) = Netns::up("sv4", 44) else {
        panic!("could not create the sv4a/sv4b namespaces and their veth pair");
    };
    let dir = std::env::temp_dir().join(format!("sv4-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let daemon = |ns: &str, ip: &str| {
        let sock = dir.join(format!("{ns}.sock"));
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(softverbs_bin())
            .arg("daemon")
            .arg("--socket")
            .arg(&sock)
            .arg("--device")
            .arg(format!("softverbs0={ip}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("{ns}.log"))).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cm_of(&sock).is_object() {
            assert!(Instant::now() < deadline, "daemon in {ns} did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        (child, sock)
    };
    let (mut da, sa) = daemon("sv4a", "10.44.0.1");
    let (mut db, sb) = daemon("sv4b", "10.44.0.2");
    let (_, out) = pair(
        (Some("sv4a"), &sa),
        (Some("sv4b"), &sb),
        (
            "rping",
            &["-s", "-v", "-a", "10.44.0.1", "-p", "7474", "-C", "20"],
        ),
        (
            "rping",
            &["-c", "-v", "-a", "10.44.0.1", "-p", "7474", "-C", "20"],
        ),
    );
    assert_eq!(out.matches("ping data: rdma-ping-").count(), 20, "{out}");
    wait_cm(&sa, "nothing left on the server's daemon", cm_empty);
    wait_cm(&sb, "nothing left on the client's daemon", cm_empty);
    let _ = da.kill();
    let _ = db.kill();
    let _ = da.wait();
    let _ = db.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

unsafe extern "C" {
    #[link_name = "getuid"]
    fn libc_getuid() -> u32;
}

#[test]
fn udaddy_resolves_with_sidr_and_exchanges_ud_datagrams() {
    if !have("udaddy") {
        return;
    }
    let d = Daemon::start("udaddy");
    let at = (None, d.socket.as_path());
    let (srv, cli) = pair(at, at, ("udaddy", &[]), ("udaddy", &["-s", "127.0.0.1"]));
    assert!(srv.contains("data transfers complete"), "{srv}");
    assert!(cli.contains("data transfers complete"), "{cli}");
    wait_cm(&d.socket, "nothing left after udaddy", cm_empty);
}

/// perftest connecting through rdma_cm (`-R`) instead of its TCP exchange.
#[test]
fn perftest_with_rdma_cm() {
    if !have("ib_send_bw") || !have("ib_write_lat") {
        return;
    }
    let d = Daemon::start("perftest");
    let at = (None, d.socket.as_path());
    // `-c UD`: the client resolves the server's QPN and Q_Key with SIDR, its AH comes from
    // the ESTABLISHED event's UD parameters.
    for (prog, port, extra) in [
        ("ib_send_bw", "18601", &[][..]),
        ("ib_write_lat", "18602", &[]),
        ("ib_send_bw", "18603", &["-c", "UD"]),
    ] {
        let mut args = vec!["-R", "-d", "softverbs0", "-x", "0", "-n", "50", "-p", port];
        args.extend_from_slice(extra);
        let mut cargs = args.clone();
        cargs.push("127.0.0.1");
        let (_, out) = pair(at, at, (prog, &args), (prog, &cargs));
        assert!(out.contains("#bytes"), "{prog}: {out}");
        wait_cm(&d.socket, "nothing left after perftest", cm_empty);
    }
}

/// An rping server SIGKILLed while its client pings: the client sees the disconnect (the
/// daemon sent the DREQ for the dead process) and exits, and no CM state is left.
#[test]
fn killed_rping_server_disconnects_its_client_and_leaves_nothing() {
    if !have("rping") {
        return;
    }
    let d = Daemon::start("rping-kill");
    let mut server = run(
        None,
        &d.socket,
        "rping",
        &["-s", "-a", "127.0.0.1", "-p", "7476"],
    );
    wait_cm(&d.socket, "server listening", |cm| cm["listeners"] != 0);
    let client = run(
        None,
        &d.socket,
        "rping",
        &["-c", "-a", "127.0.0.1", "-p", "7476", "-C", "100000000"],
    );
    // Both ends connected: the listener and one connection per side.
    wait_cm(&d.socket, "connected", |cm| cm["connections"] == 2);
    server.kill().unwrap();
    let _ = server.wait();
    let o = finish(client, "rping client after its server died");
    assert!(
        !o.status.success() || text(&o).contains("DISCONNECT"),
        "{}",
        text(&o)
    );
    wait_cm(&d.socket, "nothing left after the kill", cm_empty);
}

/// libfabric's verbs provider offers connected endpoints (`FI_EP_MSG`, which it builds on
/// rdma_cm: rdma_create_id, rdma_getaddrinfo, rdma_bind_addr on each non-loopback address)
/// for a softverbs device on a namespace host's address.
#[test]
fn fi_info_lists_msg_endpoints_for_a_namespace_host() {
    if !have("fi_info") {
        return;
    }
    // SAFETY: getuid has no preconditions.
    if unsafe { libc_getuid() } != 0 {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        eprintln!("SKIP: network namespaces need root");
        return;
    }
    struct Ns;
    impl Drop for Ns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", "sv4c"]).status();
        }
    }
    let sh = |c: &str| {
        Command::new("sh")
            .args(["-c", c])
            .status()
            .is_ok_and(|s| s.success())
    };
    let _ = sh("ip netns del sv4c 2>/dev/null");
    let _ns = Ns;
    assert!(sh(
        "ip netns add sv4c && ip link add sv4c0 netns sv4c type veth peer name sv4c1 netns sv4c \
        && ip -n sv4c addr add 10.46.0.1/24 dev sv4c0 && ip -n sv4c link set sv4c0 up \
        && ip -n sv4c link set sv4c1 up && ip -n sv4c link set lo up"
    ));
    let dir = std::env::temp_dir().join(format!("sv4c-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("sv.sock");
    let mut daemon = Command::new("ip")
        .args(["netns", "exec", "sv4c"])
        .arg(softverbs_bin())
        .arg("daemon")
        .arg("--socket")
        .arg(&sock)
        .args(["--device", "softverbs0=10.46.0.1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cm_of(&sock).is_object() {
        assert!(Instant::now() < deadline, "daemon did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = finish(
        run(Some("sv4c"), &sock, "fi_info", &["-p", "verbs"]),
        "fi_info",
    );
    let out = ok(o, "fi_info -p verbs");
    // One block per entry: the MSG endpoint is the one on the device's own domain.
    let msg = out
        .split("provider:")
        .find(|b| b.contains("type: FI_EP_MSG"))
        .unwrap_or_else(|| panic!("no FI_EP_MSG entry: {out}"));
    assert!(msg.contains("domain: softverbs0\n"), "{msg}");
    let _ = daemon.kill();
    let _ = daemon.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
