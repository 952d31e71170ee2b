//! What the drop-in's events report to the program (rdma_get_cm_event(3)): tests/c/
//! conn_params.c connects an RC id and a SIDR (RDMA_PS_UDP) id to listeners of its own on
//! one daemon and checks that the active side's ESTABLISHED carries the passive side's QPN
//! and private data (`param.conn` from the REP, `param.ud` from the SIDR_REP), as rdma_cm's
//! does. libfabric's XRC path (Open MPI `mtl ofi` over `verbs;ofi_rxm` with
//! `FI_VERBS_PREFER_XRC=1`, docs/mpi.md) depends on both: without the REP's QPN it never
//! learns the target QP its later connections share, and without the SIDR_REP's data it
//! takes its own SIDR connection for a target's and crashes.
//!
//! Skipped (with a message) without gcc or librdmacm-dev (CI has both). Build
//! `softverbs-cli` first; run inside a network namespace of your own (docs/cm.md §6).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use softverbs_testkit::process::finish;
use softverbs_testkit::Daemon;
use support::{ok, run, wait_cm};

#[test]
fn established_events_carry_the_peers_qpn_and_private_data() {
    let header = Path::new("/usr/include/rdma/rdma_cma.h");
    if !header.is_file() || Command::new("gcc").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "gcc and librdmacm-dev are required under CI"
        );
        eprintln!("SKIP: gcc or /usr/include/rdma/rdma_cma.h (librdmacm-dev) missing");
        return;
    }
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("conn_params-{}", std::process::id()));
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/conn_params.c");
    let o = Command::new("gcc")
        .args(["-Wall", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(src)
        .args(["-lrdmacm", "-libverbs"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let d = Daemon::start("conn_params");
    let out = ok(
        finish(run(None, &d.socket, &exe, &["7590"]), "conn_params.c"),
        "conn_params.c",
    );
    let _ = std::fs::remove_file(&exe);
    assert!(out.contains("ok rc\nok sidr\n"), "{out}");
    wait_cm(&d.socket, "every CM id gone", |cm| {
        ["listeners", "connections", "owned"]
            .iter()
            .all(|k| cm[k] == 0)
    });
}
