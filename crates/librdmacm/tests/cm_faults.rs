//! Unmodified `ucmatose` between two daemons in two network namespaces joined by veth
//! (`sv2fa`/`sv2fb`, made and removed by the test) whose devices lose, duplicate and reorder
//! what they send (`softverbs daemon --faults`, the CM MADs included): every connection is
//! made exactly once — a duplicated or reordered REQ never becomes a second connection,
//! which ucmatose would refuse with "failing connection request" — and every run ends
//! (bounded) with both sides' "test complete", after which neither daemon holds CM state
//! (docs/design/cm.md §3, "Duplicates, reordering, loss").
//!
//! Skipped (with a message) without rdmacm-utils, or without root for the namespaces (CI has
//! both). Build `softverbs-cli` first.

mod support;

use softverbs_testkit::process::finish;
use support::{have, ok, run, wait_cm, Netns, NsDaemon};

fn cm_empty(cm: &serde_json::Value) -> bool {
    ["listeners", "connections", "time_wait", "owned"]
        .iter()
        .all(|k| cm[k] == 0)
}

unsafe extern "C" {
    #[link_name = "getuid"]
    fn libc_getuid() -> u32;
}

#[test]
fn ucmatose_over_a_lossy_duplicating_reordering_wire_connects_each_once() {
    if !have("ucmatose") {
        return;
    }
    // SAFETY: getuid has no preconditions.
    if unsafe { libc_getuid() } != 0 {
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        eprintln!("SKIP: network namespaces need root");
        return;
    }
    let Some(_ns) = Netns::up("sv2f", 53) else {
        panic!("could not create the sv2fa/sv2fb namespaces and their veth pair");
    };
    let dir = std::env::temp_dir().join(format!("sv2f-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Loss is kept low: each lost CM MAD costs rdma_cm's response timeout (about 4.3 s)
    // before its retransmission; duplication and reordering cost nothing but are what
    // could make a second connection.
    let faults = ["--faults", "loss=0.03,dup=0.3,reorder=0.3"];
    let a = NsDaemon::start(&dir, "sv2fa", "10.53.0.1", &faults);
    let b = NsDaemon::start(&dir, "sv2fb", "10.53.0.2", &faults);
    for (round, port) in ["7851", "7852", "7853"].iter().enumerate() {
        let server = run(
            Some("sv2fa"),
            &a.1,
            "ucmatose",
            &["-p", port, "-c", "8", "-C", "10"],
        );
        wait_cm(&a.1, "ucmatose listening", |cm| cm["listeners"] != 0);
        let client = run(
            Some("sv2fb"),
            &b.1,
            "ucmatose",
            &["-s", "10.53.0.1", "-p", port, "-c", "8", "-C", "10"],
        );
        let cli = ok(finish(client, "ucmatose client"), "ucmatose client");
        let srv = ok(finish(server, "ucmatose server"), "ucmatose server");
        for (who, out) in [("server", &srv), ("client", &cli)] {
            assert!(out.contains("test complete"), "round {round} {who}: {out}");
            assert!(
                !out.contains("failing connection request"),
                "round {round} {who}: a second connection for one request: {out}"
            );
        }
        wait_cm(&a.1, "nothing left on the server's daemon", cm_empty);
        wait_cm(&b.1, "nothing left on the client's daemon", cm_empty);
    }
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}
