//! UD multicast attachment rules (`crates/core/src/mcast.rs`, `docs/guide/dropin.md`): which QPs
//! and GIDs may attach, attaching twice, detaching what is not attached, the device's three
//! limits, destroy and context close leaving the groups, and the changes the daemon joins and
//! leaves IP groups by.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use softverbs_core::attr::{QpCap, QpInitAttr};
use softverbs_core::device::{Device, Gid};
use softverbs_core::errno::{EINVAL, ENOMEM};
use softverbs_core::ids::{CtxId, Handle};
use softverbs_core::types::{Mtu, QpType};
use softverbs_core::{ContextInfo, Core, CoreChange};

fn device() -> Device {
    Device::roce("sv0", 1, &["10.0.0.1".parse().unwrap()], Mtu::M1024)
}

fn core_with(dev: Device) -> (Core, CtxId, Handle, Handle) {
    let mut core = Core::new(vec![dev]);
    let info = ContextInfo {
        pid: 1,
        uid: 1000,
        comm: "t".into(),
    };
    let c = core.open_context(0, info).unwrap();
    let pd = core.alloc_pd(c).unwrap();
    let (cq, _) = core.create_cq(c, 16, 0).unwrap();
    (core, c, pd, cq)
}

fn qp(core: &mut Core, c: CtxId, pd: Handle, cq: Handle, t: QpType) -> Handle {
    let mut init = QpInitAttr::new(t);
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
}

fn v4(a: u8, b: u8, c: u8, d: u8) -> Gid {
    Gid::from(Ipv4Addr::new(a, b, c, d))
}

fn changes(core: &mut Core) -> Vec<CoreChange> {
    std::iter::from_fn(|| core.poll_change()).collect()
}

fn errno<T: std::fmt::Debug>(r: softverbs_core::Result<T>) -> i32 {
    r.expect_err("must fail").errno()
}

#[test]
fn multicast_gids_are_ipv4_class_d_or_ipv6_ff00() {
    assert!(v4(224, 0, 0, 1).is_multicast());
    assert!(v4(239, 255, 255, 255).is_multicast());
    assert!(!v4(223, 255, 255, 255).is_multicast());
    assert!(!v4(240, 0, 0, 1).is_multicast());
    assert!(!v4(10, 0, 0, 1).is_multicast());
    let v6 = |s: &str| Gid::from_ip(IpAddr::V6(s.parse::<Ipv6Addr>().unwrap()));
    assert!(v6("ff02::1").is_multicast());
    assert!(v6("ff0e::1234").is_multicast());
    assert!(!v6("fe80::1").is_multicast());
    assert!(!v6("::1").is_multicast());
    assert!(!Gid::default().is_multicast());
}

#[test]
fn only_ud_qps_attach_and_only_to_multicast_gids() {
    let (mut core, c, pd, cq) = core_with(device());
    let rc = qp(&mut core, c, pd, cq, QpType::Rc);
    let uc = qp(&mut core, c, pd, cq, QpType::Uc);
    let ud = qp(&mut core, c, pd, cq, QpType::Ud);
    let g = v4(239, 1, 2, 3);
    changes(&mut core);
    assert_eq!(errno(core.attach_mcast(c, rc, g)), EINVAL, "RC");
    assert_eq!(errno(core.attach_mcast(c, uc, g)), EINVAL, "UC");
    assert_eq!(errno(core.attach_mcast(c, ud, v4(10, 0, 0, 2))), EINVAL);
    assert_eq!(errno(core.attach_mcast(c, Handle(999), g)), EINVAL);
    assert_eq!(changes(&mut core).len(), 0, "refusals change nothing");
    core.attach_mcast(c, ud, g).unwrap();
    assert_eq!(core.qp_mcast_groups(c, ud).unwrap(), [g]);
}

