//! The net path (docs/design/net-path.md): an RC QP connected to a QP of another daemon is run by
//! its own library's engine, over a private socket of its context that it sends from and
//! the daemon forwards the QP's packets to. Each test runs two daemons on loopback
//! addresses of their own.

mod common;

use std::time::Duration;

use softverbs::{
    BorrowedMr, Context, Pd, QpInit, QpState, QpType, SendOp, SendRequest, Sge, WcOpcode, WcStatus,
};

use common::{cap, connect, connect_with, daemon, daemon_with, RcPath, Reaped, ALL};

const T: Duration = Duration::from_secs(20);

fn lend<'a>(pd: &'a Pd<'a>, buf: &'a mut [u8]) -> BorrowedMr<'a> {
    pd.reg_slice(buf, ALL).unwrap()
}

/// `len` bytes of `mr` at `offset`, copied out.
fn read(mr: &BorrowedMr<'_>, offset: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mr.read(offset, &mut v).unwrap();
    v
}

fn sge(mr: &BorrowedMr<'_>, offset: u64, len: u32) -> [Sge; 1] {
    [mr.sge(offset as usize, len as usize).unwrap()]
}

/// Two daemons on `127.93.<net>.1` and `.2`, and on each a context, a PD, a CQ of 64 and an
/// RC QP, bound to the caller's names (a macro: each borrows the one before).
macro_rules! rc_pair {
    ($tag:literal, $net:literal => $a:ident, $b:ident, $pa:ident, $pb:ident,
     $cqa:ident, $cqb:ident, $qa:ident, $qb:ident) => {
        let (d1, _x) = daemon(
            concat!("net", $tag, "a"),
            Some(concat!("127.93.", $net, ".1")),
        );
        let (d2, _y) = daemon(
            concat!("net", $tag, "b"),
            Some(concat!("127.93.", $net, ".2")),
        );
        let $a = Context::open_at(&d1.socket, 0).unwrap();
        let $b = Context::open_at(&d2.socket, 0).unwrap();
        let ($pa, $pb) = ($a.alloc_pd().unwrap(), $b.alloc_pd().unwrap());
        let ($cqa, $cqb) = ($a.create_cq(64).unwrap(), $b.create_cq(64).unwrap());
        let $qa = $a
            .create_qp(&QpInit::new(QpType::Rc, &$pa).cqs(&$cqa, &$cqa).cap(cap()))
            .unwrap();
        let $qb = $b
            .create_qp(&QpInit::new(QpType::Rc, &$pb).cqs(&$cqb, &$cqb).cap(cap()))
            .unwrap();
    };
}

