//! The same-host direct path's atomics, memory windows and completion channels
//! (docs/design/direct-path.md, ABI 15): each scenario runs once through the daemon's engine and
//! once between two direct libraries, and both must give the same completions, values,
//! async events and QP states; atomics stay atomic with respect to the daemon's own.

use std::time::{Duration, Instant};

use softverbs::{
    Access, AttrMask as M, Context, Cq, EventType, MwType, Pd, Qp, QpAttr, QpCap, QpInit, QpState,
    QpType, SendOp, SendRequest, Sge, WcOpcode, WcStatus, WorkCompletion,
};

mod common;

const ALL: Access = Access(0x0f);
/// Local write, remote write and read, no remote atomics.
const RWR: Access = Access(0x07);
/// What an MR needs for windows over it, with remote atomics.
const MW_MR: Access = Access(0x1f);

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    }
}

/// RESET→INIT→RTR→RTS towards `remote_qpn` with `access`.
fn connect(qp: &Qp<'_>, gid: softverbs::Gid, remote_qpn: u32, access: Access) {
    connect_rnr(qp, gid, remote_qpn, access, 7);
}

/// An RC QP of A on CQs `(send, recv)` and one of B on `cqb`, connected to each other and
/// on the direct path.
fn direct_rc_pair<'c>(
    (a, pa, cqs): (&'c Context, &'c Pd<'c>, (&'c Cq<'c>, &'c Cq<'c>)),
    (b, pb, cqb): (&'c Context, &'c Pd<'c>, &'c Cq<'c>),
) -> (Qp<'c>, Qp<'c>) {
    let qa = a
        .create_qp(&QpInit::new(QpType::Rc, pa).cqs(cqs.0, cqs.1).cap(cap()))
        .unwrap();
    let qb = b
        .create_qp(&QpInit::new(QpType::Rc, pb).cqs(cqb, cqb).cap(cap()))
        .unwrap();
    let (ga, gb) = (a.query_gid(1, 0).unwrap(), b.query_gid(1, 0).unwrap());
    connect(&qa, gb, qb.qpn(), ALL);
    connect(&qb, ga, qa.qpn(), ALL);
    assert!(qa.is_direct() && qb.is_direct());
    (qa, qb)
}

/// [`connect`] with `rnr_retry` (the RNR timer asked of the peer is code 1, 10 µs).
fn connect_rnr(qp: &Qp<'_>, gid: softverbs::Gid, remote_qpn: u32, access: Access, rnr_retry: u8) {
    let path = common::RcPath {
        timeout: 10,
        access,
        retry_cnt: 2,
        rnr_retry,
        ..common::RcPath::default()
    };
    common::connect_with(qp, gid, remote_qpn, path);
}

type Shape = (u64, WcStatus, WcOpcode, u32, u32, u32);

/// What a completion says, without QP numbers; the opcode and length of an unsuccessful
/// completion are undefined (ibv_poll_cq(3)).
fn shape(w: &WorkCompletion) -> Shape {
    let (op, len) = if w.status == WcStatus::Success {
        (w.opcode, w.byte_len)
    } else {
        (WcOpcode::Send, 0)
    };
    (w.wr_id, w.status, op, len, w.imm_data, w.wc_flags)
}

#[track_caller]
fn wait_wc(cq: &Cq<'_>, n: usize) -> Vec<WorkCompletion> {
    let got = cq.wait(n, Duration::from_secs(10)).unwrap();
    assert_eq!(got.len(), n, "completions: {got:?}");
    got
}

#[track_caller]
fn wait(cq: &Cq<'_>, n: usize) -> Vec<Shape> {
    wait_wc(cq, n).iter().map(shape).collect()
}

struct Side<'c> {
    pd: Pd<'c>,
    cq: Cq<'c>,
}

fn side(ctx: &Context) -> Side<'_> {
    Side {
        pd: ctx.alloc_pd().unwrap(),
        cq: ctx.create_cq(256).unwrap(),
    }
}

fn rc<'a>(s: &'a Side<'a>) -> Qp<'a> {
    s.pd.context()
        .create_qp(&QpInit::new(QpType::Rc, &s.pd).cqs(&s.cq, &s.cq).cap(cap()))
        .unwrap()
}

fn open(socket: &std::path::Path, direct: bool) -> (Context, Context) {
    (
        Context::open_at_direct(socket, 0, direct).unwrap(),
        Context::open_at_direct(socket, 0, direct).unwrap(),
    )
}

