//! Registration while another thread writes the buffer, from C: `tests/c/concurrent_reg.c`
//! on the drop-in. A second thread stores every word of three pages once, one after another,
//! while the first calls `ibv_reg_mr` over all but 40 bytes at each end; afterwards every
//! word holds what was stored (nothing lost, nothing torn), an RDMA READ of the MR returns
//! what the program sees, and an RDMA WRITE into it lands while the bytes beside it keep
//! theirs (docs/design/registered-memory.md, "Registration while other threads write").
//!
//! Run with the default registration (the pages become shared memory in place while the
//! writer runs), with `SOFTVERBS_SHARED_MR=1` (the same, named) and with
//! `SOFTVERBS_SHARED_MR=0` (the daemon reaches the pages through the program's own
//! `/proc/self/mem`, nothing is remapped).
//!
//! Skipped (with a message) only when gcc or rdma-core's `verbs.h` is missing.

mod support;

use support::{assert_nothing_left, c_program, is_root, run_checks};

const CHECKS: &[&str] = &[
    "reg_mr_while_another_thread_writes",
    "no_write_lost_or_torn",
    "rdma_read_sees_what_the_program_wrote",
    "rdma_write_lands_and_neighbours_keep_theirs",
];

/// `ROUNDS` of the C program.
const ROUNDS: u32 = 40;

/// `shared_mr`: the value of `SOFTVERBS_SHARED_MR`, or `None` to leave it unset.
fn run(name: &str, shared_mr: Option<&str>) {
    let Some((d, prog)) = c_program(name, "tests/c/concurrent_reg.c") else {
        return;
    };
    let mut cmd = d.command(&prog, &[]);
    cmd.env_remove("SOFTVERBS_SHARED_MR");
    if let Some(v) = shared_mr {
        cmd.env("SOFTVERBS_SHARED_MR", v);
    }
    let said = run_checks(cmd, "concurrent_reg", CHECKS);
    let text = said.join("\n");
    // Unless SOFTVERBS_SHARED_MR=0, every registration converts, unless userfaultfd
    // write-protection is unavailable (no CAP_SYS_PTRACE), when none may.
    let converted = said
        .iter()
        .find_map(|l| l.strip_prefix("info converted "))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse::<u32>().ok());
    let root = is_root();
    match (shared_mr, root) {
        (Some("0"), _) => assert_eq!(converted, Some(0), "{text}"),
        (_, true) => assert_eq!(converted, Some(ROUNDS), "{text}"),
        (_, false) => assert!(matches!(converted, Some(0) | Some(ROUNDS)), "{text}"),
    }
    assert_nothing_left(&d);
}

#[test]
fn default_registration_loses_no_concurrent_write() {
    run("concurrent-reg", None);
}

#[test]
fn shared_registration_named_loses_no_concurrent_write() {
    run("concurrent-reg-shared", Some("1"));
}

#[test]
fn registration_without_sharing_loses_no_concurrent_write() {
    run("concurrent-reg-private", Some("0"));
}