#[test]
fn rc_operations_between_two_daemons_run_in_the_libraries() {
    rc_pair!("", "0" => a, b, pa, pb, cqa, cqb, qa, qb);
    let mut abuf = vec![0u8; 1 << 16];
    let mut bbuf = vec![0u8; 1 << 16];
    let pattern: Vec<u8> = (0..6000u32).map(|i| (i * 7 + 3) as u8).collect();
    abuf[..6000].copy_from_slice(&pattern);
    bbuf[0x8000..0x8008].copy_from_slice(&40u64.to_ne_bytes());
    let ma = lend(&pa, &mut abuf);
    let mb = lend(&pb, &mut bbuf);
    // A receive posted before RTR (in INIT) is held by the library and taken over by its
    // engine.
    let init = softverbs::QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: ALL,
        ..softverbs::QpAttr::default()
    };
    use softverbs::AttrMask as M;
    qb.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
        .unwrap();
    qb.post_recv(1, &sge(&mb, 0x1000, 8192)).unwrap();
    connect(&qa, b.query_gid(1, 0).unwrap(), qb.qpn());
    connect(&qb, a.query_gid(1, 0).unwrap(), qa.qpn());
    assert!(qa.is_net() && qb.is_net(), "both QPs on the net path");
    assert!(!qa.is_direct());
    let (a0, b0) = (ma.sge(0, 1).unwrap().addr, mb.sge(0, 1).unwrap().addr);

    // 6000 bytes at MTU 1024: six packets.
    qa.post_send(&SendRequest::new(10, SendOp::Send, &sge(&ma, 0, 6000)))
        .unwrap();
    let w_sge = sge(&ma, 0, 3000);
    let w = SendRequest::new(
        11,
        SendOp::Write {
            remote_addr: b0 + 0x4000,
            rkey: mb.rkey(),
        },
        &w_sge,
    );
    qa.post_send(&w).unwrap();
    let r_sge = sge(&ma, 0x6000, 3000);
    let r = SendRequest::new(
        12,
        SendOp::Read {
            remote_addr: b0 + 0x4000,
            rkey: mb.rkey(),
        },
        &r_sge,
    );
    qa.post_send(&r).unwrap();
    let f_sge = sge(&ma, 0x9000, 8);
    let f = SendRequest::new(
        13,
        SendOp::FetchAdd {
            remote_addr: b0 + 0x8000,
            rkey: mb.rkey(),
            add: 2,
        },
        &f_sge,
    );
    qa.post_send(&f).unwrap();
    let c_sge = sge(&ma, 0x9008, 8);
    let c = SendRequest::new(
        14,
        SendOp::CompareSwap {
            remote_addr: b0 + 0x8000,
            rkey: mb.rkey(),
            compare: 42,
            swap: 7,
        },
        &c_sge,
    );
    qa.post_send(&c).unwrap();
    qb.post_recv(2, &sge(&mb, 0x3000, 64)).unwrap();
    let mut imm = SendRequest::new(15, SendOp::SendWithImm(0xabcd), &[]);
    imm.inline = Some(b"inline hello");
    qa.post_send(&imm).unwrap();

    let wa = cqa.wait(6, T).unwrap();
    assert_eq!(
        wa.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        vec![
            (10, WcStatus::Success, WcOpcode::Send),
            (11, WcStatus::Success, WcOpcode::RdmaWrite),
            (12, WcStatus::Success, WcOpcode::RdmaRead),
            (13, WcStatus::Success, WcOpcode::FetchAdd),
            (14, WcStatus::Success, WcOpcode::CompSwap),
            (15, WcStatus::Success, WcOpcode::Send),
        ]
    );
    let wb = cqb.wait(2, T).unwrap();
    assert_eq!(
        (wb[0].wr_id, wb[0].status, wb[0].byte_len, wb[0].qp_num),
        (1, WcStatus::Success, 6000, qb.qpn())
    );
    assert_eq!(
        (wb[1].wr_id, wb[1].byte_len, wb[1].imm_data),
        (2, 12, 0xabcd)
    );
    assert_eq!(read(&mb, 0x1000, 6000), pattern, "SEND landed");
    assert_eq!(read(&mb, 0x4000, 3000), pattern[..3000], "WRITE landed");
    assert_eq!(read(&ma, 0x6000, 3000), pattern[..3000], "READ came back");
    assert_eq!(
        read(&ma, 0x9000, 8),
        40u64.to_ne_bytes(),
        "FETCH_ADD's old value"
    );
    assert_eq!(
        read(&ma, 0x9008, 8),
        42u64.to_ne_bytes(),
        "CMP_SWAP saw the add"
    );
    assert_eq!(read(&mb, 0x8000, 8), 7u64.to_ne_bytes(), "and swapped");
    assert_eq!(read(&mb, 0x3000, 12), b"inline hello");
    let _ = a0;

    // The responder's checks are the library's now: a wrong R_Key fails the requester with
    // REM_ACCESS_ERR, and the daemon learns that the QP is in ERR.
    let bad_sge = sge(&ma, 0, 8);
    let bad = SendRequest::new(
        16,
        SendOp::Write {
            remote_addr: b0,
            rkey: mb.rkey() ^ 0x5a5a,
        },
        &bad_sge,
    );
    qa.post_send(&bad).unwrap();
    let e = cqa.wait(1, T).unwrap();
    assert_eq!((e[0].wr_id, e[0].status), (16, WcStatus::RemAccessErr));
    let end = std::time::Instant::now() + T;
    while qa.query().unwrap().attr.qp_state != QpState::Err && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        qa.query().unwrap().attr.qp_state,
        QpState::Err,
        "the daemon knows"
    );
    // A request posted in ERR flushes.
    qa.post_send(&SendRequest::new(17, SendOp::Send, &sge(&ma, 0, 8)))
        .unwrap();
    let e = cqa.wait(1, T).unwrap();
    assert_eq!((e[0].wr_id, e[0].status), (17, WcStatus::WrFlushErr));
}

