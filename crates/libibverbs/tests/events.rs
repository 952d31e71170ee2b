//! Completion channels and async events from C, as rdma-core documents them: blocking and
//! non-blocking fds, one event per arming (solicited-only too), acknowledgement, and
//! `ibv_destroy_cq`/`ibv_destroy_qp` waiting for the acks of the events they handed out
//! (`tests/c/events.c`, compiled with gcc against the real `<infiniband/verbs.h>` and run on the
//! drop-in with `softverbs run`). Skipped (with a message) only when gcc or `verbs.h` is missing.

mod support;

use support::c_program;

const CHECKS: &[&str] = &[
    "channel_refcnt_counts_cqs",
    "get_cq_event_blocks_then_names_the_cq",
    "unarmed_cq_raises_no_event",
    "nonblocking_channel_fd_not_readable",
    "channel_fd_becomes_readable",
    "get_cq_event_nonblocking",
    "solicited_only_ignores_unsolicited",
    "destroy_cq_waits_for_acks",
    "destroy_cq_returns_after_acks",
    "channel_refcnt_drops",
    "destroy_comp_channel",
    "get_async_event_blocks_then_names_the_qp",
    "destroy_qp_waits_for_ack",
    "destroy_qp_returns_after_ack",
    "async_nonblocking_eagain",
    "async_fd_becomes_readable",
    "async_port_event",
];

#[test]
fn channels_and_async_events_behave_as_rdma_core_documents() {
    let Some((d, prog)) = c_program("events", "tests/c/events.c") else {
        return;
    };
    let (said, status) = d.run("events", &prog, &[]).finish();
    let text = said.join("\n");
    let ok: Vec<&str> = said.iter().filter_map(|l| l.strip_prefix("ok ")).collect();
    assert_eq!(ok, CHECKS, "events.c:\n{text}");
    assert!(
        said.last()
            .is_some_and(|l| l == &format!("events: {} checks, 0 failed", CHECKS.len())),
        "{text}"
    );
    assert!(status.success(), "events exited with {status}:\n{text}");
}
