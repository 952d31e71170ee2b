//! Operation × transport matrix: every operation each transport allows, at the message sizes
//! around the path MTU, between two simulated hosts. Each case checks the bytes that land
//! (and that nothing else in either address space changes), the requester's completion, the
//! responder's completion where a receive is consumed, and that both QPs stay healthy.

use std::net::IpAddr;
use std::time::Duration;

use softverbs_core::datapath::PdRef;
use softverbs_core::ids::CtxId;
use softverbs_core::mw::MwType;
use softverbs_core::types::{Access, EventType, Mtu, QpType};
use softverbs_transport::sim::{ConnParams, Faults, Host, Network};
use softverbs_transport::wr::{
    BindMw, Payload, RecvWr, SendOp, SendWr, Sge, UdDest, WcOpcode, WcStatus, WorkCompletion,
    WC_GRH, WC_WITH_IMM, WC_WITH_INV,
};
use softverbs_transport::{CqId, PostError, SrqKey};

const ALL: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0,
);
const SPACE: usize = 1 << 20;
/// Requester: the two gather pieces of a send, and the two scatter pieces of a READ.
const SRC1: u64 = 0x1000;
const SRC2: u64 = 0x9003;
const DST1: u64 = 0x2_0000;
const DST2: u64 = 0x2_8005;
/// Responder: the two scatter pieces of a receive, the RDMA window and the atomic word.
const RBUF1: u64 = 0x1_0000;
const RBUF1_LEN: u32 = 53;
const RBUF2: u64 = 0x1_1001;
const RBUF2_LEN: u32 = 0x6000;
const RDMA: u64 = 0x4_0000;
const ATOM: u64 = 0x7_0000;
const QKEY: u32 = 0x1111_1111;
const IMM: u32 = 0xDEAD_BEEF;
const V0: u64 = 0x1122_3344_5566_7788;
const V1: u64 = 0x0102_0304_0506_0708;
const ADD: u64 = 0x1_0000_0001;
const SEND_WR_ID: u64 = 0xA0A0_0001;
const RECV_WR_ID: u64 = 0xB0B0_0002;
const MAX_INLINE: u32 = 256;