/// Two QPs of two daemons, connected along `path`, each with its own CQ.
struct Pair<'a> {
    qa: softverbs::Qp<'a>,
    qb: softverbs::Qp<'a>,
}

/// The message `i` of a stream: its length (1..3000 B) and its bytes.
fn message(i: u32, from: u8) -> Vec<u8> {
    let len = 1 + (i * 97) % 3000;
    (0..len).map(|j| (j as u8) ^ (i as u8) ^ from).collect()
}

/// Streams `n` SENDs from `tx` to `rx` in rounds of 16 and checks that each arrives once,
/// whole and in order.
#[allow(clippy::too_many_arguments)]
fn stream(
    tx: &softverbs::Qp<'_>,
    tx_cq: &softverbs::Cq<'_>,
    tx_mr: &BorrowedMr<'_>,
    rx: &softverbs::Qp<'_>,
    rx_cq: &softverbs::Cq<'_>,
    rx_mr: &BorrowedMr<'_>,
    n: u32,
    from: u8,
) {
    for round in 0..n / 16 {
        for k in 0..16u32 {
            rx.post_recv(u64::from(k), &sge(rx_mr, u64::from(k) * 4096, 4096))
                .unwrap();
        }
        for k in 0..16u32 {
            let m = message(round * 16 + k, from);
            tx_mr.write(k as usize * 4096, &m).unwrap();
            let s = sge(tx_mr, u64::from(k) * 4096, m.len() as u32);
            tx.post_send(&SendRequest::new(u64::from(k), SendOp::Send, &s))
                .unwrap();
        }
        let sent = tx_cq.wait(16, T).unwrap();
        assert_eq!(sent.len(), 16, "round {round}: sends completed");
        assert!(
            sent.iter().all(|w| w.status == WcStatus::Success),
            "stream {from} round {round}: {sent:?}"
        );
        let got = rx_cq.wait(16, T).unwrap();
        assert_eq!(got.len(), 16, "round {round}: receives completed");
        for (k, w) in got.iter().enumerate() {
            let m = message(round * 16 + k as u32, from);
            assert_eq!(
                (w.wr_id, w.status),
                (k as u64, WcStatus::Success),
                "round {round}"
            );
            assert_eq!(w.byte_len as usize, m.len(), "round {round} message {k}");
            assert_eq!(
                read(rx_mr, k * 4096, m.len()),
                m,
                "round {round} message {k}"
            );
        }
        // Nothing more arrived: no message twice.
        assert!(
            rx_cq.poll(4).unwrap().is_empty(),
            "round {round}: a duplicate"
        );
    }
}

