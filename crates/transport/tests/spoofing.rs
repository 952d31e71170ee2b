//! Forged packets against running connections. RoCE has no authentication, so a host that
//! can reach UDP 4791 and guess a QP number can send anything; what holds it off are the two
//! checks a NIC makes:
//!
//! - a response acts only inside the window of outstanding PSNs (IBA 9.7.5.1): a duplicate
//!   (a PSN already acknowledged) or a ghost (a PSN never sent) is dropped, whether it is an
//!   ACK, a NAK, an RNR NAK, a sequence NAK, an atomic ACK or a READ response;
//! - a connected QP (RC, UC, XRC) takes packets only from the address of the path it was
//!   connected with; UD takes datagrams from anyone (it checks Q_Keys).
//!
//! Each test runs a transfer (SENDs, RDMA WRITEs and, where the transport has them, a
//! multi-packet RDMA READ; the PSNs wrap from 0xFFFFFF to 0 on the way) while forgeries
//! arrive, and checks what a user checks: every request completes successfully in order,
//! every byte arrived, and both QPs are still in RTS. Forgeries inside the window from the
//! peer's own address still act as the IBA says (the last tests), which is the limit of what
//! a transport without authentication can refuse.

use std::net::IpAddr;
use std::time::Duration;

use softverbs_core::datapath::QpTarget;
use softverbs_core::device::Gid;
use softverbs_core::ids::CtxId;
use softverbs_core::types::{Access, Mtu, QpState, QpType};
use softverbs_transport::sim::{ConnParams, Faults, Host, Network, Rng};
use softverbs_transport::wr::{Payload, RecvWr, SendOp, SendWr, Sge, WcStatus};
use softverbs_transport::{CqId, SrqKey};
use softverbs_wire::ip::split_ip_udp;
use softverbs_wire::psn::{psn_add, psn_diff};
use softverbs_wire::{
    Direction, HeaderKind, NakCode, Opcode, Operation, Packet, PacketBuilder, Syndrome, Transport,
};

const A_IP: &str = "10.0.0.1";
const B_IP: &str = "10.0.0.2";
/// A host that is not part of the connection.
const STRANGER: &str = "10.0.0.66";
/// The first PSN of the transfer: its PSNs wrap from 0xFFFFFF to 0.
const START: u32 = 0xFF_FF40;
const MTU: u32 = 1024;
const SPACE: usize = 4 << 20;
const SLOT: u64 = 8192;
/// B's receive buffers.
const RECV_AT: u64 = 0x20_0000;
/// B's READ source and A's READ destination.
const READ_SRC: u64 = 0x3F_0000;
const READ_DST: u64 = 0x3E_0000;
const READ_LEN: u32 = 3 * MTU - 100;
const MESSAGES: usize = 160;
/// Steps of the network before which forgeries are injected, at most.
const FORGING_ROUNDS: u32 = 5000;
/// The UDP source port forgeries use (RoCE v2 source ports vary per QP; no one checks them).
const SPORT: u16 = 0xC123;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Send,
    Write,
    Read,
}

#[derive(Clone, Copy, Debug)]
struct Msg {
    op: Op,
    len: u32,
    /// Where it comes from in A (READ: where it lands).
    a_at: u64,
    /// Where it lands in B (SEND: the receive slot; READ: where it comes from).
    b_at: u64,
}

