//! On-demand paging from C: `tests/c/odp.c` on the drop-in reads the ODP capabilities from
//! `ibv_query_device_ex`, registers an ODP MR over an unmapped page and the implicit MR
//! (addr NULL, length SIZE_MAX), writes into a page mapped after registration, gets
//! `IBV_WC_REM_ACCESS_ERR` for a READ of a page unmapped after it and the new contents once
//! it is mapped again, `IBV_WC_LOC_PROT_ERR` for a gather from an unmapped page, and the
//! kernel's errnos from `ibv_advise_mr` (docs/design/registered-memory.md, "On-demand paging").
//! Afterwards the daemon holds nothing of it.
//!
//! Skipped (with a message) only when gcc or rdma-core's `verbs.h` is missing.

mod support;

use support::{assert_nothing_left, c_toolchain_missing, compile, Daemon};

const CHECKS: &[&str] = &[
    "query_device_ex_odp_caps",
    "reg_odp_over_unmapped",
    "reg_implicit_needs_on_demand",
    "reg_implicit",
    "write_into_page_mapped_after_implicit_mr",
    "read_of_unmapped_page_is_rem_access_err",
    "remapped_page_is_read",
    "gather_from_unmapped_is_loc_prot_err",
    "advise_prefetch_write_flush",
    "advise_flush_of_unmapped_is_efault",
    "advise_async_of_unmapped_is_0",
    "advise_unknown_flag_is_einval",
    "advise_unknown_advice_is_eopnotsupp",
    "advise_of_pinned_mr_is_enoent",
    "advise_of_unknown_lkey_is_enoent",
];

#[test]
fn odp_and_implicit_mrs_see_memory_as_mapped_at_access_time() {
    if let Some(why) = c_toolchain_missing() {
        eprintln!("SKIP: {why}");
        return;
    }
    let d = Daemon::start("odp");
    let prog = d.dir.join("odp");
    compile("tests/c/odp.c", &prog);
    let (said, status) = d.run("odp", &prog, &[]).finish();
    let text = said.join("\n");
    let failed: Vec<&String> = said.iter().filter(|l| !l.starts_with("ok ")).collect();
    let ok: Vec<&str> = said.iter().filter_map(|l| l.strip_prefix("ok ")).collect();
    let summary = format!("odp: {} checks, 0 failed", CHECKS.len());
    assert_eq!(failed, vec![&summary], "{text}");
    assert_eq!(ok, CHECKS, "{text}");
    assert!(status.success(), "odp exited with {status}:\n{text}");
    assert_nothing_left(&d);
}