/// A QP on the net path against a peer whose device loses, duplicates, reorders and
/// corrupts what it sends (that peer stays on its daemon's engine: a device that injects
/// faults keeps its QPs): both directions deliver every message once, in order, whole. The
/// library's engine is the responder of the lossy direction and the requester of the other.
#[test]
fn a_net_path_qp_and_a_lossy_peer_deliver_everything_once() {
    let faults = softverbs_transport::Faults {
        loss: 0.1,
        duplicate: 0.1,
        reorder: 0.1,
        corrupt: 0.02,
        ..softverbs_transport::Faults::NONE
    };
    let (d1, _x) = daemon("netla", Some("127.93.1.1"));
    let (d2, _y) = daemon_with("netlb", Some("127.93.1.2"), Some(faults));
    let a = Context::open_at(&d1.socket, 0).unwrap();
    let b = Context::open_at(&d2.socket, 0).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cqa, cqb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let p = Pair {
        qa: a
            .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&cqa, &cqa).cap(cap()))
            .unwrap(),
        qb: b
            .create_qp(&QpInit::new(QpType::Rc, &pb).cqs(&cqb, &cqb).cap(cap()))
            .unwrap(),
    };
    // A short ACK timeout (4.096 µs · 2^10 ≈ 4 ms) so that losses cost little time, and
    // seven retries of it outlast a responder whose progress thread waits for a CPU on a
    // loaded machine: at 2^8 (1 ms) they ran out in 3 of 20 runs beside two busy loops,
    // with the thread of `c70dd45` as with today's, and once in CI.
    let path = RcPath {
        timeout: 10,
        ..RcPath::default()
    };
    connect_with(&p.qa, b.query_gid(1, 0).unwrap(), p.qb.qpn(), path);
    connect_with(&p.qb, a.query_gid(1, 0).unwrap(), p.qa.qpn(), path);
    // `SOFTVERBS_NET=0` keeps the clean side on its daemon's engine: the daemon-path
    // control of `scripts/lossy-under-load.sh` (PATHS=daemon).
    let net = std::env::var_os("SOFTVERBS_NET").is_none_or(|v| v != "0");
    assert_eq!(p.qa.is_net(), net, "the clean side runs its engine");
    assert!(!p.qb.is_net(), "the faulty device keeps its QP");
    let mut abuf = vec![0u8; 16 * 4096];
    let mut bbuf = vec![0u8; 16 * 4096];
    let ma = lend(&pa, &mut abuf);
    let mb = lend(&pb, &mut bbuf);
    stream(&p.qb, &cqb, &mb, &p.qa, &cqa, &ma, 160, 1);
    stream(&p.qa, &cqa, &ma, &p.qb, &cqb, &mb, 160, 2);
}

/// The peer of this side is a child process; this is its body (does nothing as a test).
#[test]
fn net_child_process() {
    let Some(socket) = std::env::var_os("SV_NET_CHILD") else {
        return;
    };
    use std::io::BufRead;
    let b = Context::open_at(std::path::Path::new(&socket), 0).unwrap();
    let pb = b.alloc_pd().unwrap();
    let cqb = b.create_cq(64).unwrap();
    let qb = b
        .create_qp(&QpInit::new(QpType::Rc, &pb).cqs(&cqb, &cqb).cap(cap()))
        .unwrap();
    let g = b.query_gid(1, 0).unwrap();
    println!("qpn {} gid {}", qb.qpn(), g.to_ip());
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    let (qpn, ip) = line.trim().split_once(' ').unwrap();
    let gid = softverbs::Gid::from_ip(ip.parse().unwrap());
    connect(&qb, gid, qpn.parse().unwrap());
    let mut buf = vec![0u8; 64 * 4096];
    let mb = lend(&pb, &mut buf);
    for k in 0..64u64 {
        qb.post_recv(k, &sge(&mb, k * 4096, 4096)).unwrap();
    }
    println!("ready {}", qb.is_net());
    loop {
        for w in cqb.poll(16).unwrap() {
            qb.post_recv(w.wr_id, &sge(&mb, w.wr_id * 4096, 4096))
                .unwrap();
        }
    }
}