/// The inline bytes a QP of `t` holds: an XRC send QP 16 fewer (crates/core/src/qp.rs).
fn max_inline(t: Tr) -> u32 {
    match t {
        Tr::Xrc => softverbs_core::qp::max_inline_data(MAX_INLINE, QpType::XrcSend),
        _ => MAX_INLINE,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tr {
    Rc,
    Uc,
    Ud,
    Xrc,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Send,
    SendImm,
    SendInv,
    Write,
    WriteImm,
    Read,
    Cas,
    Faa,
    InlineSend,
}

const TRANSPORTS: [Tr; 4] = [Tr::Rc, Tr::Uc, Tr::Ud, Tr::Xrc];
const OPS: [Op; 9] = [
    Op::Send,
    Op::SendImm,
    Op::SendInv,
    Op::Write,
    Op::WriteImm,
    Op::Read,
    Op::Cas,
    Op::Faa,
    Op::InlineSend,
];

fn valid(t: Tr, op: Op) -> bool {
    match op {
        Op::Send | Op::SendImm | Op::InlineSend => true,
        Op::SendInv | Op::Read | Op::Cas | Op::Faa => matches!(t, Tr::Rc | Tr::Xrc),
        Op::Write | Op::WriteImm => t != Tr::Ud,
    }
}

/// An XRC receive QP has no send queue, so no type 2 window is ever bound to it and a Send
/// with Invalidate to it has nothing it may invalidate: it fails
/// (`xrc_send_with_invalidate_is_an_invalid_request`).
fn no_window_to_name(t: Tr, op: Op) -> bool {
    t == Tr::Xrc && op == Op::SendInv
}

fn consumes_recv(op: Op) -> bool {
    matches!(
        op,
        Op::Send | Op::SendImm | Op::SendInv | Op::InlineSend | Op::WriteImm
    )
}

/// Two hosts with one connected pair of QPs of transport `t` (for XRC: an XRC_SEND QP on A
/// and an XRC receive QP on B delivering into an XRC SRQ on B).
struct Bed {
    net: Network,
    t: Tr,
    ca: CtxId,
    cb: CtxId,
    ka: u32,
    kb: u32,
    /// B's PD (the receiving QP's, for XRC the SRQ's).
    pb: PdRef,
    cqa: CqId,
    /// Where B's receive completions go (XRC: the SRQ's CQ).
    cqb: CqId,
    /// A CQ of B that nothing should complete on.
    decoy_cq: CqId,
    qa: u32,
    /// The receiving QP (XRC: the XRC receive QP).
    qb: u32,
    srq: Option<(SrqKey, u32)>,
}

fn fill(space: &mut [u8], mul: usize, add: usize) {
    for (i, x) in space.iter_mut().enumerate() {
        *x = (i.wrapping_mul(mul) + add + (i >> 8) * 3) as u8;
    }
}

impl Bed {
    fn new(t: Tr, mtu: Mtu, ipa: &str, ipb: &str) -> Bed {
        let ipa: IpAddr = ipa.parse().unwrap();
        let ipb: IpAddr = ipb.parse().unwrap();
        let mut a = Host::new(ipa, mtu);
        let mut b = Host::new(ipb, mtu);
        let ca = a.context(1, SPACE);
        let cb = b.context(2, SPACE);
        let pa = a.pd(ca);
        let ka = a.mr(pa, 0, SPACE as u64, ALL);
        let cqa = a.cq(ca);
        // Another PD and CQ on B first, so "the right one" is not simply the first one.
        let decoy_pd = b.pd(cb);
        let _decoy_key = b.mr(decoy_pd, 0, SPACE as u64, ALL);
        let decoy_cq = b.cq(cb);
        let pb = b.pd(cb);
        // MW_BIND: a Send with Invalidate needs a type 2 window bound over it.
        let kb = b.mr(pb, 0, SPACE as u64, ALL | Access::MW_BIND);
        let cqb = b.cq(cb);
        let (qa, qb, srq) = match t {
            Tr::Xrc => {
                let xrcd = b.xrcd(cb, 7);
                let srq = b.xrc_srq(pb, xrcd, cqb, 64);
                let (_, qb) = b.xrc_recv_qp(cb, xrcd);
                let qa = a.qp(QpType::XrcSend, pa, cqa, None);
                (qa, qb, Some(srq))
            }
            _ => {
                let qt = match t {
                    Tr::Rc => QpType::Rc,
                    Tr::Uc => QpType::Uc,
                    _ => QpType::Ud,
                };
                let qa = a.qp(qt, pa, cqa, None);
                let qb = b.qp(qt, pb, cqb, None);
                (qa, qb, None)
            }
        };
        let p = ConnParams {
            mtu,
            qkey: QKEY,
            ..ConnParams::default()
        };
        let (ga, gb) = (a.gid, b.gid);
        a.connect(qa, gb, qb, p);
        b.connect(qb, ga, qa, p);
        fill(a.mem.space_mut(ca), 7, 3);
        fill(b.mem.space_mut(cb), 13, 5);
        Bed {
            net: Network::new(vec![a, b], Faults::NONE, 42),
            t,
            ca,
            cb,
            ka,
            kb,
            pb,
            cqa,
            cqb,
            decoy_cq,
            qa,
            qb,
            srq,
        }
    }

    fn a(&mut self) -> &mut Host {
        &mut self.net.hosts[0]
    }

    fn b(&mut self) -> &mut Host {
        &mut self.net.hosts[1]
    }

    fn post_recv(&mut self, wr: RecvWr) {
        let (qb, srq) = (self.qb, self.srq);
        let r = match srq {
            Some((key, _)) => self.b().engine.post_srq_recv(key, wr),
            None => self.b().engine.post_recv(qb, wr),
        };
        r.expect("post_recv");
    }

    /// A type 2 window of B's PD bound to B's QP over `[RDMA, RDMA + 4096)`: what a Send with
    /// Invalidate must name (IBA 10.6.7.2.5; docs/design/memory-windows.md). Returns its R_Key once
    /// the bind has completed (its completion taken off B's CQ).
    fn bound_window(&mut self) -> u32 {
        let (pb, qb, kb, cqb) = (self.pb, self.qb, self.kb, self.cqb);
        let (_, k0) = self.b().mw(pb, MwType::Two);
        let new_rkey = (k0 & !0xff) | 0x5a;
        let bind = BindMw {
            mw_rkey: k0,
            new_rkey,
            mr_lkey: kb,
            addr: RDMA,
            length: 4096,
            access: Access::REMOTE_READ | Access::REMOTE_WRITE,
        };
        self.b()
            .engine
            .post_send(
                qb,
                SendWr::new(7, SendOp::BindMw(bind), Payload::Sges(vec![])),
            )
            .expect("post bind");
        let ok = self.net.run_until(Duration::from_secs(1), |n| {
            !n.hosts[1].completions.is_empty()
        });
        assert!(ok, "the bind did not complete");
        let w = self.b().take_completions(cqb);
        assert_eq!(
            w.iter().map(|w| (w.status, w.opcode)).collect::<Vec<_>>(),
            vec![(WcStatus::Success, WcOpcode::BindMw)],
            "the bind's completion"
        );
        new_rkey
    }

    /// A signaled send WR with the UD / XRC addressing this bed needs.
    fn wr(&self, wr_id: u64, op: SendOp, payload: Payload) -> SendWr {
        let mut wr = SendWr::new(wr_id, op, payload);
        if self.t == Tr::Ud {
            wr.ud = Some(UdDest {
                dgid: self.net.hosts[1].gid,
                dest_qpn: self.qb,
                qkey: QKEY,
            });
        }
        if let Some((_, srqn)) = self.srq {
            wr.remote_srqn = srqn;
        }
        wr
    }

    /// Runs until A has `na` completions and B has `nb`, then on until the network is idle,
    /// so late extra completions are seen too.
    fn run(&mut self, ctx: &str, na: usize, nb: usize) {
        let ok = self.net.run_until(Duration::from_secs(2), |n| {
            n.hosts[0].completions.len() >= na && n.hosts[1].completions.len() >= nb
        });
        assert!(
            ok,
            "{ctx}: timed out: A {:?} {:?}, B {:?} {:?}",
            self.net.hosts[0].completions,
            self.net.hosts[0].failures,
            self.net.hosts[1].completions,
            self.net.hosts[1].failures
        );
        self.net.run_until(Duration::from_millis(200), |_| false);
    }
}

/// The send gather list for `len` bytes: two non-adjacent pieces when there are two bytes.
fn src_sges(len: u32) -> Vec<(u64, u32)> {
    match len {
        0 => vec![],
        1 => vec![(SRC1, 1)],
        _ => vec![(SRC1, len / 2), (SRC2, len - len / 2)],
    }
}

fn dst_sges(len: u32) -> Vec<(u64, u32)> {
    match len {
        0 => vec![],
        1 => vec![(DST1, 1)],
        _ => vec![(DST1, len / 3 + 1), (DST2, len - len / 3 - 1)],
    }
}

fn recv_sges() -> Vec<(u64, u32)> {
    vec![(RBUF1, RBUF1_LEN), (RBUF2, RBUF2_LEN)]
}

fn sges(list: &[(u64, u32)], lkey: u32) -> Vec<Sge> {
    list.iter()
        .map(|&(addr, length)| Sge { addr, length, lkey })
        .collect()
}

fn gather(space: &[u8], list: &[(u64, u32)], len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for &(addr, l) in list {
        let n = (l as usize).min(len - out.len());
        out.extend_from_slice(&space[addr as usize..addr as usize + n]);
    }
    assert_eq!(out.len(), len, "gather list too short");
    out
}

fn scatter(space: &mut [u8], list: &[(u64, u32)], data: &[u8]) {
    let mut done = 0;
    for &(addr, l) in list {
        let n = (l as usize).min(data.len() - done);
        space[addr as usize..addr as usize + n].copy_from_slice(&data[done..done + n]);
        done += n;
    }
    assert_eq!(done, data.len(), "scatter list too short");
}

/// Asserts two address spaces are equal, reporting the first difference (not 1 MiB of bytes).
fn assert_space(what: &str, got: &[u8], want: &[u8]) {
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
        let end = (i + 16).min(got.len());
        panic!(
            "{what}: first difference at {i:#x}: got {:02x?}, want {:02x?}",
            &got[i..end],
            &want[i..end]
        );
    }
    assert_eq!(got.len(), want.len(), "{what}: length");
}

fn sizes(t: Tr, op: Op, mtu: u32) -> Vec<u32> {
    if matches!(op, Op::Cas | Op::Faa) {
        return vec![8];
    }
    let mut v = vec![0, 1, mtu - 1, mtu, mtu + 1, 3 * mtu + 17];
    if op == Op::InlineSend {
        v.push(max_inline(t));
        v.retain(|&s| s <= max_inline(t));
    }
    if t == Tr::Ud {
        v.retain(|&s| s <= mtu);
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// Checks the 40 bytes before UD data: an IPv4 RoCE v2 GRH is 20 zero bytes and then the
/// IPv4 header (what rdma-core's `ibv_init_ah_from_wc` parses); an IPv6 one is the IPv6
/// header.
fn check_grh(ctx: &str, grh: &[u8], src: IpAddr, dst: IpAddr) {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            assert_eq!(&grh[..20], &[0u8; 20], "{ctx}: GRH reserved bytes");
            let h = &grh[20..40];
            assert_eq!(h[0], 0x45, "{ctx}: IPv4 version/IHL");
            assert_eq!(h[9], 17, "{ctx}: IPv4 protocol");
            assert_eq!(&h[12..16], &s.octets(), "{ctx}: IPv4 source");
            assert_eq!(&h[16..20], &d.octets(), "{ctx}: IPv4 destination");
            let mut sum = 0u32;
            for c in h.chunks(2) {
                sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
            }
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            assert_eq!(sum, 0xffff, "{ctx}: IPv4 header checksum");
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            assert_eq!(grh[0] >> 4, 6, "{ctx}: IPv6 version");
            assert_eq!(grh[6], 17, "{ctx}: IPv6 next header");
            assert_eq!(&grh[8..24], &s.octets(), "{ctx}: IPv6 source");
            assert_eq!(&grh[24..40], &d.octets(), "{ctx}: IPv6 destination");
        }
        _ => panic!("mixed address families"),
    }
}

/// One case of the matrix.
fn run_case(t: Tr, op: Op, len: u32, mtu: Mtu) {
    let ctx = format!("{t:?} {op:?} len={len} mtu={}", mtu.bytes());
    let mut bed = Bed::new(t, mtu, "10.0.0.1", "10.0.0.2");
    let (ka, kb) = (bed.ka, bed.kb);
    let b0 = V0.to_ne_bytes();
    let cb = bed.cb;
    bed.b().mem.space_mut(cb)[ATOM as usize..ATOM as usize + 8].copy_from_slice(&b0);
    bed.post_recv(RecvWr {
        wr_id: RECV_WR_ID,
        sges: sges(&recv_sges(), kb),
    });
    let inv_rkey = if op == Op::SendInv {
        bed.bound_window()
    } else {
        0
    };
    let (sop, payload) = match op {
        Op::Send => (SendOp::Send, Payload::Sges(sges(&src_sges(len), ka))),
        Op::SendImm => (
            SendOp::SendWithImm(IMM),
            Payload::Sges(sges(&src_sges(len), ka)),
        ),
        Op::SendInv => (
            SendOp::SendWithInv(inv_rkey),
            Payload::Sges(sges(&src_sges(len), ka)),
        ),
        Op::InlineSend => {
            let ca = bed.ca;
            let bytes = gather(bed.a().mem.space(ca), &src_sges(len), len as usize);
            (SendOp::Send, Payload::Inline(bytes))
        }
        Op::Write => (
            SendOp::Write {
                remote_addr: RDMA,
                rkey: kb,
            },
            Payload::Sges(sges(&src_sges(len), ka)),
        ),
        Op::WriteImm => (
            SendOp::WriteWithImm {
                remote_addr: RDMA,
                rkey: kb,
                imm: IMM,
            },
            Payload::Sges(sges(&src_sges(len), ka)),
        ),
        Op::Read => (
            SendOp::Read {
                remote_addr: RDMA,
                rkey: kb,
            },
            Payload::Sges(sges(&dst_sges(len), ka)),
        ),
        Op::Cas => (
            SendOp::CompareSwap {
                remote_addr: ATOM,
                rkey: kb,
                compare: V0,
                swap: V1,
            },
            Payload::Sges(sges(&[(DST1, 8)], ka)),
        ),
        Op::Faa => (
            SendOp::FetchAdd {
                remote_addr: ATOM,
                rkey: kb,
                add: ADD,
            },
            Payload::Sges(sges(&[(DST1, 8)], ka)),
        ),
    };
    let wr = bed.wr(SEND_WR_ID, sop, payload);
    let qa = bed.qa;
    bed.a().engine.post_send(qa, wr).expect("post_send");
    let (ca, cb) = (bed.ca, bed.cb);
    if op == Op::InlineSend {
        // Inline data was copied at post time: changing the buffer now must not matter.
        let src = gather(bed.a().mem.space(ca), &src_sges(len), len as usize);
        for &(addr, l) in &src_sges(len) {
            bed.a().mem.space_mut(ca)[addr as usize..(addr + u64::from(l)) as usize].fill(0);
        }
        let before = bed.a().mem.space(ca).to_vec();
        let mut expect_b = bed.b().mem.space(cb).to_vec();
        bed.run(&ctx, 1, 1);
        check_send(&ctx, &mut bed, (op, 0), &src, &mut expect_b);
        assert_space(&format!("{ctx}: A memory"), bed.a().mem.space(ca), &before);
        return;
    }
    let before_a = bed.a().mem.space(ca).to_vec();
    let before_b = bed.b().mem.space(cb).to_vec();
    let (mut expect_a, mut expect_b) = (before_a.clone(), before_b.clone());
    let src = gather(&before_a, &src_sges(len), len as usize);
    bed.run(&ctx, 1, usize::from(consumes_recv(op)));

    // The requester's completion.
    let cqa = bed.cqa;
    let wcs = bed.a().take_completions(cqa);
    assert!(
        bed.a().completions.is_empty(),
        "{ctx}: completions on other CQs of A: {:?}",
        bed.a().completions
    );
    assert_eq!(wcs.len(), 1, "{ctx}: requester completions {wcs:?}");
    let wc = wcs[0];
    let opcode = match op {
        Op::Write | Op::WriteImm => WcOpcode::RdmaWrite,
        Op::Read => WcOpcode::RdmaRead,
        Op::Cas => WcOpcode::CompSwap,
        Op::Faa => WcOpcode::FetchAdd,
        _ => WcOpcode::Send,
    };
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.qp_num),
        (SEND_WR_ID, WcStatus::Success, opcode, qa),
        "{ctx}: requester completion {wc:?}"
    );
    if op == Op::Read {
        assert_eq!(wc.byte_len, len, "{ctx}: READ byte_len");
    }
    if matches!(op, Op::Cas | Op::Faa) {
        assert_eq!(wc.byte_len, 8, "{ctx}: atomic byte_len");
    }

    match op {
        Op::Send | Op::SendImm | Op::SendInv => {
            check_send(&ctx, &mut bed, (op, inv_rkey), &src, &mut expect_b);
        }
        Op::Write | Op::WriteImm => {
            expect_b[RDMA as usize..RDMA as usize + len as usize].copy_from_slice(&src);
            if len > 0 {
                assert_ne!(
                    &before_b[RDMA as usize..RDMA as usize + len as usize],
                    &src[..],
                    "{ctx}: test data must differ"
                );
            }
            let rwcs = recv_side(&ctx, &mut bed);
            if op == Op::WriteImm {
                assert_eq!(rwcs.len(), 1, "{ctx}: receiver completions {rwcs:?}");
                let r = rwcs[0];
                assert_eq!(
                    (r.wr_id, r.status, r.opcode, r.byte_len),
                    (
                        RECV_WR_ID,
                        WcStatus::Success,
                        WcOpcode::RecvRdmaWithImm,
                        len
                    ),
                    "{ctx}: receiver completion {r:?}"
                );
                assert_eq!(
                    (r.imm_data, r.wc_flags, r.qp_num),
                    (IMM, WC_WITH_IMM, bed.qb),
                    "{ctx}: receiver completion {r:?}"
                );
            } else {
                assert!(rwcs.is_empty(), "{ctx}: WRITE consumed a receive: {rwcs:?}");
            }
        }
        Op::Read => {
            let data = before_b[RDMA as usize..RDMA as usize + len as usize].to_vec();
            scatter(&mut expect_a, &dst_sges(len), &data);
            if len > 0 {
                assert_ne!(
                    gather(&before_a, &dst_sges(len), len as usize),
                    data,
                    "{ctx}: test data must differ"
                );
            }
            let rwcs = recv_side(&ctx, &mut bed);
            assert!(rwcs.is_empty(), "{ctx}: READ consumed a receive: {rwcs:?}");
        }
        Op::Cas | Op::Faa => {
            let new = if op == Op::Cas { V1 } else { V0 + ADD };
            expect_b[ATOM as usize..ATOM as usize + 8].copy_from_slice(&new.to_ne_bytes());
            expect_a[DST1 as usize..DST1 as usize + 8].copy_from_slice(&V0.to_ne_bytes());
            let rwcs = recv_side(&ctx, &mut bed);
            assert!(
                rwcs.is_empty(),
                "{ctx}: atomic consumed a receive: {rwcs:?}"
            );
        }
        Op::InlineSend => unreachable!("handled above"),
    }
    // The receive WR is still there unless the operation consumed it.
    if let Some((key, _)) = bed.srq {
        let left = bed.b().engine.srq_len(key);
        assert_eq!(
            left,
            usize::from(!consumes_recv(op)),
            "{ctx}: receive WRs left in the XRC SRQ"
        );
    }
    assert_space(
        &format!("{ctx}: A memory"),
        bed.a().mem.space(ca),
        &expect_a,
    );
    assert_space(
        &format!("{ctx}: B memory"),
        bed.b().mem.space(cb),
        &expect_b,
    );
    assert_healthy(&ctx, &bed);
}