fn words(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

/// Compare-and-swap and fetch-and-add from A into B's memory: A's completions, the original
/// values A got back, B's words after, and whether the pair was direct.
fn atomics(socket: &std::path::Path, direct: bool) -> (Vec<Shape>, Vec<u64>, Vec<u64>, bool) {
    let (a, b) = open(socket, direct);
    let (sa, sb) = (side(&a), side(&b));
    let (qa, qb) = (rc(&sa), rc(&sb));
    let (ga, gb) = (a.query_gid(1, 0).unwrap(), b.query_gid(1, 0).unwrap());
    let mut bbuf = vec![0u8; 64];
    bbuf[8..16].copy_from_slice(&10u64.to_ne_bytes());
    let mut abuf = vec![0u8; 64];
    let mb = sb.pd.reg_slice(&mut bbuf, ALL).unwrap();
    let ma = sa.pd.reg_slice(&mut abuf, ALL).unwrap();
    connect(&qa, gb, qb.qpn(), ALL);
    connect(&qb, ga, qa.qpn(), ALL);
    let is_direct = qa.is_direct() && qb.is_direct();
    let r = mb.remote();
    let ops = [
        SendOp::FetchAdd {
            remote_addr: r.addr,
            rkey: r.rkey,
            add: 5,
        },
        SendOp::CompareSwap {
            remote_addr: r.addr,
            rkey: r.rkey,
            compare: 5,
            swap: 100,
        },
        SendOp::CompareSwap {
            remote_addr: r.addr,
            rkey: r.rkey,
            compare: 7,
            swap: 1,
        },
        SendOp::FetchAdd {
            remote_addr: r.addr + 8,
            rkey: r.rkey,
            add: u64::MAX,
        },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        let s = [ma.sge(i * 8, 8).unwrap()];
        qa.post_send(&SendRequest::new(i as u64 + 1, op, &s))
            .unwrap();
    }
    let wa = wait(&sa.cq, 4);
    let mut got = vec![0u8; 32];
    ma.read(0, &mut got).unwrap();
    let mut after = vec![0u8; 16];
    mb.read(0, &mut after).unwrap();
    (wa, words(&got), words(&after), is_direct)
}

#[test]
fn atomics_on_a_direct_pair_give_the_values_of_the_daemon_path() {
    let (d, _dir) = common::daemon("opsatom", None);
    let engine = atomics(&d.socket, false);
    let direct = atomics(&d.socket, true);
    assert!(!engine.3, "without asking, the engine carries the work");
    assert!(
        direct.3,
        "remote atomics no longer keep a pair off the direct path"
    );
    assert_eq!(direct.0, engine.0, "completions");
    assert_eq!(engine.1, vec![0, 5, 100, 10], "original values");
    assert_eq!(direct.1, engine.1, "original values");
    assert_eq!(engine.2, vec![100, 9], "the words after");
    assert_eq!(direct.2, engine.2, "the words after");
}

/// A small SEND into B's word 0 (its bytes may wait in an inline slot until B polls), then a
/// fetch-and-add on that word, B not polling in between: the atomic sees the SEND's bytes
/// (IBA 9.5: the responder executes requests in order). The original value A got, the word
/// after, and whether the pair was direct.
fn send_then_atomic(socket: &std::path::Path, direct: bool) -> (u64, u64, bool) {
    let (a, b) = open(socket, direct);
    let (sa, sb) = (side(&a), side(&b));
    let (qa, qb) = (rc(&sa), rc(&sb));
    let (ga, gb) = (a.query_gid(1, 0).unwrap(), b.query_gid(1, 0).unwrap());
    let mut bbuf = vec![0u8; 64];
    let mut abuf = vec![0u8; 64];
    abuf[..8].copy_from_slice(&40u64.to_ne_bytes());
    let mb = sb.pd.reg_slice(&mut bbuf, ALL).unwrap();
    let ma = sa.pd.reg_slice(&mut abuf, ALL).unwrap();
    connect(&qa, gb, qb.qpn(), ALL);
    connect(&qb, ga, qa.qpn(), ALL);
    qb.post_recv(1, &[mb.sge(0, 8).unwrap()]).unwrap();
    let is_direct = qa.is_direct() && qb.is_direct();
    let r = mb.remote();
    qa.post_send(&SendRequest::new(1, SendOp::Send, &[ma.sge(0, 8).unwrap()]))
        .unwrap();
    let add = SendOp::FetchAdd {
        remote_addr: r.addr,
        rkey: r.rkey,
        add: 2,
    };
    qa.post_send(&SendRequest::new(2, add, &[ma.sge(8, 8).unwrap()]))
        .unwrap();
    let wa = wait(&sa.cq, 2);
    assert!(wa.iter().all(|w| w.1 == WcStatus::Success), "{wa:?}");
    let wb = wait(&sb.cq, 1);
    assert_eq!(wb[0].1, WcStatus::Success, "{wb:?}");
    let mut got = vec![0u8; 16];
    ma.read(0, &mut got).unwrap();
    let mut after = vec![0u8; 8];
    mb.read(0, &mut after).unwrap();
    (words(&got)[1], words(&after)[0], is_direct)
}

#[test]
fn an_atomic_sees_the_bytes_of_a_small_send_before_it() {
    let (d, _dir) = common::daemon("opsorder", None);
    let engine = send_then_atomic(&d.socket, false);
    let direct = send_then_atomic(&d.socket, true);
    assert!(direct.2, "the pair goes direct");
    assert_eq!((engine.0, engine.1), (40, 42), "the daemon path");
    assert_eq!((direct.0, direct.1), (40, 42), "the direct path");
}

/// One broken rule at B by a request of A: A's and B's completions, B's events and states.
#[derive(Debug, PartialEq)]
struct Violation {
    a: Vec<Shape>,
    b: Vec<Shape>,
    b_events: Vec<EventType>,
    a_state: QpState,
    b_state: QpState,
}

/// Posts `first` then a SEND from A, with two receives posted at B, and collects what
/// happened.
fn outcome(
    a: &Context,
    b: &Context,
    (qa, qb): (&Qp<'_>, &Qp<'_>),
    (ca, cb): (&Cq<'_>, &Cq<'_>),
    post: impl FnOnce(),
    nb: usize,
) -> Violation {
    post();
    let wa = wait(ca, 2);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut b_events = Vec::new();
    while Instant::now() < deadline && b_events.is_empty() {
        match b.try_get_async_event() {
            Ok(Some(e)) => b_events.extend(e.event_type),
            _ => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    let wb = wait(cb, nb);
    let _ = a;
    Violation {
        a: wa,
        b: wb,
        b_events,
        a_state: qa.query().unwrap().attr.qp_state,
        b_state: qb.query().unwrap().attr.qp_state,
    }
}

#[derive(Clone, Copy, Debug)]
enum AtomicBreak {
    UnknownRkey,
    Misaligned,
    OutOfBounds,
    MrWithoutAtomic,
    QpWithoutAtomic,
    WindowWithoutAtomic,
}

fn atomic_violation(socket: &std::path::Path, direct: bool, how: AtomicBreak) -> Violation {
    let (a, b) = open(socket, direct);
    let (sa, sb) = (side(&a), side(&b));
    let (qa, qb) = (rc(&sa), rc(&sb));
    let (ga, gb) = (a.query_gid(1, 0).unwrap(), b.query_gid(1, 0).unwrap());
    let mut bbuf = vec![0u8; 4096];
    let mut cbuf = vec![0u8; 4096];
    let mut abuf = vec![0u8; 64];
    let mb = sb.pd.reg_slice(&mut bbuf, MW_MR).unwrap();
    let m_rw = sb.pd.reg_slice(&mut cbuf, RWR).unwrap();
    let ma = sa.pd.reg_slice(&mut abuf, ALL).unwrap();
    connect(&qa, gb, qb.qpn(), ALL);
    let b_access = if matches!(how, AtomicBreak::QpWithoutAtomic) {
        RWR
    } else {
        ALL
    };
    connect(&qb, ga, qa.qpn(), b_access);
    assert_eq!(qa.is_direct(), direct);
    let mut mw = sb.pd.alloc_mw(MwType::One).unwrap();
    let win = qb
        .bind_mw_over(900, &mut mw, &mb, 0, 64, Access(0x06))
        .unwrap();
    assert_eq!(wait(&sb.cq, 1)[0].1, WcStatus::Success, "the bind");
    qb.post_recv(10, &[mb.sge(1024, 16).unwrap()]).unwrap();
    qb.post_recv(11, &[mb.sge(2048, 16).unwrap()]).unwrap();
    let r = mb.remote();
    let (addr, rkey) = match how {
        AtomicBreak::UnknownRkey => (r.addr, r.rkey ^ 0x5555),
        AtomicBreak::Misaligned => (r.addr + 4, r.rkey),
        AtomicBreak::OutOfBounds => (r.addr + 4096, r.rkey),
        AtomicBreak::MrWithoutAtomic => (m_rw.remote().addr, m_rw.remote().rkey),
        AtomicBreak::QpWithoutAtomic => (r.addr, r.rkey),
        AtomicBreak::WindowWithoutAtomic => (win.addr, win.rkey),
    };
    let s = [ma.sge(0, 8).unwrap()];
    let post = || {
        let op = SendOp::FetchAdd {
            remote_addr: addr,
            rkey,
            add: 1,
        };
        qa.post_send(&SendRequest::new(1, op, &s)).unwrap();
        qa.post_send(&SendRequest::new(2, SendOp::Send, &[ma.sge(8, 8).unwrap()]))
            .unwrap();
    };
    let v = outcome(&a, &b, (&qa, &qb), (&sa.cq, &sb.cq), post, 2);
    let mut word = [0u8; 8];
    mb.read(0, &mut word).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 0, "{how:?}: nothing was added");
    v
}

#[test]
fn refused_atomics_give_the_statuses_and_events_of_the_daemon_path() {
    let (d, _dir) = common::daemon("opsatomerr", None);
    for how in [
        AtomicBreak::UnknownRkey,
        AtomicBreak::Misaligned,
        AtomicBreak::OutOfBounds,
        AtomicBreak::MrWithoutAtomic,
        AtomicBreak::QpWithoutAtomic,
        AtomicBreak::WindowWithoutAtomic,
    ] {
        let engine = atomic_violation(&d.socket, false, how);
        let direct = atomic_violation(&d.socket, true, how);
        assert_eq!(direct, engine, "{how:?}");
        let want = match how {
            AtomicBreak::Misaligned => (WcStatus::RemInvReqErr, EventType::QpReqErr),
            _ => (WcStatus::RemAccessErr, EventType::QpAccessErr),
        };
        assert_eq!(engine.a[0].1, want.0, "{how:?}");
        assert_eq!(engine.b_events, vec![want.1], "{how:?}");
    }
}

/// A direct requester's atomics and a daemon-path requester's atomics on the same word of B
/// interleave as atomics: every fetch-and-add sees a distinct original value and none is
/// lost (`IBV_ATOMIC_HCA`: atomic among the device's atomics).
/// A direct pair (A, B1) and a daemon-path pair (C, B2) add 1 to the same word of B,
/// concurrently, 300 times each: every add must see a value of its own and the word must end
/// at 600. `shared`: the word is in a shared-memory MR, whose atomics the direct library
/// executes itself with a CPU atomic on its mapping and the daemon with one on its own
/// (docs/design/direct-path.md, "Atomics"); else in borrowed private memory, where the daemon
/// executes both.
fn atomic_race(socket: &std::path::Path, shared: bool) {
    let a = Context::open_at_direct(socket, 0, true).unwrap();
    let b = Context::open_at_direct(socket, 0, true).unwrap();
    let c = Context::open_at_direct(socket, 0, false).unwrap();
    let (sa, sb, sc) = (side(&a), side(&b), side(&c));
    let (qa, qb1, qb2, qc) = (rc(&sa), rc(&sb), rc(&sb), rc(&sc));
    let (ga, gb, gc) = (
        a.query_gid(1, 0).unwrap(),
        b.query_gid(1, 0).unwrap(),
        c.query_gid(1, 0).unwrap(),
    );
    connect(&qa, gb, qb1.qpn(), ALL);
    connect(&qb1, ga, qa.qpn(), ALL);
    connect(&qc, gb, qb2.qpn(), ALL);
    connect(&qb2, gc, qc.qpn(), ALL);
    assert!(qa.is_direct() && qb1.is_direct());
    assert!(!qc.is_direct() && !qb2.is_direct());
    let mut word = vec![0u8; 8];
    let mut owned;
    let buf;
    let borrowed;
    let (r, read_word): (softverbs::Remote, Box<dyn Fn() -> u64 + '_>) = if shared {
        owned = sb.pd.alloc_mr(4096, ALL).unwrap();
        buf = owned.take(8).unwrap();
        (
            owned.remote(),
            Box::new(|| {
                let mut v = [0u8; 8];
                buf.read(0, &mut v).unwrap();
                u64::from_ne_bytes(v)
            }),
        )
    } else {
        borrowed = sb.pd.reg_slice(&mut word, ALL).unwrap();
        (
            borrowed.remote(),
            Box::new(|| {
                let mut v = [0u8; 8];
                borrowed.read(0, &mut v).unwrap();
                u64::from_ne_bytes(v)
            }),
        )
    };
    const N: usize = 300;
    let run = |qp: &Qp<'_>, s: &Side<'_>| -> Vec<u64> {
        let mut out = vec![0u8; 8];
        let mo = s.pd.reg_slice(&mut out, ALL).unwrap();
        let mut seen = Vec::with_capacity(N);
        for i in 0..N {
            let op = SendOp::FetchAdd {
                remote_addr: r.addr,
                rkey: r.rkey,
                add: 1,
            };
            qp.post_send(&SendRequest::new(i as u64, op, &[mo.sge(0, 8).unwrap()]))
                .unwrap();
            let w = wait_wc(&s.cq, 1);
            assert_eq!(w[0].status, WcStatus::Success);
            let mut v = [0u8; 8];
            mo.read(0, &mut v).unwrap();
            seen.push(u64::from_ne_bytes(v));
        }
        seen
    };
    let (mut seen, other) = std::thread::scope(|t| {
        let h = t.spawn(|| run(&qc, &sc));
        let mine = run(&qa, &sa);
        (mine, h.join().unwrap())
    });
    seen.extend(other);
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..2 * N as u64).collect::<Vec<_>>(),
        "shared {shared}: an add was lost or doubled"
    );
    assert_eq!(read_word(), 2 * N as u64, "shared {shared}");
}