/// A peer on the net path SIGKILLed mid-transfer: this side's requests run out of retries
/// (`RETRY_EXC_ERR`, then flushes), and the dead peer's daemon keeps nothing of it.
#[test]
fn a_net_path_peer_killed_mid_transfer_fails_its_partner_and_is_cleaned_up() {
    use std::io::{BufRead, BufReader, Write};
    let (d1, _x) = daemon("netka", Some("127.93.2.1"));
    let (d2, _y) = daemon("netkb", Some("127.93.2.2"));
    let mut child = Reaped(
        std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "net_child_process", "--nocapture"])
            .env("SV_NET_CHILD", &d2.socket)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let mut line = String::new();
    let peer = loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child ended");
        if let Some(rest) = line.trim().strip_prefix("qpn ") {
            let (qpn, ip) = rest.split_once(" gid ").unwrap();
            break (
                qpn.parse::<u32>().unwrap(),
                ip.parse::<std::net::IpAddr>().unwrap(),
            );
        }
    };
    let a = Context::open_at(&d1.socket, 0).unwrap();
    let pa = a.alloc_pd().unwrap();
    let cqa = a.create_cq(64).unwrap();
    let qa = a
        .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&cqa, &cqa).cap(cap()))
        .unwrap();
    // 4.096 µs · 2^12 ≈ 17 ms per try, eight tries: a dead peer is found within about 0.15 s.
    // Three tries (50 ms) ran out before the kill on a loaded machine (load ≈ 10: the
    // responder's daemon and its library each wait for a CPU since the daemon forwards).
    let path = RcPath {
        timeout: 12,
        retry_cnt: 7,
        ..RcPath::default()
    };
    connect_with(&qa, softverbs::Gid::from_ip(peer.1), peer.0, path);
    let ga = a.query_gid(1, 0).unwrap();
    writeln!(
        child.0.stdin.as_mut().unwrap(),
        "{} {}",
        qa.qpn(),
        ga.to_ip()
    )
    .unwrap();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child ended");
        if let Some(net) = line.trim().strip_prefix("ready ") {
            assert_eq!(net, "true", "the child's QP is on the net path");
            break;
        }
    }
    assert!(qa.is_net());
    let mut abuf = vec![5u8; 4096];
    let ma = lend(&pa, &mut abuf);
    let s = sge(&ma, 0, 2048);
    let mut done = 0;
    let mut posted = 0u64;
    // Stream until 200 completed, then kill the child with requests outstanding.
    while done < 200 {
        while posted - done < 32 {
            qa.post_send(&SendRequest::new(posted, SendOp::Send, &s))
                .unwrap();
            posted += 1;
        }
        for w in cqa.poll(16).unwrap() {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
            done += 1;
        }
    }
    let pid = child.0.id();
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    // Requests the dead peer can no longer take.
    for _ in 0..8 {
        qa.post_send(&SendRequest::new(posted, SendOp::Send, &s))
            .unwrap();
        posted += 1;
    }
    let mut statuses = Vec::new();
    let end = std::time::Instant::now() + T;
    while (done as usize + statuses.len()) < posted as usize && std::time::Instant::now() < end {
        for w in cqa.poll(16).unwrap() {
            if w.status == WcStatus::Success {
                done += 1;
            } else {
                statuses.push(w.status);
            }
        }
    }
    assert_eq!(
        done as usize + statuses.len(),
        posted as usize,
        "every request completed"
    );
    assert_eq!(
        statuses.first(),
        Some(&WcStatus::RetryExcErr),
        "{statuses:?}"
    );
    assert!(
        statuses[1..].iter().all(|s| *s == WcStatus::WrFlushErr),
        "{statuses:?}"
    );
    let end = std::time::Instant::now() + T;
    while qa.query().unwrap().attr.qp_state != QpState::Err && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(qa.query().unwrap().attr.qp_state, QpState::Err);
    common::wait_until_nothing_of(&d2.socket, pid, T);
}

/// The library's progress thread: a receiver that never polls — it sleeps in
/// `ibv_get_cq_event` — still acknowledges (the sender's requests complete), and its
/// completion wakes it through its channel.
#[test]
fn a_net_path_receiver_asleep_on_its_channel_acks_and_wakes() {
    let (d1, _x) = daemon("netpa", Some("127.93.3.1"));
    let (d2, _y) = daemon("netpb", Some("127.93.3.2"));
    let a = Context::open_at(&d1.socket, 0).unwrap();
    let b = Context::open_at(&d2.socket, 0).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let ch = b.create_comp_channel().unwrap();
    let cqa = a.create_cq(64).unwrap();
    let cqb = b.create_cq_with_channel(64, &ch).unwrap();
    let qa = a
        .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&cqa, &cqa).cap(cap()))
        .unwrap();
    let qb = b
        .create_qp(&QpInit::new(QpType::Rc, &pb).cqs(&cqb, &cqb).cap(cap()))
        .unwrap();
    connect(&qa, b.query_gid(1, 0).unwrap(), qb.qpn());
    connect(&qb, a.query_gid(1, 0).unwrap(), qa.qpn());
    assert!(qa.is_net() && qb.is_net());
    let mut abuf = vec![9u8; 4096];
    let mut bbuf = vec![0u8; 4096];
    let ma = lend(&pa, &mut abuf);
    let mb = lend(&pb, &mut bbuf);
    for round in 0..5u64 {
        qb.post_recv(round, &sge(&mb, 0, 4096)).unwrap();
        cqb.req_notify(false).unwrap();
        // Nothing completed before the arm, so none is missed (ibv_req_notify_cq(3)).
        std::thread::scope(|t| {
            let sleeper = t.spawn(|| ch.get_event(Some(T)).unwrap());
            // Let the receiver fall asleep, off its CQ, for longer than the thread's
            // "still polling" window.
            std::thread::sleep(Duration::from_millis(20));
            let s = sge(&ma, 0, 100);
            qa.post_send(&SendRequest::new(round, SendOp::Send, &s))
                .unwrap();
            let w = cqa.wait(1, T).unwrap();
            assert_eq!(
                (w[0].wr_id, w[0].status),
                (round, WcStatus::Success),
                "acked"
            );
            assert_eq!(sleeper.join().unwrap(), Some(cqb.handle()), "woken");
        });
        let w = cqb.wait(1, T).unwrap();
        assert_eq!((w[0].wr_id, w[0].byte_len), (round, 100));
    }
}

