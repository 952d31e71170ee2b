//! SRQs on the same-host direct path (docs/design/direct-path.md, "SRQs"): a QP that receives
//! through an SRQ goes direct with its peer, whose library takes the SRQ's receives from its
//! ring; the same work gives the same completions and bytes as through the daemon's engine;
//! one SRQ serves a direct pair and an engine pair at once, each receive used exactly once;
//! the SRQ's limit event fires once when a direct peer takes it below the limit.

use std::time::{Duration, Instant};

use softverbs::{
    Access, BorrowedMr, Context, Cq, Element, EventType, Pd, Qp, QpCap, QpInit, QpType, SendOp,
    SendRequest, Srq, SrqAttr, WcOpcode, WcStatus, SRQ_LIMIT,
};

mod common;

const RWR: Access = Access(0x07);

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 128,
        max_recv_wr: 64,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    }
}

fn connect(qp: &Qp<'_>, gid: softverbs::Gid, remote_qpn: u32) {
    let path = common::RcPath {
        access: RWR,
        ..common::RcPath::default()
    };
    common::connect_with(qp, gid, remote_qpn, path);
}

fn srq<'a>(pd: &'a Pd<'a>, max_wr: u32) -> Srq<'a> {
    pd.create_srq(SrqAttr {
        max_wr,
        max_sge: 4,
        srq_limit: 0,
    })
    .unwrap()
}

#[track_caller]
fn wait(cq: &Cq<'_>, n: usize) -> Vec<softverbs::WorkCompletion> {
    let mut got = Vec::new();
    let end = Instant::now() + Duration::from_secs(10);
    while got.len() < n && Instant::now() < end {
        let more = cq.poll(n - got.len()).unwrap();
        if more.is_empty() {
            std::thread::sleep(Duration::from_micros(100));
        }
        got.extend(more);
    }
    assert_eq!(got.len(), n, "completions: {got:?}");
    got
}

type Shape = (u64, WcStatus, WcOpcode, u32, u32);

fn shape(w: &softverbs::WorkCompletion) -> Shape {
    (w.wr_id, w.status, w.opcode, w.byte_len, w.imm_data)
}

/// SENDs of every size class (inline-sized, larger than a slot, over two receive SGEs), a
/// SEND with immediate, a WRITE with immediate and a receive too short, from A into B's SRQ;
/// returns both sides' completions, the bytes B holds, and whether the pair was direct.
fn into_srq(socket: &std::path::Path, direct: bool) -> (Vec<Shape>, Vec<Shape>, Vec<u8>, bool) {
    let a = Context::open_at_direct(socket, 0, direct).unwrap();
    let b = Context::open_at_direct(socket, 0, direct).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
    let s = srq(&pb, 32);
    let qa = a
        .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&ca, &ca).cap(cap()))
        .unwrap();
    let qb = b
        .create_qp(
            &QpInit::new(QpType::Rc, &pb)
                .cqs(&cb, &cb)
                .srq(&s)
                .cap(cap()),
        )
        .unwrap();
    let mut abuf = vec![0u8; 1 << 16];
    let mut bbuf = vec![0u8; 1 << 16];
    for (i, x) in abuf.iter_mut().enumerate() {
        *x = (i * 13 % 251) as u8;
    }
    let ma: BorrowedMr<'_> = pa.reg_slice(&mut abuf, RWR).unwrap();
    let mb: BorrowedMr<'_> = pb.reg_slice(&mut bbuf, RWR).unwrap();
    s.post_recv(10, &[mb.sge(0, 64).unwrap()]).unwrap();
    s.post_recv(
        11,
        &[mb.sge(1000, 100).unwrap(), mb.sge(4096, 8000).unwrap()],
    )
    .unwrap();
    s.post_recv(12, &[mb.sge(20000, 16).unwrap()]).unwrap();
    s.post_recv(13, &[]).unwrap();
    let (ga, gb) = (a.query_gid(1, 0).unwrap(), b.query_gid(1, 0).unwrap());
    connect(&qb, ga, qa.qpn());
    connect(&qa, gb, qb.qpn());
    let direct_now = qa.is_direct() && qb.is_direct();
    let rb = mb.remote();
    let post = |id, op, sges: &[softverbs::Sge]| {
        qa.post_send(&SendRequest::new(id, op, sges)).unwrap();
    };
    post(1, SendOp::Send, &[ma.sge(0, 40).unwrap()]);
    post(2, SendOp::Send, &[ma.sge(100, 6000).unwrap()]);
    post(3, SendOp::SendWithImm(9), &[ma.sge(7000, 16).unwrap()]);
    post(
        4,
        SendOp::WriteWithImm {
            remote_addr: rb.addr + 30000,
            rkey: rb.rkey,
            imm: 5,
        },
        &[ma.sge(9000, 3000).unwrap()],
    );
    let wa = wait(&ca, 4).iter().map(shape).collect();
    let mut wb: Vec<Shape> = wait(&cb, 4).iter().map(shape).collect();
    // One receive left, of 16 bytes, and a SEND of 17: too short.
    s.post_recv(14, &[mb.sge(40000, 16).unwrap()]).unwrap();
    post(5, SendOp::Send, &[ma.sge(0, 17).unwrap()]);
    let mut wa: Vec<Shape> = wa;
    wa.extend(
        wait(&ca, 1)
            .iter()
            .map(|w| (w.wr_id, w.status, WcOpcode::Send, 0, 0)),
    );
    wb.extend(
        wait(&cb, 1)
            .iter()
            .map(|w| (w.wr_id, w.status, WcOpcode::Recv, 0, 0)),
    );
    let mut bytes = vec![0u8; 1 << 16];
    mb.read(0, &mut bytes).unwrap();
    (wa, wb, bytes, direct_now)
}

