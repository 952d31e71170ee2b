//! The same-host direct path (docs/design/direct-path.md): the same work run once through the
//! daemon's engine and once directly between the two libraries must give the same
//! completions, the same data and the same errors; a peer killed mid-transfer fails its
//! partner's QP and leaves nothing behind in the daemon.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use softverbs::{
    Access, BorrowedMr, Context, Cq, Introspect, Pd, Qp, QpCap, QpInit, QpState, QpType,
};
use softverbs::{SendOp, SendRequest, Sge, WcOpcode, WcStatus, WorkCompletion};

mod common;

/// Local write, remote write and read (atomics: tests/direct_ops.rs).
const RWR: Access = Access(0x07);
const WAIT: Duration = Duration::from_secs(20);

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    }
}

/// RESET→INIT→RTR→RTS towards `remote_qpn` with `access` (the RTR step is where the path is
/// decided); a short ACK timeout and two retries, so a vanished peer fails a request soon.
fn connect(qp: &Qp<'_>, gid: softverbs::Gid, remote_qpn: u32, access: Access) {
    let path = common::RcPath {
        timeout: 10,
        access,
        retry_cnt: 2,
        ..common::RcPath::default()
    };
    common::connect_with(qp, gid, remote_qpn, path);
}

/// Two contexts of one daemon, each with a PD, one CQ and a QP of `t`.
struct Pair {
    a: Context,
    b: Context,
}

struct Side<'c> {
    pd: Pd<'c>,
    cq: Cq<'c>,
}

fn open_pair(socket: &std::path::Path, direct: bool) -> Pair {
    Pair {
        a: Context::open_at_direct(socket, 0, direct).unwrap(),
        b: Context::open_at_direct(socket, 0, direct).unwrap(),
    }
}

fn side(ctx: &Context) -> Side<'_> {
    Side {
        pd: ctx.alloc_pd().unwrap(),
        cq: ctx.create_cq(256).unwrap(),
    }
}

fn qp<'a>(s: &'a Side<'a>, t: QpType) -> Qp<'a> {
    s.pd.context()
        .create_qp(&QpInit::new(t, &s.pd).cqs(&s.cq, &s.cq).cap(cap()))
        .unwrap()
}

/// What a completion says, without the QP numbers (which differ between runs).
fn shape(w: &WorkCompletion) -> (u64, WcStatus, WcOpcode, u32, u32, u32) {
    let ok = w.status == WcStatus::Success;
    // The opcode and length of an unsuccessful completion are undefined (ibv_poll_cq(3)).
    let (op, len) = if ok {
        (w.opcode, w.byte_len)
    } else {
        (WcOpcode::Send, 0)
    };
    (w.wr_id, w.status, op, len, w.imm_data, w.wc_flags)
}

#[track_caller]
fn wait(cq: &Cq<'_>, n: usize) -> Vec<(u64, WcStatus, WcOpcode, u32, u32, u32)> {
    let mut got = Vec::new();
    let end = Instant::now() + Duration::from_secs(3);
    while got.len() < n && Instant::now() < end {
        let more = cq.poll(n - got.len()).unwrap();
        if more.is_empty() {
            std::thread::sleep(Duration::from_micros(100));
        }
        got.extend(more);
    }
    if got.len() != n {
        let more = cq.wait(1, Duration::from_secs(3)).unwrap();
        panic!("completions: {got:?}, later {more:?}");
    }
    got.iter().map(shape).collect()
}

type Shapes = Vec<(u64, WcStatus, WcOpcode, u32, u32, u32)>;

/// A mixed RC or UC sequence from A to B and back; returns both sides' completions and the
/// bytes that arrived, and whether the QPs were direct.
fn mixed(socket: &std::path::Path, direct: bool, t: QpType) -> (Shapes, Shapes, Vec<u8>, bool) {
    let p = open_pair(socket, direct);
    let (sa, sb) = (side(&p.a), side(&p.b));
    let (qa, qb) = (qp(&sa, t), qp(&sb, t));
    let (ga, gb) = (p.a.query_gid(1, 0).unwrap(), p.b.query_gid(1, 0).unwrap());
    let mut abuf = vec![0u8; 1 << 16];
    let mut bbuf = vec![0u8; 1 << 16];
    for (i, b) in abuf.iter_mut().enumerate() {
        *b = (i * 7 % 253) as u8;
    }
    let ma: BorrowedMr<'_> = sa.pd.reg_slice(&mut abuf, RWR).unwrap();
    let mb: BorrowedMr<'_> = sb.pd.reg_slice(&mut bbuf, RWR).unwrap();
    // Receives posted while the peer has not attached yet (B connected, A not yet) wait in
    // the channel for A.
    connect(&qb, ga, qa.qpn(), RWR);
    qb.post_recv(100, &[mb.sge(0, 4096).unwrap()]).unwrap();
    // Two pieces into two receive SGEs.
    qb.post_recv(
        101,
        &[mb.sge(8192, 100).unwrap(), mb.sge(12288, 5000).unwrap()],
    )
    .unwrap();
    qb.post_recv(102, &[mb.sge(20000, 64).unwrap()]).unwrap();
    qb.post_recv(103, &[]).unwrap();
    // UC has no RNR: a SEND that meets no receive is lost, and on the daemon path a receive
    // and a SEND in two rings have no order. So the receives (B's, and A's for the answer
    // at the end) are posted before the sender connects, several round trips to the daemon
    // before the SENDs that need them.
    connect(&qa, gb, qb.qpn(), RWR);
    qa.post_recv(200, &[ma.sge(60000, 100).unwrap()]).unwrap();
    let direct_now = qa.is_direct() && qb.is_direct();

    let send = |id, op, sges: &[Sge], signaled| {
        let mut w = SendRequest::new(id, op, sges);
        w.signaled = signaled;
        qa.post_send(&w).unwrap();
    };
    let rb = mb.remote();
    send(1, SendOp::Send, &[ma.sge(0, 3000).unwrap()], true);
    send(
        2,
        SendOp::SendWithImm(0x1234),
        &[ma.sge(100, 50).unwrap(), ma.sge(4000, 5000).unwrap()],
        true,
    );
    send(
        3,
        SendOp::Write {
            remote_addr: rb.addr + 30000,
            rkey: rb.rkey,
        },
        &[ma.sge(0, 9000).unwrap()],
        false,
    );
    let mut w = SendRequest::new(4, SendOp::Send, &[]);
    w.inline = Some(b"inline bytes");
    qa.post_send(&w).unwrap();
    send(
        5,
        SendOp::WriteWithImm {
            remote_addr: rb.addr + 40000,
            rkey: rb.rkey,
            imm: 77,
        },
        &[ma.sge(500, 700).unwrap()],
        true,
    );
    let reads = t == QpType::Rc;
    if reads {
        send(
            6,
            SendOp::Read {
                remote_addr: rb.addr + 30000,
                rkey: rb.rkey,
            },
            &[ma.sge(50000, 9000).unwrap()],
            true,
        );
    }
    let na = if reads { 5 } else { 4 };
    let wa = wait(&sa.cq, na);
    let wb = wait(&sb.cq, 4);
    // And one back the other way.
    let mut back = SendRequest::new(300, SendOp::Send, &[]);
    back.inline = Some(b"pong");
    qb.post_send(&back).unwrap();
    let mut wa2 = wait(&sa.cq, 1);
    let mut wb2 = wait(&sb.cq, 1);
    let mut wa = wa;
    wa.append(&mut wa2);
    let mut wb = wb;
    wb.append(&mut wb2);
    let mut bytes = vec![0u8; 50000];
    mb.read(0, &mut bytes).unwrap();
    let mut tail = vec![0u8; 9000];
    ma.read(50000, &mut tail).unwrap();
    bytes.extend(tail);
    let mut pong = vec![0u8; 4];
    ma.read(60000, &mut pong).unwrap();
    bytes.extend(pong);
    (wa, wb, bytes, direct_now)
}