/// A net-path QP on an SRQ: its library's engine takes the receives from the SRQ's shared
/// ring as messages need them (in order, each once, into the right buffer), and a take
/// that leaves the SRQ below its armed limit raises `SRQ_LIMIT_REACHED` once.
#[test]
fn a_net_path_qp_receives_through_its_srq_and_raises_the_limit_event() {
    use softverbs::{Element, EventType, SrqAttr};
    let (d1, _x) = daemon("netsa", Some("127.93.4.1"));
    let (d2, _y) = daemon("netsb", Some("127.93.4.2"));
    let a = Context::open_at(&d1.socket, 0).unwrap();
    let b = Context::open_at(&d2.socket, 0).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cqa, cqb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let s = pb
        .create_srq(SrqAttr {
            max_wr: 64,
            max_sge: 4,
            srq_limit: 0,
        })
        .unwrap();
    let qa = a
        .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&cqa, &cqa).cap(cap()))
        .unwrap();
    let qb = b
        .create_qp(
            &QpInit::new(QpType::Rc, &pb)
                .cqs(&cqb, &cqb)
                .srq(&s)
                .cap(cap()),
        )
        .unwrap();
    let mut abuf = vec![0u8; 4096];
    let mut bbuf = vec![0u8; 16 * 4096];
    let ma = lend(&pa, &mut abuf);
    let mb = lend(&pb, &mut bbuf);
    for i in 0..8u64 {
        s.post_recv(i, &sge(&mb, i * 4096, 4096)).unwrap();
    }
    s.modify(
        &SrqAttr {
            srq_limit: 4,
            ..SrqAttr::default()
        },
        softverbs::SRQ_LIMIT,
    )
    .unwrap();
    connect(&qa, b.query_gid(1, 0).unwrap(), qb.qpn());
    connect(&qb, a.query_gid(1, 0).unwrap(), qa.qpn());
    assert!(
        qa.is_net() && qb.is_net(),
        "an SRQ's QP goes on the net path too"
    );
    for id in 0..6u64 {
        let m = message(id as u32, 9);
        ma.write(0, &m).unwrap();
        let sg = sge(&ma, 0, m.len() as u32);
        qa.post_send(&SendRequest::new(id, SendOp::Send, &sg))
            .unwrap();
        let w = cqa.wait(1, T).unwrap();
        assert_eq!((w[0].wr_id, w[0].status), (id, WcStatus::Success));
        let w = cqb.wait(1, T).unwrap();
        assert_eq!(
            (w[0].wr_id, w[0].status, w[0].qp_num, w[0].byte_len as usize),
            (id, WcStatus::Success, qb.qpn(), m.len()),
            "receive {id} is the SRQ's next"
        );
        assert_eq!(read(&mb, id as usize * 4096, m.len()), m);
        if id == 3 {
            assert!(
                b.try_get_async_event().unwrap().is_none(),
                "4 left: not below 4"
            );
        }
    }
    let ev = b
        .get_async_event_within(Some(T))
        .unwrap()
        .expect("the limit event");
    assert_eq!(ev.event_type, Some(EventType::SrqLimitReached));
    assert_eq!(ev.element, Element::Srq(s.handle()));
    std::thread::sleep(Duration::from_millis(50));
    assert!(b.try_get_async_event().unwrap().is_none(), "once");
}

