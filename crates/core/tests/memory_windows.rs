//! The core's part of memory windows (docs/design/memory-windows.md): the objects, their limits and
//! keys, the PD they hold, the MR their bindings pin, and teardown.

use softverbs_core::device::Device;
use softverbs_core::errno::*;
use softverbs_core::ids::Handle;
use softverbs_core::mw::{is_window_key, MwType};
use softverbs_core::types::{Access, Mtu};
use softverbs_core::{ContextInfo, Core, CoreChange};

fn core_with(max_mw: u32) -> Core {
    let mut d = Device::roce("sv0", 0x1122, &["127.0.0.1".parse().unwrap()], Mtu::M4096);
    d.attr.max_mw = max_mw;
    Core::new(vec![d])
}

fn ctx(core: &mut Core) -> softverbs_core::ids::CtxId {
    core.open_context(
        0,
        ContextInfo {
            pid: 1,
            uid: 1000,
            comm: "p".into(),
        },
    )
    .unwrap()
}

/// uverbs `ib_uverbs_alloc_mw`: only types 1 and 2 exist.
#[test]
fn only_types_1_and_2_exist() {
    assert_eq!(MwType::from_raw(1).unwrap(), MwType::One);
    assert_eq!(MwType::from_raw(2).unwrap(), MwType::Two);
    for t in [0, 3, 0xffff_ffff] {
        assert_eq!(MwType::from_raw(t).unwrap_err().errno(), EINVAL);
    }
}

/// Window keys and MR keys never meet: every window key has its top bit set, whatever the
/// consumer key, and no MR key does.
#[test]
fn window_keys_are_disjoint_from_mr_keys() {
    let mut c = core_with(16);
    let x = ctx(&mut c);
    let pd = c.alloc_pd(x).unwrap();
    let mr = c
        .reg_mr(x, pd, 0x1000, 0x1000, 0x1000, Access::LOCAL_WRITE)
        .unwrap();
    let w = c.alloc_mw(x, pd, MwType::One).unwrap();
    assert!(!is_window_key(mr.rkey));
    assert!(is_window_key(w.rkey) && is_window_key(w.rkey | 0xff));
    assert_eq!(w.rkey & 0xff, 0, "a new window's consumer key is 0");
    assert_eq!(c.mw_info(x, w.handle).unwrap(), (MwType::One, w.rkey));
}

/// `max_mw` is device-wide (`ENOMEM` past it); a window holds its PD (`EBUSY`); dealloc frees
/// both, and a second dealloc names nothing (`ENOENT`, as a destroy of a handle that is gone).
#[test]
fn limits_pd_reference_and_dealloc() {
    let mut c = core_with(2);
    let x = ctx(&mut c);
    let pd = c.alloc_pd(x).unwrap();
    assert_eq!(
        c.alloc_mw(x, Handle(9999), MwType::One)
            .unwrap_err()
            .errno(),
        EINVAL
    );
    let a = c.alloc_mw(x, pd, MwType::One).unwrap();
    let b = c.alloc_mw(x, pd, MwType::Two).unwrap();
    assert_ne!(a.rkey >> 8, b.rkey >> 8);
    assert_eq!(c.alloc_mw(x, pd, MwType::One).unwrap_err().errno(), ENOMEM);
    assert_eq!(c.dealloc_pd(x, pd).unwrap_err().errno(), EBUSY);
    c.dealloc_mw(x, a.handle).unwrap();
    assert_eq!(c.dealloc_mw(x, a.handle).unwrap_err().errno(), ENOENT);
    c.alloc_mw(x, pd, MwType::One).unwrap();
    let mut deallocated = 0;
    let mut allocated = 0;
    while let Some(ch) = c.poll_change() {
        match ch {
            CoreChange::MwAllocated { .. } => allocated += 1,
            CoreChange::MwDeallocated { .. } => deallocated += 1,
            _ => {}
        }
    }
    assert_eq!((allocated, deallocated), (3, 1));
}

/// IBA 10.6.7.2.6: while the transport reports a window bound to an MR, dereg and rereg are
/// `EINVAL` and change nothing; after the unbind they work.
#[test]
fn a_bound_window_pins_its_mr() {
    let mut c = core_with(16);
    let x = ctx(&mut c);
    let pd = c.alloc_pd(x).unwrap();
    let mr = c
        .reg_mr(
            x,
            pd,
            0x1000,
            0x1000,
            0x1000,
            Access::LOCAL_WRITE | Access::MW_BIND,
        )
        .unwrap();
    c.note_window_binding(x, mr.handle, true);
    assert_eq!(c.dereg_mr(x, mr.handle).unwrap_err().errno(), EINVAL);
    assert_eq!(
        c.rereg_mr(x, mr.handle, None, Some(Access::LOCAL_WRITE), None)
            .unwrap_err()
            .errno(),
        EINVAL
    );
    assert_eq!(c.bound_windows(x, mr.handle), 1);
    c.note_window_binding(x, mr.handle, false);
    c.dereg_mr(x, mr.handle).unwrap();
}

/// Closing a context releases its windows (their key indices come back) and says so to the
/// data path, so the engine forgets them.
#[test]
fn closing_a_context_releases_its_windows() {
    let mut c = core_with(1);
    let x = ctx(&mut c);
    let pd = c.alloc_pd(x).unwrap();
    let w = c.alloc_mw(x, pd, MwType::Two).unwrap();
    while c.poll_change().is_some() {}
    c.close_context(x).unwrap();
    let mut gone = false;
    while let Some(ch) = c.poll_change() {
        if let CoreChange::MwDeallocated { rkey, .. } = ch {
            gone |= rkey == w.rkey;
        }
    }
    assert!(gone);
    let y = ctx(&mut c);
    let pd = c.alloc_pd(y).unwrap();
    c.alloc_mw(y, pd, MwType::One)
        .expect("max_mw is 1 and the closed context's window is gone");
}

/// `softverbs resources` counts windows like the other objects: per context, per PD (with
/// the PD's MRs: what keeps `ibv_dealloc_pd` at `EBUSY`), and in `counts()`, the leak check;
/// a dealloc takes them out again.
#[test]
fn resources_count_windows_per_context_and_pd() {
    let mut c = core_with(16);
    let x = ctx(&mut c);
    let (p1, p2) = (c.alloc_pd(x).unwrap(), c.alloc_pd(x).unwrap());
    c.reg_mr(x, p1, 0x1000, 0x1000, 0x1000, Access::LOCAL_WRITE)
        .unwrap();
    let w1 = c.alloc_mw(x, p1, MwType::One).unwrap();
    c.alloc_mw(x, p1, MwType::Two).unwrap();
    c.alloc_mw(x, p2, MwType::Two).unwrap();
    let r = c.resources();
    assert_eq!((r.contexts[0].mrs, r.contexts[0].mws), (1, 3));
    let pds: Vec<_> = r.pds.iter().map(|p| (p.handle, p.mrs, p.mws)).collect();
    assert_eq!(pds, vec![(p1, 1, 2), (p2, 0, 1)]);
    assert_eq!(c.counts().mws, 3);
    c.dealloc_mw(x, w1.handle).unwrap();
    let r = c.resources();
    assert_eq!(r.contexts[0].mws, 2);
    assert_eq!(r.pds[0].mws, 1);
    assert_eq!(c.counts().mws, 2);
}