/// A's requester QP and B's responder QP (an XRC receive QP for XRC), mid-transfer.
struct Transfer {
    t: QpType,
    net: Network,
    ca: CtxId,
    cb: CtxId,
    cqa: CqId,
    cqb: CqId,
    qa: u32,
    qb: u32,
    srqn: u32,
    msgs: Vec<Msg>,
    /// PSNs the transfer occupies from [`START`].
    npsn: u32,
    sends: usize,
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

impl Transfer {
    fn new(t: QpType, faults: Faults, seed: u64, a_params: ConnParams) -> Transfer {
        let mut rng = Rng::new(seed ^ 0x5EED);
        let mut a = Host::new(ip(A_IP), Mtu::M1024);
        let mut b = Host::new(ip(B_IP), Mtu::M1024);
        let ca = a.context(1, SPACE);
        let cb = b.context(2, SPACE);
        let pa = a.pd(ca);
        let pb = b.pd(cb);
        let all = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        let ka = a.mr(pa, 0, SPACE as u64, all);
        let kb = b.mr(pb, 0, SPACE as u64, all);
        let cqa = a.cq(ca);
        let cqb = b.cq(cb);
        let (qa, qb, srqn, srq): (u32, u32, u32, Option<SrqKey>) = match t {
            QpType::XrcSend => {
                let xrcd = b.xrcd(cb, 7);
                let (srq, srqn) = b.xrc_srq(pb, xrcd, cqb, 4096);
                let (_h, tgt) = b.xrc_recv_qp(cb, xrcd);
                (a.qp(t, pa, cqa, None), tgt, srqn, Some(srq))
            }
            _ => (a.qp(t, pa, cqa, None), b.qp(t, pb, cqb, None), 0, None),
        };
        let a_params = ConnParams {
            sq_psn: START,
            rq_psn: START,
            ..a_params
        };
        let b_params = ConnParams {
            sq_psn: START,
            rq_psn: START,
            ..ConnParams::default()
        };
        let (ga, gb) = (a.gid, b.gid);
        a.connect(qa, gb, qb, a_params);
        b.connect(qb, ga, qa, b_params);
        for x in a.mem.space_mut(ca).iter_mut() {
            *x = rng.next_u64() as u8;
        }
        for x in b.mem.space_mut(cb).iter_mut() {
            *x = rng.next_u64() as u8;
        }

        let mut msgs = Vec::new();
        let mut sends = 0;
        for i in 0..MESSAGES {
            let len = 1 + rng.below(u64::from(3 * MTU + 100)) as u32;
            let a_at = i as u64 * SLOT;
            if i % 2 == 0 {
                let b_at = RECV_AT + sends as u64 * SLOT;
                let wr = RecvWr {
                    wr_id: sends as u64,
                    sges: vec![Sge {
                        addr: b_at,
                        length: SLOT as u32,
                        lkey: kb,
                    }],
                };
                match srq {
                    Some(k) => b.engine.post_srq_recv(k, wr).unwrap(),
                    None => b.engine.post_recv(qb, wr).unwrap(),
                }
                sends += 1;
                msgs.push(Msg {
                    op: Op::Send,
                    len,
                    a_at,
                    b_at,
                });
            } else {
                msgs.push(Msg {
                    op: Op::Write,
                    len,
                    a_at,
                    b_at: a_at,
                });
            }
        }
        if t != QpType::Uc {
            msgs.push(Msg {
                op: Op::Read,
                len: READ_LEN,
                a_at: READ_DST,
                b_at: READ_SRC,
            });
        }
        let mut npsn = 0;
        for (i, m) in msgs.iter().enumerate() {
            npsn += m.len.div_ceil(MTU).max(1);
            let op = match m.op {
                Op::Send => SendOp::Send,
                Op::Write => SendOp::Write {
                    remote_addr: m.b_at,
                    rkey: kb,
                },
                Op::Read => SendOp::Read {
                    remote_addr: m.b_at,
                    rkey: kb,
                },
            };
            let mut wr = SendWr::new(
                i as u64,
                op,
                Payload::Sges(vec![Sge {
                    addr: m.a_at,
                    length: m.len,
                    lkey: ka,
                }]),
            );
            wr.remote_srqn = srqn;
            a.engine.post_send(qa, wr).unwrap();
        }
        let mut net = Network::new(vec![a, b], faults, seed);
        net.capture = Some(Vec::new());
        Transfer {
            t,
            net,
            ca,
            cb,
            cqa,
            cqb,
            qa,
            qb,
            srqn,
            msgs,
            npsn,
            sends,
        }
    }