#[test]
fn direct_atomics_are_atomic_with_the_daemons_own() {
    let (d, _dir) = common::daemon("opsatomrace", None);
    atomic_race(&d.socket, false);
    atomic_race(&d.socket, true);
}

/// B binds a type 1 and a type 2 window on its own QP; A writes and reads through them,
/// sends with invalidate to the type 2 window, then writes through the invalidated key.
/// Returns A's and B's completions (the invalidated key replaced by 1 when it is the
/// window's), B's events, the bytes B holds and the bytes A read.
fn windows(socket: &std::path::Path, direct: bool) -> (Violation, Vec<u8>, bool) {
    let (a, b) = open(socket, direct);
    let (sa, sb) = (side(&a), side(&b));
    let (qa, qb) = (rc(&sa), rc(&sb));
    let (ga, gb) = (a.query_gid(1, 0).unwrap(), b.query_gid(1, 0).unwrap());
    let mut abuf = vec![0u8; 8192];
    for (i, x) in abuf.iter_mut().enumerate() {
        *x = (i * 13 % 251) as u8;
    }
    let mut bbuf = vec![0u8; 8192];
    let ma = sa.pd.reg_slice(&mut abuf, ALL).unwrap();
    let mb = sb.pd.reg_slice(&mut bbuf, MW_MR).unwrap();
    connect(&qa, gb, qb.qpn(), ALL);
    connect(&qb, ga, qa.qpn(), ALL);
    let is_direct = qa.is_direct() && qb.is_direct();
    let mut mw1 = sb.pd.alloc_mw(MwType::One).unwrap();
    let w1 = qb
        .bind_mw_over(900, &mut mw1, &mb, 0, 4096, Access(0x06))
        .unwrap();
    let mut mw2 = sb.pd.alloc_mw(MwType::Two).unwrap();
    let (bind2, w2) = mw2
        .bind_request_over(&mb, 4096, 1024, Access(0x02))
        .unwrap();
    qb.post_send(&SendRequest::new(901, SendOp::BindMw(bind2), &[]))
        .unwrap();
    let mut wb = wait(&sb.cq, 2);
    mw2.set_rkey(bind2.new_rkey);
    qb.post_recv(50, &[mb.sge(6000, 64).unwrap()]).unwrap();
    qb.post_recv(51, &[mb.sge(7000, 64).unwrap()]).unwrap();
    let send = |id, op, sges: &[Sge]| qa.post_send(&SendRequest::new(id, op, sges)).unwrap();
    send(
        1,
        SendOp::Write {
            remote_addr: w1.addr + 100,
            rkey: w1.rkey,
        },
        &[ma.sge(0, 300).unwrap()],
    );
    send(
        2,
        SendOp::Read {
            remote_addr: w1.addr + 100,
            rkey: w1.rkey,
        },
        &[ma.sge(4000, 300).unwrap()],
    );
    send(
        3,
        SendOp::Write {
            remote_addr: w2.addr + 10,
            rkey: w2.rkey,
        },
        &[ma.sge(1000, 500).unwrap()],
    );
    send(
        4,
        SendOp::SendWithInv(w2.rkey),
        &[ma.sge(2000, 40).unwrap()],
    );
    let mut wa = wait(&sa.cq, 4);
    let got = wait_wc(&sb.cq, 1)[0];
    let mut g = shape(&got);
    if got.wc_flags & 0x8 != 0 && got.imm_data == w2.rkey {
        g.4 = 1;
    }
    wb.push(g);
    // Through the invalidated key: a remote access error, everything after it flushed.
    let post = || {
        send(
            5,
            SendOp::Write {
                remote_addr: w2.addr,
                rkey: w2.rkey,
            },
            &[ma.sge(0, 8).unwrap()],
        );
        send(6, SendOp::Send, &[ma.sge(0, 8).unwrap()]);
    };
    let mut v = outcome(&a, &b, (&qa, &qb), (&sa.cq, &sb.cq), post, 1);
    wa.append(&mut v.a);
    wb.append(&mut v.b);
    v.a = wa;
    v.b = wb;
    let mut bytes = vec![0u8; 8192];
    mb.read(0, &mut bytes).unwrap();
    let mut read_back = vec![0u8; 300];
    ma.read(4000, &mut read_back).unwrap();
    bytes.extend(read_back);
    (v, bytes, is_direct)
}

