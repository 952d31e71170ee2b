//! rping's teardown order (tests/c/destroy_order.c): a CM thread handling an event while the
//! main thread destroys its id, then the channel while that thread waits in
//! `rdma_get_cm_event` again. `rdma_destroy_id` must wait for the event's ack
//! (rdma_destroy_id(3)) and the waiting thread must neither fail nor touch freed memory —
//! rping exited 255 ("rdma_get_cm_event: Bad file descriptor") when the drop-in did neither.
//! First the same wait in `rdma_migrate_id` (rdma_migrate_id(3)): a thread holds an event of
//! an id while the main thread migrates it ("rdma_migrate_id returned before the event was
//! acked" before).
//!
//! Skipped (with a message) without gcc or librdmacm-dev (CI has both). Build
//! `softverbs-cli` first; run inside a network namespace of your own (docs/design/cm.md §6).

mod support;

use std::path::Path;

use softverbs_testkit::process::finish;
use softverbs_testkit::Daemon;
use support::{ok, run};

#[test]
fn destroy_and_migrate_wait_for_the_ack_and_a_waiter_outlives_its_channel() {
    let Some(exe) = support::build_c("destroy_order", Path::new(env!("CARGO_TARGET_TMPDIR")))
    else {
        return;
    };
    let d = Daemon::start("destroy_order");
    let out = ok(
        finish(run(None, &d.socket, &exe, &[]), "destroy_order.c"),
        "destroy_order.c",
    );
    let _ = std::fs::remove_file(&exe);
    assert_eq!(out, "ok\n");
}
