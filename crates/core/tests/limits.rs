//! The quotas of `softverbs_core::limits` (docs/guide/limits.md), deterministically: each limit
//! refuses with `OverLimit` (ENOMEM) in the scope that is full and charges nothing, other
//! contexts and uids keep their share, and charges go back on destroy and on context close.

use softverbs_core::attr::{QpCap, QpInitAttr};
use softverbs_core::device::{Device, Gid};
use softverbs_core::errno::ENOMEM;
use softverbs_core::ids::CtxId;
use softverbs_core::limits::{Budget, Limits, Resource, Ring, Scope, UNLIMITED};
use softverbs_core::types::{Access, Mtu, QpType};
use softverbs_core::{ContextInfo, Core, Error};

fn core(settings: &[&str]) -> Core {
    let mut core = Core::new(vec![Device::roce(
        "sv0",
        0x1122,
        &["127.0.0.1".parse().unwrap()],
        Mtu::M4096,
    )]);
    let mut l = Limits::unlimited();
    for s in settings {
        l.apply(s).unwrap();
    }
    core.set_limits(l);
    core
}

fn open(core: &mut Core, uid: u32) -> CtxId {
    core.open_context(
        0,
        ContextInfo {
            pid: 100 + uid,
            uid,
            comm: "t".into(),
        },
    )
    .unwrap()
}

/// The scope an error says is full.
fn over<T: std::fmt::Debug>(r: Result<T, Error>) -> (Resource, Scope) {
    match r.expect_err("expected a limit") {
        e @ Error::OverLimit {
            resource, scope, ..
        } => {
            assert_eq!(e.errno(), ENOMEM);
            (resource, scope)
        }
        e => panic!("expected OverLimit, got {e:?}"),
    }
}

#[test]
fn a_full_context_is_refused_and_another_context_of_the_uid_is_not() {
    let mut core = core(&["context.cqs=2", "context.pds=1"]);
    let (a, b) = (open(&mut core, 1000), open(&mut core, 1000));
    let cq = core.create_cq(a, 4, 0).unwrap().0;
    core.create_cq(a, 4, 0).unwrap();
    assert_eq!(
        over(core.create_cq(a, 4, 0)),
        (Resource::Cqs, Scope::Context)
    );
    core.create_cq(b, 4, 0).unwrap();
    core.alloc_pd(a).unwrap();
    assert_eq!(over(core.alloc_pd(a)), (Resource::Pds, Scope::Context));
    core.destroy_cq(a, cq).unwrap();
    core.create_cq(a, 4, 0).unwrap();
    assert_eq!(core.context_usage(a, Resource::Cqs).unwrap(), 2);
    assert_eq!(core.uid_usage(1000, Resource::Cqs), 3);
}

#[test]
fn a_full_uid_is_refused_in_every_context_and_other_uids_are_not() {
    let mut core = core(&["uid.qps=3", "uid.contexts=2"]);
    let (a, b) = (open(&mut core, 1000), open(&mut core, 1000));
    let qp = |core: &mut Core, c: CtxId| {
        let pd = core.alloc_pd(c).unwrap();
        let cq = core.create_cq(c, 4, 0).unwrap().0;
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
        core.create_qp(c, &init)
    };
    qp(&mut core, a).unwrap();
    qp(&mut core, a).unwrap();
    qp(&mut core, b).unwrap();
    assert_eq!(over(qp(&mut core, b)), (Resource::Qps, Scope::Uid));
    assert_eq!(over(qp(&mut core, a)), (Resource::Qps, Scope::Uid));
    let other = ContextInfo {
        pid: 7,
        uid: 1000,
        comm: "t".into(),
    };
    assert_eq!(
        over(core.open_context(0, other)),
        (Resource::Contexts, Scope::Uid)
    );
    let c = open(&mut core, 2000);
    qp(&mut core, c).unwrap();
    // Closing a context gives its whole share back to the uid.
    core.close_context(a).unwrap();
    assert_eq!(core.uid_usage(1000, Resource::Qps), 1);
    assert_eq!(core.uid_usage(1000, Resource::Contexts), 1);
    qp(&mut core, b).unwrap();
    open(&mut core, 1000);
}

