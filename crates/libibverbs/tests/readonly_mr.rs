//! Registrations over read-only and unmapped pages from C: `tests/c/readonly_mr.c` on the
//! drop-in gets NULL with errno EFAULT from `ibv_reg_mr` with write access over a
//! `PROT_READ` page and with any access over an unmapped one; a read-only registration of
//! the page works, an RDMA READ of it returns its bytes, and an RDMA WRITE towards it fails
//! and leaves it unchanged (docs/design/registered-memory.md, "Writes to read-only pages").
//! Afterwards the daemon holds nothing of it.
//!
//! Skipped (with a message) only when gcc or rdma-core's `verbs.h` is missing.

mod support;

use support::{assert_nothing_left, c_toolchain_missing, compile, Daemon};

const CHECKS: &[&str] = &[
    "reg_local_write_over_prot_read",
    "reg_remote_write_over_prot_read",
    "reg_remote_atomic_over_prot_read",
    "reg_over_unmapped",
    "reg_write_over_unmapped",
    "reg_remote_read_over_prot_read",
    "rdma_read_of_prot_read",
    "rdma_write_leaves_prot_read_unchanged",
];

#[test]
fn reg_mr_over_read_only_or_unmapped_pages_is_efault_and_a_write_never_lands() {
    if let Some(why) = c_toolchain_missing() {
        eprintln!("SKIP: {why}");
        return;
    }
    let d = Daemon::start("readonly-mr");
    let prog = d.dir.join("readonly_mr");
    compile("tests/c/readonly_mr.c", &prog);
    let (said, status) = d.run("readonly_mr", &prog, &[]).finish();
    let text = said.join("\n");
    let failed: Vec<&String> = said.iter().filter(|l| !l.starts_with("ok ")).collect();
    let ok: Vec<&str> = said.iter().filter_map(|l| l.strip_prefix("ok ")).collect();
    let summary = format!("readonly_mr: {} checks, 0 failed", CHECKS.len());
    assert_eq!(failed, vec![&summary], "{text}");
    assert_eq!(ok, CHECKS, "{text}");
    assert!(
        status.success(),
        "readonly_mr exited with {status}:\n{text}"
    );
    assert_nothing_left(&d);
}