#[test]
fn memory_windows_on_a_direct_pair_work_as_on_the_daemon_path() {
    let (d, _dir) = common::daemon("opsmw", None);
    let engine = windows(&d.socket, false);
    let direct = windows(&d.socket, true);
    assert!(direct.2 && !engine.2);
    assert_eq!(direct.0, engine.0);
    assert!(direct.1 == engine.1, "the bytes moved differ");
    assert_eq!(
        engine.0.b[2].5 & 0x8,
        0x8,
        "the receive says it invalidated"
    );
    assert_eq!(engine.0.b[2].4, 1, "the window's key");
    assert_eq!(engine.0.a[4].1, WcStatus::RemAccessErr, "{:?}", engine.0.a);
    assert_eq!(engine.0.b_events, vec![EventType::QpAccessErr]);
}

#[derive(Clone, Copy, Debug)]
enum WindowBreak {
    /// Allocated, never bound.
    Unbound,
    /// Past the window's end (inside the MR).
    OutOfWindow,
    /// A write through a window that grants only remote read.
    WithoutAccess,
    /// Invalidated by its owner (`IBV_WR_LOCAL_INV`), then used.
    LocallyInvalidated,
    /// Send with Invalidate naming a type 1 window.
    InvalidateType1,
    /// A bind over an MR registered without `IBV_ACCESS_MW_BIND`.
    BindWithoutMwBind,
}

