//! What real stacks read from a UD receive completion and from the device:
//! `tests/c/ud_completion.c`, compiled against the real `<infiniband/verbs.h>` and run on the
//! drop-in with `softverbs run`. A datagram between two processes, on one daemon and across
//! two daemons over UDP, must complete with `wc.sl` = mlx5's L3 header type (UCX's UD check
//! reads it; `docs/design/roce-wire.md`), `IBV_WC_GRH` and rxe's GRH-area layout, the sender's QPN in
//! `src_qp` and P_Key index 0; every `ibv_device_attr_ex` field must be truthful or zero
//! (`docs/guide/dropin.md`).
//!
//! Skipped (with a message) only when gcc or rdma-core's `verbs.h` is missing. Run the
//! daemon tests inside `unshare -n` (they bind UDP 4791 on 127.x addresses).

mod support;

use support::{c_toolchain_missing, compile, Daemon, Proc};

const RECV_CHECKS_V4: &[&str] = &[
    "ud_recv_completes",
    "ud_recv_sl_is_l3_type",
    "ud_recv_wc_grh",
    "ud_recv_src_qp",
    "ud_recv_qp_num",
    "ud_recv_pkey_index",
    "ud_recv_slid_path_bits",
    "ud_recv_grh_ipv4_layout",
    "ud_recv_ucx_keeps",
    "ud_recv_payload",
];

const RECV_CHECKS_V6: &[&str] = &[
    "ud_recv_completes",
    "ud_recv_sl_is_l3_type",
    "ud_recv_wc_grh",
    "ud_recv_src_qp",
    "ud_recv_qp_num",
    "ud_recv_pkey_index",
    "ud_recv_slid_path_bits",
    "ud_recv_grh_ipv6_layout",
    "ud_recv_ucx_keeps",
    "ud_recv_payload",
];

const DEVICE_CHECKS: &[&str] = &[
    "query_device_ex",
    "dx_comp_mask_zero",
    "dx_odp_caps",
    "dx_timestamp_clock",
    "dx_cap_flags_ex",
    "dx_no_tso",
    "dx_no_rss",
    "dx_no_wq",
    "dx_no_pacing",
    "dx_no_raw_packet",
    "dx_no_tag_matching",
    "dx_no_cq_moderation",
    "dx_no_device_memory",
    "dx_no_pci_atomics",
    "dx_phys_port_cnt_ex",
    "dx_modify_cq_unsupported",
    "dx_alloc_dm_unsupported",
];

/// A loopback address of this test process's own (`support::loopback_addr`).
fn addr(host: u8) -> String {
    support::loopback_addr(200 + host)
}

fn program(d: &Daemon) -> Option<std::path::PathBuf> {
    if let Some(why) = c_toolchain_missing() {
        eprintln!("SKIP: {why}");
        return None;
    }
    let prog = d.dir.join("ud_completion");
    compile("tests/c/ud_completion.c", &prog);
    Some(prog)
}

fn oks(said: &[String]) -> Vec<&str> {
    said.iter().filter_map(|l| l.strip_prefix("ok ")).collect()
}

/// One datagram from a process on `ds` to one on `dr`; the receiver's checks, `checks`.
fn one_datagram(dr: &Daemon, ds: &Daemon, prog: &std::path::Path, checks: &[&str]) {
    let mut r: Proc = dr.run("recv", prog, &["recv"]);
    let rq = r.expect("qp ");
    r.expect("posted");
    let mut s: Proc = ds.run("send", prog, &["send"]);
    let sq = s.expect("qp ");
    s.tell(&format!("peer {rq}"));
    let (s_said, s_status) = s.finish();
    assert!(
        oks(&s_said) == ["ud_send_completes"] && s_status.success(),
        "sender:\n{}\nlogs:\n{}\n{}",
        s_said.join("\n"),
        ds.log(),
        dr.log()
    );
    r.tell(&format!("peer {sq}"));
    let (said, status) = r.finish();
    let summary = format!("ud_completion: {} checks, 0 failed", checks.len());
    assert!(
        oks(&said) == checks && said.last() == Some(&summary) && status.success(),
        "receiver:\n{}\nlogs:\n{}\n{}",
        said.join("\n"),
        dr.log(),
        ds.log()
    );
}

#[test]
fn ud_receive_completion_fields_between_two_processes_on_one_daemon() {
    let d = Daemon::start_with_ip("ud-one", &addr(1));
    let Some(prog) = program(&d) else { return };
    one_datagram(&d, &d, &prog, RECV_CHECKS_V4);
}

#[test]
fn ud_receive_completion_fields_across_two_daemons() {
    let a = Daemon::start_with_ip("ud-a", &addr(2));
    let b = Daemon::start_with_ip("ud-b", &addr(3));
    let Some(prog) = program(&a) else { return };
    one_datagram(&a, &b, &prog, RECV_CHECKS_V4);
}

/// IPv6 addresses this test put on the loopback, taken off again when it ends (also when it
/// fails), so a run outside a network namespace of its own leaves nothing behind.
struct LoopbackV6(Vec<String>);

impl LoopbackV6 {
    fn add(ips: &[String]) -> LoopbackV6 {
        let mut added = LoopbackV6(Vec::new());
        for ip in ips {
            let out = std::process::Command::new("ip")
                .args([
                    "-6",
                    "addr",
                    "add",
                    &format!("{ip}/128"),
                    "dev",
                    "lo",
                    "nodad",
                ])
                .output()
                .expect("run ip");
            assert!(
                out.status.success(),
                "ip -6 addr add {ip} (run inside unshare --net as root): {}",
                String::from_utf8_lossy(&out.stderr)
            );
            added.0.push(ip.clone());
        }
        added
    }
}

impl Drop for LoopbackV6 {
    fn drop(&mut self) {
        for ip in &self.0 {
            let _ = std::process::Command::new("ip")
                .args(["-6", "addr", "del", &format!("{ip}/128"), "dev", "lo"])
                .output();
        }
    }
}

/// The same over IPv6: two daemons on ULA addresses (RFC 4193) this test puts on the
/// loopback (`nodad`: usable at once). The GRH area is then the IPv6 header and `wc.sl` 1,
/// and UCX's check reads the 16-byte DGID at bytes 24–39.
#[test]
fn ud_receive_completion_fields_across_two_daemons_over_ipv6() {
    let p = std::process::id() & 0xffff;
    let ips = [
        format!("fd00:5f1:7d:{p:x}::2"),
        format!("fd00:5f1:7d:{p:x}::3"),
    ];
    let _addrs = LoopbackV6::add(&ips);
    let a = Daemon::start_with_ip("ud6-a", &ips[0]);
    let b = Daemon::start_with_ip("ud6-b", &ips[1]);
    let Some(prog) = program(&a) else { return };
    one_datagram(&a, &b, &prog, RECV_CHECKS_V6);
}

#[test]
fn query_device_ex_fields_are_truthful_or_zero() {
    let d = Daemon::start("ud-device");
    let Some(prog) = program(&d) else { return };
    let (said, status) = d.run("device", &prog, &["device"]).finish();
    let summary = format!("ud_completion: {} checks, 0 failed", DEVICE_CHECKS.len());
    assert!(
        oks(&said) == DEVICE_CHECKS && said.last() == Some(&summary) && status.success(),
        "{}",
        said.join("\n")
    );
}
