//! The client against a real daemon (in a background thread of the test process). Each
//! `Context` is its own connection, so to the daemon two contexts are two processes.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::PathBuf;

use softverbs::{
    errno, Access, AhAttr, AttrMask, Context, Element, EventType, Introspect, QpAttr, QpCap,
    QpInit, QpState, QpType, SrqAttr, O_CREAT, O_EXCL, SRQ_LIMIT,
};
use softverbs_daemon::{spawn_daemon_with, spawn_test_daemon, Config, TestDaemon};

/// A fresh directory for one test, removed afterwards.
struct TestDir(PathBuf);

impl std::ops::Deref for TestDir {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn test_dir(name: &str) -> TestDir {
    let dir = std::env::temp_dir().join(format!("svc-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TestDir(dir)
}

/// A daemon on a background thread of this process, in a fresh directory.
fn daemon(name: &str) -> (TestDaemon, TestDir) {
    let dir = test_dir(name);
    let d = spawn_test_daemon(dir.join("sv.sock")).unwrap();
    (d, dir)
}

fn open(d: &TestDaemon) -> Context {
    Context::open_at(&d.socket, 0).unwrap()
}

fn status(d: &TestDaemon) -> softverbs::Status {
    Introspect::connect_at(&d.socket).unwrap().status().unwrap()
}

/// RESET→INIT attributes of an XRC receive QP.
fn to_init() -> (QpAttr, AttrMask) {
    let attr = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        pkey_index: 0,
        qp_access_flags: Access::REMOTE_WRITE,
        ..QpAttr::default()
    };
    (
        attr,
        AttrMask::STATE | AttrMask::PORT | AttrMask::PKEY_INDEX | AttrMask::ACCESS_FLAGS,
    )
}

#[test]
fn context_opens_and_queries_the_device() {
    let (d, _dir) = daemon("query");
    let intro = Introspect::connect_at(&d.socket).unwrap();
    let devs = intro.devices().unwrap();
    assert_eq!(devs.len(), 1);
    assert_eq!((devs[0].index, devs[0].name.as_str()), (0, "softverbs0"));

    let ctx = open(&d);
    assert_eq!(ctx.abi_version(), softverbs::ABI_VERSION);
    assert_ne!(ctx.ctx_id(), 0);
    let attr = ctx.query_device().unwrap();
    assert_eq!(attr.node_guid, devs[0].node_guid);
    assert_eq!(attr.phys_port_cnt, 1);
    assert_ne!(
        attr.device_cap_flags & softverbs_core::device::DEVICE_XRC,
        0
    );
    assert!(attr.fw_ver.starts_with("softverbs"));
    let port = ctx.query_port(1).unwrap();
    assert_eq!(port.state, softverbs::PortState::Active);
    let gid = ctx.query_gid(1, 0).unwrap();
    assert_eq!(
        gid.to_ip(),
        "127.0.0.1".parse::<std::net::IpAddr>().unwrap()
    );
    assert!(ctx.query_port(2).is_err());

    let by_name = Context::open_by_name_at(&d.socket, "softverbs0").unwrap();
    assert_ne!(by_name.ctx_id(), ctx.ctx_id());
    let e = Context::open_by_name_at(&d.socket, "nope").unwrap_err();
    assert_eq!(e.errno(), errno::ENODEV);
    let e = Context::open_at(&d.socket, 7).unwrap_err();
    assert_eq!(e.op(), "hello");

    assert_eq!(status(&d).contexts, 2);
    let res = intro.resources().unwrap();
    assert!(res.is_object(), "resources parse as JSON");
    assert!(!intro.resources_json().unwrap().is_empty());
}

#[test]
fn connect_failures_carry_the_connect_errno() {
    let dir = test_dir("noconn");
    let e = softverbs::connect_socket_with(&dir.join("none.sock"), false).unwrap_err();
    assert_eq!((e.op(), e.errno()), ("connect", errno::ENOENT));
    assert!(e
        .to_string()
        .starts_with("connect: No such file or directory (errno 2)"));
}

#[test]
fn pd_mr_cq_srq_ah_qp_lifecycle() {
    let (d, _dir) = daemon("objects");
    let ctx = open(&d);
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd
        .alloc_mr(8192, Access::LOCAL_WRITE | Access::REMOTE_READ)
        .unwrap();
    assert_ne!(mr.lkey(), 0);
    let mut buf = vec![0u8; 4096];
    let mr2 = pd.reg_slice(&mut buf, Access::LOCAL_WRITE).unwrap();
    assert_ne!(mr2.mr().handle(), mr.mr().handle());
    mr2.dereg().unwrap();
    // The raw form with an iova other than the address, for FFI callers.
    // SAFETY: `buf` outlives the MR, which has no write access to it, and nothing posts.
    let raw = unsafe { softverbs::RawMemory::new(buf.as_ptr() as usize, 4096) };
    let mr3 = pd.reg_mr_iova(raw, 0x1000, Access(0)).unwrap();
    mr3.dereg().unwrap();
    let e = pd.alloc_mr(4096, Access(1 << 30)).unwrap_err();
    assert_eq!((e.op(), e.errno()), ("reg_mr", errno::EINVAL));

    let cq = ctx.create_cq(16).unwrap();
    assert!(cq.cqe() >= 16);
    assert!(cq.resize(64).unwrap() >= 64);
    assert!(cq.cqe() >= 64);

    let srq = pd
        .create_srq(SrqAttr {
            max_wr: 32,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    assert!(srq.query().unwrap().max_wr >= 32);
    let a = srq
        .modify(
            &SrqAttr {
                srq_limit: 4,
                ..SrqAttr::default()
            },
            SRQ_LIMIT,
        )
        .unwrap();
    assert_eq!(a.srq_limit, 4);

    let e = pd
        .create_ah(&AhAttr {
            port_num: 1,
            dlid: 1,
            ..AhAttr::default()
        })
        .unwrap_err();
    assert_eq!(
        (e.op(), e.errno()),
        ("create_ah", errno::EINVAL),
        "RoCE needs a GRH"
    );
    let gid = ctx.query_gid(1, 0).unwrap();
    let ah = pd
        .create_ah(&AhAttr {
            port_num: 1,
            is_global: true,
            dgid: gid,
            hop_limit: 64,
            ..AhAttr::default()
        })
        .unwrap();
    ah.destroy().unwrap();
    let _ah = pd
        .create_ah(&AhAttr {
            port_num: 1,
            is_global: true,
            dgid: gid,
            ..AhAttr::default()
        })
        .unwrap();

    let cap = QpCap {
        max_send_wr: 8,
        max_recv_wr: 0,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = ctx
        .create_qp(
            &QpInit::new(QpType::Rc, &pd)
                .cqs(&cq, &cq)
                .srq(&srq)
                .cap(cap),
        )
        .unwrap();
    assert_ne!(qp.qpn(), 0);
    let (attr, mask) = to_init();
    qp.modify(&attr, mask).unwrap();
    let q = qp.query().unwrap();
    assert_eq!(
        (q.attr.qp_state, q.qpn, q.init.qp_type),
        (QpState::Init, qp.qpn(), QpType::Rc)
    );
    // INIT→RTS skips RTR: the daemon's state machine says EINVAL.
    let e = qp
        .modify(
            &QpAttr {
                qp_state: QpState::Rts,
                ..attr
            },
            AttrMask::STATE,
        )
        .unwrap_err();
    assert_eq!((e.op(), e.errno()), ("modify_qp", errno::EINVAL));

    let ud = ctx
        .create_qp(&QpInit::new(QpType::Ud, &pd).cqs(&cq, &cq).cap(cap))
        .unwrap();
    let s = status(&d);
    assert_eq!((s.qps, s.cqs, s.srqs, s.mrs), (2, 1, 1, 1));
    assert_eq!(ud.destroy().unwrap(), 0);
    assert_eq!(qp.destroy().unwrap(), 0);
    drop(srq);
    drop(mr);
    drop(cq);
    drop(_ah);
    pd.dealloc().unwrap();
    let s = status(&d);
    assert_eq!((s.qps, s.cqs, s.srqs, s.mrs), (0, 0, 0, 0));
}

#[test]
fn create_flags_follow_the_daemons_abi() {
    let dir = test_dir("abi1");
    let mut config = Config::new(dir.join("sv.sock"));
    config.abi_version = 1;
    let old = spawn_daemon_with(config).unwrap();
    let (new, _dir2) = daemon("abi2");
    for (d, abi) in [(&old, 1), (&new, softverbs_abi::ABI_VERSION)] {
        let ctx = open(d);
        assert_eq!(ctx.abi_version(), abi);
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(8).unwrap();
        let cap = QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let init = QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap);
        ctx.create_qp(&init).unwrap();
        // Non-zero flags: an ABI 1 daemon refuses the field, an ABI 2 daemon the flag
        // (softverbs implements none). Either way EOPNOTSUPP, never silently ignored.
        let e = ctx.create_qp(&init.create_flags(1)).unwrap_err();
        assert_eq!(
            (e.op(), e.errno()),
            ("create_qp", errno::EOPNOTSUPP),
            "daemon ABI {abi}"
        );
    }
}

#[test]
fn xrcd_open_rules_and_close() {
    let (d, dir) = daemon("xrcd");
    let a = open(&d);
    let b = open(&d);
    let file = File::create(dir.join("domain")).unwrap();

    let e = a.open_xrcd(Some(&file), 0).unwrap_err();
    assert_eq!((e.op(), e.errno()), ("open_xrcd", errno::EAGAIN));
    let xa = a.open_xrcd(Some(&file), O_CREAT).unwrap();
    assert!(xa.created());
    // Another "process" opening another fd of the same file finds the same domain.
    let again = File::open(dir.join("domain")).unwrap();
    let xb = b.open_xrcd(Some(&again), O_CREAT).unwrap();
    assert!(!xb.created());
    assert_eq!(xa.xrcd_id(), xb.xrcd_id());
    let e = b.open_xrcd(Some(&file), O_CREAT | O_EXCL).unwrap_err();
    assert_eq!(e.errno(), errno::EINVAL);
    // Private domains are never shared.
    let p1 = a.open_xrcd(None, O_CREAT).unwrap();
    let p2 = a.open_xrcd(None, O_CREAT).unwrap();
    assert_ne!(p1.xrcd_id(), p2.xrcd_id());
    p1.close().unwrap();
    drop(p2);
    xa.close().unwrap();
    assert_eq!(status(&d).xrcds, 1, "b still holds the file's domain");
    drop(xb);
    assert_eq!(status(&d).xrcds, 0);
}

#[test]
fn xrc_srq_and_send_qp() {
    let (d, _dir) = daemon("xsrq");
    let ctx = open(&d);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let xrcd = ctx.open_xrcd(None, O_CREAT).unwrap();
    let srq = xrcd
        .create_xrc_srq(
            &pd,
            &cq,
            SrqAttr {
                max_wr: 16,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let srqn = srq.srq_num().unwrap();
    assert!(srqn > 0 && srqn <= 0x00ff_ffff);
    // A basic SRQ has no number.
    let basic = pd
        .create_srq(SrqAttr {
            max_wr: 4,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    assert!(basic.srq_num().is_err());

    let cap = QpCap {
        max_send_wr: 8,
        max_recv_wr: 0,
        max_send_sge: 1,
        max_recv_sge: 0,
        max_inline_data: 0,
    };
    let send = ctx
        .create_qp(&QpInit::new(QpType::XrcSend, &pd).send_cq(&cq).cap(cap))
        .unwrap();
    assert_eq!(send.query().unwrap().init.qp_type, QpType::XrcSend);
    // An XRC send QP with an SRQ is refused.
    let e = ctx
        .create_qp(
            &QpInit::new(QpType::XrcSend, &pd)
                .send_cq(&cq)
                .srq(&srq)
                .cap(cap),
        )
        .unwrap_err();
    assert_eq!(e.errno(), errno::EINVAL);
}

#[test]
fn upstream_face_shares_one_qp_across_contexts() {
    let (d, dir) = daemon("upstream");
    let file = File::create(dir.join("domain")).unwrap();
    let a = open(&d);
    let b = open(&d);
    let xa = a.open_xrcd(Some(&file), O_CREAT).unwrap();
    let xb = b.open_xrcd(Some(&file), O_CREAT).unwrap();

    let qa = xa.create_recv_qp().unwrap();
    let qb = xb.open_recv_qp(qa.qpn()).unwrap();
    assert_eq!(qb.qpn(), qa.qpn());
    // Any holder may modify; every holder sees it.
    let (attr, mask) = to_init();
    qb.modify(&attr, mask).unwrap();
    let q = qa.query().unwrap();
    assert_eq!(
        (q.attr.qp_state, q.init.qp_type, q.init.create_flags),
        (QpState::Init, QpType::XrcRecv, 0)
    );
    // Only receive QPs of that domain can be opened.
    let other = b.open_xrcd(None, O_CREAT).unwrap();
    assert_eq!(
        other.open_recv_qp(qa.qpn()).unwrap_err().errno(),
        errno::EINVAL
    );
    assert_eq!(xb.open_recv_qp(0xabcd).unwrap_err().errno(), errno::EINVAL);
    drop(other);

    // The creator's destroy closes only its handle.
    assert_eq!(qa.destroy().unwrap(), 0);
    assert_eq!(qb.query().unwrap().attr.qp_state, QpState::Init);
    assert_eq!(status(&d).xrc_recv_qps, 1);
    // A handle keeps its XRCD handle busy (the borrow checker keeps `xb` alive here; the
    // daemon agrees).
    drop(qb);
    assert_eq!(status(&d).xrc_recv_qps, 0);

    // A context that goes away drops its handles with it.
    let qa = xa.create_recv_qp().unwrap();
    {
        let c = open(&d);
        let xc = c.open_xrcd(Some(&file), 0).unwrap();
        let _qc = xc.open_recv_qp(qa.qpn()).unwrap();
        drop(qa);
        assert_eq!(status(&d).xrc_recv_qps, 1, "c still holds it");
    }
    assert_eq!(
        status(&d).xrc_recv_qps,
        0,
        "c's teardown dropped the last holder"
    );
}

#[test]
fn legacy_face_counts_registrations_per_context() {
    let (d, dir) = daemon("legacy");
    let file = File::create(dir.join("domain")).unwrap();
    let a = open(&d);
    let b = open(&d);
    let xa = a.open_xrcd(Some(&file), O_CREAT).unwrap();
    let xb = b.open_xrcd(Some(&file), O_CREAT).unwrap();

    let ra = xa.create_xrc_rcv_qp().unwrap();
    let qpn = ra.qpn();
    let rb1 = xb.reg_xrc_rcv_qp(qpn).unwrap();
    let rb2 = xb.reg_xrc_rcv_qp(qpn).unwrap();
    assert_eq!(xb.registrations(qpn), 2);

    let (attr, mask) = to_init();
    xa.modify_xrc_rcv_qp(qpn, &attr, mask).unwrap();
    let q = xb.query_xrc_rcv_qp(qpn).unwrap();
    assert_eq!((q.attr.qp_state, q.qpn), (QpState::Init, qpn));
    assert_eq!(
        xb.reg_xrc_rcv_qp(0xabcd).unwrap_err().errno(),
        errno::EINVAL
    );

    // The creator leaving does not destroy the QP.
    assert_eq!(ra.unregister().unwrap(), 0);
    assert_eq!(
        xa.query_xrc_rcv_qp(qpn).unwrap_err().errno(),
        errno::EINVAL,
        "a holds nothing now"
    );
    assert_eq!(status(&d).xrc_recv_qps, 1);
    // b's first registration object goes: b is still registered (nothing was sent).
    drop(rb1);
    assert_eq!(xb.registrations(qpn), 1);
    assert_eq!(xb.query_xrc_rcv_qp(qpn).unwrap().qpn, qpn);
    // The last one unregisters, and the QP goes with its last holder.
    drop(rb2);
    assert_eq!(xb.registrations(qpn), 0);
    assert_eq!(status(&d).xrc_recv_qps, 0);
    assert_eq!(xb.query_xrc_rcv_qp(qpn).unwrap_err().errno(), errno::EINVAL);

    // The raw legacy destroy means "unregister me"; leftover objects become inert.
    let ra = xa.create_xrc_rcv_qp().unwrap();
    let rb = xb.reg_xrc_rcv_qp(ra.qpn()).unwrap();
    assert_eq!(xa.destroy_xrc_rcv_qp(ra.qpn()).unwrap(), 0);
    assert_eq!(xa.registrations(ra.qpn()), 0);
    assert_eq!(status(&d).xrc_recv_qps, 1, "b keeps it");
    assert_eq!(
        xa.destroy_xrc_rcv_qp(ra.qpn()).unwrap_err().errno(),
        errno::EINVAL
    );
    assert_eq!(ra.unregister().unwrap(), 0, "inert: nothing sent");
    drop(rb);
    assert_eq!(status(&d).xrc_recv_qps, 0);

    // Registrations hold the XRCD handle they were made through: closing it is EBUSY. Here
    // the daemon's single registration of b rests on xb, while the object that made it is
    // gone and another object, made through a second handle, holds the count.
    let xb2 = b.open_xrcd(Some(&file), 0).unwrap();
    let ra = xa.create_xrc_rcv_qp().unwrap();
    let first = xb.reg_xrc_rcv_qp(ra.qpn()).unwrap();
    let second = xb2.reg_xrc_rcv_qp(ra.qpn()).unwrap();
    drop(first);
    let e = xb.close().unwrap_err();
    assert_eq!((e.op(), e.errno()), ("close_xrcd", errno::EBUSY));
    drop(second);
    drop(ra);
    assert_eq!(status(&d).xrc_recv_qps, 0);
}

#[test]
fn minimal_face_register_and_unregister() {
    let (d, dir) = daemon("minimal");
    let file = File::create(dir.join("domain")).unwrap();
    let a = open(&d);
    let b = open(&d);
    let xa = a.open_xrcd(Some(&file), O_CREAT).unwrap();
    let xb = b.open_xrcd(Some(&file), O_CREAT).unwrap();

    let ra = xa.register_xrc_rcv_qp(None).unwrap();
    let rb = xb.register_xrc_rcv_qp(Some(ra.qpn())).unwrap();
    assert_eq!(rb.qpn(), ra.qpn());
    // Mixed faces share the context's count.
    let rb_legacy = xb.reg_xrc_rcv_qp(ra.qpn()).unwrap();
    assert_eq!(xb.registrations(ra.qpn()), 2);
    let qpn = ra.qpn();
    ra.unregister().unwrap();
    assert_eq!(status(&d).xrc_recv_qps, 1);
    assert_eq!(rb.unregister().unwrap(), 0, "rb_legacy still holds it");
    assert_eq!(xb.query_xrc_rcv_qp(qpn).unwrap().qpn, qpn);
    rb_legacy.unregister().unwrap();
    assert_eq!(status(&d).xrc_recv_qps, 0);
    assert_eq!(
        xb.register_xrc_rcv_qp(Some(qpn)).unwrap_err().errno(),
        errno::EINVAL
    );
}

#[test]
fn events_fan_out_to_every_holder_in_its_own_terms() {
    let (d, dir) = daemon("events");
    let file = File::create(dir.join("domain")).unwrap();
    let a = open(&d);
    let b = open(&d);
    let c = open(&d);
    let xa = a.open_xrcd(Some(&file), O_CREAT).unwrap();
    let xb = b.open_xrcd(Some(&file), 0).unwrap();
    let xc = c.open_xrcd(Some(&file), 0).unwrap();
    let qa = xa.create_recv_qp().unwrap();
    let qb = xb.open_recv_qp(qa.qpn()).unwrap();
    let rc = xc.reg_xrc_rcv_qp(qa.qpn()).unwrap();

    assert_eq!(a.try_get_async_event().unwrap(), None);
    assert!(!softverbs_ipc::wait_readable(a.async_fd(), Some(0)).unwrap());
    assert_eq!(a.inject_event(qa.qpn(), EventType::CommEst).unwrap(), 3);
    assert!(softverbs_ipc::wait_readable(a.async_fd().as_fd(), Some(1000)).unwrap());

    let ea = a.get_async_event().unwrap();
    assert_eq!(
        (ea.event_type, ea.element),
        (Some(EventType::CommEst), Element::Qp(qa.handle()))
    );
    assert_eq!(ea.legacy_event_type, EventType::CommEst as u32);
    let eb = b.get_async_event().unwrap();
    assert_eq!(eb.element, Element::Qp(qb.handle()));
    let ec = c.get_async_event().unwrap();
    assert_eq!(ec.element, Element::XrcRecvQpNum(qa.qpn()));
    assert_eq!(
        ec.legacy_event_type,
        EventType::CommEst as u32 | 0x8000_0000
    );
    assert_eq!(a.try_get_async_event().unwrap(), None);

    // A blocked reader wakes when an event arrives.
    std::thread::scope(|s| {
        let waiter = s.spawn(|| b.get_async_event().unwrap());
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(a.inject_event(qa.qpn(), EventType::PathMig).unwrap(), 3);
        let got = waiter.join().unwrap();
        assert_eq!(
            (got.event_type, got.element),
            (Some(EventType::PathMig), Element::Qp(qb.handle()))
        );
    });
    // Destroy reports the events each holder read.
    assert_eq!(qb.destroy().unwrap(), 2);
    assert_eq!(rc.unregister().unwrap(), 1);
    assert_eq!(qa.destroy().unwrap(), 1);
    // No QP of that number any more.
    let e = a.inject_event(0xabcd, EventType::CommEst).unwrap_err();
    assert_eq!((e.op(), e.errno()), ("inject_event", errno::EINVAL));
    let _ = d;
}

/// Kills the autostarted daemon however the test ends.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .arg(self.0.to_string())
            .status();
    }
}

#[test]
fn autostart_starts_the_cli_daemon_when_none_answers() {
    // The `softverbs` binary is there when the workspace (or the CLI) was built into this
    // target directory, as `cargo test --workspace` does; otherwise there is nothing to start.
    let exe = std::env::current_exe().unwrap();
    let found = std::env::var_os("SOFTVERBS_DAEMON_BIN")
        .map(PathBuf::from)
        .or_else(|| {
            exe.ancestors()
                .skip(1)
                .take(2)
                .map(|d| d.join("softverbs"))
                .find(|p| p.is_file())
        });
    if found.is_none() || std::env::var_os("SOFTVERBS_AUTOSTART").is_some_and(|v| v == "0") {
        eprintln!("skipped: no softverbs binary to autostart (or SOFTVERBS_AUTOSTART=0)");
        return;
    }
    let dir = test_dir("autostart");
    let sock = dir.join("run").join("sv.sock");
    let ctx = Context::open_at(&sock, 0).unwrap();
    let s = Introspect::connect_at(&sock).unwrap().status().unwrap();
    let _kill = KillOnDrop(s.daemon_pid);
    assert_ne!(
        s.daemon_pid,
        std::process::id(),
        "a separate daemon process"
    );
    assert_eq!(s.contexts, 1);
    assert!(ctx.alloc_pd().is_ok());
    assert!(dir.join("run").join("daemon.log").is_file());
}
