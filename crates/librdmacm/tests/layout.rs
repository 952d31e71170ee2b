//! The installed `<rdma/rdma_cma.h>` lays its structs out as `src/ffi.rs` pins them at
//! compile time (programs read `id->verbs`, `id->qp`, `id->route`, `event->param` directly):
//! a C program prints sizes and offsets (tests/c/layout.c) and they must equal these
//! numbers, measured on Debian bookworm. Skipped with a message without gcc or
//! librdmacm-dev (failing under CI).

use std::collections::BTreeMap;
use std::process::Command;

const EXPECTED: &[(&str, usize)] = &[
    ("sizeof rdma_event_channel", 4),
    ("sizeof rdma_addr", 296),
    ("offsetof rdma_addr.dst_addr", 128),
    ("offsetof rdma_addr.addr", 256),
    ("sizeof rdma_route", 312),
    ("offsetof rdma_route.path_rec", 296),
    ("offsetof rdma_route.num_paths", 304),
    ("sizeof rdma_cm_id", 416),
    ("offsetof rdma_cm_id.verbs", 0),
    ("offsetof rdma_cm_id.channel", 8),
    ("offsetof rdma_cm_id.context", 16),
    ("offsetof rdma_cm_id.qp", 24),
    ("offsetof rdma_cm_id.route", 32),
    ("offsetof rdma_cm_id.ps", 344),
    ("offsetof rdma_cm_id.port_num", 348),
    ("offsetof rdma_cm_id.event", 352),
    ("offsetof rdma_cm_id.send_cq_channel", 360),
    ("offsetof rdma_cm_id.send_cq", 368),
    ("offsetof rdma_cm_id.recv_cq_channel", 376),
    ("offsetof rdma_cm_id.recv_cq", 384),
    ("offsetof rdma_cm_id.srq", 392),
    ("offsetof rdma_cm_id.pd", 400),
    ("offsetof rdma_cm_id.qp_type", 408),
    ("sizeof rdma_conn_param", 24),
    ("offsetof rdma_conn_param.private_data_len", 8),
    ("offsetof rdma_conn_param.responder_resources", 9),
    ("offsetof rdma_conn_param.rnr_retry_count", 13),
    ("offsetof rdma_conn_param.srq", 14),
    ("offsetof rdma_conn_param.qp_num", 16),
    ("sizeof rdma_ud_param", 56),
    ("offsetof rdma_ud_param.ah_attr", 16),
    ("offsetof rdma_ud_param.qp_num", 48),
    ("offsetof rdma_ud_param.qkey", 52),
    ("sizeof rdma_cm_event", 80),
    ("offsetof rdma_cm_event.listen_id", 8),
    ("offsetof rdma_cm_event.event", 16),
    ("offsetof rdma_cm_event.status", 20),
    ("offsetof rdma_cm_event.param", 24),
    ("sizeof rdma_addrinfo", 96),
    ("offsetof rdma_addrinfo.ai_src_len", 16),
    ("offsetof rdma_addrinfo.ai_src_addr", 24),
    ("offsetof rdma_addrinfo.ai_dst_addr", 32),
    ("offsetof rdma_addrinfo.ai_route_len", 56),
    ("offsetof rdma_addrinfo.ai_connect", 80),
    ("offsetof rdma_addrinfo.ai_next", 88),
    ("sizeof ibv_qp_attr", 144),
    ("offsetof ibv_qp_attr.ah_attr", 56),
    ("offsetof ibv_qp_attr.pkey_index", 120),
    ("offsetof ibv_qp_attr.rnr_retry", 132),
    ("sizeof ibv_qp_init_attr", 64),
    ("offsetof ibv_qp_init_attr.qp_type", 52),
    ("offsetof ibv_qp_init_attr_ex.comp_mask", 60),
    ("offsetof ibv_qp_init_attr_ex.pd", 64),
    ("offsetof ibv_qp.qp_num", 52),
    ("offsetof ibv_qp.qp_type", 60),
];

#[test]
fn rdma_cma_h_layouts_match_the_drop_in() {
    let header = std::path::Path::new("/usr/include/rdma/rdma_cma.h");
    let gcc = Command::new("gcc").arg("--version").output();
    if !header.is_file() || gcc.is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "gcc and librdmacm-dev are required under CI"
        );
        eprintln!("SKIP: gcc or /usr/include/rdma/rdma_cma.h (librdmacm-dev) missing");
        return;
    }
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let exe = dir.join(format!("rdmacm-layout-{}", std::process::id()));
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/layout.c");
    let o = Command::new("gcc")
        .arg("-o")
        .arg(&exe)
        .arg(src)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_file(&exe);
    let got: BTreeMap<String, usize> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect();
    for (k, v) in EXPECTED {
        assert_eq!(got.get(*k), Some(v), "{k}");
    }
    assert_eq!(got.len(), EXPECTED.len(), "every printed layout is checked");
}
