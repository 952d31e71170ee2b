//! Counters (issue 36 item 5, docs/guide/counters.md) as a user checks them: a scripted RC
//! exchange between this test process's QPs, on each data path, and `softverbs stat
//! --json`, `softverbs resources --json` and the daemon's `--metrics` endpoint read after
//! it. The counters move by exactly the packets the exchange sends: 6,000-byte SENDs at a
//! 1,024-byte path MTU are six request packets each.
//!
//! Run inside a network namespace of their own (`unshare -n`), as every test that binds
//! RoCE ports must be on a shared machine; each test has loopback addresses of its own.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use serde_json::Value;
use softverbs::{
    Access, AhAttr, AttrMask as M, Context, Gid, Mtu, QpAttr, QpCap, QpInit, QpState, QpType,
    SendOp, SendRequest, WcStatus,
};
use softverbs_testkit::Daemon;

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");
/// A bound against a hang, never a measurement.
const T: Duration = Duration::from_secs(60);
const LEN: usize = 6000;
/// Request packets per message: 6,000 bytes at MTU 1024.
const PKTS: u64 = 6;
const PSN: u32 = 0x10_0000;
const ALL: Access = Access(0x0f);

fn daemon(name: &str, ip: &str, args: &[&str]) -> Daemon {
    Daemon::options(name)
        .bin(BIN)
        .device(&format!("sv-{name}"), ip)
        .args(args)
        .start()
}

fn connect(qp: &softverbs::Qp<'_>, gid: Gid, qpn: u32, timeout: u8) {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: ALL,
        ..QpAttr::default()
    };
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
        .unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: AhAttr {
            dgid: gid,
            is_global: true,
            port_num: 1,
            hop_limit: 64,
            ..AhAttr::default()
        },
        path_mtu: Mtu::M1024,
        dest_qp_num: qpn,
        max_dest_rd_atomic: 4,
        rq_psn: PSN,
        min_rnr_timer: 1,
        ..init
    };
    let mask = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    qp.modify(&rtr, mask | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER)
        .unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout,
        sq_psn: PSN,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
        ..rtr
    };
    let mask = M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY;
    qp.modify(&rts, mask | M::MAX_QP_RD_ATOMIC).unwrap();
}

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// Where the exchange runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    Daemon,
    Direct,
    Net,
}

/// `n` SENDs of [`LEN`] bytes from a QP of `a` to a QP of `b` (the same daemon for the
/// direct path), both completed; then `check(qpn_a, qpn_b)` while both QPs exist.
fn exchange(a: &Daemon, b: &Daemon, path: Path, n: u64, timeout: u8, check: impl FnOnce(u32, u32)) {
    let direct = path != Path::Daemon;
    let ca = Context::open_at_direct(&a.socket, 0, direct).unwrap();
    let cb = Context::open_at_direct(&b.socket, 0, direct).unwrap();
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let (qa_cq, qb_cq) = (ca.create_cq(128).unwrap(), cb.create_cq(128).unwrap());
    let qa = ca
        .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&qa_cq, &qa_cq).cap(cap()))
        .unwrap();
    let qb = cb
        .create_qp(&QpInit::new(QpType::Rc, &pb).cqs(&qb_cq, &qb_cq).cap(cap()))
        .unwrap();
    let mut abuf = vec![7u8; LEN];
    let mut bbuf = vec![0u8; LEN * n as usize];
    let ma = pa.reg_slice(&mut abuf, ALL).unwrap();
    let mb = pb.reg_slice(&mut bbuf, ALL).unwrap();
    connect(&qa, cb.query_gid(1, 0).unwrap(), qb.qpn(), timeout);
    connect(&qb, ca.query_gid(1, 0).unwrap(), qa.qpn(), timeout);
    for i in 0..n as usize {
        qb.post_recv(i as u64, &[mb.sge(i * LEN, LEN).unwrap()])
            .unwrap();
    }
    assert_eq!(qa.is_net(), path == Path::Net, "QP a on the {path:?} path");
    assert_eq!(
        qa.is_direct(),
        path == Path::Direct,
        "QP a on the {path:?} path"
    );
    let sge = [ma.sge(0, LEN).unwrap()];
    for i in 0..n {
        qa.post_send(&SendRequest::new(i, SendOp::Send, &sge))
            .unwrap();
    }
    for (cq, what) in [(&qa_cq, "sends"), (&qb_cq, "receives")] {
        let wcs = cq.wait(n as usize, T).unwrap();
        assert!(
            wcs.iter().all(|w| w.status == WcStatus::Success),
            "{what}: {wcs:?}"
        );
    }
    check(qa.qpn(), qb.qpn());
}

