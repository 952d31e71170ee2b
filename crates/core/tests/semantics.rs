//! The XRC semantics of docs/design/xrc-semantics.md, one test per rule: the §6 errno rows the core owns,
//! the three API faces, persistence, event fan-out and teardown. `docs/design/xrc-design.md` cites
//! these tests by name.

use softverbs_core::attr::{AhAttr, QpAttr, QpInitAttr, SrqAttr};
use softverbs_core::device::{Device, Gid};
use softverbs_core::errno::*;
use softverbs_core::event::{AsyncEvent, EventElement};
use softverbs_core::ids::{CtxId, FileId, Handle};
use softverbs_core::types::{
    Access, AttrMask as M, EventType, Mtu, QpState, QpType, XRC_QP_EVENT_FLAG,
};
use softverbs_core::{ContextInfo, Core, Error, HolderKind, HolderRef};

const FILE: FileId = FileId { dev: 8, ino: 42 };
const OTHER_FILE: FileId = FileId { dev: 8, ino: 43 };

fn core() -> Core {
    Core::new(vec![Device::roce(
        "sv0",
        0x1122,
        &["127.0.0.1".parse().unwrap()],
        Mtu::M4096,
    )])
}

fn ctx(core: &mut Core, pid: u32) -> CtxId {
    core.open_context(
        0,
        ContextInfo {
            pid,
            uid: 1000,
            comm: format!("p{pid}"),
        },
    )
    .unwrap()
}

fn errno<T: std::fmt::Debug>(r: Result<T, Error>) -> i32 {
    r.expect_err("expected an error").errno()
}

/// A context with the domain of `FILE` open.
fn with_xrcd(core: &mut Core, pid: u32) -> (CtxId, Handle) {
    let c = ctx(core, pid);
    let x = core.open_xrcd(c, Some(FILE), O_CREAT).unwrap().handle;
    (c, x)
}

fn events(core: &mut Core, c: CtxId) -> Vec<AsyncEvent> {
    std::iter::from_fn(|| core.next_event(c).unwrap()).collect()
}

fn init_attr() -> QpAttr {
    QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: Access::REMOTE_WRITE,
        ..QpAttr::default()
    }
}
const TO_INIT: M = M(M::STATE.0 | M::PKEY_INDEX.0 | M::PORT.0 | M::ACCESS_FLAGS.0);

// ---- §1.1 XRC domains ------------------------------------------------------------------

#[test]
fn open_xrcd_without_o_creat_on_a_new_file_is_eagain() {
    let mut core = core();
    let c = ctx(&mut core, 1);
    assert_eq!(errno(core.open_xrcd(c, Some(FILE), 0)), EAGAIN);
}

#[test]
fn open_xrcd_with_o_excl_on_an_existing_domain_is_einval() {
    let mut core = core();
    let (c, _) = with_xrcd(&mut core, 1);
    assert_eq!(
        errno(core.open_xrcd(c, Some(FILE), O_CREAT | O_EXCL)),
        EINVAL
    );
    // Upstream does not look at O_CREAT here: O_EXCL alone is refused as well.
    assert_eq!(errno(core.open_xrcd(c, Some(FILE), O_EXCL)), EINVAL);
    // O_CREAT|O_EXCL on a new file creates it.
    assert!(
        core.open_xrcd(c, Some(OTHER_FILE), O_CREAT | O_EXCL)
            .unwrap()
            .created
    );
}

#[test]
fn contexts_opening_the_same_file_share_one_domain_and_each_gets_a_handle() {
    let mut core = core();
    let a = ctx(&mut core, 1);
    let b = ctx(&mut core, 2);
    let oa = core.open_xrcd(a, Some(FILE), O_CREAT).unwrap();
    let ob = core.open_xrcd(b, Some(FILE), 0).unwrap();
    let oa2 = core.open_xrcd(a, Some(FILE), 0).unwrap();
    assert!(oa.created && !ob.created && !oa2.created);
    assert_eq!(oa.xrcd, ob.xrcd);
    assert_ne!(oa.handle, oa2.handle);
    let other = core.open_xrcd(a, Some(OTHER_FILE), O_CREAT).unwrap();
    assert_ne!(other.xrcd, oa.xrcd);
    assert_eq!(
        core.resources()
            .xrcds
            .iter()
            .find(|x| x.xrcd == oa.xrcd)
            .unwrap()
            .opens,
        3
    );
}

#[test]
fn private_domains_are_never_shared() {
    let mut core = core();
    let a = ctx(&mut core, 1);
    let p1 = core.open_xrcd(a, None, O_CREAT).unwrap();
    let p2 = core.open_xrcd(a, None, 0).unwrap();
    assert!(p1.created && p2.created);
    assert_ne!(p1.xrcd, p2.xrcd);
    core.close_xrcd(a, p1.handle).unwrap();
    core.close_xrcd(a, p2.handle).unwrap();
    assert_eq!(core.counts().xrcds, 0);
}

