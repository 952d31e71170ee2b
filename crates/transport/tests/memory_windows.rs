//! Memory windows on the deterministic network (IBA 10.6.7; docs/design/memory-windows.md): binds on
//! the responder's send queue, remote access through a window's R_Key with the window's own
//! range and access, the errors every broken rule ends in at both ends, invalidation (local,
//! remote, by deallocation, by destroying the QP) and the MR the windows pin.

use std::time::Duration;

use softverbs_core::datapath::PdRef;
use softverbs_core::event::{AsyncEvent, EventElement};
use softverbs_core::ids::{CtxId, Handle};
use softverbs_core::mw::MwType;
use softverbs_core::types::{Access, EventType, Mtu, QpType};
use softverbs_core::Error;
use softverbs_transport::sim::{ConnParams, Faults, Host, Network};
use softverbs_transport::wr::{
    BindMw, Payload, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion, WC_WITH_INV,
};
use softverbs_transport::CqId;

const SPACE: usize = 1 << 20;
const SRC: u64 = 0x1000;
/// B's MR for windows: `[MR, MR + MR_LEN)`, local write and MW_BIND only (no remote access
/// of its own: whatever a peer reaches, it reaches through a window).
const MR: u64 = 0x4_0000;
const MR_LEN: u64 = 0x4000;
/// The window's range inside it.
const WIN: u64 = MR + 0x1000;
const WIN_LEN: u64 = 0x1000;
const RW: Access = Access(Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0);

struct Pair {
    net: Network,
    cb: CtxId,
    pdb: PdRef,
    ka: u32,
    /// B's window MR (lkey).
    kmr: u32,
    mr_handle: Handle,
    /// B's MR over everything (for receives).
    kb: u32,
    cqa: CqId,
    cqb: CqId,
    qa: u32,
    qb: u32,
}

impl Pair {
    fn new(mr_access: Access) -> Pair {
        let mut a = Host::new("10.0.0.1".parse().unwrap(), Mtu::M1024);
        let mut b = Host::new("10.0.0.2".parse().unwrap(), Mtu::M1024);
        let ca = a.context(1, SPACE);
        let cb = b.context(2, SPACE);
        let pda = a.pd(ca);
        let pdb = b.pd(cb);
        let all = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        let ka = a.mr(pda, 0, MR, all);
        let kb = b.mr(pdb, 0, MR, Access::LOCAL_WRITE);
        let k = b
            .core
            .reg_mr(cb, pdb.pd, MR, MR_LEN, MR, mr_access)
            .expect("reg_mr");
        let cqa = a.cq(ca);
        let cqb = b.cq(cb);
        let qa = a.qp(QpType::Rc, pda, cqa, None);
        let qb = b.qp(QpType::Rc, pdb, cqb, None);
        let (ga, gb) = (a.gid, b.gid);
        a.connect(qa, gb, qb, ConnParams::default());
        b.connect(qb, ga, qa, ConnParams::default());
        for (i, x) in a.mem.space_mut(ca).iter_mut().enumerate() {
            *x = (i * 7 + 3) as u8;
        }
        Pair {
            net: Network::new(vec![a, b], Faults::NONE, 1),
            cb,
            pdb,
            ka,
            kmr: k.lkey,
            mr_handle: k.handle,
            kb,
            cqa,
            cqb,
            qa,
            qb,
        }
    }

    fn a(&mut self) -> &mut Host {
        &mut self.net.hosts[0]
    }

    fn b(&mut self) -> &mut Host {
        &mut self.net.hosts[1]
    }

    /// Posts a bind on B's QP of window `rkey` over `[addr, addr+len)` with `access`;
    /// returns the window's new R_Key (the consumer key incremented, as `ibv_inc_rkey`).
    fn bind(&mut self, wr_id: u64, rkey: u32, addr: u64, len: u64, access: Access) -> u32 {
        let new_rkey = (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff);
        let b = BindMw {
            mw_rkey: rkey,
            new_rkey,
            mr_lkey: self.kmr,
            addr,
            length: len,
            access,
        };
        let qb = self.qb;
        self.b()
            .engine
            .post_send(
                qb,
                SendWr::new(wr_id, SendOp::BindMw(b), Payload::Sges(vec![])),
            )
            .expect("post bind");
        new_rkey
    }

