//! Small SENDs and WRITEs posted without `IBV_SEND_INLINE` (perftest's way on a device it
//! does not know), which the drop-in copies itself when the SGEs lie in the QP's PD's MRs:
//! `tests/c/small_sends.c`, compiled with gcc against the real `<infiniband/verbs.h>` and run
//! on the drop-in with `softverbs run`. The data must arrive intact (several SGEs, an IOVA
//! MR), and requests with a bad lkey, a range past the MR or a deregistered MR must still
//! complete with `IBV_WC_LOC_PROT_ERR`.
//!
//! Skipped (with a message) only when gcc or rdma-core's `verbs.h` is missing. The `softverbs`
//! binary must be built in the same profile (`cargo build -p softverbs-cli`).

mod support;

use support::c_program;

/// Every check the program makes; each must report `ok`.
const CHECKS: &[&str] = &[
    "query_qp_caps_at_least_asked",
    "send_100_bytes",
    "send_three_sges_in_order",
    "send_from_iova_mr",
    "write_64_bytes",
    "send_unknown_lkey_loc_prot_err",
    "send_past_mr_end_loc_prot_err",
    "send_from_deregistered_mr_loc_prot_err",
];

#[test]
fn small_sends_arrive_intact_and_bad_keys_still_fail_at_completion() {
    let Some((d, prog)) = c_program("small-sends", "tests/c/small_sends.c") else {
        return;
    };
    let (said, status) = d.run("small_sends", &prog, &[]).finish();
    let text = said.join("\n");
    let ok: Vec<&str> = said.iter().filter_map(|l| l.strip_prefix("ok ")).collect();
    let summary = format!("small_sends: {} checks, 0 failed", CHECKS.len());
    assert!(
        said.last() == Some(&summary) && ok == CHECKS,
        "small_sends:\n{text}\ndaemon log:\n{}",
        d.log()
    );
    assert!(
        status.success(),
        "small_sends exited with {status}:\n{text}"
    );
}
