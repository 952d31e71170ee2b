//! Moving data through the daemon: RC SEND/RECV, RDMA WRITE, RDMA READ and atomics between
//! two contexts on one daemon (the engine delivers in-process) and between two daemons on
//! different loopback addresses (RoCE v2 over UDP).
//!
//! Memory is registered through the borrowing API ([`Pd::reg_slice`]: the buffer is lent to
//! the MR for its whole life, read back through it, and posted with its range-checked
//! [`BorrowedMr::sge`]), except in `rc_operations_on_memory_shared_in_place`, which is about
//! the raw `reg_mr_shared` (converting the caller's pages to shared memory in place, the
//! drop-in's path) and so stays raw. These tests post one region many times and use inline
//! data and application `wr_id`s, so they post with `post_send`/`post_recv`; the owning
//! API's version of the RC operations is `tests/owned_api.rs`.

use std::time::Duration;

use softverbs::{
    Access, AttrMask as M, BorrowedMr, Context, QpAttr, QpCap, QpInit, QpState, QpType,
};
use softverbs::{Pd, SendOp, SendRequest, Sge, SrqAttr, WcOpcode, WcStatus};
use softverbs_daemon::{spawn_daemon_with, Config, DeviceSpec, TestDaemon};

mod common;
use common::{connect, connect_with, RcPath};

struct Dir(std::path::PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn daemon(name: &str, ip: Option<&str>) -> (TestDaemon, Dir) {
    let dir = std::env::temp_dir().join(format!("svdp-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = Config::new(dir.join("sv.sock"));
    if let Some(ip) = ip {
        c.devices = vec![DeviceSpec {
            name: format!("sv-{name}"),
            ips: vec![ip.parse().unwrap()],
        }];
        c.net.bind = true;
    }
    (spawn_daemon_with(c).unwrap(), Dir(dir))
}

const ALL: Access = Access(0x0f);

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    }
}

/// `buf` lent to a new MR with every access.
fn lend<'a>(pd: &'a Pd<'a>, buf: &'a mut [u8]) -> BorrowedMr<'a> {
    pd.reg_slice(buf, ALL).unwrap()
}

/// The range-checked SGE `[offset, offset + len)` of `mr`.
fn sge(mr: &BorrowedMr<'_>, offset: u64, len: u32) -> [Sge; 1] {
    [mr.sge(offset as usize, len as usize).unwrap()]
}

/// Registered memory of the RC operations: borrowed, or the caller's pages shared in place
/// through the raw API.
enum Mem<'a> {
    Borrowed(BorrowedMr<'a>),
    SharedInPlace(softverbs::Mr<'a>, &'a [u8]),
}