    fn post_b(&mut self, wr_id: u64, op: SendOp) {
        let qb = self.qb;
        self.b()
            .engine
            .post_send(qb, SendWr::new(wr_id, op, Payload::Sges(vec![])))
            .expect("post_send on B");
    }

    fn send_a(&mut self, wr_id: u64, op: SendOp, len: u32) {
        let (qa, ka) = (self.qa, self.ka);
        let p = Payload::Sges(vec![Sge {
            addr: SRC,
            length: len,
            lkey: ka,
        }]);
        self.a()
            .engine
            .post_send(qa, SendWr::new(wr_id, op, p))
            .expect("post_send on A");
    }

    fn recv_b(&mut self, wr_id: u64) {
        let (qb, kb) = (self.qb, self.kb);
        let wr = RecvWr {
            wr_id,
            sges: vec![Sge {
                addr: 0x100,
                length: 4096,
                lkey: kb,
            }],
        };
        self.b().engine.post_recv(qb, wr).expect("post_recv");
    }

    fn run(&mut self) {
        self.net.run_until(Duration::from_millis(200), |_| false);
        self.a().pump();
        self.b().pump();
    }

    fn a_wcs(&mut self) -> Vec<WorkCompletion> {
        let c = self.cqa;
        self.a().take_completions(c)
    }

    fn b_wcs(&mut self) -> Vec<WorkCompletion> {
        let c = self.cqb;
        self.b().take_completions(c)
    }

    fn write(&mut self, wr_id: u64, addr: u64, rkey: u32, len: u32) {
        self.send_a(
            wr_id,
            SendOp::Write {
                remote_addr: addr,
                rkey,
            },
            len,
        );
    }

    fn b_events(&mut self) -> Vec<AsyncEvent> {
        let cb = self.cb;
        let mut v = Vec::new();
        while let Some(e) = self.b().core.next_event(cb).expect("context") {
            v.push(e);
        }
        v
    }
}

fn st(w: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    w.iter().map(|w| (w.wr_id, w.status)).collect()
}

fn mw_bind_access() -> Access {
    Access::LOCAL_WRITE | Access::MW_BIND
}

/// A remote access error NAK at A (IBA 9.7.5.2.4: `REM_ACCESS_ERR`), and B's QP in error
/// with `IBV_EVENT_QP_ACCESS_ERR` (IBA 11.6.3.1, affiliated asynchronous error).
fn assert_access_error(p: &mut Pair, wr_id: u64, what: &str) {
    assert_eq!(
        st(&p.a_wcs()),
        vec![(wr_id, WcStatus::RemAccessErr)],
        "{what}: the requester's completion"
    );
    let qb = p.qb;
    assert_eq!(
        p.b().failures,
        vec![(qb, Some(EventType::QpAccessErr))],
        "{what}: the responder QP goes to error with an access error event"
    );
    let ev = p.b_events();
    assert!(
        ev.iter()
            .any(|e| e.event_type == EventType::QpAccessErr
                && matches!(e.element, EventElement::Qp(_))),
        "{what}: {ev:?}"
    );
}

// ---- type 1 ---------------------------------------------------------------------------------

/// IBA 10.6.7.2.1: a bound type 1 window lets a peer write and read its range through its
/// R_Key, although the MR grants no remote access of its own; the bind completes with
/// `IBV_WC_BIND_MW` on the binder's CQ.
#[test]
fn type1_window_grants_its_own_access() {
    let mut p = Pair::new(mw_bind_access());
    let pdb = p.pdb;
    let (_, rkey) = p.b().mw(pdb, MwType::One);
    let rkey = p.bind(1, rkey, WIN, WIN_LEN, RW);
    p.run();
    let w = p.b_wcs();
    assert_eq!(st(&w), vec![(1, WcStatus::Success)]);
    assert_eq!(w[0].opcode, WcOpcode::BindMw);
    p.write(2, WIN + 8, rkey, 100);
    p.send_a(
        3,
        SendOp::Read {
            remote_addr: WIN + 8,
            rkey,
        },
        100,
    );
    p.run();
    assert_eq!(
        st(&p.a_wcs()),
        vec![(2, WcStatus::Success), (3, WcStatus::Success)]
    );
    let cb = p.cb;
    let expect: Vec<u8> = (SRC as usize..SRC as usize + 100)
        .map(|i| (i * 7 + 3) as u8)
        .collect();
    let off = (WIN + 8) as usize;
    assert_eq!(&p.b().mem.space(cb)[off..off + 100], &expect[..]);
}