fn window_violation(socket: &std::path::Path, direct: bool, how: WindowBreak) -> Violation {
    let (a, b) = open(socket, direct);
    let (sa, sb) = (side(&a), side(&b));
    let (qa, qb) = (rc(&sa), rc(&sb));
    let (ga, gb) = (a.query_gid(1, 0).unwrap(), b.query_gid(1, 0).unwrap());
    let mut abuf = vec![0u8; 4096];
    let mut bbuf = vec![0u8; 8192];
    let mut cbuf = vec![0u8; 4096];
    let ma = sa.pd.reg_slice(&mut abuf, ALL).unwrap();
    let mb = sb.pd.reg_slice(&mut bbuf, MW_MR).unwrap();
    let m_plain = sb.pd.reg_slice(&mut cbuf, ALL).unwrap();
    connect(&qa, gb, qb.qpn(), ALL);
    connect(&qb, ga, qa.qpn(), ALL);
    assert_eq!(qa.is_direct(), direct);
    let mut mw1 = sb.pd.alloc_mw(MwType::One).unwrap();
    let mw2 = sb.pd.alloc_mw(MwType::Two).unwrap();
    let unbound = mw1.rkey();
    let mut nb = 2;
    let (addr, rkey) = match how {
        WindowBreak::Unbound => (mb.remote().addr, unbound),
        WindowBreak::OutOfWindow | WindowBreak::WithoutAccess | WindowBreak::InvalidateType1 => {
            let access = if matches!(how, WindowBreak::WithoutAccess) {
                Access(0x04)
            } else {
                Access(0x06)
            };
            let w = qb.bind_mw_over(900, &mut mw1, &mb, 0, 256, access).unwrap();
            assert_eq!(wait(&sb.cq, 1)[0].1, WcStatus::Success);
            let at = if matches!(how, WindowBreak::OutOfWindow) {
                w.addr + 250
            } else {
                w.addr
            };
            (at, w.rkey)
        }
        WindowBreak::LocallyInvalidated => {
            let (bind, w) = mw2.bind_request_over(&mb, 0, 256, Access(0x02)).unwrap();
            qb.post_send(&SendRequest::new(901, SendOp::BindMw(bind), &[]))
                .unwrap();
            qb.post_send(&SendRequest::new(902, SendOp::LocalInv(bind.new_rkey), &[]))
                .unwrap();
            let got = wait(&sb.cq, 2);
            assert!(got.iter().all(|g| g.1 == WcStatus::Success), "{got:?}");
            (w.addr, w.rkey)
        }
        WindowBreak::BindWithoutMwBind => {
            // The bind fails at B itself: its QP goes to error, nothing reaches A's.
            let bind = mw2.bind_request(m_plain.lkey(), m_plain.remote().addr, 64, Access(0x02));
            qb.post_send(&SendRequest::new(901, SendOp::BindMw(bind), &[]))
                .unwrap();
            nb = 1;
            (0, 0)
        }
    };
    if matches!(how, WindowBreak::BindWithoutMwBind) {
        let wb = wait(&sb.cq, nb);
        return Violation {
            a: Vec::new(),
            b: wb,
            b_events: Vec::new(),
            a_state: qa.query().unwrap().attr.qp_state,
            b_state: qb.query().unwrap().attr.qp_state,
        };
    }
    qb.post_recv(10, &[mb.sge(4096, 64).unwrap()]).unwrap();
    qb.post_recv(11, &[mb.sge(5000, 64).unwrap()]).unwrap();
    let s = [ma.sge(0, 16).unwrap()];
    let post = || {
        let op = if matches!(how, WindowBreak::InvalidateType1) {
            SendOp::SendWithInv(rkey)
        } else {
            SendOp::Write {
                remote_addr: addr,
                rkey,
            }
        };
        qa.post_send(&SendRequest::new(1, op, &s)).unwrap();
        qa.post_send(&SendRequest::new(2, SendOp::Send, &s))
            .unwrap();
    };
    outcome(&a, &b, (&qa, &qb), (&sa.cq, &sb.cq), post, nb)
}

#[test]
fn broken_window_rules_give_the_statuses_and_events_of_the_daemon_path() {
    let (d, _dir) = common::daemon("opsmwerr", None);
    for how in [
        WindowBreak::Unbound,
        WindowBreak::OutOfWindow,
        WindowBreak::WithoutAccess,
        WindowBreak::LocallyInvalidated,
        WindowBreak::InvalidateType1,
        WindowBreak::BindWithoutMwBind,
    ] {
        let engine = window_violation(&d.socket, false, how);
        let direct = window_violation(&d.socket, true, how);
        assert_eq!(direct, engine, "{how:?}");
        let first = if matches!(how, WindowBreak::BindWithoutMwBind) {
            engine.b[0].1
        } else {
            engine.a[0].1
        };
        let want = match how {
            WindowBreak::InvalidateType1 => WcStatus::RemInvReqErr,
            WindowBreak::BindWithoutMwBind => WcStatus::MwBindErr,
            _ => WcStatus::RemAccessErr,
        };
        assert_eq!(first, want, "{how:?}: {engine:?}");
    }
}

