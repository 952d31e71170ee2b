//! The connection manager through the client API: two contexts connect RC QPs with IB CM
//! MADs on the daemon's QP1 (the numbers the QPs use come from the REQ and REP), data flows,
//! they disconnect; a REQ for a service nobody listens on is rejected; and a connecting or
//! connected process killed with SIGKILL has its peer told and leaves no CM state in the
//! daemon (`resources --json`, key `cm`).

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{cap, connect_with, daemon, RcPath, ALL};
use softverbs::{
    CmChannel, CmEvent, CmEventKind, CmQp, CmTimers, Context, Introspect, Op, QpInit, QpType,
    SendWork, WcStatus,
};

const T: Duration = Duration::from_secs(20);
const ROLE: &str = "SOFTVERBS_CM_TEST_ROLE";
const SOCKET: &str = "SOFTVERBS_CM_TEST_SOCKET";
/// rdma_cm's service ID for TCP port 7174 (rping's default port).
const SID: u64 = 0x0106_1C06;
const FAST: CmTimers = CmTimers {
    response_timeout: 14, // ~67 ms a try
    max_retries: 3,
};

fn wait(ch: &CmChannel<'_>, kind: CmEventKind) -> CmEvent {
    let ev = ch
        .wait_event(T)
        .unwrap()
        .unwrap_or_else(|| panic!("no CM event (waiting for {kind:?})"));
    assert_eq!(ev.kind, kind, "{ev:?}");
    ev
}

/// The daemon's CM state as `softverbs resources --json` shows it.
fn cm_state(socket: &std::path::Path) -> serde_json::Value {
    let json = Introspect::connect_at(socket)
        .unwrap()
        .resources_json()
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    v["cm"].clone()
}

/// Waits (bounded) until the daemon's CM holds nothing.
fn wait_cm_empty(socket: &std::path::Path) {
    let deadline = Instant::now() + T;
    loop {
        let cm = cm_state(socket);
        let empty = ["listeners", "connections", "time_wait", "owned"]
            .iter()
            .all(|k| cm[k] == 0);
        if empty {
            return;
        }
        assert!(Instant::now() < deadline, "CM state left: {cm}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn rc_connection_set_up_by_the_cm_carries_data() {
    let (d, _dir) = daemon("cm-rc", None);
    let a = Context::open_at(&d.socket, 0).unwrap();
    let b = Context::open_at(&d.socket, 0).unwrap();
    let (ca, cb) = (a.cm_channel().unwrap(), b.cm_channel().unwrap());
    assert_eq!(
        a.cm_channel().unwrap_err().errno(),
        softverbs::errno::EEXIST
    );
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cqa, cqb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let qa = a
        .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&cqa, &cqa).cap(cap()))
        .unwrap();
    let qb = b
        .create_qp(&QpInit::new(QpType::Rc, &pb).cqs(&cqb, &cqb).cap(cap()))
        .unwrap();
    let gid = a.query_gid(1, 0).unwrap();
    let ip = gid.to_ip();

    let listener = cb.listen(SID).unwrap();
    assert_eq!(
        ca.listen(SID).unwrap_err().errno(),
        softverbs::errno::EADDRINUSE
    );
    let id_a = ca
        .connect(ip, SID, CmQp::new(qa.qpn(), 0x1234), FAST, b"hello from a")
        .unwrap();

    let req = wait(&cb, CmEventKind::ConnectRequest);
    assert_eq!(req.listener, listener);
    assert_eq!((req.remote_qpn, req.starting_psn), (qa.qpn(), 0x1234));
    assert_eq!(&req.private_data[..12], b"hello from a");
    assert_eq!(req.peer, Some(ip));
    let path = |psn| RcPath {
        psn,
        ..RcPath::default()
    };
    connect_with(&qb, gid, req.remote_qpn, path(0x1234));
    cb.accept(req.id, CmQp::new(qb.qpn(), 0x1234), b"welcome")
        .unwrap();

    let rep = wait(&ca, CmEventKind::ConnectResponse);
    assert_eq!(rep.id, id_a);
    assert_eq!(rep.remote_qpn, qb.qpn());
    assert_eq!(&rep.private_data[..7], b"welcome");
    connect_with(&qa, gid, rep.remote_qpn, path(rep.starting_psn));
    ca.establish(id_a).unwrap();
    wait(&ca, CmEventKind::Established);
    wait(&cb, CmEventKind::Established);

    // The QPs the CM paired carry a SEND.
    let mut ma = pa.alloc_mr(4096, ALL).unwrap();
    let mut mb = pb.alloc_mr(4096, ALL).unwrap();
    let mut src = ma.take(100).unwrap();
    src.write(0, &[0x5a; 100]).unwrap();
    qb.post_recv_buf(mb.take(100).unwrap()).unwrap();
    qa.post(SendWork::new(Op::Send, src)).unwrap();
    assert_eq!(cqa.wait_bufs(1, T).unwrap()[0].wc.status, WcStatus::Success);
    let got = cqb.wait_bufs(1, T).unwrap().pop().unwrap();
    assert_eq!(got.wc.status, WcStatus::Success);
    assert_eq!(got.buf.unwrap().to_vec(), vec![0x5a; 100]);

    ca.disconnect(id_a, b"bye").unwrap();
    wait(&cb, CmEventKind::Disconnected);
    wait(&ca, CmEventKind::Disconnected);
    assert_eq!(ca.counts().unwrap().ids, 1);
    ca.destroy(id_a).unwrap();
    cb.destroy(req.id).unwrap();
    cb.destroy(listener).unwrap();
    assert_eq!(ca.counts().unwrap(), softverbs::CmCounts::default());
    assert_eq!(cb.counts().unwrap(), softverbs::CmCounts::default());
    wait_cm_empty(&d.socket);
}

