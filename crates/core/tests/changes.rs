//! The changes the core queues for the data path (`Core::poll_change`, docs/architecture.md
//! §2): one per operation that alters what an engine mirrors, carrying what applying it needs,
//! none for a failed operation or for one the data path does not mirror, and the hidden
//! effects too — an XRC receive QP leaving with its last holder, every QP of a closed context.

use softverbs_core::attr::{QpAttr, QpCap, QpInitAttr, SrqAttr, SRQ_LIMIT, SRQ_MAX_WR};
use softverbs_core::datapath::PdRef;
use softverbs_core::device::Device;
use softverbs_core::errno::O_CREAT;
use softverbs_core::ids::{CtxId, FileId, Handle};
use softverbs_core::types::{Access, AttrMask as M, Mtu, QpState, QpType};
use softverbs_core::{ContextInfo, Core, CoreChange};

const FILE: FileId = FileId { dev: 8, ino: 42 };

fn core() -> Core {
    Core::new(vec![
        Device::roce("sv0", 1, &["127.0.0.1".parse().unwrap()], Mtu::M4096),
        Device::roce("sv1", 2, &["127.0.0.2".parse().unwrap()], Mtu::M4096),
    ])
}

fn ctx(core: &mut Core, device: usize, pid: u32) -> CtxId {
    let info = ContextInfo {
        pid,
        uid: 1000,
        comm: format!("p{pid}"),
    };
    core.open_context(device, info).unwrap()
}

fn changes(core: &mut Core) -> Vec<CoreChange> {
    std::iter::from_fn(|| core.poll_change()).collect()
}

fn rc_init(pd: Handle, cq: Handle) -> QpInitAttr {
    let mut init = QpInitAttr::new(QpType::Rc);
    init.pd = Some(pd);
    init.send_cq = Some(cq);
    init.recv_cq = Some(cq);
    init.cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    init
}