/// Waits, without polling any CQ, until the 8 bytes at `offset` of `mr` read `want`: a
/// program watching its memory for a peer's WRITE, as `ib_write_lat` does.
fn watch(mr: &BorrowedMr<'_>, offset: usize, want: u64) {
    let end = std::time::Instant::now() + T;
    while u64::from_ne_bytes(read(mr, offset, 8).try_into().unwrap()) != want {
        assert!(std::time::Instant::now() < end, "WRITE {want} never landed");
        std::hint::spin_loop();
    }
}

/// A WRITE of `v` into the peer's MR at `offset`, signaled, and the poll for its
/// completion.
fn write_and_complete(
    qp: &softverbs::Qp<'_>,
    cq: &softverbs::Cq<'_>,
    mine: &BorrowedMr<'_>,
    peer: (u64, u32),
    v: u64,
) {
    mine.write(0, &v.to_ne_bytes()).unwrap();
    let s = sge(mine, 0, 8);
    let w = SendRequest::new(
        v,
        SendOp::Write {
            remote_addr: peer.0 + 64,
            rkey: peer.1,
        },
        &s,
    );
    qp.post_send(&w).unwrap();
    let c = cq.wait(1, T).unwrap();
    assert_eq!(
        (c.len(), c.first().map(|c| (c.wr_id, c.status))),
        (1, Some((v, WcStatus::Success))),
        "WRITE {v} completes"
    );
}

/// `ib_write_lat`'s pattern between two hosts: each side polls its CQ only for its own
/// WRITE's completion and watches its memory for the peer's. A peer's WRITE that lands
/// while a side watches is taken by that side's progress thread; the ACKs the libraries
/// hold back for the next post (docs/design/net-path.md, "Order") are released by that post, or
/// after a while when two sides' WRITEs cross and each waits for its own ACK. Every value
/// lands, in order, and every WRITE completes.
#[test]
fn write_ping_pong_and_crossing_writes_between_two_net_path_qps() {
    rc_pair!("w", "5" => a, b, pa, pb, cqa, cqb, qa, qb);
    connect(&qa, b.query_gid(1, 0).unwrap(), qb.qpn());
    connect(&qb, a.query_gid(1, 0).unwrap(), qa.qpn());
    assert!(qa.is_net() && qb.is_net());
    let mut abuf = vec![0u8; 4096];
    let mut bbuf = vec![0u8; 4096];
    let ma = lend(&pa, &mut abuf);
    let mb = lend(&pb, &mut bbuf);
    let (to_a, to_b) = ((ma.addr(), ma.rkey()), (mb.addr(), mb.rkey()));
    for v in 1..=500u64 {
        write_and_complete(&qa, &cqa, &ma, to_b, v);
        watch(&mb, 64, v);
        write_and_complete(&qb, &cqb, &mb, to_a, v);
        watch(&ma, 64, v);
    }
    // Crossing: both post before either polls.
    for v in 501..=600u64 {
        for (qp, mine, peer) in [(&qa, &ma, to_b), (&qb, &mb, to_a)] {
            mine.write(0, &v.to_ne_bytes()).unwrap();
            let s = sge(mine, 0, 8);
            let op = SendOp::Write {
                remote_addr: peer.0 + 64,
                rkey: peer.1,
            };
            qp.post_send(&SendRequest::new(v, op, &s)).unwrap();
        }
        for cq in [&cqa, &cqb] {
            let c = cq.wait(1, T).unwrap();
            assert_eq!(
                c.first().map(|c| (c.wr_id, c.status)),
                Some((v, WcStatus::Success))
            );
        }
        watch(&ma, 64, v);
        watch(&mb, 64, v);
    }
}