fn assert_healthy(ctx: &str, bed: &Bed) {
    for (i, h) in bed.net.hosts.iter().enumerate() {
        assert!(
            h.failures.is_empty(),
            "{ctx}: host {i} failures {:?}",
            h.failures
        );
    }
}

/// B's receive-side completions: all must be on the receive CQ (for XRC: the SRQ's CQ).
fn recv_side(ctx: &str, bed: &mut Bed) -> Vec<WorkCompletion> {
    let cqb = bed.cqb;
    let decoy = bed.decoy_cq;
    let others: Vec<_> = bed
        .b()
        .completions
        .iter()
        .filter(|(c, _)| *c != cqb)
        .copied()
        .collect();
    assert!(
        others.is_empty(),
        "{ctx}: completions on other CQs of B (decoy {decoy:#x}, want {cqb:#x}): {others:?}"
    );
    bed.b().take_completions(cqb)
}

/// Checks a SEND's arrival: the receiver completion, and the bytes (UD: after the GRH);
/// `inv_rkey` is the key a Send with Invalidate named.
fn check_send(
    ctx: &str,
    bed: &mut Bed,
    (op, inv_rkey): (Op, u32),
    src: &[u8],
    expect_b: &mut [u8],
) {
    let len = src.len() as u32;
    let rwcs = recv_side(ctx, bed);
    assert_eq!(rwcs.len(), 1, "{ctx}: receiver completions {rwcs:?}");
    let r = rwcs[0];
    let ud = bed.t == Tr::Ud;
    let hdr = if ud { 40 } else { 0 };
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len, r.qp_num),
        (
            RECV_WR_ID,
            WcStatus::Success,
            WcOpcode::Recv,
            hdr + len,
            bed.qb
        ),
        "{ctx}: receiver completion {r:?}"
    );
    let (imm, flags) = match op {
        Op::SendImm => (IMM, WC_WITH_IMM),
        Op::SendInv => (inv_rkey, WC_WITH_INV),
        _ => (0, 0),
    };
    let flags = if ud { flags | WC_GRH } else { flags };
    assert_eq!(r.wc_flags, flags, "{ctx}: wc_flags of {r:?}");
    if flags & (WC_WITH_IMM | WC_WITH_INV) != 0 {
        assert_eq!(r.imm_data, imm, "{ctx}: imm_data of {r:?}");
    }
    if ud {
        assert_eq!(r.src_qp, bed.qa, "{ctx}: src_qp of {r:?}");
        // mlx5's L3 header type for an IPv4 RoCE v2 datagram (docs/design/roce-wire.md).
        let v4 = bed.net.hosts[0].gid.to_ip().is_ipv4();
        assert_eq!(r.sl, if v4 { 2 } else { 1 }, "{ctx}: sl of {r:?}");
    } else {
        assert_eq!(r.sl, 0, "{ctx}: sl of {r:?}");
    }
    let cb = bed.cb;
    let got = gather(bed.b().mem.space(cb), &recv_sges(), (hdr + len) as usize);
    if ud {
        let (ga, gb) = (bed.net.hosts[0].gid, bed.net.hosts[1].gid);
        check_grh(ctx, &got[..40], ga.to_ip(), gb.to_ip());
    }
    assert_eq!(&got[hdr as usize..], src, "{ctx}: received bytes");
    scatter(expect_b, &recv_sges(), &got);
    if let Some((key, _)) = bed.srq {
        assert_eq!(bed.b().engine.srq_len(key), 0, "{ctx}: XRC SRQ WR consumed");
    }
    let cb = bed.cb;
    assert_space(&format!("{ctx}: B memory"), bed.b().mem.space(cb), expect_b);
    assert_healthy(ctx, bed);
}