#[test]
fn xrc_receive_qp_holders_count_as_qps_of_each_holder() {
    let mut core = core(&["context.qps=1"]);
    let (a, b) = (open(&mut core, 1), open(&mut core, 2));
    let xa = core.open_xrcd(a, None, 0).unwrap().handle;
    let qpn = core.create_xrc_rcv_qp(a, xa).unwrap();
    assert_eq!(
        over(core.create_xrc_rcv_qp(a, xa)),
        (Resource::Qps, Scope::Context)
    );
    let mut init = QpInitAttr::new(QpType::XrcRecv);
    init.xrcd = Some(xa);
    assert_eq!(
        over(core.create_qp(a, &init)),
        (Resource::Qps, Scope::Context)
    );
    assert_eq!(
        over(core.open_qp(a, xa, qpn, QpType::XrcRecv)),
        (Resource::Qps, Scope::Context)
    );
    // A second domain's context has its own share.
    let xb = core.open_xrcd(b, None, 0).unwrap().handle;
    core.create_xrc_rcv_qp(b, xb).unwrap();
    core.unreg_xrc_rcv_qp(a, xa, qpn).unwrap();
    assert_eq!(core.context_usage(a, Resource::Qps).unwrap(), 0);
    core.create_xrc_rcv_qp(a, xa).unwrap();
}

#[test]
fn rings_and_shared_mrs_are_charged_as_bytes_and_mappings_until_their_object_goes() {
    let mut core = core(&[
        "context.ring-bytes=12K",
        "uid.mappings=3",
        "daemon.mappings=4",
    ]);
    let a = open(&mut core, 1);
    let cqs: Vec<_> = (0..3).map(|_| core.create_cq(a, 4, 0).unwrap().0).collect();
    core.attach_ring(a, Ring::Cq(cqs[0]), 4096).unwrap();
    core.attach_ring(a, Ring::Cq(cqs[1]), 8192).unwrap();
    assert_eq!(
        over(core.attach_ring(a, Ring::Cq(cqs[2]), 4096)),
        (Resource::RingBytes, Scope::Context)
    );
    // Replacing a ring charges only the difference, and no second mapping.
    core.attach_ring(a, Ring::Cq(cqs[1]), 4096).unwrap();
    assert_eq!(core.context_usage(a, Resource::Mappings).unwrap(), 2);
    core.attach_ring(a, Ring::Cq(cqs[2]), 4096).unwrap();
    assert_eq!(core.context_usage(a, Resource::RingBytes).unwrap(), 12288);
    let pd = core.alloc_pd(a).unwrap();
    let mr = core
        .reg_mr(a, pd, 0x10000, 4096, 0x10000, Access::LOCAL_WRITE)
        .unwrap()
        .handle;
    assert_eq!(
        over(core.set_mr_mapped(a, mr, true)),
        (Resource::Mappings, Scope::Uid)
    );
    // The daemon's limit holds across uids.
    let b = open(&mut core, 2);
    let cq_b = core.create_cq(b, 4, 0).unwrap().0;
    core.attach_ring(b, Ring::Cq(cq_b), 4096).unwrap();
    let cq_b2 = core.create_cq(b, 4, 0).unwrap().0;
    assert_eq!(
        over(core.attach_ring(b, Ring::Cq(cq_b2), 4096)),
        (Resource::Mappings, Scope::Daemon)
    );
    // Destroying the CQ takes its ring's charge with it.
    core.destroy_cq(a, cqs[0]).unwrap();
    assert_eq!(core.context_usage(a, Resource::RingBytes).unwrap(), 8192);
    core.set_mr_mapped(a, mr, true).unwrap();
    core.dereg_mr(a, mr).unwrap();
    assert_eq!(core.context_usage(a, Resource::Mappings).unwrap(), 2);
    // A ring for something the context does not have is refused, not charged.
    assert!(core.attach_ring(a, Ring::Qp(pd), 4096).is_err());
    core.close_context(a).unwrap();
    assert_eq!(core.uid_usage(1, Resource::Mappings), 0);
    core.attach_ring(b, Ring::Cq(cq_b2), 4096).unwrap();
}