    fn done(&self) -> bool {
        let a = &self.net.hosts[0];
        let b = &self.net.hosts[1];
        a.completions.len() >= self.msgs.len() && b.completions.len() >= self.sends
    }

    /// Runs the transfer to its end, calling `forge` before every step of the network.
    fn run(&mut self, mut forge: impl FnMut(&mut Network, &Live)) {
        let mut live = Live::default();
        let (qa, qb, sends) = (self.qa, self.qb, self.sends);
        let msgs = self.msgs.clone();
        let (ca, cb, cqa) = (self.ca, self.cb, self.cqa);
        let done = |n: &Network| {
            n.hosts[0].completions.len() >= msgs.len() && n.hosts[1].completions.len() >= sends
        };
        let reliable = self.t != QpType::Uc;
        let mut rounds = 0;
        let finished = self.net.run_until(Duration::from_secs(5), |n| {
            live.update(n, qa, qb);
            if reliable {
                check_completed_means_delivered(n, &msgs, ca, cb, cqa);
            }
            if done(n) {
                return true;
            }
            // Bounded, so a connection the forgeries broke ends the run instead of idling
            // on them for the whole limit.
            if rounds < FORGING_ROUNDS && n.hosts.iter().all(|h| h.failures.is_empty()) {
                rounds += 1;
                forge(n, &live);
            }
            false
        });
        assert!(
            finished && self.done(),
            "{:?}: the transfer did not finish by {:?}: A has {}, B {} receive completions; \
             failures A {:?}, B {:?}",
            self.t,
            self.net.now,
            summary(&self.net.hosts[0].completions),
            self.net.hosts[1].completions.len(),
            self.net.hosts[0].failures,
            self.net.hosts[1].failures,
        );
        // Forgeries still in flight arrive too.
        self.net.run_until(Duration::from_millis(10), |_| false);
    }