fn run_matrix(t: Tr, mtus: &[Mtu]) {
    let mut cases = 0;
    for &mtu in mtus {
        for op in OPS {
            if !valid(t, op) || no_window_to_name(t, op) {
                continue;
            }
            for len in sizes(t, op, mtu.bytes()) {
                run_case(t, op, len, mtu);
                cases += 1;
            }
        }
    }
    assert!(cases > 0);
}

#[test]
fn matrix_rc() {
    run_matrix(Tr::Rc, &[Mtu::M256, Mtu::M1024, Mtu::M4096]);
}

#[test]
fn matrix_uc() {
    run_matrix(Tr::Uc, &[Mtu::M256, Mtu::M1024, Mtu::M4096]);
}

#[test]
fn matrix_ud() {
    run_matrix(Tr::Ud, &[Mtu::M256, Mtu::M1024]);
}

/// UD messages may be as large as the port's active MTU (UD has no path MTU attribute; rxe's
/// `get_mtu` uses the port MTU for UD). On a 4096-MTU port a 4096-byte datagram must go.
#[test]
fn matrix_ud_port_mtu_4096() {
    run_matrix(Tr::Ud, &[Mtu::M4096]);
}

/// IBA C10-93.1.1: a UD message longer than the port MTU emits no packet and generates no
/// error (rxe "fakes a successful UD send"); the QP stays usable.
#[test]
fn ud_message_longer_than_the_port_mtu_is_not_sent() {
    for (mtu, len) in [(Mtu::M256, 257u32), (Mtu::M1024, 1025), (Mtu::M1024, 3000)] {
        let ctx = format!("port mtu {} len {len}", mtu.bytes());
        let mut bed = Bed::new(Tr::Ud, mtu, "10.0.0.1", "10.0.0.2");
        bed.net.capture = Some(Vec::new());
        let (ka, kb, qa) = (bed.ka, bed.kb, bed.qa);
        for id in [1, 2] {
            bed.post_recv(RecvWr {
                wr_id: id,
                sges: sges(&recv_sges(), kb),
            });
        }
        let wr = bed.wr(1, SendOp::Send, Payload::Sges(sges(&[(SRC1, len)], ka)));
        bed.a().engine.post_send(qa, wr).unwrap();
        let wr = bed.wr(2, SendOp::Send, Payload::Sges(sges(&[(SRC1, 10)], ka)));
        bed.a().engine.post_send(qa, wr).unwrap();
        bed.run(&ctx, 2, 1);
        let cqa = bed.cqa;
        let w = bed.a().take_completions(cqa);
        assert_eq!(
            w.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            vec![(1, WcStatus::Success), (2, WcStatus::Success)],
            "{ctx}"
        );
        assert_eq!(
            bed.net.capture.as_ref().map(Vec::len),
            Some(1),
            "{ctx}: only the small datagram is on the wire"
        );
        let r = recv_side(&ctx, &mut bed);
        assert_eq!(
            r.iter()
                .map(|w| (w.wr_id, w.status, w.byte_len))
                .collect::<Vec<_>>(),
            vec![(1, WcStatus::Success, 50)],
            "{ctx}"
        );
        assert_healthy(&ctx, &bed);
    }
}

