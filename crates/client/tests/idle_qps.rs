//! Another client's idle QPs cost the daemon nothing per round (issue 10, item 5): the daemon
//! visits the rings of QPs with work only. Counted in ring visits (`softverbs status`'s data
//! path figures), never timed.
//!
//! Receive buffers are lent to their MRs with `reg_slice`, posted through the MRs'
//! range-checked SGEs and read back through the MRs; the sends are inline.

use std::time::Duration;

use softverbs::{
    Access, AhAttr, AttrMask as M, Context, Gid, Introspect, Mtu, QpAttr, QpCap, QpInit, QpState,
    QpType, SendOp, SendRequest, WcStatus,
};
use softverbs_daemon::{spawn_test_daemon, TestDaemon};

const IDLE: usize = 2000;

struct Dir(std::path::PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn daemon(name: &str) -> (TestDaemon, Dir) {
    let dir = std::env::temp_dir().join(format!("svidle-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    (spawn_test_daemon(dir.join("sv.sock")).unwrap(), Dir(dir))
}

fn status(d: &TestDaemon) -> softverbs::Status {
    Introspect::connect_at(&d.socket).unwrap().status().unwrap()
}

fn init(qp: &softverbs::Qp<'_>) {
    let a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: Access(0x0f),
        ..QpAttr::default()
    };
    qp.modify(&a, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
        .unwrap();
}

/// INIT → RTR → RTS towards `remote`.
fn connect(qp: &softverbs::Qp<'_>, gid: Gid, remote: u32) {
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
        dest_qp_num: remote,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 1,
        ..QpAttr::default()
    };
    qp.modify(
        &rtr,
        M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER,
    )
    .unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
        ..rtr
    };
    qp.modify(
        &rts,
        M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
}

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    }
}

/// `n` SEND/RECV round trips between `a` and `b` (one message in flight, as
/// ibv_rc_pingpong), each payload checked.
fn pingpong(
    a: (&softverbs::Qp<'_>, &softverbs::Cq<'_>),
    b: (&softverbs::Qp<'_>, &softverbs::Cq<'_>),
    rmr: &softverbs::BorrowedMr<'_>,
    n: u32,
) {
    for i in 0..n {
        for (k, (tx, rx)) in [(a, b), (b, a)].into_iter().enumerate() {
            rx.0.post_recv(u64::from(i), &[rmr.sge(64 * k, 64).unwrap()])
                .unwrap();
            let msg = [(i % 251) as u8 ^ k as u8; 8];
            let mut w = SendRequest::new(u64::from(i), SendOp::Send, &[]);
            w.inline = Some(&msg);
            w.signaled = true;
            tx.0.post_send(&w).unwrap();
            let s = tx.1.wait(1, Duration::from_secs(20)).unwrap();
            assert_eq!(s[0].status, WcStatus::Success);
            let r = rx.1.wait(1, Duration::from_secs(20)).unwrap();
            assert_eq!((r[0].status, r[0].byte_len), (WcStatus::Success, 8));
            assert_eq!(
                rmr.to_vec()[64 * k..64 * k + 8],
                msg,
                "round trip {i}, leg {k}"
            );
        }
    }
}