#[test]
fn close_xrcd_with_an_srq_or_receive_qp_made_through_the_handle_is_ebusy() {
    let mut core = core();
    let (c, x) = with_xrcd(&mut core, 1);
    let pd = core.alloc_pd(c).unwrap();
    let (cq, _) = core.create_cq(c, 16, 0).unwrap();
    let srq = core
        .create_xrc_srq(
            c,
            Some(pd),
            Some(x),
            Some(cq),
            SrqAttr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    assert_eq!(errno(core.close_xrcd(c, x)), EBUSY);
    core.destroy_srq(c, srq.handle).unwrap();
    let qpn = core.create_xrc_rcv_qp(c, x).unwrap();
    assert_eq!(errno(core.close_xrcd(c, x)), EBUSY);
    core.unreg_xrc_rcv_qp(c, x, qpn).unwrap();
    let mut init = QpInitAttr::new(QpType::XrcRecv);
    init.xrcd = Some(x);
    let h = core.create_qp(c, &init).unwrap().handle;
    assert_eq!(errno(core.close_xrcd(c, x)), EBUSY);
    core.destroy_qp(c, h).unwrap();
    core.close_xrcd(c, x).unwrap();
    assert!(core.resources().xrcds.is_empty());
}

#[test]
fn a_domain_lives_while_opens_srqs_or_receive_qps_remain() {
    let mut core = core();
    let (a, xa) = with_xrcd(&mut core, 1);
    let (b, xb) = with_xrcd(&mut core, 2);
    let qpn = core.create_xrc_rcv_qp(a, xa).unwrap();
    core.reg_xrc_rcv_qp(b, xb, qpn).unwrap();
    core.close_context(a).unwrap();
    let row = core.resources().xrcds[0].clone();
    assert_eq!((row.opens, row.srqs, row.xrc_recv_qps), (1, 0, 1));
    core.unreg_xrc_rcv_qp(b, xb, qpn).unwrap();
    assert_eq!(core.resources().xrcds[0].xrc_recv_qps, 0);
    core.close_xrcd(b, xb).unwrap();
    assert!(core.resources().xrcds.is_empty());
    // The file entry went with it: a new open without O_CREAT finds nothing.
    assert_eq!(errno(core.open_xrcd(b, Some(FILE), 0)), EAGAIN);
}

#[test]
fn destroying_or_closing_an_unknown_handle_is_enoent() {
    let mut core = core();
    let c = ctx(&mut core, 1);
    let h = Handle(9999);
    assert_eq!(errno(core.close_xrcd(c, h)), ENOENT);
    assert_eq!(errno(core.destroy_qp(c, h)), ENOENT);
    assert_eq!(errno(core.destroy_srq(c, h)), ENOENT);
    assert_eq!(errno(core.destroy_cq(c, h)), ENOENT);
    assert_eq!(errno(core.dealloc_pd(c, h)), ENOENT);
    assert_eq!(errno(core.dereg_mr(c, h)), ENOENT);
    assert_eq!(errno(core.destroy_ah(c, h)), ENOENT);
}

#[test]
fn bad_fd_maps_to_ebadf() {
    assert_eq!(Error::BadFd.errno(), EBADF);
}

// ---- §1.2 XRC SRQs ---------------------------------------------------------------------

#[test]
fn xrc_srq_needs_pd_domain_and_cq_and_valid_handles() {
    let mut core = core();
    let (c, x) = with_xrcd(&mut core, 1);
    let pd = core.alloc_pd(c).unwrap();
    let (cq, _) = core.create_cq(c, 16, 0).unwrap();
    let a = SrqAttr {
        max_wr: 8,
        max_sge: 1,
        srq_limit: 0,
    };
    assert_eq!(
        errno(core.create_xrc_srq(c, None, Some(x), Some(cq), a)),
        EINVAL
    );
    assert_eq!(
        errno(core.create_xrc_srq(c, Some(pd), None, Some(cq), a)),
        EINVAL
    );
    assert_eq!(
        errno(core.create_xrc_srq(c, Some(pd), Some(x), None, a)),
        EINVAL
    );
    assert_eq!(
        errno(core.create_xrc_srq(c, Some(Handle(777)), Some(x), Some(cq), a)),
        EINVAL
    );
    assert_eq!(
        errno(core.create_xrc_srq(c, Some(pd), Some(Handle(777)), Some(cq), a)),
        EINVAL
    );
    assert_eq!(
        errno(core.create_xrc_srq(c, Some(pd), Some(x), Some(Handle(777)), a)),
        EINVAL
    );
    let s = core
        .create_xrc_srq(c, Some(pd), Some(x), Some(cq), a)
        .unwrap();
    let srqn = s.srqn.unwrap();
    assert!(srqn <= 0xff_ffff);
    assert_eq!(core.srq_num(c, s.handle).unwrap(), srqn);
    // Its PD and CQ are now in use.
    assert_eq!(errno(core.dealloc_pd(c, pd)), EBUSY);
    assert_eq!(errno(core.destroy_cq(c, cq)), EBUSY);
}

#[test]
fn srq_num_of_a_basic_srq_is_eopnotsupp() {
    let mut core = core();
    let c = ctx(&mut core, 1);
    let pd = core.alloc_pd(c).unwrap();
    let s = core
        .create_srq(
            c,
            pd,
            SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    assert_eq!(s.srqn, None);
    assert_eq!(errno(core.srq_num(c, s.handle)), EOPNOTSUPP);
}

#[test]
fn destroy_srq_is_ebusy_only_with_attached_qps_and_receive_qps_never_count() {
    let mut core = core();
    let (c, x) = with_xrcd(&mut core, 1);
    let pd = core.alloc_pd(c).unwrap();
    let (cq, _) = core.create_cq(c, 16, 0).unwrap();
    let basic = core
        .create_srq(
            c,
            pd,
            SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap()
        .handle;
    let mut init = QpInitAttr::new(QpType::Rc);
    init.pd = Some(pd);
    init.send_cq = Some(cq);
    init.recv_cq = Some(cq);
    init.srq = Some(basic);
    let qp = core.create_qp(c, &init).unwrap().handle;
    assert_eq!(errno(core.destroy_srq(c, basic)), EBUSY);
    core.destroy_qp(c, qp).unwrap();
    core.destroy_srq(c, basic).unwrap();
    // An XRC SRQ can go while receive QPs of its domain are live.
    let xs = core
        .create_xrc_srq(
            c,
            Some(pd),
            Some(x),
            Some(cq),
            SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let qpn = core.create_xrc_rcv_qp(c, x).unwrap();
    core.destroy_srq(c, xs.handle).unwrap();
    assert!(core.xrc_rcv_qp_exists(qpn));
}

// ---- §1.3/§1.4 QP creation rules -------------------------------------------------------

#[test]
fn xrc_recv_creation_takes_only_a_domain() {
    let mut core = core();
    let (c, x) = with_xrcd(&mut core, 1);
    let pd = core.alloc_pd(c).unwrap();
    let (cq, _) = core.create_cq(c, 16, 0).unwrap();
    let base = QpInitAttr::new(QpType::XrcRecv);
    assert_eq!(errno(core.create_qp(c, &base)), EINVAL, "no domain");
    for bad in [
        QpInitAttr {
            pd: Some(pd),
            xrcd: Some(x),
            ..base
        },
        QpInitAttr {
            send_cq: Some(cq),
            xrcd: Some(x),
            ..base
        },
        QpInitAttr {
            recv_cq: Some(cq),
            xrcd: Some(x),
            ..base
        },
    ] {
        assert_eq!(errno(core.create_qp(c, &bad)), EINVAL, "{bad:?}");
    }
    assert_eq!(
        errno(core.create_qp(
            c,
            &QpInitAttr {
                xrcd: Some(Handle(555)),
                ..base
            }
        )),
        EINVAL
    );
    let made = core
        .create_qp(
            c,
            &QpInitAttr {
                xrcd: Some(x),
                ..base
            },
        )
        .unwrap();
    let q = core.query_qp(c, made.handle).unwrap();
    assert_eq!(
        q.init.create_flags, 0,
        "a receive QP never has create flags"
    );
    assert_eq!(
        q.init.cap,
        Default::default(),
        "a receive QP has no send or receive queue"
    );
    assert_eq!(q.attr.qp_state, QpState::Reset);
}

#[test]
fn create_flags_are_not_supported() {
    let mut core = core();
    let (c, x) = with_xrcd(&mut core, 1);
    let init = QpInitAttr {
        xrcd: Some(x),
        create_flags: 1 << 1,
        ..QpInitAttr::new(QpType::XrcRecv)
    };
    assert_eq!(errno(core.create_qp(c, &init)), EOPNOTSUPP);
}

#[test]
fn xrc_send_needs_pd_and_send_cq_and_refuses_srq_and_domain() {
    let mut core = core();
    let (c, x) = with_xrcd(&mut core, 1);
    let pd = core.alloc_pd(c).unwrap();
    let (cq, _) = core.create_cq(c, 16, 0).unwrap();
    let srq = core
        .create_srq(
            c,
            pd,
            SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap()
        .handle;
    let ok = QpInitAttr {
        pd: Some(pd),
        send_cq: Some(cq),
        ..QpInitAttr::new(QpType::XrcSend)
    };
    assert_eq!(
        errno(core.create_qp(c, &QpInitAttr { pd: None, ..ok })),
        EINVAL
    );
    assert_eq!(
        errno(core.create_qp(
            c,
            &QpInitAttr {
                send_cq: None,
                ..ok
            }
        )),
        EINVAL
    );
    assert_eq!(
        errno(core.create_qp(
            c,
            &QpInitAttr {
                xrcd: Some(x),
                ..ok
            }
        )),
        EINVAL
    );
    assert_eq!(
        errno(core.create_qp(
            c,
            &QpInitAttr {
                srq: Some(srq),
                ..ok
            }
        )),
        EINVAL
    );
    let mut with_recv = ok;
    with_recv.cap.max_recv_wr = 64;
    with_recv.cap.max_send_wr = 64;
    let made = core.create_qp(c, &with_recv).unwrap();
    assert_eq!(
        (made.cap.max_recv_wr, made.cap.max_send_wr),
        (0, 64),
        "no receive queue"
    );
}

/// An XRC send QP's request entries hold 16 bytes less inline than an RC QP's, as mlx5's
/// (its XRC segment); libfabric tells its XRC domain from its RC one by that difference
/// (docs/guide/mpi.md, "Over XRC").
#[test]
fn an_xrc_send_qp_holds_16_bytes_less_inline_than_an_rc_qp() {
    let mut core = core();
    let c = ctx(&mut core, 1);
    let pd = core.alloc_pd(c).unwrap();
    let (cq, _) = core.create_cq(c, 16, 0).unwrap();
    let limit = core.devices()[0].attr.max_inline_data;
    let qp = |t: QpType, inline: u32| {
        let mut init = QpInitAttr {
            pd: Some(pd),
            send_cq: Some(cq),
            recv_cq: (t != QpType::XrcSend).then_some(cq),
            ..QpInitAttr::new(t)
        };
        init.cap.max_send_wr = 4;
        init.cap.max_send_sge = 1;
        init.cap.max_inline_data = inline;
        init
    };
    for (t, most) in [(QpType::Rc, limit), (QpType::XrcSend, limit - 16)] {
        let made = core.create_qp(c, &qp(t, most)).unwrap();
        assert_eq!(made.cap.max_inline_data, most, "{t:?}");
        assert_eq!(
            errno(core.create_qp(c, &qp(t, most + 1))),
            EINVAL,
            "{t:?} with {} inline bytes",
            most + 1
        );
    }
}

#[test]
fn an_xrc_srq_cannot_back_an_rc_qp() {
    let mut core = core();
    let (c, x) = with_xrcd(&mut core, 1);
    let pd = core.alloc_pd(c).unwrap();
    let (cq, _) = core.create_cq(c, 16, 0).unwrap();
    let xs = core
        .create_xrc_srq(
            c,
            Some(pd),
            Some(x),
            Some(cq),
            SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let init = QpInitAttr {
        pd: Some(pd),
        send_cq: Some(cq),
        recv_cq: Some(cq),
        srq: Some(xs.handle),
        ..QpInitAttr::new(QpType::Rc)
    };
    assert_eq!(errno(core.create_qp(c, &init)), EINVAL);
    // A receive QP takes no SRQ at all.
    let tgt = QpInitAttr {
        xrcd: Some(x),
        srq: Some(xs.handle),
        ..QpInitAttr::new(QpType::XrcRecv)
    };
    assert_eq!(errno(core.create_qp(c, &tgt)), EINVAL);
}

#[test]
fn rc_qp_creation_rules_and_limits() {
    let mut core = core();
    let c = ctx(&mut core, 1);
    let pd = core.alloc_pd(c).unwrap();
    let (cq, _) = core.create_cq(c, 16, 0).unwrap();
    let ok = QpInitAttr {
        pd: Some(pd),
        send_cq: Some(cq),
        recv_cq: Some(cq),
        ..QpInitAttr::new(QpType::Rc)
    };
    assert_eq!(
        errno(core.create_qp(
            c,
            &QpInitAttr {
                recv_cq: None,
                ..ok
            }
        )),
        EINVAL
    );
    let mut big = ok;
    big.cap.max_send_wr = 1 << 30;
    assert_eq!(errno(core.create_qp(c, &big)), EINVAL);
    let q = core.create_qp(c, &ok).unwrap();
    assert!(q.qpn >= softverbs_core::FIRST_QPN && q.qpn <= 0xff_ffff);
    assert_eq!(errno(core.dealloc_pd(c, pd)), EBUSY);
    assert_eq!(errno(core.destroy_cq(c, cq)), EBUSY);
}

// ---- §1.4 modify -----------------------------------------------------------------------

fn tgt_handle(core: &mut Core) -> (CtxId, Handle, u32) {
    let (c, x) = with_xrcd(core, 1);
    let m = core
        .create_qp(
            c,
            &QpInitAttr {
                xrcd: Some(x),
                ..QpInitAttr::new(QpType::XrcRecv)
            },
        )
        .unwrap();
    (c, m.handle, m.qpn)
}

#[test]
fn modify_with_unknown_mask_bits_is_eopnotsupp() {
    let mut core = core();
    let (c, h, _) = tgt_handle(&mut core);
    assert_eq!(
        errno(core.modify_qp(c, h, &init_attr(), TO_INIT | M(1 << 27))),
        EOPNOTSUPP
    );
}

#[test]
fn modify_with_a_bad_port_or_av_port_mismatch_is_einval() {
    let mut core = core();
    let (c, h, _) = tgt_handle(&mut core);
    let bad_port = QpAttr {
        port_num: 2,
        ..init_attr()
    };
    assert_eq!(errno(core.modify_qp(c, h, &bad_port, TO_INIT)), EINVAL);
    core.modify_qp(c, h, &init_attr(), TO_INIT).unwrap();
    let gid = Gid::from_ip("127.0.0.1".parse().unwrap());
    let av = AhAttr {
        dgid: gid,
        is_global: true,
        port_num: 1,
        hop_limit: 64,
        ..AhAttr::default()
    };
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: av,
        path_mtu: Mtu::M1024,
        dest_qp_num: 0x99,
        rq_psn: 7,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ..init_attr()
    };
    let rtr_mask = M(M::STATE.0
        | M::AV.0
        | M::PATH_MTU.0
        | M::DEST_QPN.0
        | M::RQ_PSN.0
        | M::MAX_DEST_RD_ATOMIC.0
        | M::MIN_RNR_TIMER.0);
    let wrong_av_port = QpAttr {
        ah_attr: AhAttr { port_num: 2, ..av },
        ..rtr
    };
    assert_eq!(
        errno(core.modify_qp(c, h, &wrong_av_port, rtr_mask)),
        EINVAL
    );
    let no_grh = QpAttr {
        ah_attr: AhAttr {
            is_global: false,
            ..av
        },
        ..rtr
    };
    assert_eq!(
        errno(core.modify_qp(c, h, &no_grh, rtr_mask)),
        EINVAL,
        "RoCE needs a GRH"
    );
    let too_many_rd_atomics = QpAttr {
        max_dest_rd_atomic: 200,
        ..rtr
    };
    assert_eq!(
        errno(core.modify_qp(c, h, &too_many_rd_atomics, rtr_mask)),
        EINVAL
    );
    // A failed modify leaves the QP unchanged.
    assert_eq!(core.query_qp(c, h).unwrap().attr.qp_state, QpState::Init);
    core.modify_qp(c, h, &rtr, rtr_mask).unwrap();
    let q = core.query_qp(c, h).unwrap().attr;
    assert_eq!(
        (q.qp_state, q.dest_qp_num, q.rq_psn, q.min_rnr_timer),
        (QpState::Rtr, 0x99, 7, 12)
    );
}

#[test]
fn modify_with_an_illegal_transition_or_mask_is_einval() {
    let mut core = core();
    let (c, h, _) = tgt_handle(&mut core);
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..init_attr()
    };
    assert_eq!(
        errno(core.modify_qp(c, h, &rts, M::STATE)),
        EINVAL,
        "RESET->RTS"
    );
    assert_eq!(
        errno(core.modify_qp(c, h, &init_attr(), M(M::STATE.0 | M::PORT.0))),
        EINVAL,
        "missing bits"
    );
    assert_eq!(
        errno(core.modify_qp(c, h, &init_attr(), TO_INIT | M::QKEY)),
        EINVAL,
        "forbidden bit"
    );
}

#[test]
fn uverbs_strips_send_side_bits_on_a_receive_qp() {
    // Open MPI issue #1839: RC-style RTR->RTS masks on an XRC receive QP must work through
    // the user interface.
    let mut core = core();
    let (c, h, _) = tgt_handle(&mut core);
    core.modify_qp(
        c,
        h,
        &init_attr(),
        TO_INIT | M::MAX_QP_RD_ATOMIC | M::RETRY_CNT,
    )
    .unwrap();
    assert_eq!(
        core.query_qp(c, h).unwrap().attr.retry_cnt,
        0,
        "stripped bits are ignored, not applied"
    );
}

// ---- §2 sharing: the three faces -----------------------------------------------------

#[test]
fn upstream_destroy_of_one_handle_succeeds_and_leaves_the_qp_to_the_others() {
    let mut core = core();
    let (a, xa) = with_xrcd(&mut core, 1);
    let (b, xb) = with_xrcd(&mut core, 2);
    let made = core
        .create_qp(
            a,
            &QpInitAttr {
                xrcd: Some(xa),
                ..QpInitAttr::new(QpType::XrcRecv)
            },
        )
        .unwrap();
    let hb = core.open_qp(b, xb, made.qpn, QpType::XrcRecv).unwrap();
    assert_eq!(
        core.destroy_qp(a, made.handle),
        Ok(0),
        "the creator's destroy succeeds"
    );
    assert!(
        core.xrc_rcv_qp_exists(made.qpn),
        "and does not destroy the QP"
    );
    core.modify_qp(b, hb, &init_attr(), TO_INIT).unwrap();
    assert_eq!(core.query_qp(b, hb).unwrap().attr.qp_state, QpState::Init);
    core.destroy_qp(b, hb).unwrap();
    assert!(
        !core.xrc_rcv_qp_exists(made.qpn),
        "the last handle takes the QP with it"
    );
}

#[test]
fn open_qp_only_finds_receive_qps_of_the_callers_domain() {
    let mut core = core();
    let (a, xa) = with_xrcd(&mut core, 1);
    let b = ctx(&mut core, 2);
    let xb_other = core.open_xrcd(b, Some(OTHER_FILE), O_CREAT).unwrap().handle;
    let made = core
        .create_qp(
            a,
            &QpInitAttr {
                xrcd: Some(xa),
                ..QpInitAttr::new(QpType::XrcRecv)
            },
        )
        .unwrap();
    assert_eq!(
        errno(core.open_qp(b, xb_other, made.qpn, QpType::XrcRecv)),
        EINVAL,
        "other domain"
    );
    assert_eq!(
        errno(core.open_qp(a, xa, 0xabcdef, QpType::XrcRecv)),
        EINVAL,
        "no such QP"
    );
    assert_eq!(
        errno(core.open_qp(a, xa, made.qpn, QpType::Rc)),
        EINVAL,
        "wrong type"
    );
    assert_eq!(
        errno(core.open_qp(b, Handle(4242), made.qpn, QpType::XrcRecv)),
        EINVAL,
        "bad domain handle"
    );
    // An RC QP number is not a receive QP.
    let pd = core.alloc_pd(a).unwrap();
    let (cq, _) = core.create_cq(a, 4, 0).unwrap();
    let rc = core
        .create_qp(
            a,
            &QpInitAttr {
                pd: Some(pd),
                send_cq: Some(cq),
                recv_cq: Some(cq),
                ..QpInitAttr::new(QpType::Rc)
            },
        )
        .unwrap();
    assert_eq!(
        errno(core.open_qp(a, xa, rc.qpn, QpType::XrcRecv)),
        EINVAL,
        "not a receive QP"
    );
    // Two opens by one context are two handles and two holders.
    let h1 = core.open_qp(a, xa, made.qpn, QpType::XrcRecv).unwrap();
    let h2 = core.open_qp(a, xa, made.qpn, QpType::XrcRecv).unwrap();
    assert_ne!(h1, h2);
    assert_eq!(core.xrc_rcv_qp_holders(made.qpn).len(), 3);
}

#[test]
fn legacy_second_reg_by_one_context_takes_no_second_reference() {
    let mut core = core();
    let (a, xa) = with_xrcd(&mut core, 1);
    let (b, xb) = with_xrcd(&mut core, 2);
    let qpn = core.create_xrc_rcv_qp(a, xa).unwrap();
    core.reg_xrc_rcv_qp(a, xa, qpn).unwrap();
    core.reg_xrc_rcv_qp(b, xb, qpn).unwrap();
    core.reg_xrc_rcv_qp(b, xb, qpn).unwrap();
    let holders = core.xrc_rcv_qp_holders(qpn);
    assert_eq!(holders.len(), 2);
    assert_eq!(holders[0].kind, HolderKind::Creator);
    assert_eq!(holders[1].kind, HolderKind::Registration);
    // One unreg by b is enough to leave.
    core.unreg_xrc_rcv_qp(b, xb, qpn).unwrap();
    assert_eq!(
        errno(core.unreg_xrc_rcv_qp(b, xb, qpn)),
        EINVAL,
        "not registered any more"
    );
    assert_eq!(core.xrc_rcv_qp_holders(qpn).len(), 1);
}

#[test]
fn legacy_destroy_means_unregister_me() {
    // The thread's question: "What happens if one process does destroy while another
    // process is still registered?"
    let mut core = core();
    let (a, xa) = with_xrcd(&mut core, 1);
    let (b, xb) = with_xrcd(&mut core, 2);
    let qpn = core.create_xrc_rcv_qp(a, xa).unwrap();
    core.reg_xrc_rcv_qp(b, xb, qpn).unwrap();
    core.destroy_xrc_rcv_qp(a, xa, qpn).unwrap();
    assert!(core.xrc_rcv_qp_exists(qpn));
    assert_eq!(
        errno(core.modify_xrc_rcv_qp(a, xa, qpn, &init_attr(), TO_INIT)),
        EINVAL,
        "a left"
    );
    core.modify_xrc_rcv_qp(b, xb, qpn, &init_attr(), TO_INIT)
        .unwrap();
    assert_eq!(
        core.query_xrc_rcv_qp(b, xb, qpn).unwrap().attr.qp_state,
        QpState::Init
    );
    core.destroy_xrc_rcv_qp(b, xb, qpn).unwrap();
    assert!(!core.xrc_rcv_qp_exists(qpn));
}

#[test]
fn create_reg_destroy_by_one_context_leaves_nothing() {
    // The thread's other question: "What is supposed to happen if I do create/reg/destroy?"
    let mut core = core();
    let (a, xa) = with_xrcd(&mut core, 1);
    let qpn = core.create_xrc_rcv_qp(a, xa).unwrap();
    core.reg_xrc_rcv_qp(a, xa, qpn).unwrap();
    core.destroy_xrc_rcv_qp(a, xa, qpn).unwrap();
    assert!(!core.xrc_rcv_qp_exists(qpn));
    core.close_xrcd(a, xa).unwrap();
    core.close_context(a).unwrap();
    assert!(core.counts().is_empty());
}

#[test]
fn legacy_calls_reject_qps_outside_the_domain_or_not_held() {
    let mut core = core();
    let (a, xa) = with_xrcd(&mut core, 1);
    let b = ctx(&mut core, 2);
    let xb_other = core.open_xrcd(b, Some(OTHER_FILE), O_CREAT).unwrap().handle;
    let qpn = core.create_xrc_rcv_qp(a, xa).unwrap();
    assert_eq!(
        errno(core.reg_xrc_rcv_qp(b, xb_other, qpn)),
        EINVAL,
        "other domain"
    );
    assert_eq!(
        errno(core.reg_xrc_rcv_qp(a, xa, 0x123456)),
        EINVAL,
        "no such QP"
    );
    assert_eq!(
        errno(core.create_xrc_rcv_qp(b, Handle(31337))),
        EINVAL,
        "no domain"
    );
    let xb = core.open_xrcd(b, Some(FILE), 0).unwrap().handle;
    assert_eq!(errno(core.query_xrc_rcv_qp(b, xb, qpn)), EINVAL, "not held");
    assert_eq!(
        errno(core.modify_xrc_rcv_qp(b, xb, qpn, &init_attr(), TO_INIT)),
        EINVAL,
        "not held"
    );
    assert_eq!(
        errno(core.unreg_xrc_rcv_qp(b, xb, qpn)),
        EINVAL,
        "not registered"
    );
}

#[test]
fn minimal_register_creates_or_joins_and_the_last_unregister_destroys() {
    let mut core = core();
    let (a, xa) = with_xrcd(&mut core, 1);
    let (b, xb) = with_xrcd(&mut core, 2);
    let qpn = core.register_xrc_rcv_qp(a, xa, None).unwrap();
    assert_eq!(core.register_xrc_rcv_qp(b, xb, Some(qpn)), Ok(qpn));
    core.unregister_xrc_rcv_qp(a, xa, qpn).unwrap();
    assert!(core.xrc_rcv_qp_exists(qpn));
    core.unregister_xrc_rcv_qp(b, xb, qpn).unwrap();
    assert!(!core.xrc_rcv_qp_exists(qpn));
}

#[test]
fn the_three_faces_share_one_qp() {
    let mut core = core();
    let (a, xa) = with_xrcd(&mut core, 1);
    let (b, xb) = with_xrcd(&mut core, 2);
    let (c, xc) = with_xrcd(&mut core, 3);
    let qpn = core.create_xrc_rcv_qp(a, xa).unwrap();
    let hb = core.open_qp(b, xb, qpn, QpType::XrcRecv).unwrap();
    core.register_xrc_rcv_qp(c, xc, Some(qpn)).unwrap();
    let kinds: Vec<_> = core
        .xrc_rcv_qp_holders(qpn)
        .iter()
        .map(|h| (h.ctx, h.kind, h.via))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (a, HolderKind::Creator, HolderRef::Registration),
            (b, HolderKind::Opened, HolderRef::Handle(hb)),
            (c, HolderKind::Registration, HolderRef::Registration),
        ]
    );
    // A modify through one face is seen through the others.
    core.modify_qp(b, hb, &init_attr(), TO_INIT).unwrap();
    assert_eq!(
        core.query_xrc_rcv_qp(c, xc, qpn).unwrap().attr.qp_state,
        QpState::Init
    );
}

// ---- §3 events -------------------------------------------------------------------------

#[test]
fn a_receive_qp_event_reaches_every_holder_once_and_no_one_else() {
    let mut core = core();
    let (a, xa) = with_xrcd(&mut core, 1);
    let (b, xb) = with_xrcd(&mut core, 2);
    let (bystander, xs) = with_xrcd(&mut core, 3);
    let qpn = core.create_xrc_rcv_qp(a, xa).unwrap();
    let hb = core.open_qp(b, xb, qpn, QpType::XrcRecv).unwrap();
    let hb2 = core.open_qp(b, xb, qpn, QpType::XrcRecv).unwrap();
    let other = core.create_xrc_rcv_qp(bystander, xs).unwrap();
    let woken = core.raise_qp_event(qpn, EventType::PathMig);
    assert_eq!(woken, vec![a, b]);
    let ea = events(&mut core, a);
    assert_eq!(
        ea,
        vec![AsyncEvent {
            event_type: EventType::PathMig,
            element: EventElement::XrcRecvQpNum(qpn)
        }]
    );
    assert_eq!(
        ea[0].legacy_event_type(),
        EventType::PathMig as u32 | XRC_QP_EVENT_FLAG
    );
    let mut eb = events(&mut core, b);
    eb.sort_by_key(|e| format!("{e:?}"));
    let mut want = vec![
        AsyncEvent {
            event_type: EventType::PathMig,
            element: EventElement::Qp(hb),
        },
        AsyncEvent {
            event_type: EventType::PathMig,
            element: EventElement::Qp(hb2),
        },
    ];
    want.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(eb, want);
    assert!(events(&mut core, bystander).is_empty());
    let _ = other;
}

#[test]
fn unread_events_are_purged_when_a_holder_leaves_and_destroy_reports_read_ones() {
    let mut core = core();
    let (a, xa) = with_xrcd(&mut core, 1);
    let (b, xb) = with_xrcd(&mut core, 2);
    let made = core
        .create_qp(
            a,
            &QpInitAttr {
                xrcd: Some(xa),
                ..QpInitAttr::new(QpType::XrcRecv)
            },
        )
        .unwrap();
    core.reg_xrc_rcv_qp(b, xb, made.qpn).unwrap();
    core.raise_qp_event(made.qpn, EventType::CommEst);
    core.raise_qp_event(made.qpn, EventType::PathMig);
    assert!(core.next_event(a).unwrap().is_some());
    assert_eq!(
        core.destroy_qp(a, made.handle),
        Ok(1),
        "one event was read through this handle"
    );
    assert_eq!(core.pending_events(a).unwrap(), 0, "the unread one is gone");
    assert_eq!(
        core.pending_events(b).unwrap(),
        2,
        "b's copies are untouched"
    );
    assert_eq!(core.unreg_xrc_rcv_qp(b, xb, made.qpn), Ok(0));
    assert_eq!(core.pending_events(b).unwrap(), 0);
}

#[test]
fn owned_qp_events_go_to_the_owner_only() {
    let mut core = core();
    let a = ctx(&mut core, 1);
    let b = ctx(&mut core, 2);
    let pd = core.alloc_pd(a).unwrap();
    let (cq, _) = core.create_cq(a, 4, 0).unwrap();
    let q = core
        .create_qp(
            a,
            &QpInitAttr {
                pd: Some(pd),
                send_cq: Some(cq),
                recv_cq: Some(cq),
                ..QpInitAttr::new(QpType::Rc)
            },
        )
        .unwrap();
    assert_eq!(core.fail_qp(q.qpn, EventType::QpFatal), vec![a]);
    assert_eq!(
        core.query_qp(a, q.handle).unwrap().attr.qp_state,
        QpState::Err
    );
    assert_eq!(
        events(&mut core, a),
        vec![AsyncEvent {
            event_type: EventType::QpFatal,
            element: EventElement::Qp(q.handle)
        }]
    );
    assert!(events(&mut core, b).is_empty());
}

// ---- §4 process exit -------------------------------------------------------------------

#[test]
fn the_receive_qp_survives_its_creators_death_with_the_other_holders() {
    let mut core = core();
    let (creator, xc) = with_xrcd(&mut core, 1);
    let workers: Vec<(CtxId, Handle)> = (2..6).map(|p| with_xrcd(&mut core, p)).collect();
    let qpn = core.create_xrc_rcv_qp(creator, xc).unwrap();
    for &(w, x) in &workers {
        core.reg_xrc_rcv_qp(w, x, qpn).unwrap();
    }
    core.close_context(creator).unwrap();
    assert!(core.xrc_rcv_qp_exists(qpn));
    assert_eq!(core.xrc_rcv_qp_holders(qpn).len(), 4);
    assert_eq!(core.raise_qp_event(qpn, EventType::QpAccessErr).len(), 4);
    for (i, &(w, _)) in workers.iter().enumerate() {
        assert_eq!(events(&mut core, w).len(), 1);
        core.close_context(w).unwrap();
        assert_eq!(core.xrc_rcv_qp_exists(qpn), i + 1 < workers.len());
    }
    assert!(core.counts().is_empty(), "{:?}", core.counts());
}

#[test]
fn teardown_destroys_everything_of_a_context_in_dependency_order() {
    let mut core = core();
    let (a, x) = with_xrcd(&mut core, 1);
    let pd = core.alloc_pd(a).unwrap();
    let (cq, _) = core.create_cq(a, 16, 0).unwrap();
    let srq = core
        .create_srq(
            a,
            pd,
            SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap()
        .handle;
    core.create_xrc_srq(
        a,
        Some(pd),
        Some(x),
        Some(cq),
        SrqAttr {
            max_wr: 4,
            max_sge: 1,
            srq_limit: 0,
        },
    )
    .unwrap();
    core.reg_mr(a, pd, 0x1000, 4096, 0x1000, Access::LOCAL_WRITE)
        .unwrap();
    let gid = Gid::from_ip("127.0.0.1".parse().unwrap());
    core.create_ah(
        a,
        pd,
        AhAttr {
            dgid: gid,
            is_global: true,
            port_num: 1,
            ..AhAttr::default()
        },
    )
    .unwrap();
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        core.create_qp(
            a,
            &QpInitAttr {
                pd: Some(pd),
                send_cq: Some(cq),
                recv_cq: Some(cq),
                srq: Some(srq),
                ..QpInitAttr::new(t)
            },
        )
        .unwrap();
    }
    core.create_qp(
        a,
        &QpInitAttr {
            pd: Some(pd),
            send_cq: Some(cq),
            ..QpInitAttr::new(QpType::XrcSend)
        },
    )
    .unwrap();
    core.create_qp(
        a,
        &QpInitAttr {
            xrcd: Some(x),
            ..QpInitAttr::new(QpType::XrcRecv)
        },
    )
    .unwrap();
    core.create_xrc_rcv_qp(a, x).unwrap();
    core.raise_device_event(0, EventElement::Port(1), EventType::PortActive);
    core.close_context(a).unwrap();
    assert!(core.counts().is_empty(), "{:?}", core.counts());
}

// ---- isolation -------------------------------------------------------------------------

#[test]
fn another_contexts_handles_are_not_found_whatever_the_value() {
    let mut core = core();
    let (a, xa) = with_xrcd(&mut core, 1);
    let b = ctx(&mut core, 2);
    let pd = core.alloc_pd(a).unwrap();
    let (cq, _) = core.create_cq(a, 4, 0).unwrap();
    let qp = core
        .create_qp(
            a,
            &QpInitAttr {
                pd: Some(pd),
                send_cq: Some(cq),
                recv_cq: Some(cq),
                ..QpInitAttr::new(QpType::Rc)
            },
        )
        .unwrap();
    let tgt = core
        .create_qp(
            a,
            &QpInitAttr {
                xrcd: Some(xa),
                ..QpInitAttr::new(QpType::XrcRecv)
            },
        )
        .unwrap();
    let mr = core.reg_mr(a, pd, 0, 64, 0, Access::EMPTY).unwrap();
    // Every handle value a holds, tried by b, in every role.
    for h in [xa, pd, cq, qp.handle, tgt.handle, mr.handle] {
        assert_eq!(errno(core.destroy_qp(b, h)), ENOENT);
        assert_eq!(errno(core.query_qp(b, h)), EINVAL);
        assert_eq!(errno(core.modify_qp(b, h, &init_attr(), TO_INIT)), EINVAL);
        assert_eq!(errno(core.dealloc_pd(b, h)), ENOENT);
        assert_eq!(errno(core.destroy_cq(b, h)), ENOENT);
        assert_eq!(errno(core.close_xrcd(b, h)), ENOENT);
        assert_eq!(errno(core.dereg_mr(b, h)), ENOENT);
        assert_eq!(
            errno(
                core.alloc_pd(b)
                    .and_then(|p| core.reg_mr(b, h, 0, 1, 0, Access::EMPTY).map(|_| p))
            ),
            EINVAL
        );
        assert_eq!(errno(core.open_qp(b, h, tgt.qpn, QpType::XrcRecv)), EINVAL);
        assert_eq!(errno(core.reg_xrc_rcv_qp(b, h, tgt.qpn)), EINVAL);
    }
    // a's objects are intact.
    assert!(core.query_qp(a, qp.handle).is_ok());
    assert_eq!(core.xrc_rcv_qp_holders(tgt.qpn).len(), 1);
}

// ---- memory keys (data path) -----------------------------------------------------------

#[test]
fn memory_keys_check_pd_bounds_and_access_and_die_with_dereg() {
    use softverbs_core::datapath::{MemError, PdRef};
    let mut core = core();
    let a = ctx(&mut core, 1);
    let pd = core.alloc_pd(a).unwrap();
    let pd2 = core.alloc_pd(a).unwrap();
    assert_eq!(
        errno(core.reg_mr(a, pd, 0x1000, 64, 0x1000, Access::REMOTE_WRITE)),
        EINVAL,
        "remote write needs local write"
    );
    let mr = core
        .reg_mr(
            a,
            pd,
            0x1000,
            4096,
            0x9000,
            Access::LOCAL_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let p = PdRef { ctx: a, pd };
    let t = core
        .check_mem(p, mr.rkey, 0x9010, 16, Access::REMOTE_READ)
        .unwrap();
    assert_eq!(
        t.addr, 0x1010,
        "iova is translated to the registered address"
    );
    assert_eq!(
        core.check_mem(p, mr.rkey, 0x9ff8, 16, Access::REMOTE_READ),
        Err(MemError::OutOfBounds)
    );
    assert_eq!(
        core.check_mem(p, mr.rkey, 0x9000, 8, Access::REMOTE_WRITE),
        Err(MemError::AccessDenied)
    );
    assert_eq!(
        core.check_mem(
            PdRef { ctx: a, pd: pd2 },
            mr.rkey,
            0x9000,
            8,
            Access::REMOTE_READ
        ),
        Err(MemError::WrongPd)
    );
    core.dereg_mr(a, mr.handle).unwrap();
    assert_eq!(
        core.check_mem(p, mr.rkey, 0x9000, 8, Access::REMOTE_READ),
        Err(MemError::UnknownKey)
    );
}

#[test]
fn xrc_requests_resolve_only_srqs_of_the_receive_qps_domain() {
    use softverbs_core::datapath::XrcDeliveryError;
    let mut core = core();
    let (a, xa) = with_xrcd(&mut core, 1);
    let pd = core.alloc_pd(a).unwrap();
    let (cq, _) = core.create_cq(a, 4, 0).unwrap();
    let other = core.open_xrcd(a, Some(OTHER_FILE), O_CREAT).unwrap().handle;
    let attr = SrqAttr {
        max_wr: 4,
        max_sge: 1,
        srq_limit: 0,
    };
    let mine = core
        .create_xrc_srq(a, Some(pd), Some(xa), Some(cq), attr)
        .unwrap();
    let foreign = core
        .create_xrc_srq(a, Some(pd), Some(other), Some(cq), attr)
        .unwrap();
    let qpn = core.create_xrc_rcv_qp(a, xa).unwrap();
    let t = core.resolve_xrc_srq(qpn, mine.srqn.unwrap()).unwrap();
    assert_eq!((t.ctx, t.srq, t.cq), (a, mine.handle, cq));
    assert_eq!(
        core.resolve_xrc_srq(qpn, foreign.srqn.unwrap()),
        Err(XrcDeliveryError::OtherDomain)
    );
    assert_eq!(
        core.resolve_xrc_srq(qpn, 0xfffff),
        Err(XrcDeliveryError::UnknownSrq)
    );
    core.destroy_srq(a, mine.handle).unwrap();
    assert_eq!(
        core.resolve_xrc_srq(qpn, mine.srqn.unwrap()),
        Err(XrcDeliveryError::UnknownSrq)
    );
}