#[test]
fn matrix_xrc() {
    run_matrix(Tr::Xrc, &[Mtu::M256, Mtu::M1024, Mtu::M4096]);
}

/// A compare-and-swap whose compare value does not match returns the original and leaves
/// memory alone (RC and XRC).
#[test]
fn compare_swap_mismatch_leaves_memory() {
    for t in [Tr::Rc, Tr::Xrc] {
        let mut bed = Bed::new(t, Mtu::M1024, "10.0.0.1", "10.0.0.2");
        let (ka, kb, cb, ca, qa) = (bed.ka, bed.kb, bed.cb, bed.ca, bed.qa);
        bed.b().mem.space_mut(cb)[ATOM as usize..ATOM as usize + 8]
            .copy_from_slice(&V0.to_ne_bytes());
        let wr = bed.wr(
            1,
            SendOp::CompareSwap {
                remote_addr: ATOM,
                rkey: kb,
                compare: V0 ^ 1,
                swap: V1,
            },
            Payload::Sges(sges(&[(DST1, 8)], ka)),
        );
        bed.a().engine.post_send(qa, wr).unwrap();
        bed.run(&format!("{t:?}"), 1, 0);
        let cqa = bed.cqa;
        let wcs = bed.a().take_completions(cqa);
        assert_eq!(
            wcs.iter()
                .map(|w| (w.wr_id, w.status, w.opcode))
                .collect::<Vec<_>>(),
            vec![(1, WcStatus::Success, WcOpcode::CompSwap)],
            "{t:?}"
        );
        assert_eq!(
            bed.b().mem.space(cb)[ATOM as usize..ATOM as usize + 8],
            V0.to_ne_bytes(),
            "{t:?}"
        );
        assert_eq!(
            bed.a().mem.space(ca)[DST1 as usize..DST1 as usize + 8],
            V0.to_ne_bytes(),
            "{t:?}"
        );
    }
}

