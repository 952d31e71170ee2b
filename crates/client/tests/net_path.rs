//! The net path (docs/net-path.md): an RC QP connected to a QP of another daemon is run by
//! its own library's engine, over a socket of the device's reuseport group the daemon
//! steers its packets to. Each test runs two daemons on loopback addresses of their own.

mod common;

use std::time::Duration;

use softverbs::{
    BorrowedMr, Context, Pd, QpInit, QpState, QpType, SendOp, SendRequest, Sge, WcOpcode,
    WcStatus,
};

use common::{cap, connect, connect_with, daemon, daemon_with, RcPath, Reaped, ALL};

const T: Duration = Duration::from_secs(20);

fn lend<'a>(pd: &'a Pd<'a>, buf: &'a mut [u8]) -> BorrowedMr<'a> {
    pd.reg_slice(buf, ALL).unwrap()
}

/// `len` bytes of `mr` at `offset`, copied out.
fn read(mr: &BorrowedMr<'_>, offset: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mr.read(offset, &mut v).unwrap();
    v
}

fn sge(mr: &BorrowedMr<'_>, offset: u64, len: u32) -> [Sge; 1] {
    [mr.sge(offset as usize, len as usize).unwrap()]
}

#[test]
fn rc_operations_between_two_daemons_run_in_the_libraries() {
    let (d1, _x) = daemon("neta", Some("127.93.0.1"));
    let (d2, _y) = daemon("netb", Some("127.93.0.2"));
    let a = Context::open_at(&d1.socket, 0).unwrap();
    let b = Context::open_at(&d2.socket, 0).unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cqa, cqb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let qa = a
        .create_qp(&QpInit::new(QpType::Rc, &pa).cqs(&cqa, &cqa).cap(cap()))
        .unwrap();
    let qb = b
        .create_qp(&QpInit::new(QpType::Rc, &pb).cqs(&cqb, &cqb).cap(cap()))
        .unwrap();
    let mut abuf = vec![0u8; 1 << 16];
    let mut bbuf = vec![0u8; 1 << 16];
    let pattern: Vec<u8> = (0..6000u32).map(|i| (i * 7 + 3) as u8).collect();
    abuf[..6000].copy_from_slice(&pattern);
    bbuf[0x8000..0x8008].copy_from_slice(&40u64.to_ne_bytes());
    let ma = lend(&pa, &mut abuf);
    let mb = lend(&pb, &mut bbuf);
    // A receive posted before RTR (in INIT) is held by the library and taken over by its
    // engine.
    let init = softverbs::QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: ALL,
        ..softverbs::QpAttr::default()
    };
    use softverbs::AttrMask as M;
    qb.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
        .unwrap();
    qb.post_recv(1, &sge(&mb, 0x1000, 8192)).unwrap();
    connect(&qa, b.query_gid(1, 0).unwrap(), qb.qpn());
    connect(&qb, a.query_gid(1, 0).unwrap(), qa.qpn());
    assert!(qa.is_net() && qb.is_net(), "both QPs on the net path");
    assert!(!qa.is_direct());
    let (a0, b0) = (ma.sge(0, 1).unwrap().addr, mb.sge(0, 1).unwrap().addr);

    // 6000 bytes at MTU 1024: six packets.
    qa.post_send(&SendRequest::new(10, SendOp::Send, &sge(&ma, 0, 6000)))
        .unwrap();
    let w_sge = sge(&ma, 0, 3000);
    let w = SendRequest::new(
        11,
        SendOp::Write {
            remote_addr: b0 + 0x4000,
            rkey: mb.rkey(),
        },
        &w_sge,
    );
    qa.post_send(&w).unwrap();
    let r_sge = sge(&ma, 0x6000, 3000);
    let r = SendRequest::new(
        12,
        SendOp::Read {
            remote_addr: b0 + 0x4000,
            rkey: mb.rkey(),
        },
        &r_sge,
    );
    qa.post_send(&r).unwrap();
    let f_sge = sge(&ma, 0x9000, 8);
    let f = SendRequest::new(
        13,
        SendOp::FetchAdd {
            remote_addr: b0 + 0x8000,
            rkey: mb.rkey(),
            add: 2,
        },
        &f_sge,
    );
    qa.post_send(&f).unwrap();
    let c_sge = sge(&ma, 0x9008, 8);
    let c = SendRequest::new(
        14,
        SendOp::CompareSwap {
            remote_addr: b0 + 0x8000,
            rkey: mb.rkey(),
            compare: 42,
            swap: 7,
        },
        &c_sge,
    );
    qa.post_send(&c).unwrap();
    qb.post_recv(2, &sge(&mb, 0x3000, 64)).unwrap();
    let mut imm = SendRequest::new(15, SendOp::SendWithImm(0xabcd), &[]);
    imm.inline = Some(b"inline hello");
    qa.post_send(&imm).unwrap();

    let wa = cqa.wait(6, T).unwrap();
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
    let wb = cqb.wait(2, T).unwrap();
    assert_eq!(
        (wb[0].wr_id, wb[0].status, wb[0].byte_len, wb[0].qp_num),
        (1, WcStatus::Success, 6000, qb.qpn())
    );
    assert_eq!((wb[1].wr_id, wb[1].byte_len, wb[1].imm_data), (2, 12, 0xabcd));
    assert_eq!(read(&mb, 0x1000, 6000), pattern, "SEND landed");
    assert_eq!(read(&mb, 0x4000, 3000), pattern[..3000], "WRITE landed");
    assert_eq!(read(&ma, 0x6000, 3000), pattern[..3000], "READ came back");
    assert_eq!(read(&ma, 0x9000, 8), 40u64.to_ne_bytes(), "FETCH_ADD's old value");
    assert_eq!(read(&ma, 0x9008, 8), 42u64.to_ne_bytes(), "CMP_SWAP saw the add");
    assert_eq!(read(&mb, 0x8000, 8), 7u64.to_ne_bytes(), "and swapped");
    assert_eq!(read(&mb, 0x3000, 12), b"inline hello");
    let _ = a0;

    // The responder's checks are the library's now: a wrong R_Key fails the requester with
    // REM_ACCESS_ERR, and the daemon learns that the QP is in ERR.
    let bad_sge = sge(&ma, 0, 8);
    let bad = SendRequest::new(
        16,
        SendOp::Write {
            remote_addr: b0,
            rkey: mb.rkey() ^ 0x5a5a,
        },
        &bad_sge,
    );
    qa.post_send(&bad).unwrap();
    let e = cqa.wait(1, T).unwrap();
    assert_eq!((e[0].wr_id, e[0].status), (16, WcStatus::RemAccessErr));
    let end = std::time::Instant::now() + T;
    while qa.query().unwrap().attr.qp_state != QpState::Err && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(qa.query().unwrap().attr.qp_state, QpState::Err, "the daemon knows");
    // A request posted in ERR flushes.
    qa.post_send(&SendRequest::new(17, SendOp::Send, &sge(&ma, 0, 8)))
        .unwrap();
    let e = cqa.wait(1, T).unwrap();
    assert_eq!((e[0].wr_id, e[0].status), (17, WcStatus::WrFlushErr));
}