#[test]
fn attaching_twice_succeeds_once_and_detaching_what_is_not_attached_is_einval() {
    let (mut core, c, pd, cq) = core_with(device());
    let a = qp(&mut core, c, pd, cq, QpType::Ud);
    let b = qp(&mut core, c, pd, cq, QpType::Ud);
    let (qa, qb) = (core.qp_num(c, a).unwrap(), core.qp_num(c, b).unwrap());
    let g = v4(239, 1, 2, 3);
    changes(&mut core);
    core.attach_mcast(c, a, g).unwrap();
    core.attach_mcast(c, a, g).unwrap();
    core.attach_mcast(c, b, g).unwrap();
    assert_eq!(core.mcast_members(0, g), [qa, qb], "one entry per QP");
    assert_eq!(
        changes(&mut core),
        [
            CoreChange::McastAttached {
                device: 0,
                mgid: g,
                qpn: qa,
                first: true
            },
            CoreChange::McastAttached {
                device: 0,
                mgid: g,
                qpn: qb,
                first: false
            },
        ]
    );
    assert_eq!(errno(core.detach_mcast(c, a, v4(239, 9, 9, 9))), EINVAL);
    core.detach_mcast(c, a, g).unwrap();
    assert_eq!(
        errno(core.detach_mcast(c, a, g)),
        EINVAL,
        "already detached"
    );
    core.detach_mcast(c, b, g).unwrap();
    assert_eq!(core.mcast_group_count(0), 0);
    assert_eq!(
        changes(&mut core),
        [
            CoreChange::McastDetached {
                device: 0,
                mgid: g,
                qpn: qa,
                last: false
            },
            CoreChange::McastDetached {
                device: 0,
                mgid: g,
                qpn: qb,
                last: true
            },
        ]
    );
}

#[test]
fn the_three_device_limits_answer_enomem() {
    let mut dev = device();
    dev.attr.max_mcast_grp = 2;
    dev.attr.max_mcast_qp_attach = 2;
    dev.attr.max_total_mcast_qp_attach = 3;
    let (mut core, c, pd, cq) = core_with(dev);
    let q: Vec<Handle> = (0..4)
        .map(|_| qp(&mut core, c, pd, cq, QpType::Ud))
        .collect();
    let (g1, g2, g3) = (v4(239, 0, 0, 1), v4(239, 0, 0, 2), v4(239, 0, 0, 3));
    core.attach_mcast(c, q[0], g1).unwrap();
    core.attach_mcast(c, q[1], g1).unwrap();
    assert_eq!(errno(core.attach_mcast(c, q[2], g1)), ENOMEM, "per group");
    core.attach_mcast(c, q[0], g2).unwrap();
    assert_eq!(errno(core.attach_mcast(c, q[0], g3)), ENOMEM, "groups");
    assert_eq!(errno(core.attach_mcast(c, q[1], g2)), ENOMEM, "total");
    core.attach_mcast(c, q[1], g1).unwrap();
    assert!(core.attach_mcast(c, q[0], g2).is_ok(), "attached already");
    core.detach_mcast(c, q[0], g1).unwrap();
    core.attach_mcast(c, q[1], g2).unwrap();
    assert_eq!(core.mcast_members(0, g2).len(), 2);
}

#[test]
fn a_destroyed_qp_and_a_closed_context_leave_their_groups() {
    let (mut core, c, pd, cq) = core_with(device());
    let a = qp(&mut core, c, pd, cq, QpType::Ud);
    let qa = core.qp_num(c, a).unwrap();
    let (g1, g2) = (v4(239, 0, 0, 1), v4(224, 1, 1, 1));
    core.attach_mcast(c, a, g1).unwrap();
    core.attach_mcast(c, a, g2).unwrap();
    changes(&mut core);
    core.destroy_qp(c, a).unwrap();
    let ch = changes(&mut core);
    assert_eq!(ch.len(), 3, "{ch:?}");
    assert!(ch[..2].iter().all(|x| matches!(
        x,
        CoreChange::McastDetached { qpn, last: true, .. } if *qpn == qa
    )));
    assert_eq!(ch[2], CoreChange::QpDestroyed { qpn: qa });
    assert_eq!(core.mcast_group_count(0), 0);

    let b = qp(&mut core, c, pd, cq, QpType::Ud);
    let qb = core.qp_num(c, b).unwrap();
    core.attach_mcast(c, b, g1).unwrap();
    changes(&mut core);
    core.close_context(c).unwrap();
    let ch = changes(&mut core);
    assert_eq!(
        ch[..2],
        [
            CoreChange::McastDetached {
                device: 0,
                mgid: g1,
                qpn: qb,
                last: true
            },
            CoreChange::QpDestroyed { qpn: qb }
        ]
    );
    assert_eq!(core.mcast_group_count(0), 0);
    assert!(core.mcast_members(0, g1).is_empty());
}