/// Many operations of every kind back to back on one connection, completing in order.
#[test]
fn mixed_stream_completes_in_order() {
    for t in TRANSPORTS {
        let mut bed = Bed::new(t, Mtu::M1024, "10.0.0.1", "10.0.0.2");
        let (ka, kb, qa) = (bed.ka, bed.kb, bed.qa);
        let ops: Vec<Op> = OPS
            .into_iter()
            .filter(|&op| valid(t, op) && !no_window_to_name(t, op))
            .collect();
        // One bound window per Send with Invalidate (each invalidates its own).
        let windows: Vec<u32> = if ops.contains(&Op::SendInv) {
            (0..5).map(|_| bed.bound_window()).collect()
        } else {
            Vec::new()
        };
        let mut want = Vec::new();
        let mut recvs = 0;
        for round in 0..5u64 {
            for (i, &op) in ops.iter().enumerate() {
                let id = round * 100 + i as u64;
                let len = 700 + 500 * round as u32;
                let len = if t == Tr::Ud { len.min(1024) } else { len };
                let sg = Payload::Sges(sges(&[(SRC1, len)], ka));
                let (sop, payload) = match op {
                    Op::Send => (SendOp::Send, sg),
                    Op::SendImm => (SendOp::SendWithImm(id as u32), sg),
                    Op::SendInv => (SendOp::SendWithInv(windows[round as usize]), sg),
                    Op::InlineSend => (SendOp::Send, Payload::Inline(vec![id as u8; 100])),
                    Op::Write => (
                        SendOp::Write {
                            remote_addr: RDMA,
                            rkey: kb,
                        },
                        sg,
                    ),
                    Op::WriteImm => (
                        SendOp::WriteWithImm {
                            remote_addr: RDMA,
                            rkey: kb,
                            imm: id as u32,
                        },
                        sg,
                    ),
                    Op::Read => (
                        SendOp::Read {
                            remote_addr: RDMA,
                            rkey: kb,
                        },
                        Payload::Sges(sges(&[(DST1, len)], ka)),
                    ),
                    Op::Cas => (
                        SendOp::CompareSwap {
                            remote_addr: ATOM,
                            rkey: kb,
                            compare: 0,
                            swap: 0,
                        },
                        Payload::Sges(sges(&[(DST2, 8)], ka)),
                    ),
                    Op::Faa => (
                        SendOp::FetchAdd {
                            remote_addr: ATOM,
                            rkey: kb,
                            add: 1,
                        },
                        Payload::Sges(sges(&[(DST2, 8)], ka)),
                    ),
                };
                if consumes_recv(op) {
                    bed.post_recv(RecvWr {
                        wr_id: id,
                        sges: sges(&recv_sges(), kb),
                    });
                    recvs += 1;
                }
                let wr = bed.wr(id, sop, payload);
                bed.a().engine.post_send(qa, wr).unwrap();
                want.push(id);
            }
        }
        bed.run(&format!("{t:?}"), want.len(), recvs);
        let cqa = bed.cqa;
        let got: Vec<u64> = bed
            .a()
            .take_completions(cqa)
            .iter()
            .inspect(|w| assert_eq!(w.status, WcStatus::Success, "{t:?} {w:?}"))
            .map(|w| w.wr_id)
            .collect();
        assert_eq!(got, want, "{t:?}: requester completion order");
        let r = recv_side(&format!("{t:?}"), &mut bed);
        assert_eq!(r.len(), recvs, "{t:?}: receiver completions");
        assert!(r.iter().all(|w| w.status == WcStatus::Success), "{t:?}");
        assert_healthy(&format!("{t:?}"), &bed);
    }
}