#[test]
fn a_mixed_rc_sequence_completes_the_same_on_both_paths() {
    let (d, _dir) = common::daemon("dmix", None);
    let daemon = mixed(&d.socket, false, QpType::Rc);
    let direct = mixed(&d.socket, true, QpType::Rc);
    assert!(!daemon.3, "without asking, the engine carries the work");
    assert!(direct.3, "both asked: the pair went direct");
    assert_eq!(direct.0, daemon.0, "requester completions");
    assert_eq!(direct.1, daemon.1, "responder completions");
    assert!(direct.2 == daemon.2, "the bytes that arrived differ");
    assert_eq!(&direct.2[50000 + 9000..], b"pong");
}

/// The channel's receive ring carries only the SGEs a receive has (docs/design/direct-path.md,
/// "Speed"): a receive with fewer SGEs in a slot a longer one used before must scatter over
/// its own SGEs only. Twelve rounds through a ring of four, 3, 1 and 2 SGEs in turn.
#[test]
fn receives_of_fewer_sges_in_reused_ring_slots_scatter_over_their_own() {
    let (d, _dir) = common::daemon("dsges", None);
    let p = open_pair(&d.socket, true);
    let (sa, sb) = (side(&p.a), side(&p.b));
    let small = QpCap {
        max_recv_wr: 4,
        ..cap()
    };
    fn mk<'a>(s: &'a Side<'a>, cap: QpCap) -> Qp<'a> {
        s.pd.context()
            .create_qp(&QpInit::new(QpType::Rc, &s.pd).cqs(&s.cq, &s.cq).cap(cap))
            .unwrap()
    }
    let (qa, qb) = (mk(&sa, small), mk(&sb, small));
    let (ga, gb) = (p.a.query_gid(1, 0).unwrap(), p.b.query_gid(1, 0).unwrap());
    connect(&qb, ga, qa.qpn(), RWR);
    connect(&qa, gb, qb.qpn(), RWR);
    assert!(qa.is_direct() && qb.is_direct());
    let mut abuf = vec![0u8; 4096];
    let mut bbuf = vec![0u8; 4096];
    let ma: BorrowedMr<'_> = sa.pd.reg_slice(&mut abuf, RWR).unwrap();
    let mb: BorrowedMr<'_> = sb.pd.reg_slice(&mut bbuf, RWR).unwrap();
    for round in 0..12u64 {
        let n = [3usize, 1, 2][round as usize % 3];
        // Each receive SGE is 10 bytes at its own 256-byte area; the SEND fills them all.
        let sges: Vec<Sge> = (0..n).map(|k| mb.sge(256 * k, 10).unwrap()).collect();
        qb.post_recv(round, &sges).unwrap();
        let fill = 1 + round as u8;
        ma.write(0, &vec![fill; 10 * n]).unwrap();
        let src = [ma.sge(0, 10 * n).unwrap()];
        let w = SendRequest::new(round, SendOp::Send, &src);
        qa.post_send(&w).unwrap();
        let got = wait(&sb.cq, 1);
        assert_eq!(got[0].0, round);
        assert_eq!(got[0].1, WcStatus::Success, "round {round}");
        assert_eq!(got[0].3, 10 * n as u32);
        for k in 0..n {
            let mut area = [0u8; 10];
            mb.read(256 * k, &mut area).unwrap();
            assert_eq!(area, [fill; 10], "round {round}: receive SGE {k}");
        }
        wait(&sa.cq, 1);
    }
}

#[test]
fn a_mixed_uc_sequence_completes_the_same_on_both_paths() {
    let (d, _dir) = common::daemon("dmixuc", None);
    let daemon = mixed(&d.socket, false, QpType::Uc);
    let direct = mixed(&d.socket, true, QpType::Uc);
    assert!(direct.3 && !daemon.3);
    assert_eq!(direct.0, daemon.0, "requester completions");
    assert_eq!(direct.1, daemon.1, "responder completions");
    assert!(
        direct.2[..50000] == daemon.2[..50000],
        "the bytes that arrived differ"
    );
}

