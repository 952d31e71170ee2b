//! On-demand paging (ibv_reg_mr(3) `IBV_ACCESS_ON_DEMAND`, ibv_advise_mr(3);
//! docs/design/registered-memory.md, "On-demand paging"): ODP MRs over memory that is not mapped at
//! registration, the implicit MR over the whole address space, accesses that see the memory as
//! it is mapped at that moment (mapped, unmapped, remapped after registration), the NIC's
//! errors for an access that finds nothing mapped, and the errnos of `advise_mr`.
//!
//! Stays on the raw API (`RawMemory`, raw SGEs): the tests map and unmap the pages under the
//! registrations, which the owning API cannot express.

use std::ffi::c_void;
use std::ptr;
use std::time::Duration;

use rustix::mm::{mmap_anonymous, mprotect, munmap, MapFlags, MprotectFlags, ProtFlags};
use softverbs::{Access, Advice, Context, Cq, Pd, Qp, QpInit, QpType, ADVISE_MR_FLAG_FLUSH};
use softverbs::{SendOp, SendRequest, Sge, WcStatus};
use softverbs_daemon::{spawn_daemon_with, Config};

mod common;
use common::{cap, connect, daemon};

const PAGE: usize = 4096;
const EFAULT: i32 = 14;
const ENOENT: i32 = 2;
const EINVAL: i32 = 22;
const EOPNOTSUPP: i32 = 95;
const WAIT: Duration = Duration::from_secs(20);

/// A page that is never mapped: below `vm.mmap_min_addr`, where no unprivileged mapping can
/// be made (so no other test thread maps it either).
const HOLE: u64 = 0x1000;

fn raw(addr: u64, len: u64) -> softverbs::RawMemory {
    // SAFETY: the tests' own mappings and vectors, read only after the completions of the
    // requests that could write them, and unmapped only when the test is done with them (or
    // on purpose, to see the access fail); HOLE is never mapped.
    unsafe { softverbs::RawMemory::new(addr as usize, len as usize) }
}

fn whole_space() -> softverbs::RawMemory {
    // SAFETY: peers reach only the addresses these tests name in their work requests: the
    // tests' own mappings, as for `raw`.
    unsafe { softverbs::RawMemory::address_space() }
}

/// `n` fresh private anonymous pages, read-write, each filled with `fill`.
fn map_pages(n: usize, fill: u8) -> *mut u8 {
    // SAFETY: a fresh mapping at an address of the kernel's choosing replaces nothing.
    let p = unsafe {
        mmap_anonymous(
            ptr::null_mut(),
            n * PAGE,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE,
        )
    }
    .unwrap()
    .cast::<u8>();
    // SAFETY: the writable mapping just made.
    unsafe { ptr::write_bytes(p, fill, n * PAGE) };
    p
}

/// Maps a fresh page filled with `fill` exactly at `at` (which the test unmapped before);
/// never over anything that took the hole meanwhile (`MAP_FIXED_NOREPLACE`: `EEXIST`).
fn map_page_at(at: *mut u8, fill: u8) {
    // SAFETY: `at` is a page this test mapped and unmapped itself; NOREPLACE maps there only
    // if nothing else did since.
    let p = unsafe {
        mmap_anonymous(
            at.cast(),
            PAGE,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE | MapFlags::FIXED_NOREPLACE,
        )
    }
    .expect("the unmapped page is still a hole")
    .cast::<u8>();
    assert_eq!(p, at);
    // SAFETY: as in `map_pages`.
    unsafe { ptr::write_bytes(p, fill, PAGE) };
}

fn unmap(p: *mut u8, n: usize) {
    // SAFETY: a mapping of this test's own.
    unsafe { munmap(p.cast::<c_void>(), n * PAGE) }.unwrap();
}

fn bytes(p: *const u8, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    // SAFETY: `p..p+n` is mapped and readable (the caller's own page); a raw copy.
    unsafe { ptr::copy_nonoverlapping(p, v.as_mut_ptr(), n) };
    v
}

/// Serializes the tests of this file. They unmap pages and expect the hole to stay a hole
/// until they look at it, but any mapping made meanwhile in this process (another test's
/// buffers, the rings of a new QP, the in-process daemon's) may land in it. Each test also
/// makes every mapping it needs (QPs included) before it unmaps anything.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// An RC QP of `a` connected to one of `b`, each on its own CQ.
struct Link<'c> {
    qa: Qp<'c>,
    _qb: Qp<'c>,
    cqa: &'c Cq<'c>,
}

