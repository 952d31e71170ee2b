//! Registration never changes what a later legal operation on the program's own memory does
//! (issue 35, item 6; docs/design/registered-memory.md, "What registration must not change"):
//! `tests/c/mem_semantics.c` through the drop-in checks `mlock`, `MADV_DONTFORK`,
//! `MADV_WIPEONFORK`, the program's own `pthread_atfork` child handler and `realloc` of a
//! registered chunk, once with sharing on (the default) and once with
//! `SOFTVERBS_SHARED_MR=0` (nothing converted: what a NIC does). Both runs must pass the
//! same checks. As root, the buffers without special flags (the `atfork` and `realloc`
//! cases) must have been converted, or the shared run would prove nothing.
//!
//! Skipped (with a message) only when gcc or rdma-core's `verbs.h` is missing.

mod support;

use support::{assert_nothing_left, c_program, is_root, run_checks};

const CHECKS: &[&str] = &[
    "mlock_stays_locked",
    "dontfork_keeps_the_range_out_of_children",
    "wipeonfork_children_see_zeros",
    "program_atfork_handler_writes_the_childs_copy",
    "realloc_of_a_registered_chunk_grows",
];

fn run(name: &str, shared_mr: Option<&str>) {
    let Some((d, prog)) = c_program(name, "tests/c/mem_semantics.c") else {
        return;
    };
    let mut cmd = d.command(&prog, &[]);
    cmd.env_remove("SOFTVERBS_SHARED_MR");
    if let Some(v) = shared_mr {
        cmd.env("SOFTVERBS_SHARED_MR", v);
    }
    let said = run_checks(cmd, "mem_semantics", CHECKS);
    let text = said.join("\n");
    let converted = |what: &str| {
        said.iter()
            .find_map(|l| l.strip_prefix(&format!("info converted {what} ")))
            .map(str::to_owned)
    };
    for what in ["atfork", "realloc"] {
        match (shared_mr, is_root()) {
            (Some("0"), _) => assert_eq!(converted(what).as_deref(), Some("0"), "{text}"),
            (_, true) => assert_eq!(converted(what).as_deref(), Some("1"), "{what}: {text}"),
            (_, false) => {}
        }
    }
    assert_nothing_left(&d);
}

#[test]
fn registration_keeps_memory_semantics_when_sharing() {
    run("mem-sem", None);
}

#[test]
fn registration_keeps_memory_semantics_without_sharing() {
    run("mem-sem-private", Some("0"));
}
