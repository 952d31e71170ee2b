//! What the drop-in's events report to the program (rdma_get_cm_event(3)): tests/c/
//! conn_params.c connects an RC id and a SIDR (RDMA_PS_UDP) id to listeners of its own on
//! one daemon and checks that the active side's ESTABLISHED carries the passive side's QPN
//! and private data (`param.conn` from the REP, `param.ud` from the SIDR_REP), as rdma_cm's
//! does. libfabric's XRC path (Open MPI `mtl ofi` over `verbs;ofi_rxm` with
//! `FI_VERBS_PREFER_XRC=1`, docs/guide/mpi.md) depends on both: without the REP's QPN it never
//! learns the target QP its later connections share, and without the SIDR_REP's data it
//! takes its own SIDR connection for a target's and crashes.
//!
//! Skipped (with a message) without gcc or librdmacm-dev (CI has both). Build
//! `softverbs-cli` first; run inside a network namespace of your own (docs/design/cm.md §6).

mod support;

use std::path::Path;

use softverbs_testkit::process::finish;
use softverbs_testkit::Daemon;
use support::{ok, run, wait_cm};

#[test]
fn established_events_carry_the_peers_qpn_and_private_data() {
    let Some(exe) = support::build_c("conn_params", Path::new(env!("CARGO_TARGET_TMPDIR"))) else {
        return;
    };
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