/// The MR's own key stays useless for remote access: the window's rights are not the MR's.
#[test]
fn the_mr_key_does_not_gain_the_window_rights() {
    let mut p = Pair::new(mw_bind_access());
    let pdb = p.pdb;
    let (_, rkey) = p.b().mw(pdb, MwType::One);
    p.bind(1, rkey, WIN, WIN_LEN, RW);
    p.run();
    let kmr = p.kmr;
    p.write(2, WIN, kmr, 8);
    p.run();
    assert_access_error(&mut p, 2, "MR key without remote write");
}

/// IBA 10.6.7.3 (C10-84): an access beyond the window's range is a remote access error, even
/// inside the MR.
#[test]
fn access_outside_the_window_is_a_remote_access_error() {
    let mut p = Pair::new(mw_bind_access());
    let pdb = p.pdb;
    let (_, rkey) = p.b().mw(pdb, MwType::One);
    let rkey = p.bind(1, rkey, WIN, WIN_LEN, RW);
    p.run();
    p.b_wcs();
    p.write(2, WIN + WIN_LEN - 4, rkey, 8);
    p.run();
    assert_access_error(&mut p, 2, "straddling the window's end");
}

/// IBA 10.6.7.3: the window's access rights decide: a read-only window refuses a write.
#[test]
fn wrong_access_is_a_remote_access_error() {
    let mut p = Pair::new(mw_bind_access());
    let pdb = p.pdb;
    let (_, rkey) = p.b().mw(pdb, MwType::One);
    let rkey = p.bind(1, rkey, WIN, WIN_LEN, Access::REMOTE_READ);
    p.run();
    p.b_wcs();
    p.write(2, WIN, rkey, 8);
    p.run();
    assert_access_error(&mut p, 2, "write through a read-only window");
}