impl<'a> Mem<'a> {
    fn new(pd: &'a Pd<'a>, buf: &'a mut [u8], shared: bool) -> Mem<'a> {
        if !shared {
            return Mem::Borrowed(lend(pd, buf));
        }
        let (addr, len) = (buf.as_ptr() as usize, buf.len());
        // SAFETY: a test: the buffer outlives its MR (both borrow it), and the test reads it
        // only after the completions of the requests that write it (a peer's WRITE
        // included). No other thread of the test touches it, and at 2 MiB it has pages of
        // its own, so converting them in place races with no other heap object.
        let mr = unsafe {
            pd.reg_mr_shared(softverbs::RawMemory::new_shareable(addr, len), ALL)
                .unwrap()
        };
        Mem::SharedInPlace(mr, buf)
    }

    fn lkey(&self) -> u32 {
        match self {
            Mem::Borrowed(m) => m.lkey(),
            Mem::SharedInPlace(m, _) => m.lkey(),
        }
    }

    fn rkey(&self) -> u32 {
        match self {
            Mem::Borrowed(m) => m.rkey(),
            Mem::SharedInPlace(m, _) => m.rkey(),
        }
    }

    fn addr(&self) -> u64 {
        match self {
            Mem::Borrowed(m) => m.addr(),
            Mem::SharedInPlace(_, b) => b.as_ptr() as u64,
        }
    }

    /// `len` bytes at `offset`, copied out.
    fn bytes(&self, offset: usize, len: usize) -> Vec<u8> {
        match self {
            Mem::Borrowed(m) => {
                let mut v = vec![0u8; len];
                m.read(offset, &mut v).unwrap();
                v
            }
            Mem::SharedInPlace(_, b) => b[offset..offset + len].to_vec(),
        }
    }
}

/// Runs every RC operation between a context on `da` and one on `db`; with `shared`, the
/// memory is registered with the raw `reg_mr_shared` (the daemon then copies through a
/// mapping), else lent with `reg_slice`.
fn rc_operations(da: &TestDaemon, db: &TestDaemon, shared: bool) {
    let a = Context::open_at(&da.socket, 0).unwrap();
    let b = Context::open_at(&db.socket, 0).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cqa, cqb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let qa = a
        .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&cqa, &cqa).cap(cap()))
        .unwrap();
    let qb = b
        .create_qp(&QpInit::new(QpType::Rc, &pb).cqs(&cqb, &cqb).cap(cap()))
        .unwrap();
    let (ga, gb) = (a.query_gid(1, 0).unwrap(), b.query_gid(1, 0).unwrap());
    connect(&qa, gb, qb.qpn());
    connect(&qb, ga, qa.qpn());

    // 2 MiB: above malloc's mmap threshold, so each buffer has its own pages and converting
    // them in place cannot race with other threads' heap objects.
    let mut abuf = vec![0u8; 2 << 20];
    let mut bbuf = vec![0u8; 2 << 20];
    let pattern: Vec<u8> = (0..6000).map(|i| (i * 31 % 251) as u8).collect();
    abuf[..6000].copy_from_slice(&pattern);
    bbuf[0x8000..0x8008].copy_from_slice(&40u64.to_ne_bytes());
    let ma = Mem::new(&pa, &mut abuf, shared);
    let mb = Mem::new(&pb, &mut bbuf, shared);
    if shared {
        // The buffers really became memfd mappings (the fast path), not a silent fallback.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        for at in [ma.addr(), mb.addr()] {
            let covered = maps.lines().any(|l| {
                let (range, rest) = l.split_once(' ').unwrap();
                let (lo, hi) = range.split_once('-').unwrap();
                let (lo, hi) = (
                    u64::from_str_radix(lo, 16).unwrap(),
                    u64::from_str_radix(hi, 16).unwrap(),
                );
                lo <= at && at < hi && rest.contains("memfd:")
            });
            assert!(covered, "buffer at {at:#x} is not memfd-backed:\n{maps}");
        }
    }
    let (a0, b0) = (ma.addr(), mb.addr());
    let sge = |addr: u64, length: u32, lkey: u32| [Sge { addr, length, lkey }];

    qb.post_recv(1, &sge(b0 + 0x1000, 8192, mb.lkey())).unwrap();
    let s1 = sge(a0, 6000, ma.lkey());
    qa.post_send(&SendRequest::new(10, SendOp::Send, &s1))
        .unwrap();
    let s2 = sge(a0, 3000, ma.lkey());
    qa.post_send(&SendRequest::new(
        11,
        SendOp::Write {
            remote_addr: b0 + 0x4000,
            rkey: mb.rkey(),
        },
        &s2,
    ))
    .unwrap();
    let s3 = sge(a0 + 0x6000, 3000, ma.lkey());
    qa.post_send(&SendRequest::new(
        12,
        SendOp::Read {
            remote_addr: b0 + 0x4000,
            rkey: mb.rkey(),
        },
        &s3,
    ))
    .unwrap();
    let s4 = sge(a0 + 0x9000, 8, ma.lkey());
    qa.post_send(&SendRequest::new(
        13,
        SendOp::FetchAdd {
            remote_addr: b0 + 0x8000,
            rkey: mb.rkey(),
            add: 2,
        },
        &s4,
    ))
    .unwrap();
    let s5 = sge(a0 + 0x9008, 8, ma.lkey());
    qa.post_send(&SendRequest::new(
        14,
        SendOp::CompareSwap {
            remote_addr: b0 + 0x8000,
            rkey: mb.rkey(),
            compare: 42,
            swap: 7,
        },
        &s5,
    ))
    .unwrap();
    let inline = b"inline hello";
    qb.post_recv(2, &sge(b0 + 0x3000, 64, mb.lkey())).unwrap();
    let mut w = SendRequest::new(15, SendOp::SendWithImm(0xabcd), &[]);
    w.inline = Some(inline);
    qa.post_send(&w).unwrap();

    let wa = cqa.wait(6, Duration::from_secs(20)).unwrap();
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
    let wb = cqb.wait(2, Duration::from_secs(20)).unwrap();
    assert_eq!(
        (wb[0].wr_id, wb[0].status, wb[0].byte_len, wb[0].qp_num),
        (1, WcStatus::Success, 6000, qb.qpn())
    );
    assert_eq!(
        (wb[1].wr_id, wb[1].byte_len, wb[1].imm_data),
        (2, inline.len() as u32, 0xabcd)
    );
    assert_eq!(mb.bytes(0x1000, 6000), pattern, "SEND landed");
    assert_eq!(mb.bytes(0x4000, 3000), pattern[..3000], "WRITE landed");
    assert_eq!(ma.bytes(0x6000, 3000), pattern[..3000], "READ came back");
    assert_eq!(
        ma.bytes(0x9000, 8),
        40u64.to_ne_bytes(),
        "FETCH_ADD returned the old value"
    );
    assert_eq!(
        ma.bytes(0x9008, 8),
        42u64.to_ne_bytes(),
        "CMP_SWAP saw the added value"
    );
    assert_eq!(mb.bytes(0x8000, 8), 7u64.to_ne_bytes(), "and swapped");
    assert_eq!(mb.bytes(0x3000, inline.len()), inline);
}