#[test]
fn nobody_listening_gets_rej_invalid_service_id() {
    let (d, _dir) = daemon("cm-norej", None);
    let a = Context::open_at(&d.socket, 0).unwrap();
    let ca = a.cm_channel().unwrap();
    let ip = a.query_gid(1, 0).unwrap().to_ip();
    let id = ca.connect(ip, SID, CmQp::new(99, 0), FAST, &[]).unwrap();
    let ev = wait(&ca, CmEventKind::Rejected);
    assert_eq!(
        (ev.id, ev.status),
        (id, 8),
        "IBA 12.6.7.2: invalid service ID"
    );
    ca.destroy(id).unwrap();
    wait_cm_empty(&d.socket);
}

#[test]
fn sidr_resolves_a_ud_service() {
    let (d, _dir) = daemon("cm-sidr", None);
    let a = Context::open_at(&d.socket, 0).unwrap();
    let b = Context::open_at(&d.socket, 0).unwrap();
    let (ca, cb) = (a.cm_channel().unwrap(), b.cm_channel().unwrap());
    let ip = a.query_gid(1, 0).unwrap().to_ip();
    let udp_sid = 0x0111_1C06;
    let l = cb.listen(udp_sid).unwrap();
    let id = ca.sidr_request(ip, udp_sid, FAST, b"who").unwrap();
    let req = wait(&cb, CmEventKind::ConnectRequest);
    assert!(req.sidr);
    assert_eq!(&req.private_data[..3], b"who");
    cb.sidr_reply(req.id, 0, 0x4242, 0x1111_2222, &[]).unwrap();
    let rep = wait(&ca, CmEventKind::Established);
    assert!(rep.sidr);
    assert_eq!(
        (rep.id, rep.remote_qpn, rep.qkey),
        (id, 0x4242, 0x1111_2222)
    );
    let none = ca.sidr_request(ip, udp_sid + 1, FAST, &[]).unwrap();
    let ev = wait(&ca, CmEventKind::Rejected);
    assert_eq!(
        (ev.id, ev.status),
        (none, 1),
        "SIDR status: service ID not supported"
    );
    cb.destroy(req.id).unwrap();
    cb.destroy(l).unwrap();
    wait_cm_empty(&d.socket);
}

