//! A process SIGKILLed at each step of an rdma_cm handshake (tests/c/cmsteps.c, which stops
//! where the test asks): the daemon holds no CM state of it afterwards, and its peer sees a
//! clean end (REJECTED or DISCONNECTED) instead of waiting (docs/design/cm.md, "A process killed
//! mid-handshake"). Each case on one daemon, and the REQ-outstanding, REP-sent,
//! established and disconnecting cases between two daemons in two network namespaces joined
//! by veth (`sv2ka`/`sv2kb`, made and removed by the test).
//!
//! Skipped (with a message) without gcc or librdmacm-dev; the namespace test also needs root
//! and `ip` (CI has all). Build `softverbs-cli` first.

mod support;

use std::path::{Path, PathBuf};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use softverbs_testkit::{Actor, Daemon};
use support::{cm_of, command, wait_cm, Netns, NsDaemon};

fn cm_empty(cm: &serde_json::Value) -> bool {
    ["listeners", "connections", "time_wait", "owned"]
        .iter()
        .all(|k| cm[k] == 0)
}

/// tests/c/cmsteps.c, built once per test run; `None` (after saying why) without gcc or the
/// librdmacm headers.
fn cmsteps() -> Option<&'static Path> {
    static EXE: OnceLock<Option<PathBuf>> = OnceLock::new();
    EXE.get_or_init(|| support::build_c("cmsteps", Path::new(env!("CARGO_TARGET_TMPDIR"))))
        .as_deref()
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Client,
    Server,
}

/// One case: who dies where, where its peer holds meanwhile, and what the peer must see.
struct Case {
    victim: Side,
    /// The client's pause (the victim's kill point, or where it holds).
    client_at: &'static str,
    /// The server's pause, if it holds somewhere.
    server_at: Option<&'static str>,
    /// The client's id has a QP (the library sends the RTU) or not (the program calls
    /// rdma_establish after CONNECT_RESPONSE).
    qp: bool,
    /// The event the survivor prints (`EVENT <name> <status>`), if any.
    survivor_sees: Option<&'static str>,
}

/// Where the two sides run: (namespace, daemon socket) each, and the server's address.
struct Hosts<'a> {
    server: (Option<&'a str>, &'a Path),
    client: (Option<&'a str>, &'a Path),
    addr: &'a str,
}

/// A line of a side that must come: the next `STEP <step>`, skipping the events printed on
/// the way (which must not be an unexpected one).
fn until_step(a: &Actor, step: &str) -> Vec<String> {
    let mut said = Vec::new();
    loop {
        let l = a.line();
        assert!(
            !l.starts_with("UNEXPECTED"),
            "{}: {l} after {said:?}",
            a.name
        );
        said.push(l.clone());
        if l == format!("STEP {step}") {
            return said;
        }
    }
}

/// What a paused survivor says until it exits (its stdin left open: the event, not the
/// test, must end its pause), within 20 s, and how it exited.
fn outcome(mut a: Actor) -> (Vec<String>, std::process::ExitStatus) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut said = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match a.lines.recv_timeout(left) {
            Ok(l) => said.push(l),
            Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => {
                panic!("{} still waits after 20 s; it said {said:?}", a.name)
            }
        }
    }
    let st = a.child.wait().expect("wait");
    (said, st)
}

fn no_peer_state(cm: &serde_json::Value) -> bool {
    cm["connections"] == 0 && cm["time_wait"] == 0 && cm["owned"] == 0
}