#[test]
fn rc_operations_between_two_contexts_of_one_daemon() {
    let (d, _dir) = daemon("one", None);
    rc_operations(&d, &d, false);
}

#[test]
fn rc_operations_on_memory_shared_in_place() {
    let (d, _dir) = daemon("shared", None);
    rc_operations(&d, &d, true);
}

#[test]
fn rc_operations_between_two_daemons_over_udp() {
    let (d1, _x) = daemon("a", Some("127.91.0.1"));
    let (d2, _y) = daemon("b", Some("127.91.0.2"));
    rc_operations(&d1, &d2, false);
}

#[test]
fn completion_channels_fire_on_armed_cqs_and_honour_solicited_only() {
    let (d, _dir) = daemon("chan", None);
    let a = Context::open_at(&d.socket, 0).unwrap();
    let b = Context::open_at(&d.socket, 0).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let ch = b.create_comp_channel().unwrap();
    let cqa = a.create_cq(16).unwrap();
    let cqb = b.create_cq_with_channel(16, &ch).unwrap();
    let qa = a
        .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&cqa, &cqa).cap(cap()))
        .unwrap();
    let qb = b
        .create_qp(&QpInit::new(QpType::Rc, &pb).cqs(&cqb, &cqb).cap(cap()))
        .unwrap();
    let g = a.query_gid(1, 0).unwrap();
    connect(&qa, g, qb.qpn());
    connect(&qb, g, qa.qpn());
    let mut bbuf = vec![0u8; 4096];
    let mb = lend(&pb, &mut bbuf);
    let recv = |id| qb.post_recv(id, &sge(&mb, 0, 64)).unwrap();
    let send = |id, solicited| {
        let mut w = SendRequest::new(id, SendOp::Send, &[]);
        w.inline = Some(b"x");
        w.solicited = solicited;
        qa.post_send(&w).unwrap();
        assert_eq!(cqa.wait(1, Duration::from_secs(10)).unwrap().len(), 1);
    };
    // Solicited-only: an unsolicited message completes but raises no event.
    for i in 0..3 {
        recv(i);
    }
    cqb.req_notify(true).unwrap();
    send(1, false);
    assert_eq!(cqb.wait(1, Duration::from_secs(10)).unwrap()[0].wr_id, 0);
    assert_eq!(ch.try_get_event().unwrap(), None, "unsolicited: no event");
    // A solicited one does, once.
    send(2, true);
    assert_eq!(
        ch.get_event(Some(Duration::from_secs(10))).unwrap(),
        Some(cqb.handle())
    );
    assert_eq!(cqb.wait(1, Duration::from_secs(10)).unwrap()[0].wr_id, 1);
    // Not re-armed: nothing more.
    send(3, true);
    assert_eq!(cqb.wait(1, Duration::from_secs(10)).unwrap()[0].wr_id, 2);
    assert_eq!(
        ch.try_get_event().unwrap(),
        None,
        "an event needs a new arm"
    );
    // Armed for any completion, an unsolicited message fires too.
    recv(3);
    cqb.req_notify(false).unwrap();
    send(4, false);
    assert_eq!(
        ch.get_event(Some(Duration::from_secs(10))).unwrap(),
        Some(cqb.handle())
    );
    assert_eq!(cqb.wait(1, Duration::from_secs(10)).unwrap().len(), 1);
}