/// What the completion channels of A and B report while A sends to B: whether each wait
/// was woken, in order.
fn channels(socket: &std::path::Path, direct: bool) -> (Vec<bool>, Vec<Shape>, Vec<Shape>, bool) {
    let (a, b) = open(socket, direct);
    let (cha, chb) = (
        a.create_comp_channel().unwrap(),
        b.create_comp_channel().unwrap(),
    );
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let cqa = a.create_cq_with_channel(64, &cha).unwrap();
    let cqb = b.create_cq_with_channel(64, &chb).unwrap();
    let qa = a
        .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&cqa, &cqa).cap(cap()))
        .unwrap();
    let qb = b
        .create_qp(&QpInit::new(QpType::Rc, &pb).cqs(&cqb, &cqb).cap(cap()))
        .unwrap();
    let (ga, gb) = (a.query_gid(1, 0).unwrap(), b.query_gid(1, 0).unwrap());
    let mut abuf = vec![7u8; 4096];
    let mut bbuf = vec![0u8; 4096];
    let ma = pa.reg_slice(&mut abuf, ALL).unwrap();
    let mb = pb.reg_slice(&mut bbuf, ALL).unwrap();
    connect(&qa, gb, qb.qpn(), ALL);
    connect(&qb, ga, qa.qpn(), ALL);
    let is_direct = qa.is_direct() && qb.is_direct();
    for i in 0..4 {
        qb.post_recv(10 + i as u64, &[mb.sge(i * 64, 64).unwrap()])
            .unwrap();
    }
    let s = [ma.sge(0, 32).unwrap()];
    let send = |id, solicited: bool, signaled: bool| {
        let mut w = SendRequest::new(id, SendOp::Send, &s);
        w.solicited = solicited;
        w.signaled = signaled;
        qa.post_send(&w).unwrap();
    };
    let woke = |ch: &softverbs::CompChannel<'_>, cq: &Cq<'_>| {
        ch.get_event(Some(Duration::from_secs(10)))
            .unwrap()
            .is_some_and(|h| h == cq.handle())
    };
    let mut seen = Vec::new();
    let mut wb = Vec::new();
    // An armed receive CQ is woken by the receive completion the peer produced.
    cqb.req_notify(false).unwrap();
    send(1, false, false);
    seen.push(woke(&chb, &cqb));
    wb.extend(wait(&cqb, 1));
    // Solicited only: an unsolicited SEND lands (B polls it) without an event...
    cqb.req_notify(true).unwrap();
    send(2, false, false);
    wb.extend(wait(&cqb, 1));
    seen.push(chb.try_get_event().unwrap().is_some());
    // ...and a solicited one raises it.
    send(3, true, false);
    seen.push(woke(&chb, &cqb));
    wb.extend(wait(&cqb, 1));
    // A's own send completion wakes A's armed CQ.
    cqa.req_notify(false).unwrap();
    send(4, false, true);
    seen.push(woke(&cha, &cqa));
    let mut wa = wait(&cqa, 1);
    wb.extend(wait(&cqb, 1));
    // A SEND that finds no receive waits (RNR); the receive B posts then lets it complete,
    // and A, blocked on its armed CQ, is woken for it.
    cqa.req_notify(false).unwrap();
    send(6, false, true);
    qb.post_recv(14, &[mb.sge(1024, 64).unwrap()]).unwrap();
    seen.push(woke(&cha, &cqa));
    wa.extend(wait(&cqa, 1));
    wb.extend(wait(&cqb, 1));
    // A spent arm is not woken again: a second signalled SEND completes without an event.
    for i in 0..2 {
        qb.post_recv(20 + i as u64, &[mb.sge(2048 + i * 64, 64).unwrap()])
            .unwrap();
    }
    send(7, false, true);
    wa.extend(wait(&cqa, 1));
    wb.extend(wait(&cqb, 1));
    seen.push(cha.try_get_event().unwrap().is_some());
    // An arm a completion A did not produce fired (B's SEND into A's receive)...
    qa.post_recv(30, &[ma.sge(2048, 64).unwrap()]).unwrap();
    cqa.req_notify(false).unwrap();
    let sb = [mb.sge(3072, 16).unwrap()];
    let mut w = SendRequest::new(31, SendOp::Send, &sb);
    w.signaled = false;
    qb.post_send(&w).unwrap();
    seen.push(woke(&cha, &cqa));
    wa.extend(wait(&cqa, 1));
    // ...then a solicited-only arm is not woken by a successful send completion...
    cqa.req_notify(true).unwrap();
    send(8, false, true);
    wa.extend(wait(&cqa, 1));
    wb.extend(wait(&cqb, 1));
    seen.push(cha.try_get_event().unwrap().is_some());
    // ...but stays armed, and an error completion wakes it: a write with a bad key.
    let bad = SendOp::Write {
        remote_addr: mb.remote().addr,
        rkey: mb.remote().rkey ^ 0x5555,
    };
    qa.post_send(&SendRequest::new(5, bad, &s)).unwrap();
    seen.push(woke(&cha, &cqa));
    wa.extend(wait(&cqa, 1));
    (seen, wa, wb, is_direct)
}

#[test]
fn completion_channels_wake_for_direct_completions_as_for_the_daemons() {
    let (d, _dir) = common::daemon("opschan", None);
    let engine = channels(&d.socket, false);
    let direct = channels(&d.socket, true);
    assert!(
        direct.3,
        "a CQ with a completion channel no longer keeps a pair off the path"
    );
    assert_eq!(
        engine.0,
        vec![true, false, true, true, true, false, true, false, true],
        "the daemon path's events"
    );
    assert_eq!(direct.0, engine.0, "events");
    assert_eq!(direct.1, engine.1, "A's completions");
    assert_eq!(direct.2, engine.2, "B's completions");
}