#[test]
fn a_pair_that_allows_remote_atomics_goes_direct_and_adds() {
    let (d, _dir) = common::daemon("datomic", None);
    let p = open_pair(&d.socket, true);
    let (sa, sb) = (side(&p.a), side(&p.b));
    let (qa, qb) = (qp(&sa, QpType::Rc), qp(&sb, QpType::Rc));
    let (ga, gb) = (p.a.query_gid(1, 0).unwrap(), p.b.query_gid(1, 0).unwrap());
    connect(&qa, gb, qb.qpn(), Access(0x0f));
    connect(&qb, ga, qa.qpn(), Access(0x0f));
    assert!(
        qa.is_direct() && qb.is_direct(),
        "ABI 15: atomics run on the direct path"
    );
    let mut buf = vec![0u8; 64];
    let mr = sb.pd.reg_slice(&mut buf, Access(0x0f)).unwrap();
    let mut out = vec![0u8; 8];
    let mo = sa.pd.reg_slice(&mut out, Access(0x0f)).unwrap();
    let r = mr.remote();
    qa.post_send(&SendRequest::new(
        1,
        SendOp::FetchAdd {
            remote_addr: r.addr,
            rkey: r.rkey,
            add: 5,
        },
        &[mo.sge(0, 8).unwrap()],
    ))
    .unwrap();
    assert_eq!(wait(&sa.cq, 1)[0].1, WcStatus::Success);
    let mut word = [0u8; 8];
    mr.read(0, &mut word).unwrap();
    assert_eq!(u64::from_ne_bytes(word), 5);
}

/// One rule broken by a request of A at B: A's completions, B's completions and B's async
/// events.
#[derive(Debug, PartialEq)]
struct Violation {
    a: Shapes,
    b: Shapes,
    b_events: Vec<softverbs::EventType>,
    a_state: QpState,
    b_state: QpState,
}

#[derive(Clone, Copy, Debug)]
enum Break {
    UnknownRkey,
    OutOfBounds,
    OtherPd,
    NoRemoteWrite,
    ReadWithoutAccess,
    ShortReceive,
    BadLocalKey,
}

fn violate(socket: &std::path::Path, direct: bool, how: Break) -> Violation {
    let p = open_pair(socket, direct);
    let (sa, sb) = (side(&p.a), side(&p.b));
    let (qa, qb) = (qp(&sa, QpType::Rc), qp(&sb, QpType::Rc));
    let other_pd = p.b.alloc_pd().unwrap();
    let (ga, gb) = (p.a.query_gid(1, 0).unwrap(), p.b.query_gid(1, 0).unwrap());
    let mut abuf = vec![0u8; 8192];
    let mut bbuf = vec![0u8; 8192];
    let mut cbuf = vec![0u8; 8192];
    let mut dbuf = vec![0u8; 8192];
    let ma = sa.pd.reg_slice(&mut abuf, RWR).unwrap();
    let mb = sb.pd.reg_slice(&mut bbuf, RWR).unwrap();
    let m_other = other_pd.reg_slice(&mut cbuf, RWR).unwrap();
    let m_local = sb.pd.reg_slice(&mut dbuf, Access(0x01)).unwrap();
    connect(&qa, gb, qb.qpn(), RWR);
    connect(&qb, ga, qa.qpn(), RWR);
    assert_eq!(qa.is_direct(), direct);
    qb.post_recv(10, &[mb.sge(0, 16).unwrap()]).unwrap();
    qb.post_recv(11, &[mb.sge(16, 16).unwrap()]).unwrap();
    let write = |remote_addr, rkey| SendOp::Write { remote_addr, rkey };
    let rb = mb.remote();
    let s = [ma.sge(0, 64).unwrap()];
    let op = match how {
        Break::UnknownRkey => write(rb.addr, rb.rkey ^ 0x5555),
        Break::OutOfBounds => write(rb.addr + 8192 - 32, rb.rkey),
        Break::OtherPd => write(m_other.remote().addr, m_other.remote().rkey),
        Break::NoRemoteWrite => write(m_local.remote().addr, m_local.remote().rkey),
        Break::ReadWithoutAccess => SendOp::Read {
            remote_addr: m_local.remote().addr,
            rkey: m_local.remote().rkey,
        },
        Break::ShortReceive | Break::BadLocalKey => SendOp::Send,
    };
    let bad_local = [Sge {
        addr: s[0].addr,
        length: 64,
        lkey: s[0].lkey ^ 0x7777,
    }];
    let sges: &[Sge] = if matches!(how, Break::BadLocalKey) {
        &bad_local
    } else {
        &s
    };
    qa.post_send(&SendRequest::new(1, op, sges)).unwrap();
    qa.post_send(&SendRequest::new(2, SendOp::Send, &[ma.sge(0, 8).unwrap()]))
        .unwrap();
    let wa = wait(&sa.cq, 2);
    // B: the short receive fails and the rest flush; after an access error B's QP is in ERR
    // and both receives flush; after a local protection error at A, B is untouched and the
    // second SEND was flushed at A, so B's receives are still posted.
    let nb = match how {
        Break::BadLocalKey => 0,
        _ => 2,
    };
    let deadline = Instant::now() + WAIT;
    let mut b_events = Vec::new();
    while Instant::now() < deadline && b_events.is_empty() && nb > 0 {
        match p.b.try_get_async_event() {
            Ok(Some(e)) => b_events.extend(e.event_type),
            _ => std::thread::sleep(Duration::from_millis(5)),
        }
        if matches!(how, Break::ShortReceive) {
            break; // no event for it (the responder fails without one)
        }
    }
    let wb = if nb > 0 { wait(&sb.cq, nb) } else { Vec::new() };
    let state = |q: &Qp<'_>| q.query().unwrap().attr.qp_state;
    Violation {
        a: wa,
        b: wb,
        b_events,
        a_state: state(&qa),
        b_state: state(&qb),
    }
}

#[test]
fn broken_rules_give_the_statuses_and_events_of_the_daemon_path() {
    let (d, _dir) = common::daemon("dviol", None);
    for how in [
        Break::UnknownRkey,
        Break::OutOfBounds,
        Break::OtherPd,
        Break::NoRemoteWrite,
        Break::ReadWithoutAccess,
        Break::ShortReceive,
        Break::BadLocalKey,
    ] {
        let engine = violate(&d.socket, false, how);
        let direct = violate(&d.socket, true, how);
        assert_eq!(direct, engine, "{how:?}");
        assert_ne!(engine.a[0].1, WcStatus::Success, "{how:?} broke a rule");
    }
}