#[test]
fn sends_into_an_srq_complete_the_same_on_both_paths() {
    let (d, _dir) = common::daemon("dsrq", None);
    let engine = into_srq(&d.socket, false);
    let direct = into_srq(&d.socket, true);
    assert!(!engine.3, "without asking, the engine carries the work");
    assert!(
        direct.3,
        "an SRQ no longer keeps the pair off the direct path"
    );
    assert_eq!(direct.0, engine.0, "requester completions");
    assert_eq!(direct.1, engine.1, "responder completions");
    // A receive that fails leaves its buffer undefined (ibv_poll_cq(3)): 40000.. is the
    // too-short one's.
    assert!(
        direct.2[..40000] == engine.2[..40000],
        "the bytes that arrived differ"
    );
    assert_eq!(
        direct.1[..4].iter().map(|w| w.0).collect::<Vec<_>>(),
        [10, 11, 12, 13],
        "SRQ receives are taken oldest first"
    );
    assert_eq!(direct.1[4].1, WcStatus::LocLenErr, "{:?}", direct.1[4]);
    assert_eq!(direct.0[4].1, WcStatus::RemInvReqErr, "{:?}", direct.0[4]);
}

/// One SRQ behind two QPs of B: one paired with a direct-capable context (direct), one with
/// a context that keeps to the daemon path (its engine takes from the same ring). Both
/// senders send at once; every message lands in exactly one receive, every receive is used
/// once, and each QP's receives complete in its messages' order.
#[test]
fn one_srq_serves_a_direct_pair_and_an_engine_pair_each_receive_once() {
    const PER: u64 = 150;
    let (d, _dir) = common::daemon("dsrqmix", None);
    let b = Context::open_at_direct(&d.socket, 0, true).unwrap();
    let a1 = Context::open_at_direct(&d.socket, 0, true).unwrap();
    let a2 = Context::open_at_direct(&d.socket, 0, false).unwrap();
    let pb = b.alloc_pd().unwrap();
    let cb = b.create_cq(1024).unwrap();
    let s = srq(&pb, 2 * PER as u32);
    let mut bbuf = vec![0u8; 64 * 2 * PER as usize];
    let mb: BorrowedMr<'_> = pb.reg_slice(&mut bbuf, RWR).unwrap();
    for i in 0..2 * PER {
        s.post_recv(1000 + i, &[mb.sge(i as usize * 64, 64).unwrap()])
            .unwrap();
    }
    let gb = b.query_gid(1, 0).unwrap();
    let init_b = QpInit::new(QpType::Rc, &pb)
        .cqs(&cb, &cb)
        .srq(&s)
        .cap(cap());
    let (qb1, qb2) = (b.create_qp(&init_b).unwrap(), b.create_qp(&init_b).unwrap());
    let senders: Vec<(&Context, &Qp<'_>)> = vec![(&a1, &qb1), (&a2, &qb2)];
    let direct: Vec<bool> = std::thread::scope(|sc| {
        let hs: Vec<_> = senders
            .into_iter()
            .enumerate()
            .map(|(k, (a, qb))| {
                sc.spawn(move || {
                    let pa = a.alloc_pd().unwrap();
                    let ca = a.create_cq(512).unwrap();
                    let qa = a
                        .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&ca, &ca).cap(cap()))
                        .unwrap();
                    connect(qb, a.query_gid(1, 0).unwrap(), qa.qpn());
                    connect(&qa, gb, qb.qpn());
                    let direct = qa.is_direct() && qb.is_direct();
                    let mut buf = vec![0u8; 16 * PER as usize];
                    for i in 0..PER as usize {
                        let tag = (k as u64) << 32 | i as u64;
                        buf[i * 16..i * 16 + 8].copy_from_slice(&tag.to_le_bytes());
                    }
                    let ma = pa.reg_slice(&mut buf, RWR).unwrap();
                    for i in 0..PER as usize {
                        let sge = ma.sge(i * 16, 8 + i % 8).unwrap();
                        qa.post_send(&SendRequest::new(i as u64, SendOp::Send, &[sge]))
                            .unwrap();
                        if i % 64 == 63 {
                            wait(&ca, 64);
                        }
                    }
                    wait(&ca, (PER % 64) as usize);
                    direct
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(direct, [true, false], "one pair direct, one on the engine");
    let got = wait(&cb, 2 * PER as usize);
    let mut ids: Vec<u64> = got.iter().map(|w| w.wr_id).collect();
    let mut seen = std::collections::HashMap::new();
    for w in &got {
        assert_eq!(w.status, WcStatus::Success, "{w:?}");
        let i = w.wr_id - 1000;
        let mut tag = [0u8; 8];
        mb.read(i as usize * 64, &mut tag).unwrap();
        let tag = u64::from_le_bytes(tag);
        let (k, n) = (tag >> 32, tag & 0xffff_ffff);
        assert_eq!(w.byte_len as u64, 8 + n % 8, "{w:?}");
        let qp = if k == 0 { qb1.qpn() } else { qb2.qpn() };
        assert_eq!(w.qp_num, qp, "message {tag:#x} completed on the other QP");
        seen.entry(k).or_insert_with(Vec::new).push(n);
    }
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 2 * PER as usize, "a receive used twice");
    for k in 0..2 {
        assert_eq!(
            seen[&k],
            (0..PER).collect::<Vec<_>>(),
            "sender {k}: lost, doubled or out of order"
        );
    }
}

/// The SRQ's limit (ibv_modify_srq(3)): armed at 4 with 8 posted, the event comes once the
/// direct peer's fifth SEND leaves 3, and only once; re-armed, it comes again.
#[test]
fn a_direct_peer_taking_an_srq_below_its_limit_raises_the_event_once() {
    let (d, _dir) = common::daemon("dsrqlim", None);
    let a = Context::open_at_direct(&d.socket, 0, true).unwrap();
    let b = Context::open_at_direct(&d.socket, 0, true).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let s = srq(&pb, 16);
    let qa = a
        .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&ca, &ca).cap(cap()))
        .unwrap();
    let qb = b
        .create_qp(
            &QpInit::new(QpType::Rc, &pb)
                .cqs(&cb, &cb)
                .srq(&s)
                .cap(cap()),
        )
        .unwrap();
    let mut bbuf = vec![0u8; 4096];
    let mb = pb.reg_slice(&mut bbuf, RWR).unwrap();
    let mut abuf = vec![7u8; 64];
    let ma = pa.reg_slice(&mut abuf, RWR).unwrap();
    for i in 0..8 {
        s.post_recv(i, &[mb.sge(i as usize * 64, 64).unwrap()])
            .unwrap();
    }
    let arm = |limit| {
        s.modify(
            &SrqAttr {
                srq_limit: limit,
                ..SrqAttr::default()
            },
            SRQ_LIMIT,
        )
        .unwrap();
    };
    arm(4);
    connect(&qb, a.query_gid(1, 0).unwrap(), qa.qpn());
    connect(&qa, b.query_gid(1, 0).unwrap(), qb.qpn());
    assert!(qa.is_direct() && qb.is_direct());
    let send = |id| {
        qa.post_send(&SendRequest::new(
            id,
            SendOp::Send,
            &[ma.sge(0, 8).unwrap()],
        ))
        .unwrap();
        wait(&ca, 1);
        wait(&cb, 1);
    };
    for id in 0..4 {
        send(id);
    }
    assert!(
        b.try_get_async_event().unwrap().is_none(),
        "4 left: not below 4"
    );
    send(4);
    let ev = b
        .get_async_event_within(Some(Duration::from_secs(10)))
        .unwrap()
        .expect("the limit event");
    assert_eq!(ev.event_type, Some(EventType::SrqLimitReached));
    assert_eq!(ev.element, Element::Srq(s.handle()));
    send(5);
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        b.try_get_async_event().unwrap().is_none(),
        "disarmed after one event"
    );
    arm(3);
    send(6);
    let ev = b
        .get_async_event_within(Some(Duration::from_secs(10)))
        .unwrap()
        .expect("the limit event, re-armed");
    assert_eq!(ev.event_type, Some(EventType::SrqLimitReached));
}

const ROLE: &str = "SOFTVERBS_DIRECT_SRQ_TEST_ROLE";
const SOCKET: &str = "SOFTVERBS_DIRECT_SRQ_TEST_SOCKET";
/// Bytes of each SEND the killed sender streams: many packets' worth, so its library is
/// copying into a receive it took from the SRQ for most of its life.
const BIG: usize = 1 << 16;

fn pattern(i: usize) -> u8 {
    (i * 7 % 253) as u8
}

/// The sender that is killed: connects to the QP number it reads on stdin, prints its own,
/// then streams `BIG`-byte SENDs until it is killed.
#[test]
fn srq_sender_role() {
    if std::env::var(ROLE).is_err() {
        return;
    }
    use std::io::{BufRead, Write};
    let socket = std::path::PathBuf::from(std::env::var(SOCKET).unwrap());
    let ctx = Context::open_at_direct(&socket, 0, true).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let q = ctx
        .create_qp(&QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap()))
        .unwrap();
    println!("QPN {}", q.qpn());
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    let peer: u32 = line.trim().parse().unwrap();
    let mut buf: Vec<u8> = (0..BIG).map(pattern).collect();
    let mr = pd.reg_slice(&mut buf, RWR).unwrap();
    connect(&q, ctx.query_gid(1, 0).unwrap(), peer);
    println!("READY {}", q.is_direct());
    std::io::stdout().flush().unwrap();
    let (mut posted, mut done) = (0u64, 0u64);
    loop {
        while posted - done < 8 {
            q.post_send(&SendRequest::new(
                posted,
                SendOp::Send,
                &[mr.sge(0, BIG).unwrap()],
            ))
            .unwrap();
            posted += 1;
        }
        done += cq.poll(16).unwrap().len() as u64;
        std::thread::yield_now();
    }
}