#[test]
fn another_clients_idle_qps_are_not_visited_and_wake_up_when_posted_to() {
    let (d, _dir) = daemon("visits");
    // The idle client: 2,000 RC QPs with mapped rings, in INIT (receives may be posted).
    let idle_ctx = Context::open_at(&d.socket, 0).unwrap();
    let ipd = idle_ctx.alloc_pd().unwrap();
    let icq = idle_ctx.create_cq(16).unwrap();
    let idle: Vec<_> = (0..IDLE)
        .map(|_| {
            let q = idle_ctx
                .create_qp(&QpInit::new(QpType::Rc, &ipd).cqs(&icq, &icq).cap(cap()))
                .unwrap();
            init(&q);
            q
        })
        .collect();

    // The busy client: one connected pair, pinging.
    // The daemon's rounds are what is measured: the pair stays on its engine (on the
    // same-host direct path it would take no round at all, docs/design/direct-path.md).
    let ctx = Context::open_at_direct(&d.socket, 0, false).unwrap();
    let gid = ctx.query_gid(1, 0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let (ca, cb) = (ctx.create_cq(16).unwrap(), ctx.create_cq(16).unwrap());
    let qa = ctx
        .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&ca, &ca).cap(cap()))
        .unwrap();
    let qb = ctx
        .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cb, &cb).cap(cap()))
        .unwrap();
    for (q, r) in [(&qa, qb.qpn()), (&qb, qa.qpn())] {
        init(q);
        connect(q, gid, r);
    }
    let mut rbuf = vec![0u8; 4096];
    let mr = pd.reg_slice(&mut rbuf, Access(0x0f)).unwrap();

    // QPs touched by the set-up stay queued for a few rounds (the daemon's idle grace);
    // status commands run rounds, so poll until only the pair is left (bounded).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while status(&d).dp_queued_qps > 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let before = status(&d);
    assert_eq!(before.qps as usize, IDLE + 2);
    assert!(
        before.dp_queued_qps <= 2,
        "{} QPs queued",
        before.dp_queued_qps
    );
    pingpong((&qa, &ca), (&qb, &cb), &mr, 200);
    let after = status(&d);
    let rounds = after.dp_rounds - before.dp_rounds;
    let visits = after.dp_qp_visits - before.dp_qp_visits;
    assert!(rounds >= 400, "{rounds} rounds for 400 messages");
    // Two QPs have work; every visit beyond them would be an idle QP's.
    assert!(
        visits <= 2 * rounds,
        "{visits} QP visits in {rounds} rounds while {IDLE} QPs were idle"
    );
    // Setting up, a round visits the QPs touched in the last few rounds (the idle grace),
    // never all of them.
    assert!(
        after.dp_max_qp_visits as usize <= IDLE / 10,
        "a round visited {} QPs (of {})",
        after.dp_max_qp_visits,
        after.qps
    );

    // A QP idle all along wakes up when posted to: connect idle QP #1234 to a new QP of the
    // busy client and ping through it.
    let sleeper = &idle[1234];
    let qc = ctx
        .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cb, &cb).cap(cap()))
        .unwrap();
    init(&qc);
    connect(sleeper, gid, qc.qpn());
    connect(&qc, gid, sleeper.qpn());
    let mut ibuf = vec![0u8; 4096];
    let imr = ipd.reg_slice(&mut ibuf, Access(0x0f)).unwrap();
    // Post from each side in turn, with the receive on the other side.
    for i in 0..20u32 {
        sleeper
            .post_recv(u64::from(i), &[imr.sge(0, 64).unwrap()])
            .unwrap();
        let msg = [i as u8; 8];
        let mut w = SendRequest::new(u64::from(i), SendOp::Send, &[]);
        w.inline = Some(&msg);
        w.signaled = true;
        qc.post_send(&w).unwrap();
        assert_eq!(
            cb.wait(1, Duration::from_secs(20)).unwrap()[0].status,
            WcStatus::Success
        );
        let r = icq.wait(1, Duration::from_secs(20)).unwrap();
        assert_eq!((r[0].status, r[0].byte_len), (WcStatus::Success, 8));
        assert_eq!(imr.to_vec()[..8], msg);
        qc.post_recv(u64::from(i), &[mr.sge(256, 64).unwrap()])
            .unwrap();
        sleeper.post_send(&w).unwrap();
        assert_eq!(
            icq.wait(1, Duration::from_secs(20)).unwrap()[0].status,
            WcStatus::Success
        );
        assert_eq!(cb.wait(1, Duration::from_secs(20)).unwrap()[0].byte_len, 8);
        assert_eq!(mr.to_vec()[256..264], msg);
    }
    // Once quiet, nothing stays queued (bounded wait: the last visits settle).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while status(&d).dp_queued_qps > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let s = status(&d);
    assert_eq!(s.dp_queued_qps, 0, "QPs left queued with nothing to do");
    assert!(
        s.dp_max_qp_visits as usize <= IDLE / 10,
        "a round visited {} QPs",
        s.dp_max_qp_visits
    );
    drop(mr);
    drop(imr);
}
