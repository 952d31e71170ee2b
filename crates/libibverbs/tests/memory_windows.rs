//! Memory windows through the drop-in (`tests/c/memory_windows.c`, compiled against the real
//! `<infiniband/verbs.h>` and run with `softverbs run`): a target process binds type 1 and
//! type 2 windows over its memory, an initiator process reaches them through their R_Keys,
//! and every window rule of IBA 10.6.7 is one named check at the end that observes it, on one
//! daemon and across two daemons over UDP (docs/design/memory-windows.md).
//!
//! Skipped (with a message) only when gcc or rdma-core's `verbs.h` is missing. Run inside
//! `unshare -n` (the daemons bind UDP 4791 on 127.x addresses).

mod support;

use support::{c_toolchain_missing, compile, Daemon, Proc};

const TARGET_CHECKS: &[&str] = &[
    "caps_max_mw",
    "caps_mem_window_flags",
    "caps_ex_flags",
    "alloc_mw_type3_einval",
    "alloc_mw_type",
    "dealloc_pd_with_window_ebusy",
    "bind_mw_type2_einval",
    "bind_mw_other_pd_eperm",
    "bind_mw_zero_based_einval",
    "bind_without_mw_bind_access",
    "bind_error_qp_in_error",
    "bind_past_mr",
    "type2_zero_length_bind",
    "type1_bind",
    "type2_bind",
    "more_binds",
    "dereg_mr_with_bound_windows_einval",
    "local_invalidate",
    "dealloc_mw",
    "write_through_type1_landed",
    "send_with_inv_completion",
    "send_with_inv_of_mr_key_recv_rem_inv_req_err",
    "responder_access_error_event",
    "send_with_inv_of_mr_key_req_err_event",
    "dereg_mr_after_windows_gone",
    "dealloc_remaining",
];

const INITIATOR_CHECKS: &[&str] = &[
    "remote_write_through_type1",
    "remote_read_through_type2",
    "send_with_invalidate",
    "access_after_remote_invalidate_rem_access_err",
    "outside_range_rem_access_err",
    "wrong_access_rem_access_err",
    "type2_other_qp_rem_access_err",
    "access_after_local_invalidate_rem_access_err",
    "stale_consumer_key_rem_access_err",
    "dealloc_mw_rem_access_err",
    "send_with_inv_of_mr_key_rem_inv_req_err",
];

/// A loopback address of this test process's own (`support::loopback_addr`).
fn addr(host: u8) -> String {
    support::loopback_addr(210 + host)
}

fn program(d: &Daemon) -> Option<std::path::PathBuf> {
    if let Some(why) = c_toolchain_missing() {
        eprintln!("SKIP: {why}");
        return None;
    }
    let prog = d.dir.join("memory_windows");
    compile("tests/c/memory_windows.c", &prog);
    Some(prog)
}

fn oks(said: &[String]) -> Vec<&str> {
    said.iter().filter_map(|l| l.strip_prefix("ok ")).collect()
}

/// The target on `dt`, the initiator on `di`.
fn windows(dt: &Daemon, di: &Daemon, prog: &std::path::Path) {
    let mut t: Proc = dt.run("target", prog, &["target"]);
    let mut i: Proc = di.run("initiator", prog, &["initiator"]);
    let tq = t.expect("qps ");
    let iq = i.expect("qps ");
    t.tell(&format!("peer {iq}"));
    // The target's local checks come first, then its keys.
    let mut early = Vec::new();
    let keys = loop {
        let l = t.line();
        if let Some(k) = l.strip_prefix("keys ") {
            break k.to_string();
        }
        assert!(!l.starts_with("FATAL"), "target: {l}\n{}", dt.log());
        early.push(l);
    };
    i.tell(&format!("peer {tq}"));
    i.tell(&format!("keys {keys}"));
    let (i_said, i_status) = i.finish();
    t.tell("check");
    let (t_said, t_status) = t.finish();
    let t_all: Vec<String> = early.into_iter().chain(t_said).collect();
    assert!(
        oks(&i_said) == INITIATOR_CHECKS && i_status.success(),
        "initiator:\n{}\ntarget:\n{}\nlogs:\n{}\n{}",
        i_said.join("\n"),
        t_all.join("\n"),
        di.log(),
        dt.log()
    );
    assert!(
        oks(&t_all) == TARGET_CHECKS && t_status.success(),
        "target:\n{}\nlogs:\n{}",
        t_all.join("\n"),
        dt.log()
    );
}

#[test]
fn window_rules_between_two_processes_on_one_daemon() {
    let d = Daemon::start_with_ip("mw-one", &addr(1));
    let Some(prog) = program(&d) else { return };
    windows(&d, &d, &prog);
}

#[test]
fn window_rules_across_two_daemons() {
    let a = Daemon::start_with_ip("mw-a", &addr(2));
    let b = Daemon::start_with_ip("mw-b", &addr(3));
    let Some(prog) = program(&a) else { return };
    windows(&a, &b, &prog);
}