use common::Reaped;

/// A direct sender SIGKILLed while it streams into an SRQ: the receives it completed hold
/// whole messages, one it had taken and not finished completes with `WR_FLUSH_ERR` on the
/// QP it came through, the rest stay posted and serve the next sender, so every receive
/// completes exactly once; the daemon keeps nothing of the dead process.
#[test]
fn a_sender_killed_while_filling_srq_receives_loses_none_of_them() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    const POSTED: u64 = 48;
    let (d, _dir) = common::daemon("dsrqkill", None);
    let b = Context::open_at_direct(&d.socket, 0, true).unwrap();
    let pb = b.alloc_pd().unwrap();
    let cb = b.create_cq(256).unwrap();
    let s = srq(&pb, POSTED as u32);
    let mut bbuf = vec![0u8; BIG * POSTED as usize];
    let mb: BorrowedMr<'_> = pb.reg_slice(&mut bbuf, RWR).unwrap();
    for i in 0..POSTED {
        s.post_recv(i, &[mb.sge(i as usize * BIG, BIG).unwrap()])
            .unwrap();
    }
    let init_b = QpInit::new(QpType::Rc, &pb)
        .cqs(&cb, &cb)
        .srq(&s)
        .cap(cap());
    let qb1 = b.create_qp(&init_b).unwrap();
    let gb = b.query_gid(1, 0).unwrap();

    let mut child = Reaped(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "srq_sender_role",
                "--exact",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(ROLE, "sender")
            .env(SOCKET, &d.socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let victim_pid = child.0.id();
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let mut said = |key: &str| -> String {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "the sender died early"
            );
            // libtest may have printed the test's name on the same line.
            if let Some(at) = line.find(key) {
                return line[at + key.len()..].trim().to_string();
            }
        }
    };
    let sender_qpn: u32 = said("QPN ").parse().unwrap();
    connect(&qb1, gb, sender_qpn);
    writeln!(child.0.stdin.as_mut().unwrap(), "{}", qb1.qpn()).unwrap();
    assert_eq!(said("READY "), "true", "the sender's QP went direct");
    assert!(qb1.is_direct());

    // Let a third of the receives fill, then kill the sender while it copies the next.
    let mut got: Vec<softverbs::WorkCompletion> = Vec::new();
    let end = Instant::now() + Duration::from_secs(20);
    while got.len() < POSTED as usize / 3 {
        assert!(Instant::now() < end, "only {} receives filled", got.len());
        got.extend(cb.poll(16).unwrap());
    }
    child.0.kill().unwrap(); // SIGKILL
    child.0.wait().unwrap();
    common::wait_until_nothing_of(&d.socket, victim_pid, Duration::from_secs(20));
    // What the dead sender finished or held has completed by the time the gone peer is
    // seen; poll a while longer for anything late.
    let quiet = Instant::now() + Duration::from_millis(300);
    while Instant::now() < quiet {
        got.extend(cb.poll(16).unwrap());
        std::thread::sleep(Duration::from_millis(1));
    }
    let flushed = got
        .iter()
        .filter(|w| w.status == WcStatus::WrFlushErr)
        .count();
    assert!(flushed <= 1, "one receive at most was held: {got:?}");
    for w in &got {
        assert_eq!(w.qp_num, qb1.qpn(), "{w:?}");
        if w.status == WcStatus::Success {
            assert_eq!(w.byte_len as usize, BIG, "{w:?}");
            let mut bytes = vec![0u8; BIG];
            mb.read(w.wr_id as usize * BIG, &mut bytes).unwrap();
            assert!(
                bytes.iter().enumerate().all(|(i, &x)| x == pattern(i)),
                "receive {} completed with torn bytes",
                w.wr_id
            );
        } else {
            assert_eq!(w.status, WcStatus::WrFlushErr, "{w:?}");
        }
    }
    println!(
        "{} receives completed before the sender's death was seen, {flushed} flushed",
        got.len()
    );

    // The rest are still the SRQ's: a new sender on another QP fills exactly them.
    let rest = POSTED as usize - got.len();
    let a = Context::open_at_direct(&d.socket, 0, true).unwrap();
    let pa = a.alloc_pd().unwrap();
    let ca = a.create_cq(64).unwrap();
    let qa = a
        .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&ca, &ca).cap(cap()))
        .unwrap();
    let qb2 = b.create_qp(&init_b).unwrap();
    connect(&qb2, a.query_gid(1, 0).unwrap(), qa.qpn());
    connect(&qa, gb, qb2.qpn());
    assert!(qa.is_direct() && qb2.is_direct());
    let mut abuf: Vec<u8> = (0..BIG).map(pattern).collect();
    let ma = pa.reg_slice(&mut abuf, RWR).unwrap();
    for i in 0..rest {
        qa.post_send(&SendRequest::new(
            i as u64,
            SendOp::Send,
            &[ma.sge(0, BIG).unwrap()],
        ))
        .unwrap();
        if i % 16 == 15 {
            wait(&ca, 16);
        }
    }
    for w in wait(&ca, rest % 16) {
        assert_eq!(w.status, WcStatus::Success, "{w:?}");
    }
    let later = wait(&cb, rest);
    assert!(later.iter().all(|w| w.status == WcStatus::Success
        && w.qp_num == qb2.qpn()
        && w.byte_len as usize == BIG));
    let mut ids: Vec<u64> = got.iter().chain(&later).map(|w| w.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..POSTED).collect::<Vec<_>>(), "lost or doubled");
    std::thread::sleep(Duration::from_millis(50));
    assert!(cb.poll(16).unwrap().is_empty(), "a receive completed twice");
}

#[test]
fn a_fed_srq_costs_its_context_a_descriptor_until_it_is_destroyed() {
    // The daemon keeps a fed SRQ's region open for the direct peers that map it: one of the
    // descriptors a uid's share counts (docs/guide/limits.md, "Descriptors").
    let (d, _dir) = common::daemon("fed-fds", None);
    let ctx = Context::open_at_direct(&d.socket, 0, true).unwrap();
    let look = softverbs::Introspect::connect_at(&d.socket).unwrap();
    let used = || {
        let r = look.resources().unwrap();
        r["limits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["resource"] == "descriptors")
            .unwrap()["used"]
            .as_u64()
            .unwrap()
    };
    let pd = ctx.alloc_pd().unwrap();
    let before = used();
    let s = srq(&pd, 16);
    let fed = look.resources().unwrap()["direct"].to_string();
    assert_eq!(used(), before + 1, "a fed SRQ's memfd: {fed}");
    drop(s);
    assert_eq!(used(), before, "back when the SRQ goes");
}
