//! Registering pages the program cannot write, or has not mapped: as on a device, where
//! `ib_umem_get` pins with `FOLL_WRITE` when the access flags let the MR be written,
//! `ibv_reg_mr` fails with `EFAULT` for write access over read-only pages and for any access
//! over unmapped ones; read-only access over read-only pages works (docs/design/registered-memory.md,
//! "Writes to read-only pages").
//!
//! Stays on the raw API (`RawMemory`, `reg_mr`, raw SGEs): the test registers pages it
//! mapped read-only or not at all, and `mprotect`s or unmaps them under a registration,
//! which the owning API (memory it allocates or borrows as writable) cannot express.

use std::ffi::c_void;
use std::ptr;
use std::time::Duration;

use rustix::mm::{mmap_anonymous, mprotect, munmap, MapFlags, MprotectFlags, ProtFlags};
use softverbs::{Access, Context, QpCap, QpInit, QpType};
use softverbs::{SendOp, SendRequest, Sge, WcStatus};
use softverbs_daemon::{spawn_daemon_with, Config, TestDaemon};

mod common;
use common::connect;

const EFAULT: i32 = 14;
const PAGE: usize = 4096;

/// Names a test page for the raw registration these tests exercise (the drop-in's path): the
/// pages are the test's own mappings, unmapped only after their MRs are gone, and read only
/// after the completions of the requests that could write them.
fn raw(addr: u64, len: u64) -> softverbs::RawMemory {
    // SAFETY: see above; where a test names an address that is not mapped, it probes that the
    // daemon refuses the registration, so no access ever happens through it.
    unsafe { softverbs::RawMemory::new(addr as usize, len as usize) }
}