    /// What a user checks after the transfer: every request completed successfully, in
    /// order; every byte is where it should be; both QPs are still in RTS (RTR for an XRC
    /// receive QP), and nothing failed.
    fn assert_intact(&mut self) {
        let (cqa, cqb, ca, cb) = (self.cqa, self.cqb, self.ca, self.cb);
        let wcs = self.net.hosts[0].take_completions(cqa);
        let got: Vec<(u64, WcStatus)> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
        let want: Vec<(u64, WcStatus)> = (0..self.msgs.len() as u64)
            .map(|i| (i, WcStatus::Success))
            .collect();
        assert_eq!(got, want, "{:?}: A's completions", self.t);
        let rwcs = self.net.hosts[1].take_completions(cqb);
        assert_eq!(rwcs.len(), self.sends, "{:?}: one receive per SEND", self.t);
        let a_mem = self.net.hosts[0].mem.space(ca).to_vec();
        let b_mem = self.net.hosts[1].mem.space(cb).to_vec();
        let mut r = 0;
        for (i, m) in self.msgs.iter().enumerate() {
            let (a, b) = (m.a_at as usize, m.b_at as usize);
            let n = m.len as usize;
            match m.op {
                Op::Send => {
                    let wc = &rwcs[r];
                    assert_eq!(
                        (wc.wr_id, wc.status, wc.byte_len),
                        (r as u64, WcStatus::Success, m.len),
                        "{:?}: receive of message {i}",
                        self.t
                    );
                    r += 1;
                    assert!(
                        a_mem[a..a + n] == b_mem[b..b + n],
                        "{:?}: SEND {i} arrived intact",
                        self.t
                    );
                }
                Op::Write | Op::Read => assert!(
                    a_mem[a..a + n] == b_mem[b..b + n],
                    "{:?}: {:?} {i} arrived intact",
                    self.t,
                    m.op
                ),
            }
        }
        for (h, qpn) in [(0, self.qa), (1, self.qb)] {
            let host = &self.net.hosts[h];
            assert!(
                host.failures.is_empty(),
                "{:?}: {:?}",
                self.t,
                host.failures
            );
            let want = if self.t == QpType::XrcSend && h == 1 {
                QpState::Rtr
            } else {
                QpState::Rts
            };
            assert_eq!(qp_state(host, qpn), want, "{:?}: QP of host {h}", self.t);
        }
    }
}

/// How many completions, and the first that failed.
fn summary(wcs: &[(CqId, softverbs_transport::wr::WorkCompletion)]) -> String {
    let bad = wcs.iter().find(|(_, w)| w.status != WcStatus::Success);
    format!(
        "{} completions (first failure: {:?})",
        wcs.len(),
        bad.map(|(_, w)| (w.wr_id, w.status))
    )
}

/// The QP's state as `ibv_query_qp` reads it.
fn qp_state(h: &Host, qpn: u32) -> QpState {
    match h.core.qp_target(qpn).expect("QP") {
        QpTarget::Owned { ctx, handle, .. } => h.core.query_qp(ctx, handle).unwrap().attr.qp_state,
        QpTarget::XrcRecv => {
            let holder = h.core.xrc_rcv_qp_holders(qpn).into_iter().next().unwrap();
            let softverbs_core::HolderRef::Handle(handle) = holder.via else {
                panic!("a handle holder")
            };
            h.core.query_qp(holder.ctx, handle).unwrap().attr.qp_state
        }
    }
}

/// RC semantics a forged ACK would break: a request completes successfully only once the
/// responder has it (its WRITE data is in B's memory, its SEND has a receive completion).
fn check_completed_means_delivered(n: &Network, msgs: &[Msg], ca: CtxId, cb: CtxId, cqa: CqId) {
    let a = &n.hosts[0];
    let b = &n.hosts[1];
    let mut sends_done = 0;
    for (_, wc) in a.completions.iter().filter(|(c, _)| *c == cqa) {
        if wc.status != WcStatus::Success {
            continue;
        }
        let m = msgs[wc.wr_id as usize];
        let (x, y, len) = (m.a_at as usize, m.b_at as usize, m.len as usize);
        match m.op {
            Op::Send => sends_done += 1,
            Op::Write => assert!(
                a.mem.space(ca)[x..x + len] == b.mem.space(cb)[y..y + len],
                "WRITE {} completed before its data reached the responder",
                wc.wr_id
            ),
            Op::Read => {}
        }
    }
    assert!(
        b.completions.len() >= sends_done,
        "{sends_done} SENDs completed but the responder received {}",
        b.completions.len()
    );
}

/// What the wire shows of the connection so far: the newest request PSN A sent and the
/// newest PSN B acknowledged (from the network's capture).
#[derive(Default)]
struct Live {
    seen: usize,
    sent: Option<u32>,
    acked: Option<u32>,
}

impl Live {
    fn update(&mut self, n: &Network, qa: u32, qb: u32) {
        let cap = n.capture.as_ref().expect("capturing");
        for (_, d) in &cap[self.seen..] {
            let Ok((_, ib)) = split_ip_udp(d) else {
                continue;
            };
            let Ok(p) = Packet::parse(ib) else { continue };
            let psn = p.headers.bth.psn;
            let later = |old: Option<u32>| old.is_none_or(|o| psn_diff(psn, o) > 0);
            match p.info.direction {
                Direction::Request if p.headers.bth.dest_qp == qb && later(self.sent) => {
                    self.sent = Some(psn)
                }
                Direction::Response
                    if p.headers.bth.dest_qp == qa
                        && matches!(
                            p.headers.aeth.map(|a| a.syndrome),
                            Some(Syndrome::Ack { .. })
                        )
                        && later(self.acked) =>
                {
                    self.acked = Some(psn)
                }
                _ => {}
            }
        }
        self.seen = cap.len();
    }
}

/// PSNs outside A's window for the whole transfer, and at its live edges: duplicates of what
/// B already acknowledged (the newest ACK's PSN itself, which the real ACK, sent earlier,
/// reaches A before), and ghosts beyond anything A can have sent when they arrive.
fn outside_psns(npsn: u32, live: &Live) -> Vec<u32> {
    let mut v = vec![
        psn_add(START, 0xFF_FFFF),
        psn_add(START, 0xFF_FFFF - 63),
        psn_add(START, 0xFF_FFFF - 1000),
        psn_add(START, 1 << 23),
        psn_add(START, npsn),
        psn_add(START, npsn + 1),
        psn_add(START, npsn + 500),
        psn_add(START, npsn + (1 << 22)),
    ];
    if let Some(a) = live.acked {
        v.extend([a, psn_add(a, 0xFF_FFFF), psn_add(a, 0xFF_FFFF - 16)]);
    }
    if let Some(s) = live.sent {
        // A keeps at most 128 PSNs (plus one request) unacknowledged past what B has
        // acknowledged, and B has acknowledged nothing A sends after this moment by the
        // time these arrive.
        v.extend([psn_add(s, 200), psn_add(s, 4096)]);
    }
    v
}

/// One forged response to A's QP `qa` at `psn`.
fn response(t: Transport, qa: u32, psn: u32, kind: Forgery) -> Vec<u8> {
    let payload = [0xEEu8; 256];
    let (op, b) = match kind {
        Forgery::Ack => (Operation::Acknowledge, None),
        Forgery::Nak(code) => (Operation::Acknowledge, Some(Syndrome::Nak { code })),
        Forgery::RnrNak => (Operation::Acknowledge, Some(Syndrome::RnrNak { timer: 1 })),
        Forgery::AtomicAck => (Operation::AtomicAcknowledge, None),
        Forgery::ReadResponse(op) => (op, None),
    };
    let opcode = Opcode::new(t, op).unwrap();
    let mut pb = PacketBuilder::new(opcode, qa, psn);
    let info = opcode.info().unwrap();
    if info.headers.contains(HeaderKind::Aeth) {
        let syn = b.unwrap_or(Syndrome::Ack {
            credits: Syndrome::UNLIMITED_CREDITS,
        });
        pb = pb.aeth(syn, psn);
    }
    if matches!(kind, Forgery::AtomicAck) {
        pb = pb.atomic_ack_eth(0xDEAD_BEEF);
    }
    if matches!(kind, Forgery::ReadResponse(_)) {
        pb = pb.payload(&payload);
    }
    let mut buf = vec![0u8; pb.buffer_len()];
    pb.emit(&mut buf).unwrap();
    buf
}

#[derive(Clone, Copy, Debug)]
enum Forgery {
    Ack,
    Nak(NakCode),
    RnrNak,
    AtomicAck,
    ReadResponse(Operation),
}

/// Params that make a forged RNR NAK or sequence NAK fatal if it counted: two RNR retries,
/// three transport retries.
fn fragile() -> ConnParams {
    ConnParams {
        timeout: 8,
        retry_cnt: 3,
        rnr_retry: 2,
        ..ConnParams::default()
    }
}

fn lossy() -> Faults {
    Faults {
        loss: 0.03,
        duplicate: 0.02,
        reorder: 0.03,
        corrupt: 0.0,
        delay: Duration::from_micros(5),
    }
}

/// A transfer of type `t` under `faults` while B's own address sends `kinds` of forged
/// responses with PSNs outside A's window, a burst of each before every step.
fn transfer_under_outside_forgeries(t: QpType, faults: Faults, seed: u64, kinds: &[Forgery]) {
    let mut x = Transfer::new(t, faults, seed, fragile());
    let (qa, npsn) = (x.qa, x.npsn);
    let tr = if t == QpType::XrcSend {
        Transport::Xrc
    } else {
        Transport::Rc
    };
    let mut forged = 0u64;
    x.run(|n, live| {
        for psn in outside_psns(npsn, live) {
            for &k in kinds {
                n.inject(ip(B_IP), SPORT, 0, &response(tr, qa, psn, k));
                forged += 1;
            }
        }
    });
    x.assert_intact();
    let drops = x.net.hosts[0].engine.drop_stats();
    assert!(forged > 100, "{forged} forgeries");
    assert!(
        drops.outside_window >= forged,
        "every forgery was dropped as outside the window ({drops:?}, {forged} forged)"
    );
    assert_eq!(drops.foreign_source, 0, "they came from the peer's address");
}

const FATAL_NAKS: [NakCode; 4] = [
    NakCode::InvalidRequest,
    NakCode::RemoteAccessError,
    NakCode::RemoteOperationalError,
    NakCode::InvalidRdRequest,
];

#[test]
fn naks_outside_the_window_do_not_fail_the_connection() {
    let kinds: Vec<Forgery> = FATAL_NAKS.iter().map(|&c| Forgery::Nak(c)).collect();
    for t in [QpType::Rc, QpType::XrcSend] {
        transfer_under_outside_forgeries(t, lossy(), 2, &kinds);
        transfer_under_outside_forgeries(t, Faults::NONE, 1, &kinds);
    }
}

#[test]
fn rnr_naks_outside_the_window_do_not_rewind_or_exhaust_retries() {
    for t in [QpType::Rc, QpType::XrcSend] {
        transfer_under_outside_forgeries(t, lossy(), 4, &[Forgery::RnrNak]);
        transfer_under_outside_forgeries(t, Faults::NONE, 3, &[Forgery::RnrNak]);
    }
}

#[test]
fn sequence_naks_outside_the_window_do_not_rewind_or_exhaust_retries() {
    let k = [Forgery::Nak(NakCode::PsnSeqErr)];
    for t in [QpType::Rc, QpType::XrcSend] {
        transfer_under_outside_forgeries(t, lossy(), 6, &k);
        transfer_under_outside_forgeries(t, Faults::NONE, 5, &k);
    }
}

/// A ghost ACK ahead of what was sent would complete requests the responder never got; a
/// lost packet would then never be retransmitted.
#[test]
fn acks_outside_the_window_complete_nothing() {
    for t in [QpType::Rc, QpType::XrcSend] {
        transfer_under_outside_forgeries(t, lossy(), 8, &[Forgery::Ack]);
        transfer_under_outside_forgeries(t, Faults::NONE, 7, &[Forgery::Ack]);
    }
}

#[test]
fn read_responses_and_atomic_acks_outside_the_window_are_dropped() {
    let kinds = [
        Forgery::AtomicAck,
        Forgery::ReadResponse(Operation::RdmaReadResponseOnly),
        Forgery::ReadResponse(Operation::RdmaReadResponseFirst),
        Forgery::ReadResponse(Operation::RdmaReadResponseMiddle),
        Forgery::ReadResponse(Operation::RdmaReadResponseLast),
    ];
    for t in [QpType::Rc, QpType::XrcSend] {
        transfer_under_outside_forgeries(t, lossy(), 10, &kinds);
        transfer_under_outside_forgeries(t, Faults::NONE, 9, &kinds);
    }
}

/// A stranger's packets are dropped however well it guesses: responses at every PSN of the
/// transfer (inside the window as it moves) and requests at every PSN B may expect, of
/// every kind, aimed at both QPs.
#[test]
fn packets_from_another_address_are_dropped_for_connected_qps() {
    for t in [QpType::Rc, QpType::Uc, QpType::XrcSend] {
        let mut x = Transfer::new(t, Faults::NONE, 11, fragile());
        let (qa, qb, srqn) = (x.qa, x.qb, x.srqn);
        let tr = match t {
            QpType::Rc => Transport::Rc,
            QpType::Uc => Transport::Uc,
            _ => Transport::Xrc,
        };
        let mut forged = 0u64;
        let mut round = 0u32;
        x.run(|n, live| {
            // Around the live edges, so that some are in the window when they arrive.
            let base = live.acked.map_or(START, |a| psn_add(a, 1));
            for k in 0..4 {
                let psn = psn_add(base, (round + k) % 8);
                if t != QpType::Uc {
                    for f in [
                        Forgery::Nak(NakCode::RemoteAccessError),
                        Forgery::Ack,
                        Forgery::Nak(NakCode::PsnSeqErr),
                    ] {
                        n.inject(ip(STRANGER), SPORT, 0, &response(tr, qa, psn, f));
                        forged += 1;
                    }
                }
                let next = live.sent.map_or(START, |s| psn_add(s, 1));
                let req = request(tr, qb, srqn, psn_add(next, k));
                n.inject(ip(STRANGER), SPORT, 1, &req);
                forged += 1;
            }
            round += 1;
        });
        x.assert_intact();
        let a = x.net.hosts[0].engine.drop_stats().foreign_source;
        let b = x.net.hosts[1].engine.drop_stats().foreign_source;
        assert_eq!(
            a + b,
            forged,
            "{t:?}: every forgery was dropped for its source"
        );
    }
}

/// A forged SEND ONLY of 64 bytes to B's QP `qb` at `psn`.
fn request(t: Transport, qb: u32, srqn: u32, psn: u32) -> Vec<u8> {
    let payload = [0x5Au8; 64];
    let mut pb = PacketBuilder::new(Opcode::new(t, Operation::SendOnly).unwrap(), qb, psn)
        .ack_req(true)
        .payload(&payload);
    if t == Transport::Xrc {
        pb = pb.xrceth(srqn);
    }
    let mut buf = vec![0u8; pb.buffer_len()];
    pb.emit(&mut buf).unwrap();
    buf
}

/// Inside the window, from the peer's address, a NAK is a NAK (IBA 9.7.5.1.3): the request
/// it names fails with the status it carries, the requests before it succeed (the NAK
/// acknowledges them), and the QP goes to ERR. This is what no check can tell from the real
/// peer.
#[test]
fn a_nak_inside_the_window_from_the_peer_still_fails_the_request_it_names() {
    let mut x = Transfer::new(QpType::Rc, Faults::NONE, 12, fragile());
    let qa = x.qa;
    // The third message's first PSN.
    let m = &x.msgs;
    let third = psn_add(
        START,
        m[0].len.div_ceil(MTU).max(1) + m[1].len.div_ceil(MTU).max(1),
    );
    let mut injected = false;
    let ok = x.net.run_until(Duration::from_secs(1), |n| {
        let sent = n.capture.as_ref().unwrap().iter().any(|(_, d)| {
            split_ip_udp(d)
                .ok()
                .and_then(|(_, ib)| Packet::parse(ib).ok())
                .is_some_and(|p| p.headers.bth.psn == third)
        });
        if sent && !injected {
            // Sent just now: B's ACK is two one-way delays away, this NAK one.
            let nak = response(
                Transport::Rc,
                qa,
                third,
                Forgery::Nak(NakCode::RemoteAccessError),
            );
            n.inject(ip(B_IP), SPORT, 0, &nak);
            injected = true;
        }
        !n.hosts[0].failures.is_empty()
    });
    assert!(ok && injected, "the NAK failed the QP");
    let cqa = x.cqa;
    let wcs = x.net.hosts[0].take_completions(cqa);
    let st: Vec<(u64, WcStatus)> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        &st[..3],
        &[
            (0, WcStatus::Success),
            (1, WcStatus::Success),
            (2, WcStatus::RemAccessErr)
        ]
    );
    assert!(
        st[3..].iter().all(|&(_, s)| s == WcStatus::WrFlushErr),
        "{st:?}"
    );
    assert_eq!(qp_state(&x.net.hosts[0], qa), QpState::Err);
}