/// The child side of the kill tests: connects, and (role `established`) brings its QP up and
/// establishes; then says so on stdout and waits to be killed.
fn child() {
    let role = std::env::var(ROLE).unwrap();
    let socket = std::env::var(SOCKET).unwrap();
    let a = Context::open_at(std::path::Path::new(&socket), 0).unwrap();
    let ca = a.cm_channel().unwrap();
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(16).unwrap();
    let qp = a
        .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap()))
        .unwrap();
    let gid = a.query_gid(1, 0).unwrap();
    let timers = CmTimers {
        response_timeout: 20,
        max_retries: 15,
    };
    let id = ca
        .connect(gid.to_ip(), SID, CmQp::new(qp.qpn(), 0), timers, &[])
        .unwrap();
    if role == "established" {
        let rep = wait(&ca, CmEventKind::ConnectResponse);
        connect_with(&qp, gid, rep.remote_qpn, RcPath::default());
        ca.establish(id).unwrap();
        wait(&ca, CmEventKind::Established);
    }
    println!("ready");
    std::thread::sleep(Duration::from_secs(600));
}

fn killed_peer(role: &str) {
    let (d, _dir) = daemon(&format!("cm-kill-{role}"), None);
    let b = Context::open_at(&d.socket, 0).unwrap();
    let cb = b.cm_channel().unwrap();
    let listener = cb.listen(SID).unwrap();
    let mut kid = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_role", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(SOCKET, &d.socket)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let req = wait(&cb, CmEventKind::ConnectRequest);
    if role == "established" {
        let pd = b.alloc_pd().unwrap();
        let cq = b.create_cq(16).unwrap();
        let qp = b
            .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap()))
            .unwrap();
        let gid = b.query_gid(1, 0).unwrap();
        connect_with(&qp, gid, req.remote_qpn, RcPath::default());
        cb.accept(req.id, CmQp::new(qp.qpn(), 0), &[]).unwrap();
        wait(&cb, CmEventKind::Established);
    }
    // Killed once it says it is where the test wants it (its REQ sent and unanswered, or
    // connected).
    use std::io::BufRead;
    // (libtest's own lines come first; the child's wait for its CM event is bounded.)
    let mut out = std::io::BufReader::new(kid.stdout.take().unwrap());
    let mut said = String::new();
    while !said.contains("ready") {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!("child ended without getting ready: {said:?}");
        }
        said.push_str(&line);
    }
    kid.kill().unwrap();
    kid.wait().unwrap();
    if role == "established" {
        wait(&cb, CmEventKind::Disconnected);
    } else {
        let ev = wait(&cb, CmEventKind::Rejected);
        assert_eq!(ev.id, req.id);
        assert_eq!(
            ev.status, 4,
            "REJ reason Timeout, as IBA 12.9 has a vanished active side"
        );
    }
    cb.destroy(req.id).unwrap();
    cb.destroy(listener).unwrap();
    wait_cm_empty(&d.socket);
}

#[test]
fn child_role() {
    if std::env::var_os(ROLE).is_some() {
        child();
    }
}

#[test]
fn process_killed_mid_handshake_is_rejected_to_its_peer_and_leaves_nothing() {
    killed_peer("req-sent");
}

#[test]
fn process_killed_while_connected_is_a_disconnect_for_its_peer() {
    killed_peer("established");
}

