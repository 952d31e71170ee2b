//! `rdma_migrate_id(3)` of ids that hold daemon CM state: tests/c/migrate.c, built with gcc
//! against the system's rdma_cma.h and run with `softverbs run` on the drop-in, migrates a
//! listener before its connect request, a connected id with its connect response still queued
//! (then destroys the old channels), disconnects on the new channel, and makes an id
//! synchronous by migrating it to NULL. Afterwards the daemon's CM holds nothing.
//!
//! Skipped (with a message) without gcc or librdmacm-dev (CI has both). Build
//! `softverbs-cli` first.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use softverbs_testkit::process::finish;
use softverbs_testkit::Daemon;
use support::{ok, run, wait_cm};

#[test]
fn migrate_id_moves_listeners_and_connected_ids_between_channels() {
    let header = Path::new("/usr/include/rdma/rdma_verbs.h");
    if !header.is_file() || Command::new("gcc").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "gcc and librdmacm-dev are required under CI"
        );
        eprintln!("SKIP: gcc or /usr/include/rdma/rdma_verbs.h (librdmacm-dev) missing");
        return;
    }
    let exe =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("migrate-{}", std::process::id()));
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/migrate.c");
    let o = Command::new("gcc")
        .args(["-Wall", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(src)
        .args(["-lrdmacm", "-libverbs"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let d = Daemon::start("migrate");
    let out = ok(
        finish(run(None, &d.socket, &exe, &["7590"]), "migrate.c"),
        "migrate.c",
    );
    let _ = std::fs::remove_file(&exe);
    for step in [
        "ok listener migrated before the connect request",
        "ok queued event moved with the connected id",
        "ok disconnected on the new channel",
        "ok synchronous after migrating to NULL",
    ] {
        assert!(out.contains(step), "{step} missing: {out}");
    }
    wait_cm(&d.socket, "nothing left", |cm| {
        ["listeners", "connections", "time_wait", "owned"]
            .iter()
            .all(|k| cm[k] == 0)
    });
}

/// ucmatose `-m`: both sides migrate their connected ids to a new event channel after the
/// data transfers and then disconnect there.
#[test]
fn ucmatose_migrates_its_connected_ids() {
    if !support::have("ucmatose") {
        return;
    }
    let d = Daemon::start("ucmatose-m");
    let server = run(None, &d.socket, "ucmatose", &["-c", "2", "-C", "5", "-m"]);
    wait_cm(&d.socket, "server listening", |cm| cm["listeners"] != 0);
    let cli = ok(
        finish(
            run(
                None,
                &d.socket,
                "ucmatose",
                &["-s", "127.0.0.1", "-c", "2", "-C", "5", "-m"],
            ),
            "ucmatose -m client",
        ),
        "ucmatose -m client",
    );
    let srv = ok(finish(server, "ucmatose -m server"), "ucmatose -m server");
    for out in [&srv, &cli] {
        assert!(
            out.contains("migrating to new event channel") && out.contains("test complete"),
            "{srv}\n{cli}"
        );
    }
    wait_cm(&d.socket, "nothing left", |cm| {
        ["listeners", "connections", "time_wait", "owned"]
            .iter()
            .all(|k| cm[k] == 0)
    });
}
