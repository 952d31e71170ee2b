//! The daemon's death is a device fatal error (docs/guide/dropin.md, "When the daemon dies"): a
//! daemon in a child process (this test binary run again as the daemon) is killed with
//! SIGKILL under a context with work outstanding, and the context's blocked calls return,
//! its async fd yields `DeviceFatal`, its outstanding work completes with `WR_FLUSH_ERR` after
//! the completions the daemon already wrote, its later verbs fail with
//! `ErrorKind::DeviceFatal`, its objects still destroy, and a new context on a new daemon
//! works.
//!
//! The test's buffer is lent to its MR with `reg_slice` and posted through the MR's
//! range-checked SGEs (application `wr_id`s, one range posted several times).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use softverbs::{
    errno, Access, AttrMask as M, Context, Element, ErrorKind, EventType, QpAttr, QpCap, QpInit,
    QpState, QpType, SendOp, SendRequest, Sge, WcOpcode, WcStatus,
};

mod common;
use common::{connect_with, RcPath};

/// How long any one step may take (debug builds on a loaded machine). Only a hang reaches it.
const WAIT: Duration = Duration::from_secs(60);

/// Where the child daemon serves (set only in the child).
const SOCKET_ENV: &str = "SOFTVERBS_DEATH_TEST_SOCKET";

