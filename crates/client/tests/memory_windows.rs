//! Memory windows through the safe API (docs/design/memory-windows.md): a window over an owned MR,
//! bound with `Qp::bind_mw` (type 1) or a bind request (type 2), reached by a peer through
//! its R_Key only within its range and rights; invalidation; the MR a window pins; the
//! device's capabilities.

mod common;

use std::time::Duration;

use common::{cap, connect, daemon};
use softverbs::{
    Access, Context, Introspect, MwType, Op, QpInit, QpType, Remote, SendOp, SendRequest, SendWork,
    WcOpcode, WcStatus,
};

const T: Duration = Duration::from_secs(20);
const MW_BIND_MR: Access = Access(Access::LOCAL_WRITE.0 | Access::MW_BIND.0);
const RW: Access = Access(Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0);

#[test]
fn device_advertises_memory_windows() {
    let (d, _dir) = daemon("mwcaps", None);
    let c = Context::open_at(&d.socket, 0).unwrap();
    let a = c.query_device().unwrap();
    assert!(a.max_mw > 0);
    assert_ne!(
        a.device_cap_flags & softverbs_core::device::DEVICE_MEM_WINDOW,
        0
    );
    assert_ne!(
        a.device_cap_flags & softverbs_core::device::DEVICE_MEM_WINDOW_TYPE_2B,
        0
    );
    assert_eq!(
        a.device_cap_flags & softverbs_core::device::DEVICE_MEM_WINDOW_TYPE_2A,
        0
    );
}

/// Type 1 and type 2 windows over one MR of B, written and read by A through their R_Keys;
/// an access past a window and one through an invalidated window fail with
/// `REM_ACCESS_ERR`; the MR cannot be deregistered while a window is bound (`EINVAL`).
#[test]
fn windows_through_the_safe_api() {
    let (d, _dir) = daemon("mwapi", None);
    let a = Context::open_at(&d.socket, 0).unwrap();
    let b = Context::open_at(&d.socket, 0).unwrap();
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

    let mut ma = pa.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
    let mut mb = pb.alloc_mr(16384, MW_BIND_MR).unwrap();
    let base = mb.remote().addr;

    // Type 1 over [base+4096, base+8192).
    let mut w1 = pb.alloc_mw(MwType::One).unwrap();
    let k0 = w1.rkey();
    // A range past the MR is refused before posting (C10-75).
    assert_eq!(
        qb.bind_mw_over(1, &mut w1, &mb, 16384 - 8, 16, RW)
            .unwrap_err()
            .errno,
        softverbs::errno::EINVAL
    );
    assert_eq!(w1.rkey(), k0, "nothing was posted");
    let win = qb.bind_mw_over(1, &mut w1, &mb, 4096, 4096, RW).unwrap();
    let k1 = win.rkey;
    assert_eq!((win.addr, win.len), (base + 4096, 4096));
    assert_eq!(k1, softverbs::inc_rkey(k0));
    let c = cqb.wait(1, T).unwrap();
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].opcode),
        (1, WcStatus::Success, WcOpcode::BindMw)
    );

    let mut src = ma.take(4096).unwrap();
    src.write(0, b"through the window").unwrap();
    let inside = Remote {
        addr: base + 4096,
        len: 18,
        rkey: k1,
    };
    let (msg, rest) = src.split_at(18).unwrap();
    qa.post(SendWork::new(Op::Write(inside), msg)).unwrap();
    let c = cqa.wait_bufs(1, T).unwrap().pop().unwrap();
    assert_eq!(c.wc.status, WcStatus::Success);
    let mut got = [0u8; 18];
    // B's bytes at the window's start: read through the MR's own view of its memory.
    let view = mb.take(16384).unwrap();
    view.read(4096, &mut got).unwrap();
    assert_eq!(&got, b"through the window");

    // Type 2 over [base, base+4096), read-only.
    let mut w2 = pb.alloc_mw(MwType::Two).unwrap();
    let (bind, w2_remote) = w2
        .bind_request_over(&mb, 0, 4096, Access::REMOTE_READ)
        .unwrap();
    assert_eq!((w2_remote.addr, w2_remote.rkey), (base, bind.new_rkey));
    qb.post_send(&SendRequest::new(2, SendOp::BindMw(bind), &[]))
        .unwrap();
    let c = cqb.wait(1, T).unwrap();
    assert_eq!((c[0].wr_id, c[0].status), (2, WcStatus::Success));
    w2.set_rkey(bind.new_rkey);
    let (rd, rest) = rest.split_at(16).unwrap();
    qa.post(SendWork::new(
        Op::Read(Remote {
            addr: base,
            len: 16,
            rkey: w2.rkey(),
        }),
        rd,
    ))
    .unwrap();
    let c = cqa.wait_bufs(1, T).unwrap().pop().unwrap();
    assert_eq!(c.wc.status, WcStatus::Success);

    // Local invalidate of the type 2 window, then a read through it fails at A.
    qb.post_send(&SendRequest::new(3, SendOp::LocalInv(w2.rkey()), &[]))
        .unwrap();
    let c = cqb.wait(1, T).unwrap();
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].opcode),
        (3, WcStatus::Success, WcOpcode::LocalInv)
    );
    let (rd2, _rest) = rest.split_at(16).unwrap();
    qa.post(SendWork::new(
        Op::Read(Remote {
            addr: base,
            len: 16,
            rkey: w2.rkey(),
        }),
        rd2,
    ))
    .unwrap();
    let c = cqa.wait_bufs(1, T).unwrap().pop().unwrap();
    assert_eq!(c.wc.status, WcStatus::RemAccessErr);

    // The type 1 window still pins the MR.
    drop(view);
    let e = mb.dereg().unwrap_err();
    assert_eq!(e.errno, softverbs::errno::EINVAL);
}

/// `softverbs resources --json` (the daemon's resources blob, as the CLI prints it) counts a
/// context's windows and each PD's windows and MRs; a dropped window leaves the count.
#[test]
fn resources_json_counts_windows() {
    let (d, _dir) = daemon("mwres", None);
    let c = Context::open_at(&d.socket, 0).unwrap();
    let (p1, p2) = (c.alloc_pd().unwrap(), c.alloc_pd().unwrap());
    let _mr = p1.alloc_mr(4096, MW_BIND_MR).unwrap();
    let w1 = p1.alloc_mw(MwType::One).unwrap();
    let _w2 = p1.alloc_mw(MwType::Two).unwrap();
    let _w3 = p2.alloc_mw(MwType::Two).unwrap();
    let intro = Introspect::connect_at(&d.socket).unwrap();
    let res = |intro: &Introspect| -> softverbs_core::resources::Resources {
        serde_json::from_str(&intro.resources_json().unwrap()).unwrap()
    };
    let r = res(&intro);
    let me = r.contexts.iter().find(|x| x.ctx.0 == c.ctx_id()).unwrap();
    assert_eq!((me.pds, me.mrs, me.mws), (2, 1, 3));
    let mut pds: Vec<_> = r
        .pds
        .iter()
        .filter(|p| p.ctx.0 == c.ctx_id())
        .map(|p| (p.mrs, p.mws))
        .collect();
    pds.sort_unstable();
    assert_eq!(pds, vec![(0, 1), (1, 2)]);
    drop(w1);
    let r = res(&intro);
    let me = r.contexts.iter().find(|x| x.ctx.0 == c.ctx_id()).unwrap();
    assert_eq!(me.mws, 2);
}