/// ibv_post_send(3): a full send queue refuses the post with ENOMEM. With the queues in shared
/// memory the daemon takes from the ring only what the QP has room for, so a client posting
/// faster than its QP drains meets a full ring instead of growing the daemon's queues; and
/// every request that was accepted completes exactly once.
#[test]
fn a_full_send_queue_refuses_posts_with_enomem_and_loses_nothing() {
    let (d, _dir) = daemon("sqfull", None);
    let a = Context::open_at(&d.socket, 0).unwrap();
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(1024).unwrap();
    let depth = 8;
    let qp = a
        .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(QpCap {
            max_send_wr: depth,
            ..cap()
        }))
        .unwrap();
    // Nobody answers at this QPN, so requests stay outstanding for their 4.3 s ACK timeout.
    connect_with_timeout(&qp, a.query_gid(1, 0).unwrap(), 0xFF_FF00, 20);
    let mut buf = vec![0u8; 2 << 20];
    let mr = lend(&pd, &mut buf);
    let s = sge(&mr, 0, 64);
    let mut posted = 0u64;
    let err = loop {
        match qp.post_send(&SendRequest::new(posted, SendOp::Send, &s)) {
            Ok(()) => posted += 1,
            Err(e) => break e,
        }
        assert!(
            posted < 100 * depth as u64,
            "{posted} posts and never refused"
        );
        // Let the daemon take what it has room for before the next post.
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(err.errno(), 12, "ENOMEM, got {err}");
    // ibv_post_send(3): exactly max_send_wr requests may be outstanding (ABI 4: the daemon
    // publishes what it retired; the ring alone would have taken more).
    assert_eq!(
        posted,
        u64::from(depth),
        "refused after {posted} of {depth}"
    );

    // Full is not broken: moving the QP to ERR flushes every accepted request exactly once.
    qp.modify(
        &QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        },
        M::STATE,
    )
    .unwrap();
    let mut ids = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while (ids.len() as u64) < posted && std::time::Instant::now() < deadline {
        for wc in cq.wait(64, Duration::from_millis(100)).unwrap() {
            assert_eq!(wc.status, WcStatus::WrFlushErr, "{wc:?}");
            ids.push(wc.wr_id);
        }
    }
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..posted).collect::<Vec<_>>(),
        "each accepted request once"
    );
    assert!(cq.poll(16).unwrap().is_empty(), "nothing more");
    // Flushed requests are retired: the queue takes `depth` more at once (which flush too).
    for i in 0..u64::from(depth) {
        qp.post_send(&SendRequest::new(1000 + i, SendOp::Send, &s))
            .unwrap_or_else(|e| panic!("post {i} after the flush: {e}"));
    }
}

