//! Registration shares pages in place by default, and a program cannot tell
//! (docs/design/registered-memory.md, "Sharing by default"): `tests/c/fork_mr.c` on the drop-in
//! forks while a `malloc`ed buffer is registered (the child gets its own copy as of the
//! fork, its writes to the buffer and its neighbours stay in it, an RDMA WRITE after the
//! fork reaches the parent only), deregisters (the pages are private again, with their
//! bytes) and grows a deregistered mmapped chunk with `realloc` (no `SIGBUS`).
//!
//! As root the first registration must have converted the pages (otherwise the test would
//! prove nothing about sharing); without privilege it may not have. Also run with
//! `SOFTVERBS_SHARED_MR=0`, where nothing is converted and every check holds as well.
//!
//! Skipped (with a message) only when gcc or rdma-core's `verbs.h` is missing.

mod support;

use support::{assert_nothing_left, c_program, is_root, run_checks};

const CHECKS: &[&str] = &[
    "child_writes_stay_in_the_child",
    "rdma_write_after_fork_reaches_the_parent",
    "child_had_its_own_copy",
    "dereg_makes_the_pages_private_again",
    "realloc_after_dereg_grows",
];

fn run(name: &str, shared_mr: Option<&str>) {
    let Some((d, prog)) = c_program(name, "tests/c/fork_mr.c") else {
        return;
    };
    let mut cmd = d.command(&prog, &[]);
    cmd.env_remove("SOFTVERBS_SHARED_MR");
    if let Some(v) = shared_mr {
        cmd.env("SOFTVERBS_SHARED_MR", v);
    }
    let said = run_checks(cmd, "fork_mr", CHECKS);
    let text = said.join("\n");
    // The small MR, then the 5 MiB one (converted in three pieces).
    for what in ["info converted ", "info converted big "] {
        let converted = said
            .iter()
            .find_map(|l| l.strip_prefix(what).filter(|v| !v.starts_with("big")));
        match (shared_mr, is_root()) {
            (Some("0"), _) => assert_eq!(converted, Some("0"), "{what}: {text}"),
            (_, true) => assert_eq!(converted, Some("1"), "{what}: {text}"),
            (_, false) => assert!(matches!(converted, Some("0" | "1")), "{what}: {text}"),
        }
    }
    assert_nothing_left(&d);
}

#[test]
fn a_forked_child_copies_registered_memory_shared_by_default() {
    run("fork-mr", None);
}

#[test]
fn a_forked_child_copies_registered_memory_without_sharing() {
    run("fork-mr-private", Some("0"));
}
