//! Wrong use from C gets the error rdma-core 44 returns: `tests/c/wrong_use.c` (each check cites
//! the rdma-core or kernel code whose answer it expects) compiled with gcc against the real
//! `<infiniband/verbs.h>`, run on the drop-in with `softverbs run` against a daemon of the
//! test's own. Afterwards the daemon holds nothing of it.
//!
//! Skipped (with a message) only when gcc or rdma-core's `verbs.h` is missing. The `softverbs`
//! binary must be built in the same profile (`cargo build -p softverbs-cli`).

mod support;

use support::{assert_nothing_left, c_program};

/// Every check the program makes; each must report `ok`.
const CHECKS: &[&str] = &[
    // NULL where rdma-core tolerates it.
    "get_device_list_null_num",
    "query_device_ex_null_input",
    "query_device_ex_unknown_comp_mask",
    "create_cq_null_channel",
    // Undersized and oversized structs.
    "query_device_ex_slot",
    "query_device_ex_undersized",
    "query_device_ex_orig_size",
    "query_device_ex_orig_size_writes_no_more",
    "query_device_ex_oversized",
    "query_device_ex_oversized_clears_the_tail",
    // Bad ports and GID indexes.
    "query_port_0",
    "query_port_9",
    "query_port_0_compat",
    "query_port_1",
    "query_gid_index_past_table",
    "query_gid_negative_index",
    "query_gid_port_9",
    "query_gid_index_0",
    // Parents still in use.
    "dealloc_pd_with_mr",
    "destroy_comp_channel_with_cq",
    "destroy_cq_of_channel",
    "destroy_comp_channel_unused",
    "destroy_cq_with_qp",
    // A QP in the wrong state.
    "post_send_in_reset",
    "post_send_in_reset_names_bad_wr",
    "modify_qp_reset_to_rts",
    "modify_qp_failure_keeps_state",
    // Destroyed objects.
    "destroy_qp",
    "destroy_qp_twice",
    "destroy_cq",
    "destroy_cq_twice",
    "dereg_mr",
    "dereg_mr_twice",
    "dealloc_pd",
    "dealloc_pd_twice",
    // A QP type softverbs does not have.
    "create_qp_raw_packet",
    // XRC domains, upstream and legacy.
    "open_xrcd_new_file_without_o_creat",
    "open_xrcd_o_excl_on_existing_domain",
    "close_xrcd_with_srq",
    "legacy_create_rcv_qp_null_init_attr",
    "legacy_reg_unknown_qp",
    "legacy_unreg_unregistered_qp",
    "legacy_destroy_srq",
    "legacy_close_domain_with_registration",
    "legacy_unreg",
    "legacy_unreg_twice",
    "close_xrcd",
    // Objects of a closed context.
    "close_device_with_open_pd",
    "dealloc_pd_after_close_device",
];

#[test]
fn wrong_use_from_c_returns_what_rdma_core_returns() {
    let Some((d, prog)) = c_program("wrong-use", "tests/c/wrong_use.c") else {
        return;
    };
    let dir = d.dir.to_str().expect("utf-8 path");
    let (said, status) = d.run("wrong_use", &prog, &[dir]).finish();
    let text = said.join("\n");
    let failed: Vec<&String> = said.iter().filter(|l| !l.starts_with("ok ")).collect();
    let ok: Vec<&str> = said.iter().filter_map(|l| l.strip_prefix("ok ")).collect();
    let summary = format!("wrong_use: {} checks, 0 failed", CHECKS.len());
    assert_eq!(
        failed,
        vec![&summary],
        "some wrong use got another answer than rdma-core's:\n{text}"
    );
    assert_eq!(
        ok, CHECKS,
        "the program made other checks than expected:\n{text}"
    );
    assert!(status.success(), "wrong_use exited with {status}:\n{text}");

    assert_nothing_left(&d);
}