/// A Send with Invalidate arriving on an XRC receive QP names no window bound to it (the QP
/// has no send queue to bind one): IBA 10.6.7.2.5 / o10-37.2.26 make it an invalid request,
/// as on RC — `REM_INV_REQ_ERR` at the sender (Invalid Request NAK) and on the SRQ receive,
/// the XRC receive QP in error with `IBV_EVENT_QP_REQ_ERR`. The key here is B's MR.
#[test]
fn xrc_send_with_invalidate_is_an_invalid_request() {
    let mut bed = Bed::new(Tr::Xrc, Mtu::M1024, "10.0.0.1", "10.0.0.2");
    let (ka, kb, qa, qb) = (bed.ka, bed.kb, bed.qa, bed.qb);
    bed.post_recv(RecvWr {
        wr_id: RECV_WR_ID,
        sges: sges(&recv_sges(), kb),
    });
    let wr = bed.wr(
        SEND_WR_ID,
        SendOp::SendWithInv(kb),
        Payload::Sges(sges(&src_sges(100), ka)),
    );
    bed.a().engine.post_send(qa, wr).unwrap();
    bed.run("XRC SendWithInv", 1, 1);
    let cqa = bed.cqa;
    let a: Vec<_> = bed
        .a()
        .take_completions(cqa)
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(a, vec![(SEND_WR_ID, WcStatus::RemInvReqErr)]);
    let r: Vec<_> = recv_side("XRC SendWithInv", &mut bed)
        .iter()
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert_eq!(r, vec![(RECV_WR_ID, WcStatus::RemInvReqErr)]);
    assert_eq!(bed.b().failures, vec![(qb, Some(EventType::QpReqErr))]);
}

/// UD over IPv6 GIDs: the GRH is the IPv6 header.
#[test]
fn ud_ipv6_grh() {
    let mut bed = Bed::new(Tr::Ud, Mtu::M1024, "fd00::1", "fd00::2");
    let (ka, kb, qa) = (bed.ka, bed.kb, bed.qa);
    bed.post_recv(RecvWr {
        wr_id: 5,
        sges: sges(&recv_sges(), kb),
    });
    let wr = bed.wr(1, SendOp::Send, Payload::Sges(sges(&[(SRC1, 300)], ka)));
    bed.a().engine.post_send(qa, wr).unwrap();
    bed.run("ud6", 1, 1);
    let r = recv_side("ud6", &mut bed);
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].status, r[0].byte_len, r[0].wc_flags, r[0].src_qp),
        (WcStatus::Success, 340, WC_GRH, qa)
    );
    assert_eq!(r[0].sl, 1, "IPv6: mlx5's L3 header type 1");
    let cb = bed.cb;
    let got = gather(bed.b().mem.space(cb), &recv_sges(), 340);
    let (ga, gb) = (bed.net.hosts[0].gid, bed.net.hosts[1].gid);
    check_grh("ud6", &got[..40], ga.to_ip(), gb.to_ip());
    let ca = bed.ca;
    assert_eq!(
        &got[40..],
        &bed.a().mem.space(ca)[SRC1 as usize..SRC1 as usize + 300]
    );
}

/// The GRH a UD receive gets is the IP header the datagram actually arrived with (a NIC DMAs
/// the real header): same length field, TTL/hop limit, addresses and checksum as on the wire.
#[test]
fn ud_grh_matches_the_received_ip_header() {
    for (ipa, ipb) in [("10.0.0.1", "10.0.0.2"), ("fd00::1", "fd00::2")] {
        for (imm, len) in [
            (false, 0u32),
            (false, 1),
            (false, 301),
            (true, 1),
            (true, 1024),
        ] {
            let ctx = format!("{ipa} imm={imm} len={len}");
            let mut bed = Bed::new(Tr::Ud, Mtu::M1024, ipa, ipb);
            bed.net.capture = Some(Vec::new());
            let (ka, kb, qa) = (bed.ka, bed.kb, bed.qa);
            bed.post_recv(RecvWr {
                wr_id: 5,
                sges: sges(&recv_sges(), kb),
            });
            let op = if imm {
                SendOp::SendWithImm(IMM)
            } else {
                SendOp::Send
            };
            let wr = bed.wr(1, op, Payload::Sges(sges(&src_sges(len), ka)));
            bed.a().engine.post_send(qa, wr).unwrap();
            bed.run(&ctx, 1, 1);
            let cap = bed.net.capture.take().unwrap();
            assert_eq!(cap.len(), 1, "{ctx}: one datagram");
            let dgram = &cap[0].1;
            let cb = bed.cb;
            let got = gather(bed.b().mem.space(cb), &recv_sges(), 40 + len as usize);
            if ipa.contains(':') {
                assert_eq!(&got[..40], &dgram[..40], "{ctx}: GRH vs IPv6 header");
            } else {
                assert_eq!(&got[..20], &[0u8; 20], "{ctx}");
                assert_eq!(&got[20..40], &dgram[..20], "{ctx}: GRH vs IPv4 header");
            }
        }
    }
}