#[test]
fn registered_bytes_count_every_mr_and_rereg_charges_the_difference() {
    let mut core = core(&["context.registered-bytes=1M"]);
    let a = open(&mut core, 1);
    let pd = core.alloc_pd(a).unwrap();
    let reg = |core: &mut Core, len: u64| {
        core.reg_mr(a, pd, 0x100000, len, 0x100000, Access::LOCAL_WRITE)
    };
    let m1 = reg(&mut core, 512 << 10).unwrap().handle;
    assert_eq!(
        over(reg(&mut core, 600 << 10)),
        (Resource::RegisteredBytes, Scope::Context)
    );
    let m2 = reg(&mut core, 512 << 10).unwrap().handle;
    assert_eq!(
        over(core.rereg_mr(a, m2, None, None, Some((0x100000, 600 << 10, 0x100000)))),
        (Resource::RegisteredBytes, Scope::Context)
    );
    core.rereg_mr(a, m2, None, None, Some((0x100000, 256 << 10, 0x100000)))
        .unwrap();
    assert_eq!(
        core.context_usage(a, Resource::RegisteredBytes).unwrap(),
        768 << 10
    );
    core.dereg_mr(a, m1).unwrap();
    reg(&mut core, 768 << 10).unwrap();
}

#[test]
fn defaults_follow_the_budget_and_settings_parse() {
    let l = Limits::for_budget(&Budget {
        max_map_count: 65530,
        mem_total: 16 << 30,
        max_fds: 1024,
    });
    let maps = l.get(Resource::Mappings);
    assert_eq!((maps.context, maps.uid, maps.daemon), (16382, 16382, 61435));
    assert_eq!(l.get(Resource::RingBytes).uid, 2 << 30);
    assert_eq!(l.get(Resource::Contexts).uid, 128);
    assert_eq!(l.get(Resource::Cqs).context, 32768);
    assert_eq!(l.get(Resource::Cqs).daemon, UNLIMITED);
    // Descriptors: a quarter per uid, so three uids at their share leave the rest room; the
    // daemon keeps an eighth for multicast sockets and a sixteenth for itself.
    let fds = l.get(Resource::Descriptors);
    assert_eq!((fds.context, fds.uid, fds.daemon), (UNLIMITED, 256, 832));
    assert!(3 * fds.uid < fds.daemon);
    // Multicast: a quarter of the table (at most an eighth of the descriptors) and of rxe's
    // attachments.
    assert_eq!(l.get(Resource::McastGroups).uid, 32);
    assert_eq!(l.get(Resource::McastAttachments).uid, 0x70000 / 4);
    let mut l = Limits::unlimited();
    l.apply("uid.ring-bytes=64M").unwrap();
    l.apply("daemon.cqs=10").unwrap();
    l.apply("context.cqs=unlimited").unwrap();
    assert_eq!(l.get(Resource::RingBytes).uid, 64 << 20);
    assert_eq!(l.get(Resource::Cqs).daemon, 10);
    for bad in [
        "uid.cq=1",
        "host.cqs=1",
        "uid.cqs",
        "uid.cqs=x",
        "uid.cqs=99999999999T",
    ] {
        assert!(l.apply(bad).is_err(), "{bad}");
    }
}

fn info(uid: u32) -> ContextInfo {
    ContextInfo {
        pid: 100 + uid,
        uid,
        comm: "t".into(),
    }
}

#[test]
fn descriptors_count_connections_and_everything_a_context_keeps_per_uid() {
    let mut core = core(&["uid.descriptors=8"]);
    // A connection is charged to its uid alone, a context's own descriptors to the context.
    core.charge_uid(1, Resource::Descriptors, 1).unwrap();
    let a = core.open_context_holding(0, info(1), 3).unwrap();
    core.charge(a, Resource::Descriptors, 2).unwrap();
    let pd = core.alloc_pd(a).unwrap();
    let mr = core
        .reg_mr(a, pd, 0x10000, 4096, 0x10000, Access::LOCAL_WRITE)
        .unwrap()
        .handle;
    core.set_mr_mapped(a, mr, true).unwrap();
    assert_eq!(core.uid_usage(1, Resource::Descriptors), 7);
    let mr2 = core
        .reg_mr(a, pd, 0x20000, 4096, 0x20000, Access::LOCAL_WRITE)
        .unwrap()
        .handle;
    core.charge_uid(1, Resource::Descriptors, 1).unwrap();
    assert_eq!(
        over(core.set_mr_mapped(a, mr2, true)),
        (Resource::Descriptors, Scope::Uid),
        "a shared MR keeps a memfd"
    );
    assert_eq!(
        core.context_usage(a, Resource::Mappings).unwrap(),
        1,
        "nothing charged"
    );
    assert_eq!(
        over(core.charge_uid(1, Resource::Descriptors, 1)),
        (Resource::Descriptors, Scope::Uid)
    );
    assert_eq!(
        over(core.open_context_holding(0, info(1), 1)),
        (Resource::Descriptors, Scope::Uid)
    );
    assert_eq!(
        core.uid_usage(1, Resource::Contexts),
        1,
        "no context was opened"
    );
    // Another uid has its own share.
    core.charge_uid(2, Resource::Descriptors, 1).unwrap();
    core.open_context_holding(0, info(2), 7).unwrap();
    // Deregistering gives the MR's descriptor back, closing the context the rest.
    core.dereg_mr(a, mr).unwrap();
    assert_eq!(core.uid_usage(1, Resource::Descriptors), 7);
    core.close_context(a).unwrap();
    assert_eq!(
        core.uid_usage(1, Resource::Descriptors),
        2,
        "the connections"
    );
    core.uncharge_uid(1, Resource::Descriptors, 2);
    assert_eq!(core.uid_usage(1, Resource::Descriptors), 0);
}