/// Inside the window, from the peer's address, a sequence NAK rewinds the requester to the
/// PSN it names (IBA 9.7.5.1.3, go-back-N): the packets from there go out again, and the
/// transfer still completes intact (the responder drops the duplicates).
#[test]
fn a_sequence_nak_inside_the_window_from_the_peer_rewinds_and_the_transfer_completes() {
    let mut x = Transfer::new(QpType::Rc, Faults::NONE, 13, ConnParams::default());
    let qa = x.qa;
    let mut target = None;
    x.run(|n, live| {
        if let (None, Some(a)) = (target, live.acked) {
            // The PSN after the newest acknowledged one is outstanding or about to be.
            let p = psn_add(a, 1);
            if live.sent.is_some_and(|s| psn_diff(s, p) >= 0) {
                let nak = response(Transport::Rc, qa, p, Forgery::Nak(NakCode::PsnSeqErr));
                n.inject(ip(B_IP), SPORT, 0, &nak);
                target = Some(p);
            }
        }
    });
    x.assert_intact();
    let p = target.expect("a NAK was sent");
    let copies = x
        .net
        .capture
        .as_ref()
        .unwrap()
        .iter()
        .filter(|(_, d)| {
            split_ip_udp(d)
                .ok()
                .and_then(|(_, ib)| Packet::parse(ib).ok())
                .is_some_and(|pk| {
                    pk.info.direction == Direction::Request && pk.headers.bth.psn == p
                })
        })
        .count();
    assert_eq!(copies, 2, "PSN {p:#x} was sent again after the NAK");
}

