//! The installed `<infiniband/verbs.h>` still lays structs out the way the drop-in does:
//! a C program prints sizes and offsets (tests/c/layout.c) and they must equal the numbers
//! `src/ffi.rs` pins at compile time (docs/design/abi-compat.md §2.1, measured on Debian bookworm).
//! Skipped with a message when gcc or libibverbs-dev is missing (scripts/test.sh installs them).

use std::collections::BTreeMap;
use std::process::Command;

const EXPECTED: &[(&str, usize)] = &[
    ("sizeof ibv_device", 664),
    ("offsetof ibv_device.transport_type", 20),
    ("offsetof ibv_device.name", 24),
    ("offsetof ibv_device.ibdev_path", 408),
    ("sizeof ibv_context", 328),
    ("offsetof ibv_context.ops", 8),
    ("offsetof ibv_context.cmd_fd", 264),
    ("offsetof ibv_context.async_fd", 268),
    ("offsetof ibv_context.num_comp_vectors", 272),
    ("offsetof ibv_context.mutex", 280),
    ("offsetof ibv_context.abi_compat", 320),
    ("offsetof ibv_context.ops.poll_cq", 96),
    ("offsetof ibv_context.ops.req_notify_cq", 104),
    ("offsetof ibv_context.ops.post_srq_recv", 168),
    ("offsetof ibv_context.ops.post_send", 208),
    ("offsetof ibv_context.ops.post_recv", 216),
    ("offsetof ibv_context.ops.alloc_mw", 64),
    ("offsetof ibv_context.ops.dealloc_mw", 80),
    ("sizeof verbs_context", 648),
    ("offsetof verbs_context.query_port", 0),
    ("offsetof verbs_context.create_cq_ex", 200),
    ("offsetof verbs_context.query_device_ex", 216),
    ("offsetof verbs_context.open_qp", 256),
    ("offsetof verbs_context.create_qp_ex", 264),
    ("offsetof verbs_context.get_srq_num", 272),
    ("offsetof verbs_context.create_srq_ex", 280),
    ("offsetof verbs_context.open_xrcd", 288),
    ("offsetof verbs_context.close_xrcd", 296),
    ("offsetof verbs_context.sz", 312),
    ("offsetof verbs_context.context", 320),
    ("sizeof ibv_device_attr", 232),
    ("sizeof ibv_device_attr_ex", 400),
    ("offsetof ibv_device_attr_ex.max_wq_type_rq", 328),
    ("offsetof ibv_device_attr_ex.max_dm_size", 376),
    ("offsetof ibv_device_attr_ex.phys_port_cnt_ex", 396),
    ("sizeof ibv_port_attr", 52),
    ("offsetof ibv_port_attr.link_layer", 46),
    ("offsetof ibv_port_attr.port_cap_flags2", 48),
    ("sizeof ibv_gid_entry", 32),
    ("sizeof ibv_comp_channel", 16),
    ("offsetof ibv_mr.addr", 16),
    ("offsetof ibv_mr.length", 24),
    ("offsetof ibv_mr.lkey", 36),
    ("offsetof ibv_mr.rkey", 40),
    ("sizeof ibv_cq", 128),
    ("offsetof ibv_cq.comp_events_completed", 120),
    ("offsetof ibv_cq.async_events_completed", 124),
    ("sizeof ibv_cq_ex", 288),
    ("offsetof ibv_cq_ex.status", 132),
    ("offsetof ibv_cq_ex.wr_id", 136),
    ("offsetof ibv_cq_ex.start_poll", 144),
    ("offsetof ibv_cq_ex.read_completion_ts", 248),
    ("offsetof ibv_cq_ex.read_completion_wallclock_ns", 280),
    ("sizeof ibv_srq", 128),
    ("offsetof ibv_srq.events_completed", 120),
    ("sizeof ibv_qp", 160),
    ("offsetof ibv_qp.qp_num", 52),
    ("offsetof ibv_qp.events_completed", 152),
    ("sizeof ibv_qp_ex", 352),
    ("offsetof ibv_qp_ex.wr_id", 168),
    ("offsetof ibv_qp_ex.wr_flags", 176),
    ("offsetof ibv_qp_ex.wr_send", 240),
    ("offsetof ibv_qp_ex.wr_set_xrc_srqn", 280),
    ("offsetof ibv_qp_ex.wr_set_sge", 304),
    ("offsetof ibv_qp_ex.wr_start", 320),
    ("offsetof ibv_qp_ex.wr_atomic_write", 344),
    ("sizeof ibv_qp_init_attr", 64),
    ("sizeof ibv_qp_init_attr_ex", 136),
    ("offsetof ibv_qp_init_attr_ex.send_ops_flags", 128),
    ("sizeof ibv_qp_attr", 144),
    ("offsetof ibv_qp_attr.ah_attr", 56),
    ("offsetof ibv_qp_attr.rate_limit", 136),
    ("sizeof ibv_ah_attr", 32),
    ("sizeof ibv_srq_init_attr_ex", 64),
    ("offsetof ibv_srq_init_attr_ex.cq", 48),
    ("sizeof ibv_cq_init_attr_ex", 56),
    ("sizeof ibv_qp_open_attr", 32),
    ("sizeof ibv_xrcd_init_attr", 12),
    ("sizeof ibv_wc", 48),
    ("sizeof ibv_send_wr", 128),
    ("offsetof ibv_send_wr.wr", 40),
    ("offsetof ibv_send_wr.qp_type.xrc.remote_srqn", 72),
    ("offsetof ibv_send_wr.bind_mw", 80),
    ("sizeof ibv_recv_wr", 32),
    ("sizeof ibv_sge", 16),
    ("sizeof ibv_async_event", 16),
];

#[test]
fn verbs_h_layout_matches_the_drop_in() {
    if !std::path::Path::new("/usr/include/infiniband/verbs.h").is_file() {
        eprintln!("SKIP: /usr/include/infiniband/verbs.h missing (apt-get install libibverbs-dev)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("sv-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("layout");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/layout.c");
    let cc = match Command::new("gcc").arg("-o").arg(&exe).arg(src).output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIP: gcc: {e}");
            return;
        }
    };
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let got: BTreeMap<String, usize> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect();
    let wrong: Vec<String> = EXPECTED
        .iter()
        .filter(|(k, v)| got.get(*k) != Some(v))
        .map(|(k, v)| format!("{k}: header {:?}, drop-in {v}", got.get(*k)))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert_eq!(got.len(), EXPECTED.len(), "every printed fact is checked");
}