struct Dir(std::path::PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn daemon(name: &str) -> (TestDaemon, Dir) {
    let dir = std::env::temp_dir().join(format!("svro-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let c = Config::new(dir.join("sv.sock"));
    (spawn_daemon_with(c).unwrap(), Dir(dir))
}

/// `PAGE` bytes of private anonymous memory holding `fill`, then made read-only.
struct ReadOnlyPage(*mut u8);

impl ReadOnlyPage {
    fn new(fill: u8) -> Self {
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing replaces
        // nothing; only this value refers to it.
        let p = unsafe {
            mmap_anonymous(
                ptr::null_mut(),
                PAGE,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }
        .unwrap()
        .cast::<u8>();
        // SAFETY: `p..p+PAGE` is the writable mapping just made.
        unsafe { ptr::write_bytes(p, fill, PAGE) };
        // SAFETY: changes the protection of our own mapping only.
        unsafe { mprotect(p.cast(), PAGE, MprotectFlags::READ) }.unwrap();
        Self(p)
    }
    fn addr(&self) -> u64 {
        self.0 as u64
    }
    fn bytes(&self) -> Vec<u8> {
        let mut v = vec![0u8; PAGE];
        // SAFETY: the mapping is readable and lives as long as `self`; raw copy, no
        // reference into it is made.
        unsafe { ptr::copy_nonoverlapping(self.0, v.as_mut_ptr(), PAGE) };
        v
    }
}

impl Drop for ReadOnlyPage {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made.
        let _ = unsafe { munmap(self.0.cast::<c_void>(), PAGE) };
    }
}

/// A page that is never mapped: below `vm.mmap_min_addr` (65536 by default), where no
/// process without `CAP_SYS_RAWIO` can map anything, so no other test thread can either.
const HOLE: u64 = 0x1000;

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

#[test]
fn write_access_over_read_only_pages_is_efault_read_access_works() {
    let (d, _dir) = daemon("flags");
    let ctx = Context::open_at(&d.socket, 0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let ro = ReadOnlyPage::new(0x5a);
    for access in [
        Access::LOCAL_WRITE,
        Access::REMOTE_WRITE | Access::LOCAL_WRITE,
        Access::REMOTE_ATOMIC | Access::LOCAL_WRITE,
        Access::MW_BIND,
    ] {
        let e = pd.reg_mr(raw(ro.addr(), PAGE as u64), access).unwrap_err();
        assert_eq!(e.errno(), EFAULT, "{access:?} over a PROT_READ page: {e}");
    }
    pd.reg_mr(raw(ro.addr(), PAGE as u64), Access::EMPTY)
        .expect("no write access over a PROT_READ page");
    pd.reg_mr(raw(ro.addr() + 100, 200), Access::REMOTE_READ)
        .expect("remote read over a PROT_READ page");
}

#[test]
fn any_access_over_unmapped_pages_is_efault() {
    let (d, _dir) = daemon("unmapped");
    let ctx = Context::open_at(&d.socket, 0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let hole = HOLE;
    for access in [Access::EMPTY, Access::REMOTE_READ, Access::LOCAL_WRITE] {
        let e = pd.reg_mr(raw(hole, PAGE as u64), access).unwrap_err();
        assert_eq!(e.errno(), EFAULT, "{access:?} over an unmapped page: {e}");
    }
    // Readable at the start, not at the end (`PROT_NONE`, which pins no better than a hole).
    // SAFETY: a fresh two-page mapping of the kernel's choosing, its second page made
    // inaccessible; nothing refers to it but this test, which unmaps it at the end.
    let p = unsafe {
        let p = mmap_anonymous(
            ptr::null_mut(),
            2 * PAGE,
            ProtFlags::READ,
            MapFlags::PRIVATE,
        )
        .unwrap();
        mprotect(
            p.cast::<u8>().add(PAGE).cast(),
            PAGE,
            MprotectFlags::empty(),
        )
        .unwrap();
        p
    };
    let e = pd
        .reg_mr(raw(p as u64, 2 * PAGE as u64), Access::REMOTE_READ)
        .unwrap_err();
    assert_eq!(e.errno(), EFAULT, "a range running into a PROT_NONE page");
    pd.reg_mr(raw(p as u64, PAGE as u64), Access::REMOTE_READ)
        .expect("the readable page alone");
    // SAFETY: the mapping made above, only ours.
    unsafe { munmap(p, 2 * PAGE) }.unwrap();
}

#[test]
fn rereg_to_write_access_or_onto_unwritable_pages_is_efault() {
    let (d, _dir) = daemon("rereg");
    let ctx = Context::open_at(&d.socket, 0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let ro = ReadOnlyPage::new(3);
    let mut mr = pd
        .reg_mr(raw(ro.addr(), PAGE as u64), Access::REMOTE_READ)
        .unwrap();
    let e = mr
        .rereg(None, Some(Access::LOCAL_WRITE | Access::REMOTE_WRITE), None)
        .unwrap_err();
    assert_eq!(e.errno(), EFAULT, "new write access over a PROT_READ page");
    let rw = vec![0u8; PAGE];
    let mut mw = pd
        .reg_mr(raw(rw.as_ptr() as u64, PAGE as u64), Access::LOCAL_WRITE)
        .unwrap();
    let e = mw
        .rereg(None, None, Some((raw(ro.addr(), PAGE as u64), ro.addr())))
        .unwrap_err();
    assert_eq!(e.errno(), EFAULT, "new translation onto a PROT_READ page");
    let hole = HOLE;
    let e = mr
        .rereg(None, None, Some((raw(hole, PAGE as u64), hole)))
        .unwrap_err();
    assert_eq!(e.errno(), EFAULT, "new translation onto an unmapped page");
    // Both MRs are as they were: the failed rereg changed nothing.
    mr.rereg(None, Some(Access::EMPTY), None).unwrap();
}

/// RDMA READ of a read-only registration returns the page; an RDMA WRITE with whatever
/// key the page could be registered under never changes it.
#[test]
fn rdma_read_of_a_read_only_page_works_and_a_write_never_changes_it() {
    let (d, _dir) = daemon("rdma");
    let ctx = Context::open_at(&d.socket, 0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8).unwrap();
    let init = QpInit::new(QpType::Rc, &pd).cqs(&cq, &cq).cap(cap());
    let (qa, qb) = (ctx.create_qp(&init).unwrap(), ctx.create_qp(&init).unwrap());
    let g = ctx.query_gid(1, 0).unwrap();
    connect(&qa, g, qb.qpn());
    connect(&qb, g, qa.qpn());

    let ro = ReadOnlyPage::new(0xc3);
    let before = ro.bytes();
    // The strongest registration the daemon grants over the page.
    let target = pd
        .reg_mr(
            raw(ro.addr(), PAGE as u64),
            Access::REMOTE_WRITE | Access::REMOTE_READ | Access::LOCAL_WRITE,
        )
        .or_else(|_| pd.reg_mr(raw(ro.addr(), PAGE as u64), Access::REMOTE_READ))
        .unwrap();

    let mut local = vec![0u8; PAGE];
    let local_addr = local.as_mut_ptr() as u64;
    let ml = pd
        .reg_mr(raw(local_addr, PAGE as u64), Access::LOCAL_WRITE)
        .unwrap();
    let sge = [Sge {
        addr: local_addr,
        length: PAGE as u32,
        lkey: ml.lkey(),
    }];
    qa.post_send(&SendRequest::new(
        1,
        SendOp::Read {
            remote_addr: ro.addr(),
            rkey: target.rkey(),
        },
        &sge,
    ))
    .unwrap();
    let wc = cq.wait(1, Duration::from_secs(20)).unwrap();
    assert_eq!(wc[0].status, WcStatus::Success, "{wc:?}");
    assert!(local == before, "RDMA READ returned the read-only page");

    local.fill(0x11);
    qa.post_send(&SendRequest::new(
        2,
        SendOp::Write {
            remote_addr: ro.addr(),
            rkey: target.rkey(),
        },
        &sge,
    ))
    .unwrap();
    let wc = cq.wait(1, Duration::from_secs(20)).unwrap();
    assert_eq!(
        ro.bytes(),
        before,
        "a remote WRITE changed a read-only page ({wc:?})"
    );
    assert_ne!(wc[0].status, WcStatus::Success, "{wc:?}");
}