/// IBA 11.4.2.1 / ibv_create_cq(3): a CQ that overflows loses completions and its owner gets
/// IBV_EVENT_CQ_ERR on the async fd; the daemon and the other CQs carry on.
#[test]
fn an_overrun_cq_raises_cq_err_and_the_rest_carries_on() {
    let (d, _dir) = daemon("cqover", None);
    let a = Context::open_at(&d.socket, 0).unwrap();
    let pd = a.alloc_pd().unwrap();
    let small = a.create_cq(4).unwrap();
    let big = a.create_cq(256).unwrap();
    let qs = a
        .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&small, &big).cap(cap()))
        .unwrap();
    let qr = a
        .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&big, &big).cap(cap()))
        .unwrap();
    let gid = a.query_gid(1, 0).unwrap();
    connect(&qs, gid, qr.qpn());
    connect(&qr, gid, qs.qpn());
    let mut buf = vec![0u8; 2 << 20];
    let mr = lend(&pd, &mut buf);
    let s = sge(&mr, 0, 16);
    let n = 8 * small.cqe().max(4) as u64;
    for i in 0..n {
        qr.post_recv(1000 + i, &s).unwrap();
    }
    // Nobody polls `small` while its n signalled sends complete.
    for i in 0..n {
        qs.post_send(&SendRequest::new(i, SendOp::Send, &s))
            .unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let ev = loop {
        if let Some(ev) = a.try_get_async_event().unwrap() {
            break ev;
        }
        assert!(std::time::Instant::now() < deadline, "no CQ_ERR event");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(ev.event_type, Some(softverbs::EventType::CqErr), "{ev:?}");
    assert_eq!(ev.element, softverbs::Element::Cq(small.handle()), "{ev:?}");
    // The receiver's CQ saw every message, and `small` holds at most what it could.
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while (got.len() as u64) < n && std::time::Instant::now() < deadline {
        got.extend(big.wait(64, Duration::from_millis(100)).unwrap());
    }
    assert_eq!(got.len() as u64, n, "{got:?}");
    assert!(got.iter().all(|w| w.status == WcStatus::Success));
    let kept = small.poll(1024).unwrap();
    assert!(
        !kept.is_empty() && (kept.len() as u64) < n,
        "{}",
        kept.len()
    );
}

/// Receives posted to an SRQ through its shared-memory ring are consumed in order by the QP
/// attached to it; past the SRQ's depth a post is refused with ENOMEM (ibv_post_srq_recv(3)),
/// and what was accepted is all used, once.
#[test]
fn srq_receives_posted_through_the_ring_are_used_in_order() {
    let (d, _dir) = daemon("srqring", None);
    let a = Context::open_at(&d.socket, 0).unwrap();
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(512).unwrap();
    let srq = pd
        .create_srq(SrqAttr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let qr = a
        .create_qp(
            &QpInit::new(QpType::Rc, &pd)
                .cqs(&cq, &cq)
                .srq(&srq)
                .cap(cap()),
        )
        .unwrap();
    let qs = a
        .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap()))
        .unwrap();
    let gid = a.query_gid(1, 0).unwrap();
    connect(&qs, gid, qr.qpn());
    connect(&qr, gid, qs.qpn());
    let mut buf = vec![0u8; 2 << 20];
    let mr = lend(&pd, &mut buf);
    let two = [mr.sge(0, 8).unwrap(), mr.sge(8, 8).unwrap()];
    assert_eq!(
        srq.post_recv(1, &two).unwrap_err().errno(),
        22,
        "more SGEs than max_sge: EINVAL"
    );
    let mut posted = 0u64;
    let err = loop {
        let s = sge(&mr, 0x1000 + posted * 64, 64);
        match srq.post_recv(100 + posted, &s) {
            Ok(()) => posted += 1,
            Err(e) => break e,
        }
        assert!(posted < 1000, "{posted} receives and never refused");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(err.errno(), 12, "ENOMEM, got {err}");
    assert!(posted >= 16, "refused after {posted}");
    assert!(
        posted <= 64,
        "the send queue (64) takes one send per receive"
    );
    for i in 0..posted {
        let s = sge(&mr, 0x10_0000, 8);
        qs.post_send(&SendRequest::new(i, SendOp::Send, &s))
            .unwrap();
    }
    let mut recvs = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while (recvs.len() as u64) < posted && std::time::Instant::now() < deadline {
        for wc in cq.wait(64, Duration::from_millis(100)).unwrap() {
            if wc.opcode == WcOpcode::Recv {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                assert_eq!(wc.qp_num, qr.qpn());
                recvs.push(wc.wr_id);
            }
        }
    }
    assert_eq!(recvs, (100..100 + posted).collect::<Vec<_>>());
}

/// `ibv_rereg_mr` changes an MR in place: the keys a peer already holds stay valid and see the
/// new access. A CQ cannot shrink below the completions it holds (`EINVAL`), counting work
/// posted just before the resize.
#[test]
fn rereg_keeps_the_keys_and_a_cq_does_not_shrink_below_its_completions() {
    let (d, _dir) = daemon("rereg", None);
    let a = Context::open_at(&d.socket, 0).unwrap();
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(8).unwrap();
    let init = QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap());
    let (qa, qb) = (a.create_qp(&init).unwrap(), a.create_qp(&init).unwrap());
    let g = a.query_gid(1, 0).unwrap();
    connect(&qa, g, qb.qpn());
    connect(&qb, g, qa.qpn());
    let mut src = vec![7u8; 4096];
    let mut dst = vec![0u8; 4096];
    let ms = lend(&pd, &mut src);
    let mut md = pd.reg_slice(&mut dst, Access::LOCAL_WRITE).unwrap();
    let (dst_addr, lkey, rkey) = (md.addr(), md.lkey(), md.rkey());
    md.rereg_access(Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    assert_eq!((md.lkey(), md.rkey()), (lkey, rkey), "rereg keeps the keys");
    let s = sge(&ms, 0, 64);
    let write = |id| {
        qa.post_send(&SendRequest::new(
            id,
            SendOp::Write {
                remote_addr: dst_addr,
                rkey,
            },
            &s,
        ))
        .unwrap()
    };
    for id in 1..=3 {
        write(id);
    }
    assert_eq!(cq.resize(2).unwrap_err().errno(), 22, "3 completions held");
    let got = cq.wait(3, Duration::from_secs(20)).unwrap();
    assert!(got.iter().all(|w| w.status == WcStatus::Success), "{got:?}");
    assert_eq!(
        md.to_vec()[..64],
        ms.to_vec()[..64],
        "the old rkey reached the MR"
    );
    assert!(cq.resize(2).unwrap() >= 2);
}

/// ibv_post_recv(3): a receive queue holds `max_recv_wr` requests; one more is `ENOMEM`
/// (rdma-core's `test_full_rq_bad_flow`), a polled receive completion frees a slot, and RESET
/// empties the queue.
#[test]
fn a_full_receive_queue_refuses_posts_until_a_receive_completes() {
    let (d, _dir) = daemon("rqfull", None);
    let a = Context::open_at(&d.socket, 0).unwrap();
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(64).unwrap();
    let depth = 4;
    let qcap = QpCap {
        max_recv_wr: depth,
        ..cap()
    };
    let tx = a
        .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap()))
        .unwrap();
    let rx = a
        .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(qcap))
        .unwrap();
    let gid = a.query_gid(1, 0).unwrap();
    connect(&tx, gid, rx.qpn());
    connect(&rx, gid, tx.qpn());
    let mut buf = vec![0u8; 1 << 16];
    let mr = lend(&pd, &mut buf);
    let s = |i: u64| sge(&mr, i * 64, 64);
    for i in 0..u64::from(depth) {
        rx.post_recv(i, &s(i)).unwrap();
    }
    let e = rx.post_recv(99, &s(9)).unwrap_err();
    assert_eq!(e.errno(), 12, "ENOMEM, got {e}");
    tx.post_send(&SendRequest::new(1, SendOp::Send, &s(20)))
        .unwrap();
    let got = cq.wait(2, Duration::from_secs(10)).unwrap();
    assert_eq!(got.len(), 2, "{got:?}");
    let recv = got.iter().find(|w| w.opcode == WcOpcode::Recv).unwrap();
    assert_eq!((recv.wr_id, recv.status), (0, WcStatus::Success));
    // One slot is free again, and only one.
    rx.post_recv(10, &s(10)).unwrap();
    assert_eq!(rx.post_recv(11, &s(11)).unwrap_err().errno(), 12);
    // RESET empties the receive queue.
    rx.modify(
        &QpAttr {
            qp_state: QpState::Reset,
            ..QpAttr::default()
        },
        M::STATE,
    )
    .unwrap();
    let _ = cq.poll(64).unwrap();
    connect(&rx, gid, tx.qpn());
    for i in 0..u64::from(depth) {
        rx.post_recv(30 + i, &s(i)).unwrap();
    }
}