#[test]
fn multicast_groups_and_attachments_are_shared_per_uid_and_come_back_with_their_last_user() {
    let mut core = core(&["uid.mcast-groups=2", "uid.mcast-attachments=3"]);
    let ud = |core: &mut Core, c: CtxId| {
        let pd = core.alloc_pd(c).unwrap();
        let cq = core.create_cq(c, 4, 0).unwrap().0;
        let mut init = QpInitAttr::new(QpType::Ud);
        init.pd = Some(pd);
        init.send_cq = Some(cq);
        init.recv_cq = Some(cq);
        init.cap = QpCap {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        core.create_qp(c, &init).unwrap().handle
    };
    let g = |n: u8| Gid::from(std::net::Ipv4Addr::new(239, 0, 0, n));
    let (a1, a2, b) = (open(&mut core, 1), open(&mut core, 1), open(&mut core, 2));
    let (q1, q1b, q2, qb) = (
        ud(&mut core, a1),
        ud(&mut core, a1),
        ud(&mut core, a2),
        ud(&mut core, b),
    );
    // Two QPs of a context in one group: one group, two attachments; again: nothing more.
    core.attach_mcast(a1, q1, g(1)).unwrap();
    core.attach_mcast(a1, q1b, g(1)).unwrap();
    core.attach_mcast(a1, q1, g(1)).unwrap();
    assert_eq!(core.uid_usage(1, Resource::McastGroups), 1);
    assert_eq!(core.uid_usage(1, Resource::McastAttachments), 2);
    core.attach_mcast(a1, q1, g(2)).unwrap();
    assert_eq!(
        over(core.attach_mcast(a1, q1b, g(2))),
        (Resource::McastAttachments, Scope::Uid)
    );
    core.detach_mcast(a1, q1b, g(1)).unwrap();
    assert_eq!(
        core.uid_usage(1, Resource::McastGroups),
        2,
        "q1 is still in 1"
    );
    assert_eq!(
        over(core.attach_mcast(a2, q2, g(3))),
        (Resource::McastGroups, Scope::Uid)
    );
    // Each context pays for the groups it is in, even one its uid's other context is in.
    assert_eq!(
        over(core.attach_mcast(a2, q2, g(1))),
        (Resource::McastGroups, Scope::Uid)
    );
    assert_eq!(
        core.mcast_members(0, g(3)),
        Vec::<u32>::new(),
        "nothing attached"
    );
    // Another uid joins the uid's groups and new ones, up to its own share.
    for n in [1, 3] {
        core.attach_mcast(b, qb, g(n)).unwrap();
    }
    // A group goes back when the context's last QP leaves it, everything at destroy and
    // close.
    core.detach_mcast(a1, q1, g(1)).unwrap();
    core.attach_mcast(a2, q2, g(3)).unwrap();
    core.destroy_qp(a2, q2).unwrap();
    assert_eq!(core.uid_usage(1, Resource::McastGroups), 1);
    assert_eq!(core.uid_usage(1, Resource::McastAttachments), 1);
    core.close_context(a1).unwrap();
    assert_eq!(core.uid_usage(1, Resource::McastGroups), 0);
    assert_eq!(core.uid_usage(1, Resource::McastAttachments), 0);
    assert_eq!(core.uid_usage(2, Resource::McastAttachments), 2);
}