/// UD takes datagrams from anyone: a SEND from a host it never heard of, with the right
/// Q_Key, is received (IBA 10.2.5; the Q_Key is UD's only check).
#[test]
fn ud_takes_datagrams_from_any_address() {
    let mut b = Host::new(ip(B_IP), Mtu::M1024);
    let cb = b.context(2, SPACE);
    let pb = b.pd(cb);
    let kb = b.mr(pb, 0, SPACE as u64, Access::LOCAL_WRITE);
    let cqb = b.cq(cb);
    let qb = b.qp(QpType::Ud, pb, cqb, None);
    let params = ConnParams::default();
    b.connect(qb, Gid::from_ip(ip(A_IP)), 0, params);
    b.engine
        .post_recv(
            qb,
            RecvWr {
                wr_id: 77,
                sges: vec![Sge {
                    addr: 0,
                    length: 4096,
                    lkey: kb,
                }],
            },
        )
        .unwrap();
    let a = Host::new(ip(A_IP), Mtu::M1024);
    let mut net = Network::new(vec![a, b], Faults::NONE, 14);
    let payload = [0x42u8; 100];
    let pkt = PacketBuilder::new(
        Opcode::new(Transport::Ud, Operation::SendOnly).unwrap(),
        qb,
        5,
    )
    .deth(params.qkey, 0x99)
    .payload(&payload);
    let mut buf = vec![0u8; pkt.buffer_len()];
    pkt.emit(&mut buf).unwrap();
    net.inject(ip(STRANGER), SPORT, 1, &buf);
    net.run_until(Duration::from_millis(10), |n| {
        !n.hosts[1].completions.is_empty()
    });
    let wcs = net.hosts[1].take_completions(cqb);
    assert_eq!(wcs.len(), 1);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status, wcs[0].src_qp),
        (77, WcStatus::Success, 0x99)
    );
    // The GRH in front of the data names the stranger as the source (IPv4 header: bytes
    // 12..16 of the 20 at offset 20).
    let grh = &net.hosts[1].mem.space(cb)[..40];
    assert_eq!(&grh[20 + 12..20 + 16], &[10, 0, 0, 66]);
    assert_eq!(net.hosts[1].engine.drop_stats().foreign_source, 0);
}
