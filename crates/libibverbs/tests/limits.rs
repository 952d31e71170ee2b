//! The daemon's limits from C (docs/guide/limits.md): `tests/c/limits.c` on the drop-in, against a
//! daemon with small per-context limits, gets NULL with errno ENOMEM from `ibv_alloc_pd`,
//! `ibv_create_cq` (too many, and a ring past the ring bytes), `ibv_create_qp`,
//! `ibv_create_comp_channel` and `ibv_reg_mr` past each limit, while a second context of the
//! same program still moves data. Afterwards the daemon holds nothing of it.
//!
//! Skipped (with a message) only when gcc or rdma-core's `verbs.h` is missing.

mod support;

use support::{c_toolchain_missing, compile, Daemon, SECTIONS};

const CHECKS: &[&str] = &[
    "alloc_pd_over_limit",
    "create_cq_over_ring_bytes",
    "create_cq_over_limit",
    "create_qp_over_limit",
    "create_comp_channel_over_limit",
    "reg_mr_over_registered_bytes",
    "other_context_transfers",
];

#[test]
fn a_c_program_over_its_limits_gets_null_and_enomem_and_its_other_context_works() {
    if let Some(why) = c_toolchain_missing() {
        eprintln!("SKIP: {why}");
        return;
    }
    let d = Daemon::start_with_args(
        "limits",
        &[
            "--limit",
            "context.cqs=3",
            "--limit",
            "context.pds=1",
            "--limit",
            "context.qps=2",
            "--limit",
            "context.channels=1",
            "--limit",
            "context.registered-bytes=64K",
            "--limit",
            "context.ring-bytes=40K",
        ],
    );
    let prog = d.dir.join("limits");
    compile("tests/c/limits.c", &prog);
    let (said, status) = d.run("limits", &prog, &[]).finish();
    let text = said.join("\n");
    let failed: Vec<&String> = said.iter().filter(|l| !l.starts_with("ok ")).collect();
    let ok: Vec<&str> = said.iter().filter_map(|l| l.strip_prefix("ok ")).collect();
    let summary = format!("limits: {} checks, 0 failed", CHECKS.len());
    assert_eq!(failed, vec![&summary], "{text}");
    assert_eq!(ok, CHECKS, "{text}");
    assert!(status.success(), "limits exited with {status}:\n{text}");
    // What remains charged is the one connection `resources` asks on (a descriptor).
    let used = |r: &serde_json::Value, name: &str| {
        r["limits"].as_array().and_then(|l| {
            l.iter()
                .find(|l| l["resource"] == name)
                .and_then(|l| l["used"].as_u64())
        })
    };
    let r = d.wait_until("the program's contexts and connections are gone", |r| {
        r["contexts"].as_array().is_some_and(Vec::is_empty) && used(r, "descriptors") == Some(1)
    });
    for section in SECTIONS {
        assert_eq!(
            r[section].as_array().map(Vec::len),
            Some(0),
            "{section}: {r:#}"
        );
    }
    let left: Vec<u64> = r["limits"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["resource"] != "descriptors")
        .map(|l| l["used"].as_u64().unwrap())
        .collect();
    assert!(left.iter().all(|&u| u == 0), "charges left behind: {r:#}");
}