/// `softverbs stat --json` of `d`.
fn stat(d: &Daemon, args: &[&str]) -> Value {
    let mut a = vec!["stat", "--json"];
    a.extend_from_slice(args);
    let v: Value = serde_json::from_str(&d.cli(&a)).expect("stat --json is JSON");
    assert_eq!(v["schema"], 1);
    v
}

/// QP `qpn`'s row of `d`'s `stat --json --qp`.
fn qp_row(d: &Daemon, qpn: u32) -> Value {
    let v = stat(d, &["--qp", &qpn.to_string()]);
    let rows = v["qps"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{v}");
    assert!(v["ports"].as_array().unwrap().is_empty());
    rows[0].clone()
}

fn n(row: &Value, k: &str) -> u64 {
    row[k]
        .as_u64()
        .unwrap_or_else(|| panic!("{k} missing: {row}"))
}

/// Waits (bounded) until `cond` holds of `(a's row, b's row)`: a library publishes its
/// counters after its round, and a last ACK may still be on its way.
fn settle(
    a: &Daemon,
    qa: u32,
    b: &Daemon,
    qb: u32,
    cond: impl Fn(&Value, &Value) -> bool,
) -> (Value, Value) {
    let end = Instant::now() + T;
    loop {
        let (ra, rb) = (qp_row(a, qa), qp_row(b, qb));
        if cond(&ra, &rb) {
            return (ra, rb);
        }
        assert!(Instant::now() < end, "counters did not settle: {ra}\n{rb}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The QP row of `resources --json` for `qpn`.
fn resource_row(d: &Daemon, qpn: u32) -> Value {
    let r = d.resources();
    assert_eq!(r["schema"], 1);
    r["qps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["qpn"] == qpn)
        .unwrap_or_else(|| panic!("QP {qpn} in {r}"))
        .clone()
}

/// The clean exchange's counts: every packet once, both ends agreeing.
fn assert_clean(ra: &Value, rb: &Value, msgs: u64) {
    assert_eq!(n(ra, "sent_pkts"), msgs * PKTS, "{ra}");
    assert_eq!(n(ra, "retransmitted_pkts"), 0);
    assert_eq!(n(ra, "rdma_sends"), msgs);
    assert_eq!(n(rb, "rcvd_pkts"), msgs * PKTS, "{rb}");
    assert_eq!(n(rb, "rdma_recvs"), msgs);
    assert_eq!(n(rb, "rcvd_bytes"), n(ra, "sent_bytes"));
    assert!(n(rb, "sent_pkts") >= 1, "at least one ACK");
    assert_eq!(n(ra, "rcvd_pkts"), n(rb, "sent_pkts"));
    for k in [
        "duplicate_request",
        "out_of_seq_request",
        "send_rnr_err",
        "rcvd_seq_err",
    ] {
        assert_eq!(n(ra, k) + n(rb, k), 0, "{k}");
    }
}

/// A plain HTTP/1.1 GET of `addr` `path`: (status line, body).
fn get(addr: &str, path: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// The value of the Prometheus series `name` whose labels include every one of `labels`.
fn series(body: &str, name: &str, labels: &[&str]) -> u64 {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|x| l.contains(x)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{name} {labels:?} in\n{body}"))
}

#[test]
fn the_daemon_path_counts_each_packet_once_and_metrics_serve_the_same_figures() {
    let metrics = "127.96.0.1:9464";
    let a = daemon("da", "127.96.0.1", &["--metrics", metrics]);
    let b = daemon("db", "127.96.0.2", &[]);
    exchange(&a, &b, Path::Daemon, 5, 20, |qa, qb| {
        let (ra, rb) = settle(&a, qa, &b, qb, |ra, rb| {
            n(ra, "rcvd_pkts") == n(rb, "sent_pkts")
        });
        assert_eq!(
            (ra["path"].as_str(), rb["path"].as_str()),
            (Some("daemon"), Some("daemon"))
        );
        assert_clean(&ra, &rb, 5);
        // The port is its one QP.
        let port = &stat(&a, &[])["ports"][0];
        for k in ["sent_pkts", "rcvd_pkts", "sent_bytes", "rdma_sends"] {
            assert_eq!(port[k], ra[k], "port {k}");
        }
        assert_eq!(n(port, "rx_icrc_errors"), 0);
        // A clean exchange between two daemons rejects nothing, and every reason is shown.
        for r in softverbs_transport::Reject::ALL {
            assert_eq!(port[r.name()], 0, "port {}: {port}", r.name());
        }
        // `resources`: the peer, both PSNs (five messages of six packets past the start)
        // and the path.
        let (xa, xb) = (resource_row(&a, qa), resource_row(&b, qb));
        assert_eq!(xa["path"], "daemon");
        assert_eq!(xa["remote_qpn"], qb);
        assert_eq!(xa["remote_addr"], "127.96.0.2");
        assert_eq!(xb["remote_addr"], "127.96.0.1");
        assert_eq!(xa["sq_psn"], u64::from(PSN) + 5 * PKTS);
        assert_eq!(xb["rq_psn"], u64::from(PSN) + 5 * PKTS);
        assert_eq!(xa["rq_psn"], PSN);
        let table = a.cli(&["resources"]);
        let line = format!(
            "path daemon remote 127.96.0.2 qpn {qb:#08x} sq_psn {:#08x}",
            PSN + 30
        );
        assert!(table.contains(&line), "{line} in\n{table}");
        // The metrics endpoint answers a GET with the same numbers.
        let (status, body) = get(metrics, "/metrics");
        assert_eq!(status, "HTTP/1.1 200 OK");
        let q = format!("qpn=\"{qa}\"");
        for k in ["sent_pkts", "rcvd_pkts", "sent_bytes", "rdma_sends"] {
            assert_eq!(
                series(&body, &format!("softverbs_qp_{k}"), &[&q]),
                n(&ra, k),
                "{k}"
            );
            assert_eq!(
                series(&body, &format!("softverbs_port_{k}"), &["device=\"sv-da\""]),
                n(port, k),
                "port {k}"
            );
        }
        assert!(get(metrics, "/nothing").0.contains("404"));
        // The text form names the same QP and counts.
        let text = a.cli(&["stat", "--qp", &qa.to_string()]);
        assert!(
            text.starts_with(&format!("link sv-da/1 qpn {qa} path daemon sent_pkts 30 ")),
            "{text}"
        );
    });
    // A destroyed QP's packets stay in its port's totals.
    let port = &stat(&a, &[])["ports"][0];
    assert_eq!(n(port, "sent_pkts"), 5 * PKTS);
    assert!(stat(&a, &[])["qps"].as_array().unwrap().is_empty());
}

#[test]
fn injected_loss_is_counted_as_retransmissions() {
    // A's device loses a fifth of what it sends (its requests); sequence NAKs and the ACK
    // timeout recover. The timeout (code 15: 134 ms, seven retries) leaves a loaded
    // machine's late daemon a second before a request fails.
    let a = daemon("la", "127.96.1.1", &["--faults", "loss=0.2"]);
    let b = daemon("lb", "127.96.1.2", &[]);
    exchange(&a, &b, Path::Daemon, 20, 15, |qa, qb| {
        let (ra, rb) = settle(&a, qa, &b, qb, |ra, rb| {
            n(ra, "rcvd_pkts") == n(rb, "sent_pkts")
        });
        let first = n(&ra, "sent_pkts") - n(&ra, "retransmitted_pkts");
        assert_eq!(
            first,
            20 * PKTS,
            "every request packet went first exactly once: {ra}"
        );
        assert!(n(&ra, "retransmitted_pkts") > 0, "{ra}");
        assert!(
            n(&ra, "completer_retry_err") + n(&ra, "rcvd_seq_err") > 0,
            "{ra}"
        );
        assert!(
            n(&rb, "rcvd_pkts") < n(&ra, "sent_pkts"),
            "some were lost: {rb}"
        );
        assert!(n(&rb, "out_of_seq_request") > 0, "{rb}");
        assert_eq!(n(&rb, "rdma_recvs"), 20, "each message executed once");
        assert_eq!(n(&ra, "rdma_sends"), 20);
    });
}

#[test]
fn the_net_path_counts_in_the_library_and_the_daemon_shows_it() {
    let a = daemon("na", "127.96.2.1", &[]);
    let b = daemon("nb", "127.96.2.2", &[]);
    exchange(&a, &b, Path::Net, 5, 20, |qa, qb| {
        let (ra, rb) = settle(&a, qa, &b, qb, |ra, rb| {
            n(ra, "rdma_sends") == 5
                && n(rb, "rdma_recvs") == 5
                && n(ra, "rcvd_pkts") == n(rb, "sent_pkts")
        });
        assert_eq!(
            (ra["path"].as_str(), rb["path"].as_str()),
            (Some("net"), Some("net"))
        );
        assert_clean(&ra, &rb, 5);
        let port = &stat(&a, &[])["ports"][0];
        assert_eq!(port["sent_pkts"], ra["sent_pkts"]);
        let (xa, xb) = (resource_row(&a, qa), resource_row(&b, qb));
        assert_eq!(xa["path"], "net");
        assert_eq!(xa["remote_qpn"], qb);
        assert_eq!(xa["remote_addr"], "127.96.2.2");
        assert_eq!(
            xb["rq_psn"],
            u64::from(PSN) + 5 * PKTS,
            "as the library published it"
        );
    });
    // The library's counts outlive its QP in the port's totals.
    let port = &stat(&a, &[])["ports"][0];
    assert_eq!(n(port, "sent_pkts"), 5 * PKTS);
}

#[test]
fn the_direct_path_counts_messages_and_no_packets() {
    let d = daemon("dd", "127.96.3.1", &[]);
    exchange(&d, &d, Path::Direct, 3, 20, |qa, qb| {
        let (ra, rb) = (qp_row(&d, qa), qp_row(&d, qb));
        for (r, q, peer) in [(&ra, qa, qb), (&rb, qb, qa)] {
            assert_eq!(r["path"], "direct");
            assert_eq!(n(r, "sent_pkts") + n(r, "rcvd_pkts"), 0, "{r}");
            let x = resource_row(&d, q);
            assert_eq!(x["path"], "direct");
            assert_eq!(x["remote_qpn"], peer);
        }
        assert_eq!((n(&ra, "rdma_sends"), n(&ra, "rdma_recvs")), (3, 0), "{ra}");
        assert_eq!((n(&rb, "rdma_sends"), n(&rb, "rdma_recvs")), (0, 3), "{rb}");
        assert_eq!(n(&rb, "rx_write_requests"), 0);
    });
    // The pair is gone; its device's port keeps what it counted.
    let port = &stat(&d, &[])["ports"][0];
    assert_eq!(
        (n(port, "rdma_sends"), n(port, "rdma_recvs")),
        (3, 3),
        "{port}"
    );
    assert_eq!(n(port, "sent_pkts"), 0);
}