fn link<'c>(
    a: (&'c Context, &'c Pd<'c>, &'c Cq<'c>),
    b: (&'c Context, &'c Pd<'c>, &'c Cq<'c>),
) -> Link<'c> {
    let qa =
        a.0.create_qp(&QpInit::new(QpType::Rc, a.1).cqs(a.2, a.2).cap(cap()))
            .unwrap();
    let qb =
        b.0.create_qp(&QpInit::new(QpType::Rc, b.1).cqs(b.2, b.2).cap(cap()))
            .unwrap();
    connect(&qa, b.0.query_gid(1, 0).unwrap(), qb.qpn());
    connect(&qb, a.0.query_gid(1, 0).unwrap(), qa.qpn());
    Link {
        qa,
        _qb: qb,
        cqa: a.2,
    }
}

impl Link<'_> {
    /// Posts one work request on `qa` and returns its completion status.
    fn run(&self, op: SendOp, sge: &[Sge]) -> WcStatus {
        self.qa.post_send(&SendRequest::new(7, op, sge)).unwrap();
        let wc = self.cqa.wait(1, WAIT).unwrap();
        wc[0].status
    }
}

#[test]
fn the_device_reports_odp_for_rc_ud_and_xrc_with_implicit() {
    let _serial = serial();
    let (d, _dir) = daemon("odpcaps", None);
    let ctx = Context::open_at(&d.socket, 0).unwrap();
    let c = ctx.odp_caps().unwrap();
    assert_eq!(
        c.general_caps, 0b11,
        "IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT"
    );
    // SEND RECV WRITE READ ATOMIC SRQ_RECV.
    assert_eq!(c.rc, 0x3f);
    assert_eq!(c.xrc, 0x3f);
    // SEND RECV SRQ_RECV: UD has no RDMA.
    assert_eq!(c.ud, 0x23);
}

/// The implicit MR's rkey reaches a page the target mapped only after registering it, and its
/// lkey serves a local buffer mapped after registration too.
#[test]
fn an_rdma_write_lands_in_memory_mapped_after_the_implicit_mr() {
    let _serial = serial();
    let (d, _dir) = daemon("odpimplicit", None);
    let (ct, ci) = (
        Context::open_at(&d.socket, 0).unwrap(),
        Context::open_at(&d.socket, 0).unwrap(),
    );
    let (pt, pi) = (ct.alloc_pd().unwrap(), ci.alloc_pd().unwrap());
    let (cqt, cqi) = (ct.create_cq(8).unwrap(), ci.create_cq(8).unwrap());
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let target = pt.reg_mr_on_demand(whole_space(), all).unwrap();
    let local = pi
        .reg_mr_on_demand(whole_space(), Access::LOCAL_WRITE)
        .unwrap();
    let l = link((&ci, &pi, &cqi), (&ct, &pt, &cqt));

    // Mapped after both registrations.
    let dst = map_pages(1, 0);
    let src = map_pages(1, 0xa7);
    let sge = [Sge {
        addr: src as u64,
        length: PAGE as u32,
        lkey: local.lkey(),
    }];
    let write = SendOp::Write {
        remote_addr: dst as u64,
        rkey: target.rkey(),
    };
    assert_eq!(l.run(write, &sge), WcStatus::Success);
    assert_eq!(
        bytes(dst, PAGE),
        vec![0xa7; PAGE],
        "the WRITE reached the new page"
    );
    unmap(dst, 1);
    unmap(src, 1);
}