/// Not a test: the body of the child process [`ChildDaemon`] starts. It serves a daemon on
/// the socket it is given until it is killed, and does nothing when run as a test.
#[test]
fn child_daemon_process() {
    let Some(socket) = std::env::var_os(SOCKET_ENV) else {
        return;
    };
    let _d = softverbs_daemon::spawn_daemon_with(softverbs_daemon::Config::new(socket.into()))
        .expect("child daemon");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// A daemon in a process of its own, so that it can be killed with SIGKILL.
struct ChildDaemon(Child);

impl ChildDaemon {
    fn start(socket: &Path) -> ChildDaemon {
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_daemon_process", "--nocapture"])
            .env(SOCKET_ENV, socket)
            .spawn()
            .expect("start the child daemon");
        let d = ChildDaemon(child);
        let deadline = Instant::now() + WAIT;
        // Without autostart: it would start a daemon of its own when nothing listens yet.
        while softverbs::connect_socket_with(socket, false).is_err() {
            assert!(Instant::now() < deadline, "the child daemon never answered");
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    fn kill9(&mut self) {
        self.0.kill().expect("SIGKILL");
        self.0.wait().expect("reap");
    }
}

impl Drop for ChildDaemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const ALL: Access = Access(0x0f);

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

#[test]
fn a_killed_daemon_is_a_device_fatal_error_and_a_new_one_serves_again() {
    let dir = std::env::temp_dir().join(format!("svdeath-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let _dir = Dir(dir.clone());
    let socket = dir.join("sv.sock");
    let mut daemon = ChildDaemon::start(&socket);

    let ctx = Context::open_at(&socket, 0).unwrap();
    // Every context of the process hears of it; one closed before does not matter.
    let other = Context::open_at(&socket, 0).unwrap();
    drop(Context::open_at(&socket, 0).unwrap());
    let pd = ctx.alloc_pd().unwrap();
    let mut buf = vec![7u8; 4096];
    let mr = pd.reg_slice(&mut buf, ALL).unwrap();
    let sge = |off: u64| -> Sge { mr.sge(off as usize, 64).unwrap() };
    let channel = ctx.create_comp_channel().unwrap();
    let send_cq = ctx.create_cq_with_channel(16, &channel).unwrap();
    let recv_cq = ctx.create_cq(16).unwrap();
    let a_cq = ctx.create_cq(16).unwrap();
    let qa = ctx
        .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&a_cq, &a_cq).cap(cap()))
        .unwrap();
    let qb = ctx
        .create_qp(
            &QpInit::new(QpType::Rc, &pd)
                .cqs(&send_cq, &recv_cq)
                .cap(cap()),
        )
        .unwrap();
    let gid = ctx.query_gid(1, 0).unwrap();
    connect(&qa, gid, qb.qpn());
    connect(&qb, gid, qa.qpn());

    // One send completes, and its completion is left unpolled in the ring: the channel says
    // when it is there. Then the CQ is armed again.
    qa.post_recv(50, &[sge(0)]).unwrap();
    send_cq.req_notify(false).unwrap();
    qb.post_send(&SendRequest::new(1, SendOp::Send, &[sge(64)]))
        .unwrap();
    assert_eq!(
        channel.get_event(Some(WAIT)).unwrap(),
        Some(send_cq.handle())
    );
    let got = a_cq.wait(1, WAIT).unwrap();
    assert_eq!(
        (got[0].wr_id, got[0].status),
        (50, WcStatus::Success),
        "{got:?}"
    );
    send_cq.req_notify(false).unwrap();
    // Three more sends (one unsignaled) that qa, with no receive posted, answers with RNR
    // NAKs forever, and three receives nobody sends to.
    let one = [sge(128)];
    for (wr_id, signaled) in [(2, true), (3, false), (4, true)] {
        let mut r = SendRequest::new(wr_id, SendOp::Send, &one);
        r.signaled = signaled;
        qb.post_send(&r).unwrap();
    }
    for wr_id in [100, 101, 102] {
        qb.post_recv(wr_id, &[sge(256)]).unwrap();
    }

    std::thread::scope(|s| {
        // Calls blocked when the daemon dies return.
        let async_waiter = s.spawn(|| ctx.get_async_event_within(Some(WAIT)));
        let channel_waiter = s.spawn(|| channel.get_event(Some(WAIT)));
        std::thread::sleep(Duration::from_millis(100));
        daemon.kill9();
        let ev = async_waiter
            .join()
            .unwrap()
            .unwrap()
            .expect("no async event after the daemon died");
        assert_eq!(
            (ev.event_type, ev.raw_event_type, ev.element),
            (Some(EventType::DeviceFatal), 8, Element::Device)
        );
        assert_eq!(
            channel_waiter.join().unwrap().unwrap(),
            Some(send_cq.handle()),
            "the armed CQ's channel reports it"
        );
    });
    assert!(ctx.device_fatal());
    let ev = other.get_async_event_within(Some(WAIT)).unwrap();
    assert_eq!(ev.map(|e| e.event_type), Some(Some(EventType::DeviceFatal)));
    drop(other);
    // The event comes once; afterwards both fds answer EIO (and stay readable).
    let e = ctx.get_async_event_within(Some(WAIT)).unwrap_err();
    assert_eq!((e.kind(), e.errno()), (ErrorKind::DeviceFatal, errno::EIO));
    assert!(channel.get_event(Some(WAIT)).unwrap_err().is_device_fatal());

    // The completion the daemon wrote comes first, then every outstanding request flushed,
    // unsignaled ones too, in the order posted, exactly once.
    let sent: Vec<_> = send_cq
        .poll(32)
        .unwrap()
        .iter()
        .map(|w| (w.wr_id, w.status, w.qp_num))
        .collect();
    let flush = WcStatus::WrFlushErr;
    assert_eq!(
        sent,
        [
            (1, WcStatus::Success, qb.qpn()),
            (2, flush, qb.qpn()),
            (3, flush, qb.qpn()),
            (4, flush, qb.qpn())
        ]
    );
    let received: Vec<_> = recv_cq
        .poll(32)
        .unwrap()
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode))
        .collect();
    assert_eq!(
        received,
        [100, 101, 102].map(|id| (id, flush, WcOpcode::Recv))
    );
    for cq in [&send_cq, &recv_cq, &a_cq] {
        assert!(cq.poll(32).unwrap().is_empty(), "no duplicates");
    }

    // Later verbs fail with the typed error (EIO).
    let fatal = |r: Result<(), softverbs::Error>| {
        let e = r.expect_err("a verb on a dead device succeeded");
        assert!(e.is_device_fatal() && e.errno() == errno::EIO, "{e}");
    };
    fatal(ctx.alloc_pd().map(drop));
    fatal(ctx.create_cq(4).map(drop));
    fatal(ctx.query_port(1).map(drop));
    fatal(pd.alloc_mr(64, ALL).map(drop));
    fatal(qb.post_send(&SendRequest::new(9, SendOp::Send, &[sge(0)])));
    fatal(qb.post_recv(9, &[sge(0)]));
    fatal(send_cq.req_notify(false));
    fatal(qb.modify(
        &QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        },
        M::STATE,
    ));
    // Destroying still works, so that the program can clean up.
    assert_eq!(qb.destroy(), Ok(0));
    assert_eq!(qa.destroy(), Ok(0));
    assert_eq!(send_cq.destroy(), Ok(0));
    assert_eq!(recv_cq.destroy(), Ok(0));
    assert_eq!(a_cq.destroy(), Ok(0));
    assert_eq!(mr.dereg(), Ok(()));
    assert_eq!(pd.dealloc(), Ok(()));
    drop(channel);
    drop(ctx);

    // A new daemon on the same socket: a new context works.
    let _daemon = ChildDaemon::start(&socket);
    let ctx = Context::open_at(&socket, 0).unwrap();
    assert!(!ctx.device_fatal());
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4).unwrap();
    let qp = ctx
        .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap()))
        .unwrap();
    assert!(qp.qpn() > 0);
}

/// RESET->INIT->RTR->RTS towards `remote_qpn` on `gid` (this file's path: common::RcPath).
fn connect(qp: &softverbs::Qp<'_>, gid: softverbs::Gid, remote_qpn: u32) {
    connect_with(
        qp,
        gid,
        remote_qpn,
        RcPath {
            timeout: 14,
            ..RcPath::default()
        },
    );
}