/// A UD datagram whose Q_Key differs from the receiver's is dropped without a trace; the
/// receive WR stays for the next one. A WR Q_Key with the high bit set means "the QP's own".
#[test]
fn ud_qkey_mismatch_is_silently_dropped() {
    let mut bed = Bed::new(Tr::Ud, Mtu::M1024, "10.0.0.1", "10.0.0.2");
    let (ka, kb, qa, qb) = (bed.ka, bed.kb, bed.qa, bed.qb);
    for id in [11, 12] {
        bed.post_recv(RecvWr {
            wr_id: id,
            sges: sges(&recv_sges(), kb),
        });
    }
    let gb = bed.net.hosts[1].gid;
    let mut wr = bed.wr(1, SendOp::Send, Payload::Sges(sges(&[(SRC1, 100)], ka)));
    wr.ud = Some(UdDest {
        dgid: gb,
        dest_qpn: qb,
        qkey: QKEY ^ 0x10,
    });
    bed.a().engine.post_send(qa, wr).unwrap();
    bed.run("qkey", 1, 0);
    let cqa = bed.cqa;
    let w = bed.a().take_completions(cqa);
    // The sender cannot know: UD completes when sent.
    assert_eq!(
        w.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success)]
    );
    assert!(bed.b().completions.is_empty(), "{:?}", bed.b().completions);
    assert_healthy("qkey", &bed);
    let cb = bed.cb;
    let untouched = bed.b().mem.space(cb)[RBUF1 as usize..RBUF1 as usize + 64].to_vec();
    let mut b_before = bed.b().mem.space(cb).to_vec();
    b_before[RBUF1 as usize..RBUF1 as usize + 64].copy_from_slice(&untouched);

    // Now with the right Q_Key, given as "use the QP's Q_Key" (high bit set).
    let mut wr = bed.wr(2, SendOp::Send, Payload::Sges(sges(&[(SRC1, 100)], ka)));
    wr.ud = Some(UdDest {
        dgid: gb,
        dest_qpn: qb,
        qkey: 0x8000_0000,
    });
    bed.a().engine.post_send(qa, wr).unwrap();
    bed.run("qkey", 1, 1);
    let r = recv_side("qkey", &mut bed);
    assert_eq!(
        r.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(11, WcStatus::Success, 140)],
        "the first receive WR was still there"
    );
}

/// Operations a transport does not have are refused at post time with `EINVAL`, and nothing
/// is queued.
#[test]
fn invalid_operations_are_refused_at_post() {
    for t in TRANSPORTS {
        let mut bed = Bed::new(t, Mtu::M1024, "10.0.0.1", "10.0.0.2");
        let (ka, kb, qa) = (bed.ka, bed.kb, bed.qa);
        for op in OPS {
            if valid(t, op) {
                continue;
            }
            let (sop, len) = match op {
                Op::SendInv => (SendOp::SendWithInv(1), 16),
                Op::Write => (
                    SendOp::Write {
                        remote_addr: RDMA,
                        rkey: kb,
                    },
                    16,
                ),
                Op::WriteImm => (
                    SendOp::WriteWithImm {
                        remote_addr: RDMA,
                        rkey: kb,
                        imm: 1,
                    },
                    16,
                ),
                Op::Read => (
                    SendOp::Read {
                        remote_addr: RDMA,
                        rkey: kb,
                    },
                    16,
                ),
                Op::Cas => (
                    SendOp::CompareSwap {
                        remote_addr: ATOM,
                        rkey: kb,
                        compare: 0,
                        swap: 1,
                    },
                    8,
                ),
                Op::Faa => (
                    SendOp::FetchAdd {
                        remote_addr: ATOM,
                        rkey: kb,
                        add: 1,
                    },
                    8,
                ),
                Op::Send | Op::SendImm | Op::InlineSend => unreachable!("valid everywhere"),
            };
            let wr = bed.wr(1, sop, Payload::Sges(sges(&[(DST1, len)], ka)));
            assert_eq!(
                bed.a().engine.post_send(qa, wr),
                Err(PostError::Invalid),
                "{t:?} {op:?}"
            );
        }
        // Atomics need exactly one 8-byte result buffer.
        if matches!(t, Tr::Rc | Tr::Xrc) {
            for len in [4, 16] {
                let wr = bed.wr(
                    2,
                    SendOp::FetchAdd {
                        remote_addr: ATOM,
                        rkey: kb,
                        add: 1,
                    },
                    Payload::Sges(sges(&[(DST1, len)], ka)),
                );
                assert_eq!(
                    bed.a().engine.post_send(qa, wr),
                    Err(PostError::Invalid),
                    "{t:?} FetchAdd into {len} bytes"
                );
            }
        }
        if t == Tr::Ud {
            // A UD send needs an address handle.
            let mut wr = bed.wr(3, SendOp::Send, Payload::Sges(sges(&[(SRC1, 8)], ka)));
            wr.ud = None;
            assert_eq!(
                bed.a().engine.post_send(qa, wr),
                Err(PostError::Invalid),
                "UD without a destination"
            );
        }
        // More inline data than the QP allows.
        let wr = bed.wr(
            4,
            SendOp::Send,
            Payload::Inline(vec![0; max_inline(t) as usize + 1]),
        );
        assert_eq!(
            bed.a().engine.post_send(qa, wr),
            Err(PostError::Invalid),
            "{t:?} oversized inline"
        );
        assert_eq!(
            bed.a().engine.send_queue_len(qa),
            0,
            "{t:?}: nothing queued"
        );
        bed.net.run_until(Duration::from_millis(10), |_| false);
        assert!(bed.a().completions.is_empty(), "{t:?}");
        assert_healthy(&format!("{t:?}"), &bed);
    }
}