fn to_init() -> (QpAttr, M) {
    let attr = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    (attr, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
}

#[test]
fn contexts_cqs_and_mrs_announce_their_changes() {
    let mut core = core();
    let c = ctx(&mut core, 1, 7);
    assert_eq!(
        changes(&mut core),
        [],
        "the daemon registers a new context's memory itself"
    );

    let (cq, cqe) = core.create_cq(c, 16, 0).unwrap();
    core.resize_cq(c, cq, 32).unwrap();
    assert!(core.resize_cq(c, cq, 0).is_err());
    assert!(core.create_cq(c, 0, 0).is_err());
    core.destroy_cq(c, cq).unwrap();
    assert_eq!(
        changes(&mut core),
        [
            CoreChange::CqCreated { ctx: c, cq, cqe },
            CoreChange::CqResized {
                ctx: c,
                cq,
                cqe: 32
            },
            CoreChange::CqDestroyed { ctx: c, cq },
        ],
        "failed calls queue nothing"
    );

    // Registering is the daemon's own business (it maps the fd); what it must undo is
    // announced: deregistration, and a new range that the old mapping no longer backs.
    let pd = core.alloc_pd(c).unwrap();
    let k = core
        .reg_mr(c, pd, 0x1000, 64, 0x1000, Access::LOCAL_WRITE)
        .unwrap();
    let mr = k.handle;
    core.rereg_mr(c, mr, None, Some(Access(0)), None).unwrap();
    core.rereg_mr(c, mr, None, None, Some((0x2000, 8, 0x2000)))
        .unwrap();
    core.dereg_mr(c, mr).unwrap();
    core.dealloc_pd(c, pd).unwrap();
    assert_eq!(
        changes(&mut core),
        [
            CoreChange::MrRangeChanged { ctx: c, mr },
            CoreChange::MrDeregistered { ctx: c, mr },
        ]
    );
}

#[test]
fn a_new_range_drops_the_mapping_the_daemon_counted() {
    let mut core = core();
    let c = ctx(&mut core, 0, 1);
    let pd = core.alloc_pd(c).unwrap();
    let mr = core
        .reg_mr(c, pd, 0x1000, 64, 0x1000, Access::LOCAL_WRITE)
        .unwrap()
        .handle;
    core.set_mr_mapped(c, mr, true).unwrap();
    let mappings = softverbs_core::limits::Resource::Mappings;
    assert_eq!(core.context_usage(c, mappings).unwrap(), 1);
    core.rereg_mr(c, mr, None, Some(Access(0)), None).unwrap();
    assert_eq!(core.context_usage(c, mappings).unwrap(), 1, "same range");
    core.rereg_mr(c, mr, None, None, Some((0x2000, 8, 0x2000)))
        .unwrap();
    assert_eq!(core.context_usage(c, mappings).unwrap(), 0);
}

#[test]
fn owned_qps_carry_what_the_engine_needs() {
    let mut core = core();
    let c = ctx(&mut core, 1, 1);
    let pd = core.alloc_pd(c).unwrap();
    let (cq, _) = core.create_cq(c, 16, 0).unwrap();
    let srq = core
        .create_srq(
            c,
            pd,
            SrqAttr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    changes(&mut core);

    let mut init = rc_init(pd, cq);
    init.srq = Some(srq.handle);
    let made = core.create_qp(c, &init).unwrap();
    let info = core.owned_qp_info(c, made.handle).unwrap();
    assert_eq!(
        (info.qpn, info.pd, info.srq),
        (made.qpn, PdRef { ctx: c, pd }, Some(srq.handle))
    );
    let (attr, mask) = to_init();
    core.modify_qp(c, made.handle, &attr, mask).unwrap();
    let now = core.query_qp(c, made.handle).unwrap().attr;
    // A refused transition leaves the QP, and the data path, as they were.
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..attr
    };
    assert!(core.modify_qp(c, made.handle, &rts, M::STATE).is_err());
    core.destroy_qp(c, made.handle).unwrap();
    assert_eq!(
        changes(&mut core),
        [
            CoreChange::QpCreated {
                ctx: c,
                qp: made.handle,
                device: 1,
                info
            },
            CoreChange::QpModified {
                qpn: made.qpn,
                attr: now
            },
            CoreChange::QpDestroyed { qpn: made.qpn },
        ]
    );
    assert_eq!(now.qp_state, QpState::Init);
}

#[test]
fn srqs_announce_creation_limit_and_destruction() {
    let mut core = core();
    let c = ctx(&mut core, 0, 1);
    let pd = core.alloc_pd(c).unwrap();
    let (cq, _) = core.create_cq(c, 16, 0).unwrap();
    let x = core.open_xrcd(c, Some(FILE), O_CREAT).unwrap().handle;
    changes(&mut core);
    let attr = SrqAttr {
        max_wr: 8,
        max_sge: 1,
        srq_limit: 0,
    };
    let basic = core.create_srq(c, pd, attr).unwrap().handle;
    let xrc = core
        .create_xrc_srq(c, Some(pd), Some(x), Some(cq), attr)
        .unwrap()
        .handle;
    let basic_info = core.srq_info(c, basic).unwrap();
    let xrc_info = core.srq_info(c, xrc).unwrap();
    assert_eq!(xrc_info.cq, Some(cq));
    let limit = SrqAttr {
        srq_limit: 3,
        ..attr
    };
    core.modify_srq(c, basic, limit, SRQ_LIMIT).unwrap();
    // Resizing alone arms nothing; a limit above the depth is refused.
    core.modify_srq(c, basic, SrqAttr { max_wr: 16, ..attr }, SRQ_MAX_WR)
        .unwrap();
    let too_high = SrqAttr {
        srq_limit: 99,
        ..attr
    };
    assert!(core.modify_srq(c, xrc, too_high, SRQ_LIMIT).is_err());
    core.destroy_srq(c, xrc).unwrap();
    core.destroy_srq(c, basic).unwrap();
    assert_eq!(
        changes(&mut core),
        [
            CoreChange::SrqCreated {
                ctx: c,
                srq: basic,
                device: 0,
                info: basic_info
            },
            CoreChange::SrqCreated {
                ctx: c,
                srq: xrc,
                device: 0,
                info: xrc_info
            },
            CoreChange::SrqLimitArmed {
                ctx: c,
                srq: basic,
                limit: 3
            },
            CoreChange::SrqDestroyed { ctx: c, srq: xrc },
            CoreChange::SrqDestroyed { ctx: c, srq: basic },
        ]
    );
}

#[test]
fn an_xrc_receive_qp_goes_with_its_last_holder_whatever_the_face() {
    let mut core = core();
    let (a, b, d) = (
        ctx(&mut core, 1, 1),
        ctx(&mut core, 1, 2),
        ctx(&mut core, 1, 3),
    );
    let xa = core.open_xrcd(a, Some(FILE), O_CREAT).unwrap().handle;
    let xb = core.open_xrcd(b, Some(FILE), O_CREAT).unwrap().handle;
    let xd = core.open_xrcd(d, Some(FILE), O_CREAT).unwrap().handle;
    changes(&mut core);

    // Upstream face creates; legacy and minimal faces join.
    let mut init = QpInitAttr::new(QpType::XrcRecv);
    init.xrcd = Some(xa);
    let made = core.create_qp(a, &init).unwrap();
    let qpn = made.qpn;
    core.reg_xrc_rcv_qp(b, xb, qpn).unwrap();
    core.register_xrc_rcv_qp(d, xd, Some(qpn)).unwrap();
    let opened = core.open_qp(b, xb, qpn, QpType::XrcRecv).unwrap();
    assert_eq!(
        changes(&mut core),
        [CoreChange::XrcRecvQpCreated { device: 1, qpn }],
        "joining changes nothing the engine holds"
    );

    // Any holder's modify reaches the one engine QP.
    let (attr, mask) = to_init();
    core.modify_xrc_rcv_qp(b, xb, qpn, &attr, mask).unwrap();
    let now = core.query_xrc_rcv_qp(b, xb, qpn).unwrap().attr;
    assert_eq!(
        changes(&mut core),
        [CoreChange::QpModified { qpn, attr: now }]
    );

    // Leaving: the creator's handle, one registration, the other's handle; the QP stays
    // while anyone holds it.
    core.destroy_qp(a, made.handle).unwrap();
    core.destroy_xrc_rcv_qp(b, xb, qpn).unwrap();
    core.destroy_qp(b, opened).unwrap();
    assert_eq!(changes(&mut core), []);
    core.unregister_xrc_rcv_qp(d, xd, qpn).unwrap();
    assert_eq!(changes(&mut core), [CoreChange::QpDestroyed { qpn }]);

    // Legacy create and unreg, alone.
    let qpn = core.create_xrc_rcv_qp(a, xa).unwrap();
    core.unreg_xrc_rcv_qp(a, xa, qpn).unwrap();
    assert_eq!(
        changes(&mut core),
        [
            CoreChange::XrcRecvQpCreated { device: 1, qpn },
            CoreChange::QpDestroyed { qpn }
        ]
    );
}

#[test]
fn closing_a_context_names_every_qp_that_goes_and_then_the_context() {
    let mut core = core();
    let (a, b) = (ctx(&mut core, 0, 1), ctx(&mut core, 0, 2));
    let xa = core.open_xrcd(a, Some(FILE), O_CREAT).unwrap().handle;
    let xb = core.open_xrcd(b, Some(FILE), O_CREAT).unwrap().handle;
    let pd = core.alloc_pd(a).unwrap();
    let (cq, _) = core.create_cq(a, 16, 0).unwrap();
    let owned = core.create_qp(a, &rc_init(pd, cq)).unwrap().qpn;
    // `shared` is held by b too and survives; `alone` is a's only.
    let shared = core.create_xrc_rcv_qp(a, xa).unwrap();
    core.reg_xrc_rcv_qp(b, xb, shared).unwrap();
    let alone = core.register_xrc_rcv_qp(a, xa, None).unwrap();
    changes(&mut core);

    core.close_context(a).unwrap();
    let got = changes(&mut core);
    let (last, qps) = got.split_last().unwrap();
    assert_eq!(*last, CoreChange::ContextClosed { ctx: a });
    let mut gone: Vec<u32> = qps
        .iter()
        .map(|c| match c {
            CoreChange::QpDestroyed { qpn } => *qpn,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    gone.sort_unstable();
    let mut want = vec![owned, alone];
    want.sort_unstable();
    assert_eq!(gone, want);
    assert!(core.xrc_rcv_qp_exists(shared));

    core.close_context(b).unwrap();
    assert_eq!(
        changes(&mut core),
        [
            CoreChange::QpDestroyed { qpn: shared },
            CoreChange::ContextClosed { ctx: b }
        ]
    );
}
