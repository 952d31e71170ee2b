//! `Qp::attach_mcast` / `Qp::detach_mcast` through the safe API against an in-process
//! daemon: the limits the device reports, and the refusals with the kernel's errnos
//! (docs/guide/dropin.md "Multicast"). Delivery is tested through the drop-in
//! (crates/libibverbs/tests/mcast.rs) and on the simulator (crates/transport/tests/mcast.rs).

mod common;

use std::net::Ipv4Addr;

use common::{cap, daemon};
use softverbs::{errno, Context, Gid, QpInit, QpType};

#[test]
fn attach_rules_and_limits_through_the_safe_api() {
    let (d, _dir) = daemon("mcast", None);
    let ctx = Context::open_at(&d.socket, 0).unwrap();
    let a = ctx.query_device().unwrap();
    let budget = softverbs_daemon::config::host_budget();
    let groups = softverbs_daemon::config::mcast_groups_per_device(&budget, 1);
    assert_eq!(
        (
            a.max_mcast_grp,
            a.max_mcast_qp_attach,
            a.max_total_mcast_qp_attach
        ),
        (groups, 56, 0x70000),
        "max_mcast_grp: rxe's 8192, at most RLIMIT_NOFILE / 8"
    );
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let qp = |t| {
        ctx.create_qp(&QpInit::new(t, &pd).cqs(&cq, &cq).cap(cap()))
            .unwrap()
    };
    let (rc, ud) = (qp(QpType::Rc), qp(QpType::Ud));
    let g = Gid::from(Ipv4Addr::new(239, 1, 2, 3));
    let e = |r: softverbs::Result<()>| r.unwrap_err().errno;
    assert_eq!(e(rc.attach_mcast(g)), errno::EINVAL, "not UD");
    assert_eq!(
        e(ud.attach_mcast(Gid::from(Ipv4Addr::new(10, 0, 0, 1)))),
        errno::EINVAL,
        "not multicast"
    );
    ud.attach_mcast(g).unwrap();
    ud.attach_mcast(g).unwrap();
    ud.detach_mcast(g).unwrap();
    assert_eq!(e(ud.detach_mcast(g)), errno::EINVAL, "attached once only");
    let many: Vec<_> = (0..56).map(|_| qp(QpType::Ud)).collect();
    for q in &many {
        q.attach_mcast(g).unwrap();
    }
    assert_eq!(e(ud.attach_mcast(g)), errno::ENOMEM, "max_mcast_qp_attach");
    drop(many);
    ud.attach_mcast(g).unwrap();
}