const ROLE: &str = "SOFTVERBS_DIRECT_TEST_ROLE";
const SOCKET: &str = "SOFTVERBS_DIRECT_TEST_SOCKET";
/// `shared`: the victim's receive buffer is shared memory (`Pd::alloc_mr`), which its
/// partner's library maps.
const MEM: &str = "SOFTVERBS_DIRECT_TEST_MEM";

/// The victim: connects to the QP number it reads on stdin, prints its own, then receives
/// and sends forever until it is killed.
#[test]
fn victim_role() {
    if std::env::var(ROLE).is_err() {
        return;
    }
    use std::io::{BufRead, Write};
    let socket = std::path::PathBuf::from(std::env::var(SOCKET).unwrap());
    let ctx = Context::open_at_direct(&socket, 0, true).unwrap();
    let s = side(&ctx);
    let q = qp(&s, QpType::Rc);
    let gid = ctx.query_gid(1, 0).unwrap();
    println!("QPN {}", q.qpn());
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    let peer: u32 = line.trim().parse().unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mr = s.pd.reg_slice(&mut buf, RWR).unwrap();
    let mut owned = s.pd.alloc_mr(1 << 16, RWR).unwrap();
    let shared = owned.take(1 << 16).unwrap();
    let sge = if std::env::var(MEM).is_ok_and(|m| m == "shared") {
        Sge {
            addr: shared.remote().addr,
            length: 1 << 16,
            lkey: shared.lkey(),
        }
    } else {
        mr.sge(0, 1 << 16).unwrap()
    };
    connect(&q, gid, peer, RWR);
    for i in 0..32 {
        q.post_recv(i, &[sge]).unwrap();
    }
    println!("READY {}", q.is_direct());
    std::io::stdout().flush().unwrap();
    // Take whatever comes, reposting, until killed.
    let mut n = 32;
    loop {
        for _ in s.cq.poll(16).unwrap() {
            q.post_recv(n, &[sge]).unwrap();
            n += 1;
        }
        std::thread::yield_now();
    }
}

use common::Reaped;

/// Starts the victim, connects `q` to its QP and waits until it is connected (direct).
fn victim(socket: &std::path::Path, q: &Qp<'_>, gid: softverbs::Gid) -> (Reaped, u32) {
    victim_with(socket, q, gid, "private")
}

fn victim_with(
    socket: &std::path::Path,
    q: &Qp<'_>,
    gid: softverbs::Gid,
    mem: &str,
) -> (Reaped, u32) {
    use std::io::{BufRead, BufReader, Write};
    let d_socket = socket;
    let mut child = Reaped(
        Command::new(std::env::current_exe().unwrap())
            .args(["victim_role", "--exact", "--test-threads=1", "--nocapture"])
            .env(ROLE, "victim")
            .env(SOCKET, d_socket)
            .env(MEM, mem)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let mut line = String::new();
    let victim_qpn = loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the victim said nothing"
        );
        // libtest may have printed the test's name on the same line.
        if let Some(at) = line.find("QPN ") {
            break line[at + 4..].trim().parse::<u32>().unwrap();
        }
    };
    let victim_pid = child.0.id();
    connect(q, gid, victim_qpn, RWR);
    writeln!(child.0.stdin.as_mut().unwrap(), "{}", q.qpn()).unwrap();
    let ready = loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the victim died early"
        );
        if let Some(at) = line.find("READY ") {
            break line[at + 6..].trim() == "true";
        }
    };
    assert!(ready, "the victim's QP went direct");
    // Keep reading its output so it never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut sink = String::new();
        while out.read_line(&mut sink).is_ok_and(|n| n > 0) {
            sink.clear();
        }
    });
    (child, victim_pid)
}

