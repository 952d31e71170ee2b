//! XRC through rdma_cm's synchronous endpoint API on the drop-ins (docs/guide/dropin.md,
//! "XRC endpoints"): unmodified `rdma_xserver -c x` / `rdma_xclient -c x` (rdmacm-utils), and
//! tests/c/xrc_ep.c — rdma_getaddrinfo with RDMA_PS_IB and the XRC QP types, rdma_create_ep
//! on both sides, rdma_get_request, rdma_create_srq_ex with an XRC SRQ (the library's domain
//! and CQ, or the program's own given in comp_mask), rdma_accept with the SRQ number as
//! private data, then 20 sends naming that SRQ, each checked on the SRQ's CQ (and, on RC, a
//! plain SRQ from rdma_create_srq that the id's QP then receives through). On one daemon,
//! and between two daemons in network namespaces `sv37xa`/`sv37xb` (10.137.0.1/.2, made and
//! removed here). After each, the daemon's CM holds no connection or listener.
//!
//! Skipped (with a message) without rdmacm-utils, gcc or librdmacm-dev; the namespace test
//! also needs root and `ip` (CI has all). Build `softverbs-cli` first.

mod support;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use softverbs_testkit::process::finish;
use softverbs_testkit::Daemon;
use support::{build_c, have, ok, run, wait_cm, Netns, NsDaemon};

fn cm_idle(cm: &serde_json::Value) -> bool {
    ["listeners", "connections", "owned"]
        .iter()
        .all(|k| cm[k] == 0)
}

/// A server and a client, the client started once the server listens; both outputs.
fn pair(
    srv: (Option<&str>, &Path),
    cli: (Option<&str>, &Path),
    (sprog, sargs): (&Path, &[&str]),
    (cprog, cargs): (&Path, &[&str]),
) -> (String, String) {
    let server = run(srv.0, srv.1, sprog, sargs);
    wait_cm(srv.1, "server listening", |cm| cm["listeners"] != 0);
    let client = finish(run(cli.0, cli.1, cprog, cargs), "client");
    let server = finish(server, "server");
    (ok(server, "server"), ok(client, "client"))
}

#[test]
fn rdma_xserver_and_rdma_xclient_over_xrc() {
    if !have("rdma_xserver") {
        return;
    }
    let d = Daemon::start("xrc-utils");
    let at = (None, d.socket.as_path());
    // Before the fix the server stopped at "rdma_get_request: Invalid argument".
    let (s, c) = pair(
        at,
        at,
        (Path::new("rdma_xserver"), &["-c", "x", "-p", "7571"]),
        (
            Path::new("rdma_xclient"),
            &["-s", "127.0.0.1", "-c", "x", "-p", "7571"],
        ),
    );
    assert!(s.contains("rdma_xserver: end 0"), "{s}");
    assert!(c.contains("rdma_xclient: end 0"), "{c}");
    wait_cm(&d.socket, "nothing left", cm_idle);
}

/// tests/c/xrc_ep.c, compiled once for the tests of this file, which run in parallel (each
/// compiling and deleting its own copy under the one name this process gives raced: a test
/// ran the file while the other rewrote it).
fn xrc_ep() -> Option<PathBuf> {
    static EXE: OnceLock<Option<PathBuf>> = OnceLock::new();
    EXE.get_or_init(|| build_c("xrc_ep", Path::new(env!("CARGO_TARGET_TMPDIR"))))
        .clone()
}

#[test]
fn xrc_endpoints_with_the_librarys_and_the_programs_srq_resources() {
    let Some(exe) = xrc_ep() else {
        return;
    };
    let d = Daemon::start("xrc-ep");
    let at = (None, d.socket.as_path());
    for (mode, port) in [("lib", "7572"), ("own", "7573")] {
        let (s, c) = pair(
            at,
            at,
            (&exe, &["server", "127.0.0.1", port, mode, "20"]),
            (&exe, &["client", "127.0.0.1", port, "20"]),
        );
        assert!(
            s.contains(&format!("ok xrc server {mode} 20 messages")),
            "{s}"
        );
        assert!(c.contains("ok xrc client 20 messages"), "{c}");
        wait_cm(&d.socket, "nothing left", cm_idle);
    }
    // The same calls on RC: rdma_create_srq (a plain SRQ; it was ENOSYS) before
    // rdma_create_qp, whose QP receives through it.
    let (s, c) = pair(
        at,
        at,
        (&exe, &["server", "127.0.0.1", "7575", "rc", "20"]),
        (&exe, &["rcclient", "127.0.0.1", "7575", "20"]),
    );
    assert!(s.contains("ok rc server srq 20 messages"), "{s}");
    assert!(c.contains("ok rc client 20 messages"), "{c}");
    wait_cm(&d.socket, "nothing left", cm_idle);
}

unsafe extern "C" {
    #[link_name = "getuid"]
    fn libc_getuid() -> u32;
}

#[test]
fn xrc_endpoints_between_two_daemons_in_two_namespaces() {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc_getuid() } != 0 {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        eprintln!("SKIP: network namespaces need root");
        return;
    }
    let Some(exe) = xrc_ep() else {
        return;
    };
    let Some(_ns) = Netns::up("sv37x", 137) else {
        panic!("could not create the sv37xa/sv37xb namespaces and their veth pair");
    };
    let dir = std::env::temp_dir().join(format!("sv37x-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let da = NsDaemon::start(&dir, "sv37xa", "10.137.0.1", &[]);
    let db = NsDaemon::start(&dir, "sv37xb", "10.137.0.2", &[]);
    let (s, c) = pair(
        (Some("sv37xa"), &da.1),
        (Some("sv37xb"), &db.1),
        (&exe, &["server", "10.137.0.1", "7574", "lib", "20"]),
        (&exe, &["client", "10.137.0.1", "7574", "20"]),
    );
    assert!(s.contains("ok xrc server lib 20 messages"), "{s}");
    assert!(c.contains("ok xrc client 20 messages"), "{c}");
    wait_cm(&da.1, "nothing left on the server's daemon", cm_idle);
    wait_cm(&db.1, "nothing left on the client's daemon", cm_idle);
    let _ = std::fs::remove_dir_all(&dir);
}