fn kill_case(exe: &Path, h: &Hosts, port: u16, c: &Case) {
    let port = port.to_string();
    let mode = if c.qp { "qp" } else { "noqp" };
    let mut sargs = vec!["server", h.addr, &port, mode];
    sargs.extend(c.server_at);
    let server = Actor::spawn(
        "cmsteps server",
        command(h.server.0, h.server.1, exe, &sargs),
    );
    until_step(&server, "listening");
    wait_cm(h.server.1, "server listening", |cm| cm["listeners"] == 1);
    let cargs = ["client", h.addr, &port, mode, c.client_at];
    let client = Actor::spawn(
        "cmsteps client",
        command(h.client.0, h.client.1, exe, &cargs),
    );
    until_step(&client, c.client_at);
    if let Some(s) = c.server_at {
        until_step(&server, s);
    }
    let what = format!("{:?} killed at {}", c.victim, c.client_at);
    let (mut victim, survivor) = match c.victim {
        Side::Client => (client, server),
        Side::Server => (server, client),
    };
    victim.kill9();
    drop(victim);
    match c.survivor_sees {
        Some(ev) => {
            let (said, st) = outcome(survivor);
            let want = format!("EVENT {ev}");
            assert!(
                said.iter().any(|l| l.starts_with(&want)),
                "{what}: the survivor should see {ev}, it said {said:?} ({st})"
            );
            // It exits 3 when the event ended a pause, 0 when it was the one it waited for.
            let code = st.code();
            assert!(code == Some(3) || code == Some(0), "{what}: {said:?} {st}");
        }
        None => {
            // Nothing reached the server: it still only listens, with no connection of the
            // dead client's (the resolve steps are local to the library).
            let cm = cm_of(h.server.1);
            assert!(no_peer_state(&cm) && cm["listeners"] == 1, "{what}: {cm}");
            let mut survivor = survivor;
            survivor.kill9();
        }
    }
    let cm_c = h.client.1;
    wait_cm(cm_c, &format!("{what}: client's daemon"), cm_empty);
    wait_cm(h.server.1, &format!("{what}: server's daemon"), cm_empty);
}

fn one_daemon(name: &str, port: u16, c: Case) {
    let Some(exe) = cmsteps() else {
        return;
    };
    let d = Daemon::start(name);
    let h = Hosts {
        server: (None, &d.socket),
        client: (None, &d.socket),
        addr: "127.0.0.1",
    };
    kill_case(exe, &h, port, &c);
}

/// The whole handshake with no kill and no pause: both sides finish (the program itself is
/// right), and nothing is left.
#[test]
fn the_handshake_runs_to_its_end_with_and_without_a_qp() {
    let Some(exe) = cmsteps() else {
        return;
    };
    let d = Daemon::start("cmsteps-full");
    for (port, mode) in [("7801", "noqp"), ("7802", "qp")] {
        let at = d.socket.as_path();
        let server = Actor::spawn(
            "server",
            command(None, at, exe, &["server", "127.0.0.1", port, mode]),
        );
        until_step(&server, "listening");
        wait_cm(at, "listening", |cm| cm["listeners"] == 1);
        let client = Actor::spawn(
            "client",
            command(None, at, exe, &["client", "127.0.0.1", port, mode]),
        );
        let check = |a: Actor, steps: &[&str]| {
            let name = a.name.clone();
            let (said, st) = a.finish();
            assert!(st.success(), "{name} {mode}: {said:?} {st}");
            let got: Vec<&str> = said
                .iter()
                .filter_map(|l| l.strip_prefix("STEP "))
                .collect();
            assert_eq!(got, steps, "{name} {mode}: {said:?}");
            assert_eq!(said.last().map(String::as_str), Some("DONE"), "{said:?}");
        };
        let mut csteps = vec!["resolved-addr", "resolved-route", "connect-sent"];
        if mode == "noqp" {
            csteps.push("connect-response");
        }
        csteps.extend(["established", "disconnect-sent"]);
        check(client, &csteps);
        check(server, &["connect-request", "accepted", "established"]);
        wait_cm(at, "nothing left", cm_empty);
    }
}

#[test]
fn client_killed_after_resolve_addr() {
    one_daemon(
        "k-addr",
        7811,
        Case {
            victim: Side::Client,
            client_at: "resolved-addr",
            server_at: None,
            qp: false,
            survivor_sees: None,
        },
    );
}

#[test]
fn client_killed_after_resolve_route() {
    one_daemon(
        "k-route",
        7812,
        Case {
            victim: Side::Client,
            client_at: "resolved-route",
            server_at: None,
            qp: false,
            survivor_sees: None,
        },
    );
}

/// The REQ outstanding, the server holding its CONNECT_REQUEST: the daemon sends the REJ
/// (reason 4, Timeout: the active side gave up, IBA table 109) for the dead client.
const REQ_OUTSTANDING: Case = Case {
    victim: Side::Client,
    client_at: "connect-sent",
    server_at: Some("connect-request"),
    qp: false,
    survivor_sees: Some("RDMA_CM_EVENT_REJECTED 4"),
};

/// The REP received, rdma_establish not called (no RTU yet), the server after rdma_accept:
/// the REJ (reason 28, consumer) rejects the REP.
const REP_RECEIVED: Case = Case {
    victim: Side::Client,
    client_at: "connect-response",
    server_at: Some("accepted"),
    qp: false,
    survivor_sees: Some("RDMA_CM_EVENT_REJECTED 28"),
};