/// ibv_resize_cq(3) may grow a CQ past the ring it was created with: completions beyond the
/// ring's depth are kept (by the daemon, polled by command after the ring drains), none is lost,
/// the order holds, and no CQ_ERR is raised.
#[test]
fn a_cq_grown_past_its_ring_keeps_every_completion_in_order() {
    let (d, _dir) = daemon("cqgrow", None);
    let a = Context::open_at(&d.socket, 0).unwrap();
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(8).unwrap();
    let big = 300;
    assert!(cq.resize(big).unwrap() >= big);
    let qcap = QpCap {
        max_send_wr: 256,
        ..cap()
    };
    let tx = a
        .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(qcap))
        .unwrap();
    let rx = a
        .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap()))
        .unwrap();
    let gid = a.query_gid(1, 0).unwrap();
    connect(&tx, gid, rx.qpn());
    connect(&rx, gid, tx.qpn());
    let mut buf = vec![0u8; 1 << 16];
    let mr = lend(&pd, &mut buf);
    let n = 200u64;
    for i in 0..n {
        let s = sge(&mr, 0, 8);
        let op = SendOp::Write {
            remote_addr: mr.addr() + 4096,
            rkey: mr.rkey(),
        };
        tx.post_send(&SendRequest::new(i, op, &s)).unwrap();
    }
    // Let every completion land before the first poll: far more than the ring holds.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut got = Vec::new();
    while (got.len() as u64) < n && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        got.extend(cq.poll(64).unwrap());
    }
    let ids: Vec<u64> = got.iter().map(|w| w.wr_id).collect();
    assert_eq!(
        ids,
        (0..n).collect::<Vec<_>>(),
        "lost or reordered completions"
    );
    assert!(got.iter().all(|w| w.status == WcStatus::Success), "{got:?}");
    assert!(
        a.try_get_async_event().unwrap().is_none(),
        "the grown CQ reported an overrun"
    );
}