/// B takes remote write away from its QP after the pair was decided (RTS→RTS,
/// `IBV_QP_ACCESS_FLAGS`): A's next WRITE is refused as the engine refuses it.
fn access_taken_back(socket: &std::path::Path, direct: bool) -> Violation {
    let (a, b) = open(socket, direct);
    let (sa, sb) = (side(&a), side(&b));
    let (qa, qb) = (rc(&sa), rc(&sb));
    let (ga, gb) = (a.query_gid(1, 0).unwrap(), b.query_gid(1, 0).unwrap());
    let mut abuf = vec![1u8; 64];
    let mut bbuf = vec![0u8; 4096];
    let ma = sa.pd.reg_slice(&mut abuf, ALL).unwrap();
    let mb = sb.pd.reg_slice(&mut bbuf, ALL).unwrap();
    connect(&qa, gb, qb.qpn(), ALL);
    connect(&qb, ga, qa.qpn(), ALL);
    assert_eq!(qa.is_direct(), direct);
    let r = mb.remote();
    let write = || SendOp::Write {
        remote_addr: r.addr,
        rkey: r.rkey,
    };
    qa.post_send(&SendRequest::new(1, write(), &[ma.sge(0, 8).unwrap()]))
        .unwrap();
    assert_eq!(wait(&sa.cq, 1)[0].1, WcStatus::Success);
    let local_only = QpAttr {
        qp_state: QpState::Rts,
        qp_access_flags: Access(0x01),
        ..QpAttr::default()
    };
    qb.modify(&local_only, M::STATE | M::ACCESS_FLAGS).unwrap();
    qb.post_recv(10, &[mb.sge(1024, 16).unwrap()]).unwrap();
    qb.post_recv(11, &[mb.sge(2048, 16).unwrap()]).unwrap();
    let s = [ma.sge(0, 8).unwrap()];
    let post = || {
        qa.post_send(&SendRequest::new(2, write(), &s)).unwrap();
        qa.post_send(&SendRequest::new(3, SendOp::Send, &s))
            .unwrap();
    };
    outcome(&a, &b, (&qa, &qb), (&sa.cq, &sb.cq), post, 2)
}

#[test]
fn access_flags_changed_after_the_decision_are_the_ones_checked() {
    let (d, _dir) = common::daemon("opsaccess", None);
    let engine = access_taken_back(&d.socket, false);
    let direct = access_taken_back(&d.socket, true);
    assert_eq!(engine.a[0].1, WcStatus::RemAccessErr, "{engine:?}");
    assert_eq!(direct, engine);
}

/// B moves its QP to ERR; A, blocked on its armed CQ, is woken once its SEND's retries ran
/// out and gets `RETRY_EXC_ERR`, as from the engine (no sooner: it waited as retries would).
fn unanswered(socket: &std::path::Path, direct: bool) -> (bool, Vec<Shape>, Duration) {
    let (a, b) = open(socket, direct);
    let cha = a.create_comp_channel().unwrap();
    let pa = a.alloc_pd().unwrap();
    let cqa = a.create_cq_with_channel(16, &cha).unwrap();
    let qa = a
        .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&cqa, &cqa).cap(cap()))
        .unwrap();
    let sb = side(&b);
    let qb = rc(&sb);
    let (ga, gb) = (a.query_gid(1, 0).unwrap(), b.query_gid(1, 0).unwrap());
    let mut abuf = vec![0u8; 64];
    let ma = pa.reg_slice(&mut abuf, ALL).unwrap();
    connect(&qa, gb, qb.qpn(), ALL);
    connect(&qb, ga, qa.qpn(), ALL);
    assert_eq!(qa.is_direct(), direct);
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    qb.modify(&err, M::STATE).unwrap();
    cqa.req_notify(false).unwrap();
    let start = Instant::now();
    qa.post_send(&SendRequest::new(1, SendOp::Send, &[ma.sge(0, 8).unwrap()]))
        .unwrap();
    let woke = cha
        .get_event(Some(Duration::from_secs(10)))
        .unwrap()
        .is_some_and(|h| h == cqa.handle());
    let got = wait(&cqa, 1);
    (woke, got, start.elapsed())
}

#[test]
fn a_blocked_requester_is_woken_when_its_retries_to_a_silent_peer_run_out() {
    let (d, _dir) = common::daemon("opsretry", None);
    let engine = unanswered(&d.socket, false);
    let direct = unanswered(&d.socket, true);
    assert!(
        engine.0 && direct.0,
        "woken: engine {engine:?}, direct {direct:?}"
    );
    assert_eq!(engine.1[0].1, WcStatus::RetryExcErr);
    assert_eq!(direct.1, engine.1);
    // timeout 10 (4.2 ms) and retry_cnt 2: three timeouts before the error.
    assert!(direct.2 >= Duration::from_millis(12), "{:?}", direct.2);
}

/// A SEND that finds no receive with a finite `rnr_retry` fails `RNR_RETRY_EXC_ERR` once
/// its RNR retries ran out, as from the engine; the responder is untouched.
fn rnr_exhausted(socket: &std::path::Path, direct: bool, rnr_retry: u8) -> Violation {
    let (a, b) = open(socket, direct);
    let (sa, sb) = (side(&a), side(&b));
    let (qa, qb) = (rc(&sa), rc(&sb));
    let (ga, gb) = (a.query_gid(1, 0).unwrap(), b.query_gid(1, 0).unwrap());
    let mut abuf = vec![0u8; 64];
    let ma = sa.pd.reg_slice(&mut abuf, ALL).unwrap();
    connect_rnr(&qa, gb, qb.qpn(), ALL, rnr_retry);
    connect(&qb, ga, qa.qpn(), ALL);
    assert_eq!(qa.is_direct(), direct);
    let s = [ma.sge(0, 8).unwrap()];
    qa.post_send(&SendRequest::new(1, SendOp::Send, &s))
        .unwrap();
    qa.post_send(&SendRequest::new(2, SendOp::Send, &s))
        .unwrap();
    let wa = wait(&sa.cq, 2);
    Violation {
        a: wa,
        b: sb.cq.poll(16).unwrap().iter().map(shape).collect(),
        b_events: b
            .try_get_async_event()
            .unwrap()
            .into_iter()
            .flat_map(|e| e.event_type)
            .collect(),
        a_state: qa.query().unwrap().attr.qp_state,
        b_state: qb.query().unwrap().attr.qp_state,
    }
}

#[test]
fn a_finite_rnr_retry_runs_out_as_on_the_daemon_path() {
    let (d, _dir) = common::daemon("opsrnr", None);
    for r in [0, 3] {
        let engine = rnr_exhausted(&d.socket, false, r);
        let direct = rnr_exhausted(&d.socket, true, r);
        assert_eq!(
            engine.a[0].1,
            WcStatus::RnrRetryExcErr,
            "rnr_retry {r}: {engine:?}"
        );
        assert_eq!(direct, engine, "rnr_retry {r}");
    }
}