/// IBA 10.6.7.2.1 / `ibv_inc_rkey(3)`: a rebind gives the window a new consumer key; the old
/// R_Key no longer reaches it, the new one does.
#[test]
fn rebind_rotates_the_consumer_key() {
    let mut p = Pair::new(mw_bind_access());
    let pdb = p.pdb;
    let (_, k0) = p.b().mw(pdb, MwType::One);
    let k1 = p.bind(1, k0, WIN, WIN_LEN, RW);
    let k2 = p.bind(2, k1, WIN, WIN_LEN, RW);
    assert_eq!(k2 >> 8, k0 >> 8);
    assert_ne!(k2, k1);
    p.run();
    assert_eq!(
        st(&p.b_wcs()),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    p.write(3, WIN, k2, 8);
    p.run();
    assert_eq!(st(&p.a_wcs()), vec![(3, WcStatus::Success)]);
    p.write(4, WIN, k1, 8);
    p.run();
    assert_access_error(&mut p, 4, "the R_Key before the rebind");
}

/// ibv_bind_mw(3): a zero-length bind unbinds a type 1 window; its key then reaches nothing,
/// and the MR may be deregistered again.
#[test]
fn zero_length_bind_unbinds_a_type1_window() {
    let mut p = Pair::new(mw_bind_access());
    let pdb = p.pdb;
    let (_, k0) = p.b().mw(pdb, MwType::One);
    let k1 = p.bind(1, k0, WIN, WIN_LEN, RW);
    p.run();
    let (cb, mr) = (p.cb, p.mr_handle);
    assert_eq!(p.b().core.bound_windows(cb, mr), 1);
    let k2 = p.bind(2, k1, 0, 0, Access::EMPTY);
    p.run();
    assert_eq!(
        st(&p.b_wcs()),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(p.b().core.bound_windows(cb, mr), 0);
    p.write(3, WIN, k2, 8);
    p.run();
    assert_access_error(&mut p, 3, "an unbound window");
}

// ---- bind errors ----------------------------------------------------------------------------

/// C10-73: binding to an MR registered without `IBV_ACCESS_MW_BIND` completes with
/// `IBV_WC_MW_BIND_ERR` (rxe) and the QP goes to error; later work flushes.
#[test]
fn bind_to_an_mr_without_mw_bind_fails() {
    let mut p = Pair::new(Access::LOCAL_WRITE);
    let pdb = p.pdb;
    let (_, k0) = p.b().mw(pdb, MwType::One);
    p.bind(1, k0, WIN, WIN_LEN, RW);
    p.post_b(2, SendOp::LocalInv(k0));
    p.run();
    assert_eq!(
        st(&p.b_wcs()),
        vec![(1, WcStatus::MwBindErr), (2, WcStatus::WrFlushErr)]
    );
    let qb = p.qb;
    assert_eq!(p.b().failures, vec![(qb, None)]);
}

/// C10-75: a window must lie inside its MR.
#[test]
fn bind_past_the_mr_fails() {
    let mut p = Pair::new(mw_bind_access());
    let pdb = p.pdb;
    let (_, k0) = p.b().mw(pdb, MwType::One);
    p.bind(1, k0, MR + MR_LEN - 8, 16, RW);
    p.run();
    assert_eq!(st(&p.b_wcs()), vec![(1, WcStatus::MwBindErr)]);
}

/// C10-74: a window granting remote write needs an MR with local write.
#[test]
fn writable_window_needs_local_write_on_the_mr() {
    let mut p = Pair::new(Access::MW_BIND);
    let pdb = p.pdb;
    let (_, k0) = p.b().mw(pdb, MwType::One);
    p.bind(1, k0, WIN, WIN_LEN, RW);
    p.run();
    assert_eq!(st(&p.b_wcs()), vec![(1, WcStatus::MwBindErr)]);
}

/// o10-37.2.40: a type 2 window cannot be bound with length 0 (it is invalidated instead).
#[test]
fn zero_length_type2_bind_fails() {
    let mut p = Pair::new(mw_bind_access());
    let pdb = p.pdb;
    let (_, k0) = p.b().mw(pdb, MwType::Two);
    p.bind(1, k0, 0, 0, Access::EMPTY);
    p.run();
    assert_eq!(st(&p.b_wcs()), vec![(1, WcStatus::MwBindErr)]);
}

/// o10-37.2.30: a bound type 2 window must be invalidated before it is bound again.
#[test]
fn rebinding_a_bound_type2_window_fails() {
    let mut p = Pair::new(mw_bind_access());
    let pdb = p.pdb;
    let (_, k0) = p.b().mw(pdb, MwType::Two);
    let k1 = p.bind(1, k0, WIN, WIN_LEN, RW);
    p.bind(2, k1, WIN, WIN_LEN, RW);
    p.run();
    assert_eq!(
        st(&p.b_wcs()),
        vec![(1, WcStatus::Success), (2, WcStatus::MwBindErr)]
    );
}

// ---- type 2 ---------------------------------------------------------------------------------

/// IBA 10.6.7.2.2: a type 2 window bound with a bind work request is reached through the QP
/// it was bound on; `IBV_WR_LOCAL_INV` invalidates it (completion `IBV_WC_LOCAL_INV`), after
/// which its key is a remote access error, and the MR is free again.
#[test]
fn type2_window_and_local_invalidate() {
    let mut p = Pair::new(mw_bind_access());
    let pdb = p.pdb;
    let (_, k0) = p.b().mw(pdb, MwType::Two);
    let k1 = p.bind(1, k0, WIN, WIN_LEN, RW);
    p.run();
    p.write(2, WIN, k1, 64);
    p.run();
    assert_eq!(st(&p.a_wcs()), vec![(2, WcStatus::Success)]);
    p.post_b(3, SendOp::LocalInv(k1));
    p.run();
    let w = p.b_wcs();
    assert_eq!(st(&w), vec![(1, WcStatus::Success), (3, WcStatus::Success)]);
    assert_eq!(w[1].opcode, WcOpcode::LocalInv);
    let (cb, mr) = (p.cb, p.mr_handle);
    assert_eq!(p.b().core.bound_windows(cb, mr), 0);
    p.write(4, WIN, k1, 8);
    p.run();
    assert_access_error(&mut p, 4, "an invalidated type 2 window");
}

/// IBA 10.6.7.2.5 / 9.4.1.3: SEND with Invalidate names the window; the receive completes with
/// `IBV_WC_WITH_INV` and the key in `invalidated_rkey`, and the window is invalid after it.
#[test]
fn send_with_invalidate_invalidates_a_type2_window() {
    let mut p = Pair::new(mw_bind_access());
    let pdb = p.pdb;
    let (_, k0) = p.b().mw(pdb, MwType::Two);
    let k1 = p.bind(1, k0, WIN, WIN_LEN, RW);
    p.run();
    p.b_wcs();
    p.recv_b(10);
    p.send_a(2, SendOp::SendWithInv(k1), 16);
    p.run();
    assert_eq!(st(&p.a_wcs()), vec![(2, WcStatus::Success)]);
    let w = p.b_wcs();
    assert_eq!(st(&w), vec![(10, WcStatus::Success)]);
    assert_ne!(w[0].wc_flags & WC_WITH_INV, 0);
    assert_eq!(w[0].imm_data, k1);
    p.write(3, WIN, k1, 8);
    p.run();
    assert_access_error(&mut p, 3, "a remotely invalidated window");
}

/// o10-37.2.26: a type 1 window cannot be invalidated remotely: the receive completes with
/// `REM_INV_REQ_ERR`, the sender gets an Invalid Request NAK (`REM_INV_REQ_ERR`) and B's QP
/// goes to error with `IBV_EVENT_QP_REQ_ERR` (rxe's class J).
#[test]
fn send_with_invalidate_of_a_type1_window_fails() {
    let mut p = Pair::new(mw_bind_access());
    let pdb = p.pdb;
    let (_, k0) = p.b().mw(pdb, MwType::One);
    let k1 = p.bind(1, k0, WIN, WIN_LEN, RW);
    p.run();
    p.b_wcs();
    p.recv_b(10);
    p.send_a(2, SendOp::SendWithInv(k1), 16);
    p.run();
    assert_eq!(st(&p.a_wcs()), vec![(2, WcStatus::RemInvReqErr)]);
    assert_eq!(st(&p.b_wcs()), vec![(10, WcStatus::RemInvReqErr)]);
    let qb = p.qb;
    assert_eq!(p.b().failures, vec![(qb, Some(EventType::QpReqErr))]);
}

/// IBA 10.6.7.2.2 (type 2B): the window belongs to the QP that bound it; the same key used on
/// another QP of the same PD is a remote access error.
#[test]
fn type2_window_of_another_qp_is_refused() {
    let mut p = Pair::new(mw_bind_access());
    let pdb = p.pdb;
    // A second connection between the hosts (a new PD on A; B's PD is the window's).
    let pda = p.a().pd(CtxId(1));
    let ka2 = p.a().mr(pda, 0, MR, Access::LOCAL_WRITE);
    let cqa = p.cqa;
    let qa2 = p.a().qp(QpType::Rc, pda, cqa, None);
    let cqb = p.cqb;
    let qb2 = p.b().qp(QpType::Rc, pdb, cqb, None);
    let (ga, gb) = (p.a().gid, p.b().gid);
    p.a().connect(qa2, gb, qb2, ConnParams::default());
    p.b().connect(qb2, ga, qa2, ConnParams::default());
    // Bound on qb2 ...
    let (_, k0) = p.b().mw(pdb, MwType::Two);
    let k1 = (k0 & !0xff) | 1;
    let kmr = p.kmr;
    let bind = BindMw {
        mw_rkey: k0,
        new_rkey: k1,
        mr_lkey: kmr,
        addr: WIN,
        length: WIN_LEN,
        access: RW,
    };
    p.b()
        .engine
        .post_send(
            qb2,
            SendWr::new(1, SendOp::BindMw(bind), Payload::Sges(vec![])),
        )
        .unwrap();
    p.run();
    assert_eq!(st(&p.b_wcs()), vec![(1, WcStatus::Success)]);
    // ... reachable through qa2 → qb2 ...
    let wr = SendWr::new(
        2,
        SendOp::Write {
            remote_addr: WIN,
            rkey: k1,
        },
        Payload::Sges(vec![Sge {
            addr: SRC,
            length: 8,
            lkey: ka2,
        }]),
    );
    p.a().engine.post_send(qa2, wr).unwrap();
    p.run();
    assert_eq!(st(&p.a_wcs()), vec![(2, WcStatus::Success)]);
    // ... and not through qa → qb.
    p.write(3, WIN, k1, 8);
    p.run();
    assert_access_error(&mut p, 3, "a type 2 window bound to another QP");
}

/// C10-72: a type 2 window is bound only through a QP of its own PD.
#[test]
fn type2_bind_through_a_qp_of_another_pd_fails() {
    let mut p = Pair::new(mw_bind_access());
    let cb = p.cb;
    let other = p.b().pd(cb);
    let (_, k0) = p.b().mw(other, MwType::Two);
    p.bind(1, k0, WIN, WIN_LEN, RW);
    p.run();
    assert_eq!(st(&p.b_wcs()), vec![(1, WcStatus::MwBindErr)]);
}

/// Destroying the QP a type 2 window is bound to invalidates it (IBA 10.6.7.2.2): the MR is
/// no longer pinned.
#[test]
fn destroying_the_qp_invalidates_its_type2_windows() {
    let mut p = Pair::new(mw_bind_access());
    let pdb = p.pdb;
    let (_, k0) = p.b().mw(pdb, MwType::Two);
    p.bind(1, k0, WIN, WIN_LEN, RW);
    p.run();
    let (cb, mr, qb) = (p.cb, p.mr_handle, p.qb);
    assert_eq!(
        p.b().core.dereg_mr(cb, mr),
        Err(Error::InvalidArgument(
            "memory windows are bound to this MR"
        ))
    );
    p.b().engine.destroy_qp(qb);
    p.b().pump();
    assert_eq!(p.b().core.bound_windows(cb, mr), 0);
    p.b().core.dereg_mr(cb, mr).expect("the MR is free");
}

// ---- the MR under a window --------------------------------------------------------------------

/// IBA 10.6.7.2.6 (rxe_dereg_mr): an MR with a bound window cannot be deregistered
/// (`EINVAL`); once the window is deallocated it can, and the window's key reaches nothing.
#[test]
fn mr_with_a_bound_window_cannot_be_deregistered() {
    let mut p = Pair::new(mw_bind_access());
    let pdb = p.pdb;
    let (h, k0) = p.b().mw(pdb, MwType::One);
    let k1 = p.bind(1, k0, WIN, WIN_LEN, RW);
    p.run();
    let (cb, mr) = (p.cb, p.mr_handle);
    let e = p.b().core.dereg_mr(cb, mr).unwrap_err();
    assert_eq!(e.errno(), softverbs_core::errno::EINVAL);
    assert!(p
        .b()
        .core
        .rereg_mr(cb, mr, None, Some(Access::LOCAL_WRITE), None)
        .is_err());
    p.b().dealloc_mw(pdb, h, k1);
    p.b().core.dereg_mr(cb, mr).expect("no window left on it");
    p.write(2, WIN, k1, 8);
    p.run();
    assert_access_error(&mut p, 2, "a deallocated window");
}

/// o10-37.2.26 and IBA 10.6.7.2.2: a Send with Invalidate of a type 2 window that is not
/// bound fails as for a type 1 window (`REM_INV_REQ_ERR` at both ends, B's QP in error with
/// `IBV_EVENT_QP_REQ_ERR`).
#[test]
fn send_with_invalidate_of_an_unbound_type2_window_fails() {
    let mut p = Pair::new(mw_bind_access());
    let pdb = p.pdb;
    let (_, k0) = p.b().mw(pdb, MwType::Two);
    p.recv_b(10);
    p.send_a(2, SendOp::SendWithInv(k0), 16);
    p.run();
    assert_eq!(st(&p.a_wcs()), vec![(2, WcStatus::RemInvReqErr)]);
    assert_eq!(st(&p.b_wcs()), vec![(10, WcStatus::RemInvReqErr)]);
    let qb = p.qb;
    assert_eq!(p.b().failures, vec![(qb, Some(EventType::QpReqErr))]);
}

/// o10-37.2.26: `IBV_WR_LOCAL_INV` of a type 1 window fails with `LOC_QP_OP_ERR` and the QP
/// goes to error; the window stays bound.
#[test]
fn local_invalidate_of_a_type1_window_fails() {
    let mut p = Pair::new(mw_bind_access());
    let pdb = p.pdb;
    let (_, k0) = p.b().mw(pdb, MwType::One);
    let k1 = p.bind(1, k0, WIN, WIN_LEN, RW);
    p.post_b(2, SendOp::LocalInv(k1));
    p.run();
    assert_eq!(
        st(&p.b_wcs()),
        vec![(1, WcStatus::Success), (2, WcStatus::LocQpOpErr)]
    );
    let (cb, mr) = (p.cb, p.mr_handle);
    assert_eq!(p.b().core.bound_windows(cb, mr), 1);
}

/// A Send with Invalidate that names no memory window fails at both ends as the type 1 case:
/// `REM_INV_REQ_ERR` on the receive and (Invalid Request NAK) at the sender, B's QP in error
/// with `IBV_EVENT_QP_REQ_ERR`, nothing invalidated.
fn assert_invalidate_refused(p: &mut Pair, what: &str) {
    assert_eq!(
        st(&p.a_wcs()),
        vec![(2, WcStatus::RemInvReqErr)],
        "{what}: the sender's completion"
    );
    assert_eq!(
        st(&p.b_wcs()),
        vec![(10, WcStatus::RemInvReqErr)],
        "{what}: the receive"
    );
    let qb = p.qb;
    assert_eq!(
        p.b().failures,
        vec![(qb, Some(EventType::QpReqErr))],
        "{what}: the responder QP"
    );
    let ev = p.b_events();
    assert!(
        ev.iter().any(|e| e.event_type == EventType::QpReqErr),
        "{what}: {ev:?}"
    );
}

/// IBA 10.6.7.2.5 / o10-37.2.26 (rxe `rxe_invalidate_mr`: only a fast-register MR may be
/// invalidated): a Send with Invalidate naming an ordinary MR's R_Key is an invalid request;
/// the MR stays registered and usable.
#[test]
fn send_with_invalidate_of_an_mr_key_fails() {
    let mut p = Pair::new(mw_bind_access());
    // B's window MR, given remote write of its own so its key is an R_Key a peer may hold.
    let (cb, mr) = (p.cb, p.mr_handle);
    p.b()
        .core
        .rereg_mr(
            cb,
            mr,
            None,
            Some(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::MW_BIND),
            None,
        )
        .expect("rereg");
    let kmr = p.kmr;
    p.recv_b(10);
    p.send_a(2, SendOp::SendWithInv(kmr), 16);
    p.run();
    assert_invalidate_refused(&mut p, "an MR's R_Key");
    let pdb = p.pdb;
    assert!(
        p.b()
            .core
            .check_mem(pdb, kmr, MR, 8, Access::REMOTE_WRITE)
            .is_ok(),
        "the MR was not invalidated"
    );
}

/// A Send with Invalidate naming a key nothing on B carries (neither an MR nor a window) is
/// an invalid request too (rxe: no MR for the key).
#[test]
fn send_with_invalidate_of_an_unknown_key_fails() {
    let mut p = Pair::new(mw_bind_access());
    p.recv_b(10);
    p.send_a(2, SendOp::SendWithInv(0x00AB_CDEF), 16);
    p.run();
    assert_invalidate_refused(&mut p, "an unknown key");
}

/// The same for a key in the window range that names no allocated window.
#[test]
fn send_with_invalidate_of_an_unallocated_window_key_fails() {
    let mut p = Pair::new(mw_bind_access());
    p.recv_b(10);
    p.send_a(2, SendOp::SendWithInv(0xFFFF_FF07), 16);
    p.run();
    assert_invalidate_refused(&mut p, "an unallocated window key");
}