/// Two daemons, one device each on its own loopback address, their CMs talking RoCE v2 over
/// UDP (run inside a network namespace: `unshare -n`, docs/design/cm.md §6). The capture of the
/// passive side's device must decode in tshark as InfiniBand CM MADs to QP1, none malformed.
#[test]
fn two_daemons_connect_over_the_wire_and_tshark_decodes_the_mads() {
    use softverbs_daemon::{spawn_daemon_with, Config, DeviceSpec};
    let dir = std::env::temp_dir().join(format!("svcm-wire-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("home")).unwrap();
    let spawn = |name: &str, ip: &str| {
        let mut c = Config::new(dir.join(format!("{name}.sock")));
        c.devices = vec![DeviceSpec {
            name: format!("sv-{name}"),
            ips: vec![ip.parse().unwrap()],
        }];
        c.net.bind = true;
        c.net.capture_dir = Some(dir.clone());
        spawn_daemon_with(c).unwrap()
    };
    let (da, db) = (spawn("cma", "127.0.4.1"), spawn("cmb", "127.0.4.2"));
    {
        let a = Context::open_at(&da.socket, 0).unwrap();
        let b = Context::open_at(&db.socket, 0).unwrap();
        let (ca, cb) = (a.cm_channel().unwrap(), b.cm_channel().unwrap());
        let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let (cqa, cqb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
        let qa = a
            .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&cqa, &cqa).cap(cap()))
            .unwrap();
        let qb = b
            .create_qp(&QpInit::new(QpType::Rc, &pb).cqs(&cqb, &cqb).cap(cap()))
            .unwrap();
        let (ga, gb) = (a.query_gid(1, 0).unwrap(), b.query_gid(1, 0).unwrap());
        let l = cb.listen(SID).unwrap();
        let id = ca
            .connect(
                gb.to_ip(),
                SID,
                CmQp::new(qa.qpn(), 0),
                FAST,
                b"over the wire",
            )
            .unwrap();
        let req = wait(&cb, CmEventKind::ConnectRequest);
        assert_eq!(req.peer, Some(ga.to_ip()));
        connect_with(&qb, ga, req.remote_qpn, RcPath::default());
        cb.accept(req.id, CmQp::new(qb.qpn(), 0), &[]).unwrap();
        let rep = wait(&ca, CmEventKind::ConnectResponse);
        connect_with(&qa, gb, rep.remote_qpn, RcPath::default());
        ca.establish(id).unwrap();
        wait(&ca, CmEventKind::Established);
        wait(&cb, CmEventKind::Established);
        let mut ma = pa.alloc_mr(4096, ALL).unwrap();
        let mut mb = pb.alloc_mr(4096, ALL).unwrap();
        let mut src = ma.take(64).unwrap();
        src.write(0, &[7; 64]).unwrap();
        qb.post_recv_buf(mb.take(64).unwrap()).unwrap();
        qa.post(SendWork::new(Op::Send, src)).unwrap();
        let got = cqb.wait_bufs(1, T).unwrap().pop().unwrap();
        assert_eq!(got.buf.unwrap().to_vec(), vec![7; 64]);
        // A REQ to a service nobody listens on, across the wire.
        let none = ca.connect(gb.to_ip(), SID + 1, CmQp::new(qa.qpn(), 0), FAST, &[]);
        let ev = wait(&ca, CmEventKind::Rejected);
        assert_eq!((ev.id, ev.status), (none.unwrap(), 8));
        ca.disconnect(id, &[]).unwrap();
        wait(&cb, CmEventKind::Disconnected);
        cb.destroy(req.id).unwrap();
        cb.destroy(l).unwrap();
    }
    wait_cm_empty(&db.socket);
    wait_cm_empty(&da.socket);
    drop((da, db));
    let pcap = dir.join("sv-cmb.pcap");
    assert!(pcap.exists(), "capture written");
    if std::process::Command::new("tshark")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "tshark is required under CI"
        );
        eprintln!("skipped the tshark check: tshark not installed");
        return;
    }
    let out = std::process::Command::new("tshark")
        .env("HOME", dir.join("home"))
        .args(["-n", "-r"])
        .arg(&pcap)
        .args([
            "-Y",
            "infiniband.mad.mgmtclass == 0x07",
            "-T",
            "fields",
            "-e",
            "infiniband.bth.destqp",
            "-e",
            "infiniband.mad.attributeid",
            "-e",
            "_ws.malformed",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    let attrs: std::collections::BTreeSet<&str> = rows.iter().map(|r| r[1]).collect();
    for a in ["0x0010", "0x0012", "0x0013", "0x0014", "0x0015", "0x0016"] {
        assert!(
            attrs.contains(a),
            "no CM attribute {a} in the capture: {text}"
        );
    }
    for r in &rows {
        assert_eq!(
            (r[0], r[2]),
            ("0x000001", ""),
            "to QP1, not malformed: {r:?}"
        );
    }
    let malformed = std::process::Command::new("tshark")
        .env("HOME", dir.join("home"))
        .args(["-n", "-r"])
        .arg(&pcap)
        .args(["-Y", "_ws.malformed", "-T", "fields", "-e", "frame.number"])
        .output()
        .unwrap();
    assert!(
        malformed.stdout.is_empty(),
        "malformed frames: {:?}",
        String::from_utf8_lossy(&malformed.stdout)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two daemons whose devices lose, duplicate, reorder and corrupt packets (the devices'
/// fault injection, `--faults`): every connection still ends established exactly once on
/// each side, and nothing is left afterwards. Run inside `unshare -n`.
#[test]
fn faulty_wire_still_gives_one_connection_each_time() {
    use softverbs_daemon::{spawn_daemon_with, Config, DeviceSpec};
    let dir = std::env::temp_dir().join(format!("svcm-faults-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let spawn = |name: &str, ip: &str| {
        let mut c = Config::new(dir.join(format!("{name}.sock")));
        c.devices = vec![DeviceSpec {
            name: format!("sv-{name}"),
            ips: vec![ip.parse().unwrap()],
        }];
        c.net.bind = true;
        c.net.faults = Some(softverbs_transport::Faults {
            loss: 0.2,
            duplicate: 0.2,
            reorder: 0.2,
            corrupt: 0.05,
            ..softverbs_transport::Faults::NONE
        });
        spawn_daemon_with(c).unwrap()
    };
    let (da, db) = (spawn("fa", "127.0.4.11"), spawn("fb", "127.0.4.12"));
    let a = Context::open_at(&da.socket, 0).unwrap();
    let b = Context::open_at(&db.socket, 0).unwrap();
    let (ca, cb) = (a.cm_channel().unwrap(), b.cm_channel().unwrap());
    let gb = b.query_gid(1, 0).unwrap();
    let l = cb.listen(SID).unwrap();
    let timers = CmTimers {
        response_timeout: 14,
        max_retries: 15,
    };
    for round in 0..10u32 {
        let id = ca
            .connect(
                gb.to_ip(),
                SID,
                CmQp::new(0x100 + round, round),
                timers,
                &[],
            )
            .unwrap();
        let req = wait(&cb, CmEventKind::ConnectRequest);
        assert_eq!(req.remote_qpn, 0x100 + round, "round {round}");
        cb.accept(req.id, CmQp::new(0x200 + round, 0), &[]).unwrap();
        let rep = wait(&ca, CmEventKind::ConnectResponse);
        assert_eq!(rep.remote_qpn, 0x200 + round);
        ca.establish(id).unwrap();
        wait(&ca, CmEventKind::Established);
        wait(&cb, CmEventKind::Established);
        ca.disconnect(id, &[]).unwrap();
        wait(&cb, CmEventKind::Disconnected);
        wait(&ca, CmEventKind::Disconnected);
        // No second request, establishment or disconnect from a duplicate.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(cb.try_event().unwrap(), None, "round {round}");
        assert_eq!(ca.try_event().unwrap(), None, "round {round}");
        ca.destroy(id).unwrap();
        cb.destroy(req.id).unwrap();
    }
    cb.destroy(l).unwrap();
    drop((ca, cb));
    drop((a, b));
    wait_cm_empty(&da.socket);
    wait_cm_empty(&db.socket);
    let _ = std::fs::remove_dir_all(&dir);
}