/// A receiver that sleeps on its channel whenever its CQ is empty (arm, poll again, then
/// `ibv_get_cq_event`, the verbs pattern) while a direct peer streams SENDs at it: the peer
/// tells the daemon of a receive completion only while the CQ is armed
/// (`CH_RECV_CHANNEL`), and no completion that lands around an arm is left without a
/// wake-up — every SEND arrives and no sleep outlasts its timeout.
#[test]
fn a_receiver_sleeping_between_direct_sends_misses_no_wakeup() {
    const N: u64 = 3000;
    let (d, _dir) = common::daemon("opssleep", None);
    let (a, b) = open(&d.socket, true);
    let chb = b.create_comp_channel().unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let cqa = a.create_cq(64).unwrap();
    let cqb = b.create_cq_with_channel(64, &chb).unwrap();
    let (qa, qb) = direct_rc_pair((&a, &pa, (&cqa, &cqa)), (&b, &pb, &cqb));
    let mut abuf = vec![7u8; 64];
    let mut bbuf = vec![0u8; 64 * 32];
    let ma = pa.reg_slice(&mut abuf, ALL).unwrap();
    let mb = pb.reg_slice(&mut bbuf, ALL).unwrap();
    for i in 0..32u64 {
        qb.post_recv(i, &[mb.sge(i as usize % 32 * 64, 64).unwrap()])
            .unwrap();
    }
    let (mut sleeps, mut got) = (0u32, 0u64);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let s = [ma.sge(0, 8).unwrap()];
            let mut done = 0u64;
            for i in 0..N {
                while i - done >= 16 {
                    done += cqa.poll(16).unwrap().len() as u64;
                }
                qa.post_send(&SendRequest::new(i, SendOp::Send, &s))
                    .unwrap();
                // Now and then a pause, so the receiver goes to sleep.
                if i % 7 == 0 {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
            while done < N {
                done += cqa.poll(16).unwrap().len() as u64;
            }
        });
        let mut next = 32u64;
        while got < N {
            let mut wcs = cqb.poll(16).unwrap();
            if wcs.is_empty() {
                cqb.req_notify(false).unwrap();
                wcs = cqb.poll(16).unwrap();
                if wcs.is_empty() {
                    sleeps += 1;
                    let woke = chb.get_event(Some(Duration::from_secs(10))).unwrap();
                    assert!(woke.is_some(), "no wake-up after {got} receives");
                    continue;
                }
            }
            for w in wcs {
                assert_eq!(w.status, WcStatus::Success, "{w:?}");
                assert_eq!(w.wr_id, got, "in order");
                got += 1;
                qb.post_recv(next, &[mb.sge(next as usize % 32 * 64, 64).unwrap()])
                    .unwrap();
                next += 1;
            }
        }
    });
    assert_eq!(got, N);
    println!("{N} receives, {sleeps} sleeps on the channel");
    assert!(
        sleeps > 0,
        "the receiver never slept: the test did not test"
    );
}

/// One thread of A posts signalled SENDs while another sleeps on A's send CQ (arm, poll,
/// `ibv_get_cq_event`): the library's own completions notify the daemon only while it may
/// hold an arm (docs/design/direct-path.md, "Own completions, only while armed"), and a thread that
/// arms while the other posts must still be woken for every later completion.
#[test]
fn a_thread_sleeping_on_its_send_cq_misses_no_wakeup_from_another_threads_sends() {
    use std::sync::atomic::{AtomicU64, Ordering};
    const N: u64 = 3000;
    let (d, _dir) = common::daemon("opsownsleep", None);
    let (a, b) = open(&d.socket, true);
    let cha = a.create_comp_channel().unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let sq = a.create_cq_with_channel(64, &cha).unwrap();
    let rq = a.create_cq(64).unwrap();
    let cqb = b.create_cq(256).unwrap();
    let (qa, qb) = direct_rc_pair((&a, &pa, (&sq, &rq)), (&b, &pb, &cqb));
    let mut abuf = vec![7u8; 64];
    let mut bbuf = vec![0u8; 64 * 64];
    let ma = pa.reg_slice(&mut abuf, ALL).unwrap();
    let mb = pb.reg_slice(&mut bbuf, ALL).unwrap();
    // B keeps 64 receives posted, more than A ever has outstanding.
    for i in 0..64u64 {
        qb.post_recv(i, &[mb.sge(i as usize % 64 * 64, 64).unwrap()])
            .unwrap();
    }
    let done = AtomicU64::new(0);
    let mut sleeps = 0u32;
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let s = [ma.sge(0, 8).unwrap()];
            for i in 0..N {
                while i - done.load(Ordering::Acquire) >= 16 {
                    std::thread::yield_now();
                }
                qa.post_send(&SendRequest::new(i, SendOp::Send, &s))
                    .unwrap();
                // Now and then a pause, so the other thread goes to sleep.
                if i % 7 == 0 {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        });
        sc.spawn(|| {
            let mut next = 64u64;
            while next < N + 64 {
                for _ in cqb.poll(16).unwrap() {
                    qb.post_recv(next, &[mb.sge(next as usize % 64 * 64, 64).unwrap()])
                        .unwrap();
                    next += 1;
                }
                std::thread::yield_now();
            }
        });
        let mut got = 0u64;
        while got < N {
            let mut wcs = sq.poll(16).unwrap();
            if wcs.is_empty() {
                sq.req_notify(false).unwrap();
                wcs = sq.poll(16).unwrap();
                if wcs.is_empty() {
                    sleeps += 1;
                    let woke = cha.get_event(Some(Duration::from_secs(10))).unwrap();
                    assert!(woke.is_some(), "no wake-up after {got} send completions");
                    continue;
                }
            }
            for w in wcs {
                assert_eq!(w.status, WcStatus::Success, "{w:?}");
                assert_eq!(w.wr_id, got, "in order");
                got += 1;
            }
            done.store(got, Ordering::Release);
        }
    });
    println!("{N} send completions, {sleeps} sleeps on the channel");
    assert!(sleeps > 0, "the poller never slept: the test did not test");
}