/// Connected (the client with a QP): the daemon's DREQ for the dead client.
const CLIENT_ESTABLISHED: Case = Case {
    victim: Side::Client,
    client_at: "established",
    server_at: Some("established"),
    qp: true,
    survivor_sees: Some("RDMA_CM_EVENT_DISCONNECTED 0"),
};

/// The server holding a CONNECT_REQUEST unanswered: REJ (consumer) for the dead server.
const SERVER_HOLDING_REQ: Case = Case {
    victim: Side::Server,
    client_at: "connect-sent",
    server_at: Some("connect-request"),
    qp: false,
    survivor_sees: Some("RDMA_CM_EVENT_REJECTED 28"),
};

/// The server after rdma_accept, the client holding the REP (so no RTU comes).
const SERVER_REP_SENT: Case = Case {
    victim: Side::Server,
    client_at: "connect-response",
    server_at: Some("accepted"),
    qp: false,
    survivor_sees: Some("RDMA_CM_EVENT_REJECTED 28"),
};

const SERVER_ESTABLISHED: Case = Case {
    victim: Side::Server,
    client_at: "established",
    server_at: Some("established"),
    qp: true,
    survivor_sees: Some("RDMA_CM_EVENT_DISCONNECTED 0"),
};

#[test]
fn client_killed_with_its_req_outstanding() {
    one_daemon("k-req", 7813, REQ_OUTSTANDING);
}

#[test]
fn client_killed_after_connect_response_before_rdma_establish() {
    one_daemon("k-rep", 7814, REP_RECEIVED);
}

#[test]
fn client_killed_when_established() {
    one_daemon("k-est", 7815, CLIENT_ESTABLISHED);
}

#[test]
fn client_without_a_qp_killed_when_established() {
    one_daemon(
        "k-est-noqp",
        7816,
        Case {
            qp: false,
            ..CLIENT_ESTABLISHED
        },
    );
}

/// The DREQ sent: the server still sees its DISCONNECTED (and finishes), nothing is left.
const CLIENT_DISCONNECTING: Case = Case {
    victim: Side::Client,
    client_at: "disconnect-sent",
    server_at: None,
    qp: true,
    survivor_sees: Some("RDMA_CM_EVENT_DISCONNECTED 0"),
};

#[test]
fn client_killed_after_rdma_disconnect() {
    one_daemon("k-dreq", 7817, CLIENT_DISCONNECTING);
}

#[test]
fn server_killed_holding_a_connect_request() {
    one_daemon("k-sreq", 7818, SERVER_HOLDING_REQ);
}

#[test]
fn server_killed_after_rdma_accept_before_the_rtu() {
    one_daemon("k-srep", 7819, SERVER_REP_SENT);
}

#[test]
fn server_killed_when_established() {
    one_daemon("k-sest", 7820, SERVER_ESTABLISHED);
}

unsafe extern "C" {
    #[link_name = "getuid"]
    fn libc_getuid() -> u32;
}

#[test]
fn kills_mid_handshake_between_two_daemons() {
    let Some(exe) = cmsteps() else {
        return;
    };
    // SAFETY: getuid has no preconditions.
    if unsafe { libc_getuid() } != 0 {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        eprintln!("SKIP: network namespaces need root");
        return;
    }
    let Some(_ns) = Netns::up("sv2k", 52) else {
        panic!("could not create the sv2ka/sv2kb namespaces and their veth pair");
    };
    let dir = std::env::temp_dir().join(format!("sv2k-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let a = NsDaemon::start(&dir, "sv2ka", "10.52.0.1", &[]);
    let b = NsDaemon::start(&dir, "sv2kb", "10.52.0.2", &[]);
    let h = Hosts {
        server: (Some("sv2ka"), &a.1),
        client: (Some("sv2kb"), &b.1),
        addr: "10.52.0.1",
    };
    for (i, c) in [
        REQ_OUTSTANDING,
        SERVER_HOLDING_REQ,
        REP_RECEIVED,
        SERVER_REP_SENT,
        CLIENT_ESTABLISHED,
        SERVER_ESTABLISHED,
        CLIENT_DISCONNECTING,
    ]
    .iter()
    .enumerate()
    {
        kill_case(exe, &h, 7830 + i as u16, c);
    }
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}
