//! `softverbs bench lat|bw` as real processes: the bench, its server and client peers and the
//! daemons are all separate processes. Only the shape of the JSON is checked — timings are
//! benchmarks, not tests.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;
use softverbs_testkit::Daemon;

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");

/// A daemon of its own for the test `name`, without network (the bench's two contexts meet
/// inside it).
fn daemon(name: &str) -> (Daemon, PathBuf) {
    let d = Daemon::options(name).bin(BIN).start();
    let socket = d.socket.clone();
    (d, socket)
}

fn bench(socket: Option<&PathBuf>, args: &[&str]) -> Value {
    let mut cmd = Command::new(BIN);
    if let Some(s) = socket {
        cmd.arg("--socket").arg(s);
    }
    let out = cmd
        .arg("bench")
        .args(args)
        .env("SOFTVERBS_AUTOSTART", "0")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "softverbs bench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn positive(row: &Value, key: &str) -> f64 {
    let v = row[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing in {row}"));
    assert!(v.is_finite() && v > 0.0, "{key} = {v} in {row}");
    v
}

#[test]
fn send_latency_over_rc_on_one_daemon() {
    let (_d, socket) = daemon("send-lat");
    let v = bench(
        Some(&socket),
        &[
            "lat",
            "--op",
            "send",
            "--transport",
            "rc",
            "--sizes",
            "8",
            "--iters",
            "50",
            "--json",
        ],
    );
    assert_eq!(v["bench"], "lat");
    assert_eq!(v["daemons"], 1);
    assert_eq!(
        v["memory"], "shared",
        "buffers are shared memory by default"
    );
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1, "{v}");
    let r = &rows[0];
    assert_eq!(
        (r["op"].as_str(), r["transport"].as_str()),
        (Some("send"), Some("rc"))
    );
    assert_eq!(
        (r["size"].as_u64(), r["iters"].as_u64()),
        (Some(8), Some(50))
    );
    let median = positive(r, "median_us");
    let p99 = positive(r, "p99_us");
    assert!(p99 >= median, "{r}");
    positive(r, "mb_s");
    positive(r, "msg_s");
}

#[test]
fn send_bandwidth_over_rc_between_two_daemons() {
    // The bench starts both daemons itself (fresh sockets, two loopback addresses).
    let v = bench(
        None,
        &[
            "bw",
            "--op",
            "send",
            "--transport",
            "rc",
            "--two-daemons",
            "--sizes",
            "4096",
            "--iters",
            "200",
            // Unsignaled requests in between, a count it does not divide (the last is signaled).
            "--cq-mod",
            "7",
            "--json",
        ],
    );
    assert_eq!(v["bench"], "bw");
    assert_eq!(v["daemons"], 2);
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1, "{v}");
    let r = &rows[0];
    assert_eq!(r["size"].as_u64(), Some(4096));
    let mb_s = positive(r, "mb_s");
    let msg_s = positive(r, "msg_s");
    assert!(
        (mb_s / (msg_s * 4096.0 / 1e6) - 1.0).abs() < 1e-6,
        "MB/s is msg/s × size: {r}"
    );
}

#[test]
fn write_latency_with_private_memory_reached_through_process_vm() {
    // Each side spins on the last word of its buffer: the run only ends if the daemon's
    // process_vm_writev path really lands the peer's writes in ordinary private pages.
    let (_d, socket) = daemon("write-private");
    let v = bench(
        Some(&socket),
        &[
            "lat",
            "--op",
            "write",
            "--transport",
            "rc",
            "--sizes",
            "8,5000",
            "--iters",
            "50",
            "--memory",
            "private",
            "--json",
        ],
    );
    assert_eq!(v["memory"], "private");
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2, "{v}");
    for r in rows {
        assert_eq!(r["op"].as_str(), Some("write"), "{r}");
        positive(r, "median_us");
    }
}