#[test]
fn an_idle_partner_of_a_killed_peer_fails_at_its_next_request() {
    let (d, _dir) = common::daemon("didle", None);
    let ctx = Context::open_at_direct(&d.socket, 0, true).unwrap();
    let s = side(&ctx);
    let q = qp(&s, QpType::Rc);
    let gid = ctx.query_gid(1, 0).unwrap();
    let (mut child, victim_pid) = victim(&d.socket, &q, gid);
    let mut buf = vec![0u8; 4096];
    let mr = s.pd.reg_slice(&mut buf, RWR).unwrap();
    for i in 0..3 {
        q.post_recv(i, &[mr.sge(0, 4096).unwrap()]).unwrap();
    }
    assert!(s.cq.poll(16).unwrap().is_empty());
    child.0.kill().unwrap(); // SIGKILL
    child.0.wait().unwrap();
    // Nothing was in flight: what tells this side is the daemon, which marks the channel
    // when it closes the dead process's context.
    let info = Introspect::connect_at(&d.socket).unwrap();
    let deadline = Instant::now() + WAIT;
    while info.resources().unwrap()["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["pid"].as_u64() == Some(u64::from(victim_pid)))
    {
        assert!(
            Instant::now() < deadline,
            "the daemon kept the victim's context"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // As on the engine, an RC QP with nothing to send learns nothing of it: its receives
    // stay posted (ibv_rc_pingpong's last receives, when its peer exits first)...
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        s.cq.poll(16).unwrap().is_empty(),
        "nothing completes by itself"
    );
    assert_eq!(q.query().unwrap().attr.qp_state, QpState::Rts);
    // ...until it sends: its retries run out, and its receives flush.
    q.post_send(&SendRequest::new(9, SendOp::Send, &[mr.sge(0, 8).unwrap()]))
        .unwrap();
    let got = wait(&s.cq, 4);
    assert_eq!(
        got.iter().map(|w| (w.0, w.1)).collect::<Vec<_>>(),
        vec![
            (9, WcStatus::RetryExcErr),
            (0, WcStatus::WrFlushErr),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(q.query().unwrap().attr.qp_state, QpState::Err);
}

#[test]
fn a_peer_killed_mid_transfer_fails_its_partner_and_leaves_nothing() {
    killed_mid_transfer("dkill", "private", 1 << 16);
}

/// The same with the victim's receive buffer in shared memory, which the partner's library
/// maps (docs/design/direct-path.md "Shared-memory MRs"): the mapping outlives the victim, and the
/// partner must still fail, not complete into it.
#[test]
fn a_peer_killed_while_its_mapped_memory_is_written_fails_its_partner() {
    killed_mid_transfer("dkillmap", "shared", 1 << 16);
}

/// The same with SENDs small enough to go through the inline slots.
#[test]
fn a_peer_killed_while_taking_small_sends_fails_its_partner() {
    killed_mid_transfer("dkillinl", "private", 64);
}

fn killed_mid_transfer(name: &str, mem: &str, size: usize) {
    let (d, _dir) = common::daemon(name, None);
    let ctx = Context::open_at_direct(&d.socket, 0, true).unwrap();
    let s = side(&ctx);
    let q = qp(&s, QpType::Rc);
    let gid = ctx.query_gid(1, 0).unwrap();
    let (mut child, victim_pid) = victim_with(&d.socket, &q, gid, mem);
    let mut buf = vec![7u8; size];
    let mr = s.pd.reg_slice(&mut buf, RWR).unwrap();
    // Stream SENDs; kill the victim while they flow, and keep posting until the partner
    // learns of it.
    let mut posted = 0u64;
    let mut done: Vec<WorkCompletion> = Vec::new();
    let start = Instant::now();
    let mut killed_at: Option<Instant> = None;
    let sge = [mr.sge(0, size).unwrap()];
    loop {
        let failed = done.iter().any(|w| w.status != WcStatus::Success);
        if failed && done.len() as u64 == posted {
            break;
        }
        if let Some(k) = killed_at {
            assert!(
                k.elapsed() < WAIT,
                "no error {:?} after the kill",
                k.elapsed()
            );
        }
        if posted - (done.len() as u64) < 16 && !failed {
            let mut w = SendRequest::new(posted, SendOp::Send, &sge);
            w.signaled = true;
            q.post_send(&w).unwrap();
            posted += 1;
        }
        done.extend(s.cq.poll(16).unwrap());
        if posted == 100 && killed_at.is_none() {
            assert!(q.is_direct());
            child.0.kill().unwrap(); // SIGKILL
            child.0.wait().unwrap();
            killed_at = Some(Instant::now());
        }
        std::thread::yield_now();
    }
    assert!(start.elapsed() < WAIT * 2);
    // Every request completed exactly once, in order: successes, then one error, then
    // flushes.
    assert_eq!(done.len() as u64, posted, "completions: {done:?}");
    for (i, w) in done.iter().enumerate() {
        assert_eq!(w.wr_id, i as u64);
    }
    let first_bad = done
        .iter()
        .position(|w| w.status != WcStatus::Success)
        .expect("the partner saw an error");
    println!(
        "{posted} posted, the first error ({:?}) at {first_bad}, {:?} after the kill",
        done[first_bad].status,
        killed_at.unwrap().elapsed()
    );
    assert_eq!(done[first_bad].status, WcStatus::RetryExcErr);
    assert!(done[first_bad + 1..]
        .iter()
        .all(|w| w.status == WcStatus::WrFlushErr));
    assert_eq!(q.query().unwrap().attr.qp_state, QpState::Err);
    // The daemon holds nothing of the dead process.
    common::wait_until_nothing_of(&d.socket, victim_pid, WAIT);
}

/// Small SENDs (carried in the completion's inline slot and placed by the receiver's library,
/// docs/design/direct-path.md "Small SENDs"), a large SEND, a WRITE and a READ, all into the same
/// bytes of B, with B polling in between only once: the bytes end as posting order says
/// whoever copied them, completions come in order, and a receive shorter than a small SEND
/// fails as the engine fails it. Returns (A's completions, B's, B's bytes 0..6000, A's READ).
fn overlapping(socket: &std::path::Path, direct: bool) -> (Shapes, Shapes, Vec<u8>, Vec<u8>) {
    let p = open_pair(socket, direct);
    let (sa, sb) = (side(&p.a), side(&p.b));
    let (qa, qb) = (qp(&sa, QpType::Rc), qp(&sb, QpType::Rc));
    let (ga, gb) = (p.a.query_gid(1, 0).unwrap(), p.b.query_gid(1, 0).unwrap());
    let mut abuf = vec![0u8; 1 << 15];
    abuf[..16].fill(b'a');
    abuf[16..6016].fill(b'b');
    abuf[6016..6032].fill(b'c');
    abuf[6032..6036].fill(b'd');
    let mut bbuf = vec![0u8; 1 << 14];
    let ma: BorrowedMr<'_> = sa.pd.reg_slice(&mut abuf, RWR).unwrap();
    let mb: BorrowedMr<'_> = sb.pd.reg_slice(&mut bbuf, RWR).unwrap();
    connect(&qb, ga, qa.qpn(), RWR);
    connect(&qa, gb, qb.qpn(), RWR);
    assert_eq!(qa.is_direct() && qb.is_direct(), direct);
    // Two SGEs for the first small SEND; all receives overlap at B's byte 0.
    qb.post_recv(1, &[mb.sge(0, 8).unwrap(), mb.sge(100, 8).unwrap()])
        .unwrap();
    qb.post_recv(2, &[mb.sge(0, 6000).unwrap()]).unwrap();
    qb.post_recv(3, &[mb.sge(0, 16).unwrap()]).unwrap();
    let send = |id, op, sges: &[Sge]| qa.post_send(&SendRequest::new(id, op, sges)).unwrap();
    let rb = mb.remote();
    send(11, SendOp::Send, &[ma.sge(0, 16).unwrap()]);
    let mut wa = wait(&sa.cq, 1);
    // B takes the first completion itself (the receiver places the inline bytes).
    let mut wb = wait(&sb.cq, 1);
    let mut first = vec![0u8; 8];
    mb.read(100, &mut first).unwrap();
    assert_eq!(first, b"aaaaaaaa", "second SGE of the first receive");
    send(12, SendOp::Send, &[ma.sge(16, 6000).unwrap()]);
    send(13, SendOp::SendWithImm(5), &[ma.sge(6016, 16).unwrap()]);
    send(
        14,
        SendOp::Write {
            remote_addr: rb.addr + 8,
            rkey: rb.rkey,
        },
        &[ma.sge(6032, 4).unwrap()],
    );
    send(
        15,
        SendOp::Read {
            remote_addr: rb.addr,
            rkey: rb.rkey,
        },
        &[ma.sge(20000, 32).unwrap()],
    );
    wa.extend(wait(&sa.cq, 4));
    wb.extend(wait(&sb.cq, 2));
    let mut bytes = vec![0u8; 6000];
    mb.read(0, &mut bytes).unwrap();
    let mut read = vec![0u8; 32];
    ma.read(20000, &mut read).unwrap();
    // A receive shorter than a small SEND.
    qb.post_recv(4, &[mb.sge(200, 4).unwrap()]).unwrap();
    send(16, SendOp::Send, &[ma.sge(0, 16).unwrap()]);
    wa.extend(wait(&sa.cq, 1));
    wb.extend(wait(&sb.cq, 1));
    (wa, wb, bytes, read)
}

#[test]
fn small_sends_keep_their_place_among_larger_sends_writes_and_reads() {
    let (d, _dir) = common::daemon("dinl", None);
    let daemon = overlapping(&d.socket, false);
    let direct = overlapping(&d.socket, true);
    let mut want = vec![b'b'; 6000];
    want[..16].fill(b'c');
    want[8..12].fill(b'd');
    assert!(
        daemon.2 == want,
        "daemon path bytes: {:?}",
        &daemon.2[..120]
    );
    assert!(direct.2 == want, "direct bytes: {:?}", &direct.2[..120]);
    assert_eq!(
        direct.3,
        want[..32],
        "the READ sees every earlier SEND and the WRITE"
    );
    assert_eq!(direct.0, daemon.0, "requester completions");
    assert_eq!(direct.1, daemon.1, "responder completions");
    let st: Vec<WcStatus> = direct.1.iter().map(|w| w.1).collect();
    assert_eq!(st.last(), Some(&WcStatus::LocLenErr), "{:?}", direct.1);
    assert_eq!(direct.0.last().map(|w| w.1), Some(WcStatus::RemInvReqErr));
    let ids: Vec<u64> = direct.1.iter().map(|w| w.0).collect();
    assert_eq!(ids, [1, 2, 3, 4], "receives complete in order");
}

/// WRITE and READ into a peer's MR registered as shared memory (`Pd::alloc_mr`: the peer
/// library maps its memfd, docs/design/direct-path.md "Shared-memory MRs"), a SEND into it, and,
/// once the owner deregistered it, `REM_ACCESS_ERR` with nothing written.
#[test]
fn a_peers_shared_memory_mr_is_reached_until_it_is_deregistered() {
    let (d, _dir) = common::daemon("dmap", None);
    let p = open_pair(&d.socket, true);
    let (sa, sb) = (side(&p.a), side(&p.b));
    let (qa, qb) = (qp(&sa, QpType::Rc), qp(&sb, QpType::Rc));
    let (ga, gb) = (p.a.query_gid(1, 0).unwrap(), p.b.query_gid(1, 0).unwrap());
    let mut abuf = vec![0u8; 1 << 16];
    for (i, b) in abuf.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let ma: BorrowedMr<'_> = sa.pd.reg_slice(&mut abuf, RWR).unwrap();
    let mut mb = sb.pd.alloc_mr(1 << 16, RWR).unwrap();
    let mut bbuf = mb.take(1 << 16).unwrap();
    let rb = bbuf.remote();
    connect(&qb, ga, qa.qpn(), RWR);
    connect(&qa, gb, qb.qpn(), RWR);
    assert!(qa.is_direct() && qb.is_direct());
    let write = |id, at: u64, len: u32| {
        let op = SendOp::Write {
            remote_addr: rb.addr + at,
            rkey: rb.rkey,
        };
        qa.post_send(&SendRequest::new(
            id,
            op,
            &[ma.sge(0, len as usize).unwrap()],
        ))
        .unwrap();
    };
    write(1, 1000, 40000);
    assert_eq!(wait(&sa.cq, 1)[0].1, WcStatus::Success);
    let mut got = vec![0u8; 40000];
    bbuf.read(1000, &mut got).unwrap();
    assert!(got == abuf_copy(&ma, 40000), "written bytes differ");
    bbuf.write(50000, b"from the owner").unwrap();
    let op = SendOp::Read {
        remote_addr: rb.addr + 50000,
        rkey: rb.rkey,
    };
    qa.post_send(&SendRequest::new(2, op, &[ma.sge(60000, 14).unwrap()]))
        .unwrap();
    assert_eq!(wait(&sa.cq, 1)[0].1, WcStatus::Success);
    let mut r = vec![0u8; 14];
    ma.read(60000, &mut r).unwrap();
    assert_eq!(r, b"from the owner");
    // A large SEND into a receive in the shared MR.
    let sge = Sge {
        addr: rb.addr + 20000,
        length: 9000,
        lkey: bbuf.lkey(),
    };
    qb.post_recv(7, &[sge]).unwrap();
    qa.post_send(&SendRequest::new(
        3,
        SendOp::Send,
        &[ma.sge(100, 9000).unwrap()],
    ))
    .unwrap();
    assert_eq!(wait(&sa.cq, 1)[0].1, WcStatus::Success);
    assert_eq!(wait(&sb.cq, 1)[0].1, WcStatus::Success);
    let mut sent = vec![0u8; 9000];
    bbuf.read(20000, &mut sent).unwrap();
    let mut want = vec![0u8; 9100];
    ma.read(0, &mut want).unwrap();
    assert!(sent == want[100..], "SEND bytes differ");
    // The owner deregisters: the peer's next WRITE finds the key gone.
    let mut before = vec![0u8; 16];
    bbuf.read(0, &mut before).unwrap();
    // The Buf keeps the memory allocated after the registration is gone, so it can be
    // checked.
    mb.dereg().unwrap();
    write(4, 0, 16);
    assert_eq!(wait(&sa.cq, 1)[0].1, WcStatus::RemAccessErr);
    let mut after = vec![0u8; 16];
    bbuf.read(0, &mut after).unwrap();
    assert_eq!(after, before, "nothing written after dereg");
}

fn abuf_copy(m: &BorrowedMr<'_>, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    m.read(0, &mut v).unwrap();
    v
}

/// A small SEND delivered (inline, not yet placed: the receiver has not polled) to a receive
/// whose MR the receiver then deregisters: its bytes land before the deregistration returns,
/// as a NIC would have placed them on arrival, and the completion says so — on both paths.
fn dereg_before_poll(socket: &std::path::Path, direct: bool) -> (Shapes, Vec<u8>) {
    let p = open_pair(socket, direct);
    let (sa, sb) = (side(&p.a), side(&p.b));
    let (qa, qb) = (qp(&sa, QpType::Rc), qp(&sb, QpType::Rc));
    let (ga, gb) = (p.a.query_gid(1, 0).unwrap(), p.b.query_gid(1, 0).unwrap());
    let mut abuf = *b"sixteen bytes!!!";
    let mut bbuf = vec![0u8; 64];
    let ma = sa.pd.reg_slice(&mut abuf, RWR).unwrap();
    let mb = sb.pd.reg_slice(&mut bbuf, RWR).unwrap();
    connect(&qb, ga, qa.qpn(), RWR);
    connect(&qa, gb, qb.qpn(), RWR);
    assert_eq!(qa.is_direct() && qb.is_direct(), direct);
    qb.post_recv(1, &[mb.sge(8, 16).unwrap()]).unwrap();
    let sge = [ma.sge(0, 16).unwrap()];
    qa.post_send(&SendRequest::new(2, SendOp::Send, &sge))
        .unwrap();
    assert_eq!(wait(&sa.cq, 1)[0].1, WcStatus::Success);
    drop(mb);
    let got = wait(&sb.cq, 1);
    drop(ma);
    (got, bbuf)
}

#[test]
fn inline_bytes_are_placed_before_their_receive_buffer_is_deregistered() {
    let (d, _dir) = common::daemon("dinldereg", None);
    let daemon = dereg_before_poll(&d.socket, false);
    let direct = dereg_before_poll(&d.socket, true);
    assert_eq!(&daemon.1[8..24], b"sixteen bytes!!!");
    assert_eq!(direct.0, daemon.0);
    assert_eq!(direct.1, daemon.1);
}

/// A stream of small SENDs through a receive queue four deep, so every inline slot is reused
/// every fourth message, from two threads on two CPUs, with a WRITE every seventh message
/// (the sender settles its unplaced slots first): each receive holds its own message, whole,
/// in order, none lost or doubled, and every request completes successfully. The sender
/// reuses a slot without reading its state once the ring shows its last entry popped
/// (`INLINE_FREES_FIRST`); this is the direct path's counterpart of the daemon path's soak.
#[test]
fn a_stream_of_small_sends_through_a_shallow_queue_arrives_whole_and_in_order() {
    const N: u32 = 5_000;
    const DEPTH: usize = 4;
    const MSG: usize = 40;
    let (d, _dir) = common::daemon("dstream", None);
    let p = open_pair(&d.socket, true);
    let (sa, sb) = (side(&p.a), side(&p.b));
    let shallow = QpCap {
        max_recv_wr: DEPTH as u32,
        ..cap()
    };
    fn mk<'a>(s: &'a Side<'a>, cap: QpCap) -> Qp<'a> {
        s.pd.context()
            .create_qp(&QpInit::new(QpType::Rc, &s.pd).cqs(&s.cq, &s.cq).cap(cap))
            .unwrap()
    }
    let (qa, qb) = (mk(&sa, shallow), mk(&sb, shallow));
    let (ga, gb) = (p.a.query_gid(1, 0).unwrap(), p.b.query_gid(1, 0).unwrap());
    let mut abuf = vec![0u8; MSG * 64 + 64];
    let mut bbuf = vec![0u8; MSG * DEPTH + 64];
    let ma: BorrowedMr<'_> = sa.pd.reg_slice(&mut abuf, RWR).unwrap();
    let mb: BorrowedMr<'_> = sb.pd.reg_slice(&mut bbuf, RWR).unwrap();
    common::connect_with(&qb, ga, qa.qpn(), common::RcPath::default());
    common::connect_with(&qa, gb, qb.qpn(), common::RcPath::default());
    assert!(qa.is_direct() && qb.is_direct());
    let msg = |i: u32| -> Vec<u8> { (0..MSG).map(|k| (i as usize * 31 + k * 7) as u8).collect() };
    let rb = mb.remote();
    let end = Instant::now() + Duration::from_secs(120);
    std::thread::scope(|t| {
        t.spawn(|| {
            // Up to 32 requests outstanding, each SEND's bytes in its own place of the source
            // buffer, not rewritten before it completes.
            let (mut posted, mut outstanding) = (0u32, 0u32);
            while (posted < N || outstanding > 0) && Instant::now() < end {
                while posted < N && outstanding < 32 {
                    let i = posted;
                    let at = (i as usize % 32) * MSG;
                    ma.write(at, &msg(i)).unwrap();
                    let sge = [ma.sge(at, MSG).unwrap()];
                    qa.post_send(&SendRequest::new(u64::from(i), SendOp::Send, &sge))
                        .unwrap();
                    outstanding += 1;
                    if i % 7 == 0 {
                        let write = SendOp::Write {
                            remote_addr: rb.addr + (MSG * DEPTH) as u64,
                            rkey: rb.rkey,
                        };
                        let src = [ma.sge(MSG * 64, 8).unwrap()];
                        qa.post_send(&SendRequest::new(u64::MAX, write, &src))
                            .unwrap();
                        outstanding += 1;
                    }
                    posted += 1;
                }
                for w in sa.cq.poll(16).unwrap() {
                    assert_eq!(w.status, WcStatus::Success, "{w:?}");
                    outstanding -= 1;
                }
            }
        });
        for k in 0..DEPTH {
            qb.post_recv(k as u64, &[mb.sge(k * MSG, MSG).unwrap()])
                .unwrap();
        }
        let mut next = 0u32;
        let mut got = vec![0u8; MSG];
        while next < N && Instant::now() < end {
            for w in sb.cq.poll(DEPTH).unwrap() {
                assert_eq!(w.status, WcStatus::Success, "receive {next}: {w:?}");
                assert_eq!(w.byte_len as usize, MSG);
                let k = w.wr_id as usize;
                assert_eq!(k, next as usize % DEPTH, "receives complete in order");
                mb.read(k * MSG, &mut got).unwrap();
                assert!(got == msg(next), "message {next}: {got:?}");
                // Scribbled over, so a receive whose bytes never land is seen as such.
                mb.write(k * MSG, &[0xee; MSG]).unwrap();
                next += 1;
                if next + (DEPTH as u32) <= N {
                    qb.post_recv(k as u64, &[mb.sge(k * MSG, MSG).unwrap()])
                        .unwrap();
                }
            }
        }
        assert_eq!(next, N, "messages received before the deadline");
    });
}

/// `Cq::fed_directly` (what the drop-in's `ibv_poll_cq` asks before it spins rather than
/// yields on an empty poll): true for the CQ of a QP pair on the direct path, false on the
/// daemon path and for a CQ no QP completes to.
#[test]
fn a_cq_is_fed_directly_only_when_its_qps_are_direct() {
    let (d, _dir) = common::daemon("dfed", None);
    for direct in [true, false] {
        let p = open_pair(&d.socket, direct);
        let (sa, sb) = (side(&p.a), side(&p.b));
        let lonely = p.a.create_cq(16).unwrap();
        let (qa, qb) = (qp(&sa, QpType::Rc), qp(&sb, QpType::Rc));
        let (ga, gb) = (p.a.query_gid(1, 0).unwrap(), p.b.query_gid(1, 0).unwrap());
        assert!(!sa.cq.fed_directly(), "before the path is decided");
        connect(&qb, ga, qa.qpn(), RWR);
        connect(&qa, gb, qb.qpn(), RWR);
        assert_eq!(qa.is_direct() && qb.is_direct(), direct);
        assert_eq!(sa.cq.fed_directly(), direct, "direct {direct}");
        assert_eq!(sb.cq.fed_directly(), direct, "direct {direct}");
        assert!(!lonely.fed_directly(), "a CQ no QP uses");
    }
}

/// The descriptors charged to this uid (`resources`' `limits`, docs/guide/limits.md).
fn descriptors_used(look: &softverbs::Introspect) -> u64 {
    look.resources().unwrap()["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["resource"] == "descriptors")
        .unwrap()["used"]
        .as_u64()
        .unwrap()
}

/// Two contexts with an RC QP each, connected on the direct path if it is offered: whether
/// both went direct, with the uid's descriptors before and after connecting.
fn direct_pair_fds(socket: &std::path::Path) -> (bool, u64, u64) {
    let look = softverbs::Introspect::connect_at(socket).unwrap();
    let p = open_pair(socket, true);
    let (sa, sb) = (side(&p.a), side(&p.b));
    let (qa, qb) = (qp(&sa, QpType::Rc), qp(&sb, QpType::Rc));
    let (ga, gb) = (p.a.query_gid(1, 0).unwrap(), p.b.query_gid(1, 0).unwrap());
    let before = descriptors_used(&look);
    connect(&qa, gb, qb.qpn(), RWR);
    connect(&qb, ga, qa.qpn(), RWR);
    let direct = qa.is_direct() && qb.is_direct();
    let after = descriptors_used(&look);
    // Data moves either way.
    let mut buf = vec![0u8; 64];
    let mr = sb.pd.reg_slice(&mut buf, RWR).unwrap();
    let mut src = *b"pair-fds";
    let ms = sa.pd.reg_slice(&mut src, RWR).unwrap();
    let r = mr.remote();
    qa.post_send(&SendRequest::new(
        1,
        SendOp::Write {
            remote_addr: r.addr,
            rkey: r.rkey,
        },
        &[ms.sge(0, 8).unwrap()],
    ))
    .unwrap();
    assert_eq!(wait(&sa.cq, 1)[0].1, WcStatus::Success);
    let mut got = [0u8; 8];
    mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"pair-fds");
    drop((qa, qb));
    assert_eq!(descriptors_used(&look), before, "given back with the QPs");
    (direct, before, after)
}

/// The memfd of a direct pair's channel is a descriptor the daemon keeps: it counts in the
/// uid's `descriptors` share while the pair lasts, and past the share the pair stays on the
/// daemon path (issue 35's note on item 8; docs/guide/limits.md, "Descriptors").
#[test]
fn a_direct_pairs_memfd_is_charged_as_a_descriptor_and_past_the_share_it_stays_on_the_daemon_path()
{
    let (d, _dir) = common::daemon("pairfds", None);
    let (direct, before, after) = direct_pair_fds(&d.socket);
    assert!(direct, "the pair went direct");
    assert_eq!(after, before + 1, "one memfd for the pair");
    // A uid whose share is exactly what the same setup uses before connecting.
    let dir = std::env::temp_dir().join(format!("svown-{}-pairfds2", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = softverbs_daemon::Config::new(dir.join("sv.sock"));
    c.limits
        .apply(&format!("uid.descriptors={before}"))
        .unwrap();
    let d2 = softverbs_daemon::spawn_daemon_with(c).unwrap();
    let (direct, before2, after2) = direct_pair_fds(&d2.socket);
    assert_eq!(before2, before, "the same setup");
    assert!(!direct, "no descriptor left for the pair's memfd");
    assert_eq!(after2, before2);
    drop(d2);
    let _ = std::fs::remove_dir_all(&dir);
}