/// [`connect`] with local ACK timeout exponent `timeout` (4.096 µs · 2^timeout).
fn connect_with_timeout(qp: &softverbs::Qp<'_>, gid: softverbs::Gid, remote_qpn: u32, timeout: u8) {
    connect_with(
        qp,
        gid,
        remote_qpn,
        RcPath {
            timeout,
            ..RcPath::default()
        },
    );
}

/// UD sends posted unsignaled and their AH destroyed right after (rdma-core's `mckey -s`
/// does that, then destroys the QP): a NIC has started on the requests when their doorbell
/// rang, so they still go out; the daemon runs the rings before a command that takes away
/// what posted requests use. Before, whenever the destroy reached the daemon before it had
/// read the send ring, every send was refused (no such AH) and the receiver never got them.
/// Each round lets the daemon fall asleep first (its adaptive polling lasts 1 ms), so that
/// the ring's doorbell and the destroy arrive together.
#[test]
fn ud_sends_still_go_out_when_their_ah_is_destroyed_right_after_posting() {
    const ROUNDS: usize = 30;
    const SENDS: usize = 8;
    let (d, _dir) = daemon("ud-ah", None);
    let ctx = Context::open_at(&d.socket, 0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let (scq, rcq) = (ctx.create_cq(64).unwrap(), ctx.create_cq(64).unwrap());
    let tx = ctx
        .create_qp(&QpInit::new(QpType::Ud, &pd).cqs(&scq, &scq).cap(cap()))
        .unwrap();
    let rx = ctx
        .create_qp(&QpInit::new(QpType::Ud, &pd).cqs(&rcq, &rcq).cap(cap()))
        .unwrap();
    const QKEY: u32 = 0x1111_2222;
    for qp in [&tx, &rx] {
        ud_ready(qp, QKEY);
    }
    let gid = ctx.query_gid(1, 0).unwrap();
    let mut sbuf = vec![7u8; 64];
    let mut rbuf = vec![0u8; 64 * 4];
    let smr = lend(&pd, &mut sbuf);
    let rmr = lend(&pd, &mut rbuf);
    let av = softverbs::AhAttr {
        dgid: gid,
        is_global: true,
        port_num: 1,
        hop_limit: 64,
        ..softverbs::AhAttr::default()
    };
    for round in 0..ROUNDS {
        for i in 0..SENDS {
            rx.post_recv(i as u64, &sge(&rmr, 0, 64 * 4)).unwrap();
        }
        std::thread::sleep(Duration::from_millis(5));
        let ah = pd.create_ah(&av).unwrap();
        let s = sge(&smr, 0, 16);
        for i in 0..SENDS {
            let mut wr = SendRequest::new(i as u64, SendOp::Send, &s);
            wr.signaled = false;
            wr.ud = Some(softverbs::UdAddress {
                ah: &ah,
                remote_qpn: rx.qpn(),
                remote_qkey: QKEY,
            });
            tx.post_send(&wr).unwrap();
        }
        drop(ah);
        let got = rcq.wait(SENDS, Duration::from_secs(5)).unwrap();
        assert_eq!(
            got.len(),
            SENDS,
            "round {round}: {} of {SENDS} datagrams arrived",
            got.len()
        );
        assert!(got.iter().all(|w| w.status == WcStatus::Success
            && w.opcode == WcOpcode::Recv
            && w.byte_len == 16 + 40));
        // Unsignaled: nothing to poll on the sender's side unless something failed.
        assert!(
            scq.poll(16).unwrap().is_empty(),
            "round {round}: send errors"
        );
    }
}

/// rdma-core's `test_odp_ud_traffic` pattern: one thread posts a receive on one context's UD
/// QP, then a UD send to it from another context. The daemon reads the two contexts' rings
/// at different moments of a round, so it could read the receiver's ring just before the
/// receive and the sender's just after the send, and then dropped the datagram as having no
/// receive (~3 % of that test's runs). Every receive posted before the send must be there.
#[test]
fn a_ud_send_right_after_a_receive_on_another_context_finds_it() {
    const ROUNDS: usize = 20_000;
    let (d, _dir) = daemon("ud-order", None);
    let (ca, cb) = (
        Context::open_at(&d.socket, 0).unwrap(),
        Context::open_at(&d.socket, 0).unwrap(),
    );
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let (rcq, scq) = (ca.create_cq(64).unwrap(), cb.create_cq(64).unwrap());
    let rx = ca
        .create_qp(&QpInit::new(QpType::Ud, &pa).cqs(&rcq, &rcq).cap(cap()))
        .unwrap();
    let tx = cb
        .create_qp(&QpInit::new(QpType::Ud, &pb).cqs(&scq, &scq).cap(cap()))
        .unwrap();
    const QKEY: u32 = 0x0dd_0dd;
    for qp in [&tx, &rx] {
        ud_ready(qp, QKEY);
    }
    let gid = ca.query_gid(1, 0).unwrap();
    let mut sbuf = vec![5u8; 64];
    let mut rbuf = vec![0u8; 128];
    let smr = lend(&pb, &mut sbuf);
    let rmr = lend(&pa, &mut rbuf);
    let ah = pb
        .create_ah(&softverbs::AhAttr {
            dgid: gid,
            is_global: true,
            port_num: 1,
            hop_limit: 64,
            ..softverbs::AhAttr::default()
        })
        .unwrap();
    let s = sge(&smr, 0, 32);
    for round in 0..ROUNDS {
        rx.post_recv(round as u64, &sge(&rmr, 0, 128)).unwrap();
        let mut wr = SendRequest::new(round as u64, SendOp::Send, &s);
        wr.ud = Some(softverbs::UdAddress {
            ah: &ah,
            remote_qpn: rx.qpn(),
            remote_qkey: QKEY,
        });
        tx.post_send(&wr).unwrap();
        let sent = scq.wait(1, Duration::from_secs(5)).unwrap();
        assert!(
            sent.len() == 1 && sent[0].status == WcStatus::Success,
            "round {round}: send {sent:?}"
        );
        let got = rcq.wait(1, Duration::from_secs(2)).unwrap();
        assert!(
            got.len() == 1 && got[0].status == WcStatus::Success && got[0].byte_len == 32 + 40,
            "round {round}: the datagram found no receive ({got:?})"
        );
    }
}

/// A UD QP through INIT (port 1, `qkey`), RTR and RTS.
fn ud_ready(qp: &softverbs::Qp<'_>, qkey: u32) {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qkey,
        ..QpAttr::default()
    };
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)
        .unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ..init
    };
    qp.modify(&rtr, M::STATE).unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..rtr
    };
    qp.modify(&rts, M::STATE | M::SQ_PSN).unwrap();
}