/// A READ of a page unmapped after registration is the NIC's remote access error; the daemon
/// goes on serving another client, and a page mapped again at the address is what the next
/// READ returns.
#[test]
fn a_read_of_an_unmapped_page_is_a_remote_access_error_and_a_remap_is_seen() {
    let _serial = serial();
    let (d, _dir) = daemon("odpunmap", None);
    let (ct, ci) = (
        Context::open_at(&d.socket, 0).unwrap(),
        Context::open_at(&d.socket, 0).unwrap(),
    );
    let (pt, pi) = (ct.alloc_pd().unwrap(), ci.alloc_pd().unwrap());
    let (cqt, cqi) = (ct.create_cq(8).unwrap(), ci.create_cq(8).unwrap());
    let pages = map_pages(2, 0x11);
    let target = pt
        .reg_mr_on_demand(
            raw(pages as u64, 2 * PAGE as u64),
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
        )
        .unwrap();
    let mut buf = vec![0u8; PAGE];
    let local = pi
        .reg_mr(
            raw(buf.as_mut_ptr() as u64, PAGE as u64),
            Access::LOCAL_WRITE,
        )
        .unwrap();
    let sge = [Sge {
        addr: buf.as_mut_ptr() as u64,
        length: PAGE as u32,
        lkey: local.lkey(),
    }];
    // SAFETY: the second page of the mapping made above.
    let second = unsafe { pages.add(PAGE) };
    let read = |at: *mut u8| SendOp::Read {
        remote_addr: at as u64,
        rkey: target.rkey(),
    };

    // Every QP (and so every ring mapping) is made before the page is unmapped.
    let l1 = link((&ci, &pi, &cqi), (&ct, &pt, &cqt));
    let l2 = link((&ci, &pi, &cqi), (&ct, &pt, &cqt));
    let l3 = link((&ci, &pi, &cqi), (&ct, &pt, &cqt));
    // Another client of the same daemon, to show it unharmed.
    let (co, co2) = (
        Context::open_at(&d.socket, 0).unwrap(),
        Context::open_at(&d.socket, 0).unwrap(),
    );
    let (po, po2) = (co.alloc_pd().unwrap(), co2.alloc_pd().unwrap());
    let (cqo, cqo2) = (co.create_cq(8).unwrap(), co2.create_cq(8).unwrap());
    let mut theirs = vec![0x5eu8; 64];
    let mut mine = vec![0u8; 64];
    let mt = po2
        .reg_mr(
            raw(theirs.as_mut_ptr() as u64, 64),
            Access::LOCAL_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let mm = po
        .reg_mr(raw(mine.as_mut_ptr() as u64, 64), Access::LOCAL_WRITE)
        .unwrap();
    let lo = link((&co, &po, &cqo), (&co2, &po2, &cqo2));

    assert_eq!(l1.run(read(second), &sge), WcStatus::Success);
    assert_eq!(buf, vec![0x11; PAGE]);

    unmap(second, 1);
    buf.fill(0);
    assert_eq!(l1.run(read(second), &sge), WcStatus::RemAccessErr);
    let write = SendOp::Write {
        remote_addr: second as u64,
        rkey: target.rkey(),
    };
    assert_eq!(l2.run(write, &sge), WcStatus::RemAccessErr, "a WRITE too");

    // The other client is unharmed.
    let s = [Sge {
        addr: mine.as_mut_ptr() as u64,
        length: 64,
        lkey: mm.lkey(),
    }];
    let op = SendOp::Read {
        remote_addr: theirs.as_mut_ptr() as u64,
        rkey: mt.rkey(),
    };
    assert_eq!(lo.run(op, &s), WcStatus::Success);
    assert_eq!(mine, theirs);

    // Mapped again, with other contents: the next READ sees the new page.
    map_page_at(second, 0x22);
    assert_eq!(l3.run(read(second), &sge), WcStatus::Success);
    assert_eq!(buf, vec![0x22; PAGE], "the remapped page");
    assert_eq!(l3.run(read(pages), &sge), WcStatus::Success);
    assert_eq!(buf, vec![0x11; PAGE], "the first page never changed");
    unmap(pages, 2);
}

/// An ODP MR needs nothing mapped at registration (a pinned one over the same range is
/// EFAULT); a local access that finds nothing mapped is LOC_PROT_ERR.
#[test]
fn odp_registration_over_unmapped_memory_and_local_faults() {
    let _serial = serial();
    let (d, _dir) = daemon("odphole", None);
    let ctx = Context::open_at(&d.socket, 0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8).unwrap();
    assert_eq!(
        pd.reg_mr(raw(HOLE, PAGE as u64), Access::LOCAL_WRITE)
            .unwrap_err()
            .errno(),
        EFAULT,
        "a pinned MR over a hole"
    );
    let hole = pd
        .reg_mr_on_demand(raw(HOLE, PAGE as u64), Access::LOCAL_WRITE)
        .expect("an ODP MR over a hole");
    // The implicit form needs ON_DEMAND (EINVAL, as the kernel), and keeps it across a
    // rereg_mr that gives no new range (EOPNOTSUPP, as mlx5).
    assert_eq!(
        pd.reg_mr(whole_space(), Access::LOCAL_WRITE)
            .unwrap_err()
            .errno(),
        EINVAL
    );
    let mut implicit = pd
        .reg_mr_on_demand(whole_space(), Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    assert_eq!(
        implicit
            .rereg(None, Some(Access::LOCAL_WRITE), None)
            .unwrap_err()
            .errno(),
        EOPNOTSUPP
    );
    implicit
        .rereg(None, Some(Access::LOCAL_WRITE | Access::ON_DEMAND), None)
        .expect("new access, still on demand");

    let mut dst = vec![0u8; 64];
    let mdst = pd
        .reg_mr(
            raw(dst.as_mut_ptr() as u64, 64),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap();
    let l = link((&ctx, &pd, &cq), (&ctx, &pd, &cq));
    let from_hole = [Sge {
        addr: HOLE,
        length: 64,
        lkey: hole.lkey(),
    }];
    let write = SendOp::Write {
        remote_addr: dst.as_mut_ptr() as u64,
        rkey: mdst.rkey(),
    };
    assert_eq!(l.run(write, &from_hole), WcStatus::LocProtErr);
}

/// A shared MR's memfd mapping (a pinned copy of the pages) does not stand in for an ODP
/// access: after the program maps other memory over the range, the implicit MR reaches the
/// new memory while the shared MR still reaches the pages it pinned, as a NIC's would.
#[test]
fn an_odp_access_bypasses_a_shared_mapping_of_the_same_address() {
    let _serial = serial();
    let (d, _dir) = daemon("odpshared", None);
    // The engine's reach into a shared MR (its memfd mapping) is what is checked; the
    // direct path reaches a peer's memory as it is mapped now (docs/design/direct-path.md).
    let ctx = Context::open_at_direct(&d.socket, 0, false).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8).unwrap();
    let page = map_pages(1, 0x33);
    // SAFETY: the test's own page, which no other thread touches during the conversion.
    let shareable = unsafe { softverbs::RawMemory::new_shareable(page as usize, PAGE) };
    let shared = pd
        .reg_mr_shared(shareable, Access::LOCAL_WRITE | Access::REMOTE_READ)
        .unwrap();
    let implicit = pd
        .reg_mr_on_demand(whole_space(), Access::LOCAL_WRITE | Access::REMOTE_READ)
        .unwrap();
    unmap(page, 1);
    map_page_at(page, 0x44);

    let mut buf = vec![0u8; PAGE];
    let local = pd
        .reg_mr(
            raw(buf.as_mut_ptr() as u64, PAGE as u64),
            Access::LOCAL_WRITE,
        )
        .unwrap();
    let sge = [Sge {
        addr: buf.as_mut_ptr() as u64,
        length: PAGE as u32,
        lkey: local.lkey(),
    }];
    let l = link((&ctx, &pd, &cq), (&ctx, &pd, &cq));
    let read = |rkey| SendOp::Read {
        remote_addr: page as u64,
        rkey,
    };
    assert_eq!(l.run(read(implicit.rkey()), &sge), WcStatus::Success);
    assert_eq!(buf, vec![0x44; PAGE], "the ODP MR sees the page mapped now");
    assert_eq!(l.run(read(shared.rkey()), &sge), WcStatus::Success);
    assert_eq!(
        buf,
        vec![0x33; PAGE],
        "the shared MR keeps its pinned pages"
    );
    unmap(page, 1);
}

#[test]
fn advise_mr_prefetches_and_answers_the_kernels_errnos() {
    let _serial = serial();
    let (d, _dir) = daemon("odpadvise", None);
    let ctx = Context::open_at(&d.socket, 0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let other_pd = ctx.alloc_pd().unwrap();
    let pages = map_pages(2, 0);
    let odp = pd
        .reg_mr_on_demand(raw(pages as u64, 2 * PAGE as u64), Access::LOCAL_WRITE)
        .unwrap();
    let odp_ro = pd
        .reg_mr_on_demand(raw(pages as u64, 2 * PAGE as u64), Access::EMPTY)
        .unwrap();
    let pinned = pd
        .reg_mr(raw(pages as u64, 2 * PAGE as u64), Access::LOCAL_WRITE)
        .unwrap();
    let sge = |lkey, addr: *mut u8, len: usize| Sge {
        addr: addr as u64,
        length: len as u32,
        lkey,
    };
    let all = [sge(odp.lkey(), pages, 2 * PAGE)];
    let errno = |r: softverbs::Result<()>| r.map_err(|e| e.errno()).err();
    for advice in [
        Advice::Prefetch,
        Advice::PrefetchWrite,
        Advice::PrefetchNoFault,
    ] {
        for flags in [0, ADVISE_MR_FLAG_FLUSH] {
            assert_eq!(errno(pd.advise_mr(advice, flags, &all)), None, "{advice:?}");
        }
    }
    let f = ADVISE_MR_FLAG_FLUSH;
    assert_eq!(errno(pd.advise_mr(Advice::Prefetch, f, &[])), Some(EINVAL));
    assert_eq!(errno(pd.advise_mr(Advice::Prefetch, 2, &all)), Some(EINVAL));
    assert_eq!(errno(pd.advise_mr_raw(3, f, &all)), Some(EOPNOTSUPP));
    let bad = [sge(0xdead_beef, pages, PAGE)];
    assert_eq!(errno(pd.advise_mr(Advice::Prefetch, f, &bad)), Some(ENOENT));
    let not_odp = [sge(pinned.lkey(), pages, PAGE)];
    assert_eq!(
        errno(pd.advise_mr(Advice::Prefetch, f, &not_odp)),
        Some(ENOENT)
    );
    assert_eq!(
        errno(other_pd.advise_mr(Advice::Prefetch, f, &all)),
        Some(ENOENT)
    );
    let ro = [sge(odp_ro.lkey(), pages, PAGE)];
    assert_eq!(
        errno(pd.advise_mr(Advice::PrefetchWrite, f, &ro)),
        Some(ENOENT)
    );
    assert_eq!(errno(pd.advise_mr(Advice::Prefetch, f, &ro)), None);
    // SAFETY: one byte past the MR's last page: outside the range (never dereferenced).
    let past = [sge(odp.lkey(), unsafe { pages.add(PAGE) }, PAGE + 1)];
    assert_eq!(
        errno(pd.advise_mr(Advice::Prefetch, f, &past)),
        Some(EFAULT)
    );
    assert_eq!(
        errno(pd.advise_mr(Advice::Prefetch, 0, &past)),
        None,
        "async"
    );

    // The second page made read-only, then unmapped: a write prefetch, then any prefetch,
    // faults with FLUSH; without it the advice is best-effort.
    // SAFETY: the second page of the test's own mapping.
    let second = unsafe { pages.add(PAGE) };
    // SAFETY: changes the protection of the test's own page.
    unsafe { mprotect(second.cast(), PAGE, MprotectFlags::READ) }.unwrap();
    assert_eq!(
        errno(pd.advise_mr(Advice::PrefetchWrite, f, &all)),
        Some(EFAULT)
    );
    assert_eq!(errno(pd.advise_mr(Advice::Prefetch, f, &all)), None);
    unmap(second, 1);
    assert_eq!(errno(pd.advise_mr(Advice::Prefetch, f, &all)), Some(EFAULT));
    assert_eq!(errno(pd.advise_mr(Advice::Prefetch, 0, &all)), None);
    assert_eq!(errno(pd.advise_mr(Advice::PrefetchNoFault, f, &all)), None);
    unmap(pages, 1);
}

/// An ODP MR pins nothing, so the `registered-bytes` quota (which counts pinned bytes, as
/// `RLIMIT_MEMLOCK` does) does not hold it back, while a pinned MR of the same range is
/// refused (docs/guide/limits.md).
#[test]
fn odp_mrs_do_not_count_against_registered_bytes() {
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("svodp-{}-limit", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = Config::new(dir.join("sv.sock"));
    c.limits.apply("context.registered-bytes=8K").unwrap();
    let d = spawn_daemon_with(c).unwrap();
    let ctx = Context::open_at(&d.socket, 0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let pages = map_pages(4, 0);
    let range = raw(pages as u64, 4 * PAGE as u64);
    let e = pd.reg_mr(range, Access::LOCAL_WRITE).unwrap_err();
    assert_eq!(e.errno(), 12, "16 KiB pinned over an 8 KiB quota: ENOMEM");
    let _odp = pd.reg_mr_on_demand(range, Access::LOCAL_WRITE).unwrap();
    let _implicit = pd
        .reg_mr_on_demand(whole_space(), Access::LOCAL_WRITE)
        .unwrap();
    // The quota is still all there for pinned memory.
    let _pinned = pd
        .reg_mr(raw(pages as u64, 2 * PAGE as u64), Access::LOCAL_WRITE)
        .unwrap();
    drop(d);
    unmap(pages, 4);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A SEND into a receive buffer of an ODP MR whose page was unmapped: the receive completes
/// with `LOC_PROT_ERR` and the sender gets `REM_OP_ERR` (a remote operational error NAK),
/// as for any receive buffer the responder cannot write.
#[test]
fn a_send_into_an_unmapped_odp_receive_buffer_fails_on_both_sides() {
    let _serial = serial();
    let (d, _dir) = daemon("odprecv", None);
    let (cs, cr) = (
        Context::open_at(&d.socket, 0).unwrap(),
        Context::open_at(&d.socket, 0).unwrap(),
    );
    let (ps, pr) = (cs.alloc_pd().unwrap(), cr.alloc_pd().unwrap());
    let (cqs, cqr) = (cs.create_cq(8).unwrap(), cr.create_cq(8).unwrap());
    let page = map_pages(1, 0);
    let recv_mr = pr
        .reg_mr_on_demand(raw(page as u64, PAGE as u64), Access::LOCAL_WRITE)
        .unwrap();
    let mut src = vec![0x77u8; 64];
    let send_mr = ps
        .reg_mr(raw(src.as_mut_ptr() as u64, 64), Access::LOCAL_WRITE)
        .unwrap();
    let qr = cr
        .create_qp(&QpInit::new(QpType::Rc, &pr).cqs(&cqr, &cqr).cap(cap()))
        .unwrap();
    let l = {
        let qs = cs
            .create_qp(&QpInit::new(QpType::Rc, &ps).cqs(&cqs, &cqs).cap(cap()))
            .unwrap();
        connect(&qs, cr.query_gid(1, 0).unwrap(), qr.qpn());
        connect(&qr, cs.query_gid(1, 0).unwrap(), qs.qpn());
        qs
    };
    unmap(page, 1);
    qr.post_recv(
        1,
        &[Sge {
            addr: page as u64,
            length: 64,
            lkey: recv_mr.lkey(),
        }],
    )
    .unwrap();
    let sge = [Sge {
        addr: src.as_mut_ptr() as u64,
        length: 64,
        lkey: send_mr.lkey(),
    }];
    l.post_send(&SendRequest::new(2, SendOp::Send, &sge))
        .unwrap();
    assert_eq!(cqr.wait(1, WAIT).unwrap()[0].status, WcStatus::LocProtErr);
    assert_eq!(cqs.wait(1, WAIT).unwrap()[0].status, WcStatus::RemOpErr);
}

/// A small SEND (one the direct path would carry inline) from a local buffer of an ODP MR
/// whose page was unmapped: the sender's completion is `LOC_PROT_ERR`, as a local access
/// that finds nothing mapped is on the engine, and the process is not killed by the copy.
#[test]
fn a_small_send_from_an_unmapped_odp_buffer_is_a_local_protection_error() {
    let _serial = serial();
    let (d, _dir) = daemon("odpsend", None);
    let (cs, cr) = (
        Context::open_at(&d.socket, 0).unwrap(),
        Context::open_at(&d.socket, 0).unwrap(),
    );
    let (ps, pr) = (cs.alloc_pd().unwrap(), cr.alloc_pd().unwrap());
    let (cqs, cqr) = (cs.create_cq(8).unwrap(), cr.create_cq(8).unwrap());
    let page = map_pages(1, 0x55);
    let send_mr = ps
        .reg_mr_on_demand(raw(page as u64, PAGE as u64), Access::LOCAL_WRITE)
        .unwrap();
    let mut dst = vec![0u8; 64];
    let recv_mr = pr
        .reg_mr(raw(dst.as_mut_ptr() as u64, 64), Access::LOCAL_WRITE)
        .unwrap();
    let qr = cr
        .create_qp(&QpInit::new(QpType::Rc, &pr).cqs(&cqr, &cqr).cap(cap()))
        .unwrap();
    let qs = cs
        .create_qp(&QpInit::new(QpType::Rc, &ps).cqs(&cqs, &cqs).cap(cap()))
        .unwrap();
    connect(&qs, cr.query_gid(1, 0).unwrap(), qr.qpn());
    connect(&qr, cs.query_gid(1, 0).unwrap(), qs.qpn());
    unmap(page, 1);
    qr.post_recv(
        1,
        &[Sge {
            addr: dst.as_mut_ptr() as u64,
            length: 64,
            lkey: recv_mr.lkey(),
        }],
    )
    .unwrap();
    let sge = [Sge {
        addr: page as u64,
        length: 16,
        lkey: send_mr.lkey(),
    }];
    qs.post_send(&SendRequest::new(2, SendOp::Send, &sge))
        .unwrap();
    assert_eq!(cqs.wait(1, WAIT).unwrap()[0].status, WcStatus::LocProtErr);
    assert_eq!(dst, vec![0u8; 64], "nothing reached the receive buffer");
}
