//! ProcessVm and SharedMappings against real child processes.

mod common;

use std::sync::atomic::Ordering;

use common::{pattern, ChildProc, PageBuf};
use softverbs_core::ids::CtxId;
use softverbs_core::memory::{AtomicOp, Fault, Memory};
use softverbs_memaccess::{
    page_size, share_in_place, unshare_in_place, Converted, NoFallback, ProcessVm, RegionError,
    ShareError, SharedMappings,
};

const CTX: CtxId = CtxId(7);

/// Not a test: the entry point of the child role (does nothing in a normal run).
#[test]
fn child_role() {
    common::run_child_if_requested();
}

fn spawn(role: &str, len: usize) -> ChildProc {
    ChildProc::spawn(
        role,
        len,
        &["child_role", "--exact", "--nocapture", "--test-threads=1"],
    )
}

fn expected(off: usize, n: usize) -> Vec<u8> {
    (off..off + n).map(pattern).collect()
}

#[test]
fn process_vm_reads_and_writes_a_child() {
    let len = 3 * page_size() + 100;
    let mut child = spawn("plain", len);
    let mut pv = ProcessVm::new();
    pv.register_process(CTX, child.pid);
    assert_eq!(pv.pid(CTX), Some(child.pid));

    // Reads, including one spanning pages and the whole buffer.
    let mut b = vec![0; 8];
    pv.read(CTX, child.addr + 5, &mut b).unwrap();
    assert_eq!(b, expected(5, 8));
    let mut all = vec![0; len];
    pv.read(CTX, child.addr, &mut all).unwrap();
    assert_eq!(all, expected(0, len));

    // Writes are seen by the child.
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    pv.write(CTX, child.addr + 1000, &data).unwrap();
    assert_eq!(child.get(1000, data.len()), data);

    // The child's writes are seen by the daemon.
    child.set(10, b"hello");
    let mut b = [0; 5];
    pv.read(CTX, child.addr + 10, &mut b).unwrap();
    assert_eq!(&b, b"hello");

    // Default read-modify-write atomics.
    child.set(64, &40u64.to_ne_bytes());
    let old = pv
        .atomic(CTX, child.addr + 64, AtomicOp::FetchAdd { add: 2 })
        .unwrap();
    assert_eq!(old, 40);
    let old = pv
        .atomic(
            CTX,
            child.addr + 64,
            AtomicOp::CompareSwap {
                compare: 42,
                swap: 9,
            },
        )
        .unwrap();
    assert_eq!(old, 42);
    assert_eq!(child.get(64, 8), 9u64.to_ne_bytes());

    // Empty accesses succeed.
    pv.read(CTX, child.addr, &mut []).unwrap();
}

#[test]
fn process_vm_faults() {
    let len = page_size();
    let child = spawn("plain", len);
    let mut pv = ProcessVm::new();
    let mut b = [0u8; 16];
    // Unknown context.
    assert_eq!(
        pv.read(CTX, child.addr, &mut b),
        Err(Fault {
            ctx: CTX,
            addr: child.addr
        })
    );
    pv.register_process(CTX, child.pid);
    // Unmapped address.
    assert_eq!(pv.read(CTX, 8, &mut b), Err(Fault { ctx: CTX, addr: 8 }));
    assert!(pv.write(CTX, 8, &b).is_err());
    // Address that does not fit / wraps.
    assert!(pv.read(CTX, u64::MAX - 3, &mut b).is_err());
    // Running past the end of the mapped heap eventually faults, reporting where.
    let mut big = vec![0u8; 256 << 20];
    let e = pv.read(CTX, child.addr, &mut big).unwrap_err();
    assert!(e.addr >= child.addr + len as u64, "{e:?}");
    // Gone process.
    let pid = child.pid;
    drop(child);
    pv.register_process(CTX, pid);
    assert!(pv.read(CTX, 0x10000, &mut b).is_err());
    assert_eq!(pv.unregister_process(CTX), Some(pid));
}

#[test]
fn shared_mappings_round_trip_with_a_child_that_shared_in_place() {
    let len = 2 * page_size() + 300;
    let mut child = spawn("shared", len);
    let fd = child.open_memfd();
    let mut shm = SharedMappings::new();
    // Register a sub-range that starts and ends inside a page.
    let start = child.addr + 100;
    let rlen = len as u64 - 150;
    let id = shm.add_region(CTX, start, rlen, &fd).unwrap();
    drop(fd); // The mapping keeps the file alive.
    assert_eq!(shm.region_count(), 1);

    // Contents survived the conversion and are visible to the daemon.
    let mut all = vec![0; rlen as usize];
    shm.read(CTX, start, &mut all).unwrap();
    assert_eq!(all, expected(100, rlen as usize));
    assert_eq!(child.get(0, len), expected(0, len));

    // Daemon writes → child sees them; child writes → daemon sees them.
    let data: Vec<u8> = (0..3000u32).map(|i| (i ^ 0x5a) as u8).collect();
    shm.write(CTX, start + 17, &data).unwrap();
    assert_eq!(child.get(117, data.len()), data);
    child.set(2000, b"from the client");
    let mut b = [0; 15];
    shm.read(CTX, child.addr + 2000, &mut b).unwrap();
    assert_eq!(&b, b"from the client");

    // Bounds: the bytes before/after the registered range (same pages) and beyond fault.
    let mut one = [0u8; 1];
    assert_eq!(
        shm.read(CTX, start - 1, &mut one),
        Err(Fault {
            ctx: CTX,
            addr: start - 1
        })
    );
    assert!(shm.read(CTX, start + rlen, &mut one).is_err());
    assert!(shm.read(CTX, start + rlen - 4, &mut [0; 8]).is_err());
    shm.read(CTX, start + rlen - 8, &mut [0; 8]).unwrap();
    // Other context, unknown address.
    assert!(shm.read(CtxId(8), start, &mut one).is_err());
    assert!(shm.write(CTX, 0x1000, &one).is_err());

    // CPU atomics on the shared word.
    let word = (start + 7) & !7;
    child.set((word - child.addr) as usize, &5u64.to_ne_bytes());
    assert_eq!(shm.atomic(CTX, word, AtomicOp::FetchAdd { add: 10 }), Ok(5));
    assert_eq!(
        shm.atomic(
            CTX,
            word,
            AtomicOp::CompareSwap {
                compare: 15,
                swap: 99
            }
        ),
        Ok(15)
    );
    assert_eq!(
        shm.atomic(
            CTX,
            word,
            AtomicOp::CompareSwap {
                compare: 15,
                swap: 1
            }
        ),
        Ok(99)
    );
    assert_eq!(
        child.get((word - child.addr) as usize, 8),
        99u64.to_ne_bytes()
    );

    // After remove_region nothing reaches the memory any more.
    assert!(shm.remove_region(id));
    assert!(!shm.remove_region(id));
    assert_eq!(shm.region_count(), 0);
    assert!(shm.read(CTX, start, &mut one).is_err());
    assert!(shm.write(CTX, start, &one).is_err());
    assert!(shm
        .atomic(CTX, word, AtomicOp::FetchAdd { add: 1 })
        .is_err());
    // And the client still has its memory, unchanged by the removal.
    assert_eq!(
        child.get((word - child.addr) as usize, 8),
        99u64.to_ne_bytes()
    );
}

/// Reads the u64 at `addr` through `mem`.
fn load(mem: &mut impl Memory, addr: u64) -> u64 {
    let mut b = [0; 8];
    mem.read(CTX, addr, &mut b).unwrap();
    u64::from_ne_bytes(b)
}

#[test]
fn fetch_add_races_between_daemon_and_client() {
    let len = page_size();
    let mut child = spawn("shared", len);
    let fd = child.open_memfd();
    let mut shm = SharedMappings::new();
    shm.add_region(CTX, child.addr, len as u64, &fd).unwrap();
    shm.write(CTX, child.addr, &[0; 16]).unwrap();
    // The client increments with its CPU for as long as the daemon does FetchAdd through
    // the mapping (it starts first and stops when the daemon raises the flag word).
    child.start_add(0, 8);
    while load(&mut shm, child.addr) == 0 {
        std::hint::spin_loop();
    }
    const N: u64 = 200_000;
    for _ in 0..N {
        shm.atomic(CTX, child.addr, AtomicOp::FetchAdd { add: 1 })
            .unwrap();
    }
    shm.write(CTX, child.addr + 8, &1u64.to_ne_bytes()).unwrap();
    let theirs = child.finish_add();
    assert_eq!(load(&mut shm, child.addr), N + theirs);
}

#[test]
fn fetch_add_from_two_threads_in_process() {
    // Share our own buffer and reach it both ways at once: one thread as the client (CPU
    // atomics at the original address), one as the daemon (SharedMappings).
    let buf = PageBuf::new(page_size());
    let fd = share_in_place(buf.addr(), buf.len()).unwrap();
    let mut shm = SharedMappings::new();
    shm.add_region(CTX, buf.addr() as u64, buf.len() as u64, &fd)
        .unwrap();
    const N: u64 = 300_000;
    let addr = buf.addr() as u64 + 8;
    let theirs = std::thread::scope(|s| {
        let client = s.spawn(|| {
            let mut n = 0u64;
            while buf.atomic(16).load(Ordering::SeqCst) == 0 {
                buf.atomic(8).fetch_add(1, Ordering::SeqCst);
                n += 1;
            }
            n
        });
        while buf.atomic(8).load(Ordering::SeqCst) == 0 {
            std::hint::spin_loop();
        }
        for _ in 0..N {
            shm.atomic(CTX, addr, AtomicOp::FetchAdd { add: 1 })
                .unwrap();
        }
        buf.atomic(16).store(1, Ordering::SeqCst);
        client.join().unwrap()
    });
    assert_eq!(buf.atomic(8).load(Ordering::SeqCst), N + theirs);
    drop(shm);
    drop(fd);
    // The buffer is still ours and usable after the daemon side is gone.
    buf.set(0, 1);
    assert_eq!(buf.get(0), 1);
}

#[test]
fn layered_falls_back_to_process_vm() {
    let len = 2 * page_size();
    let mut shared = spawn("shared", len);
    let mut plain = spawn("plain", len);
    let fd = shared.open_memfd();
    let mut mem = SharedMappings::with_fallback(ProcessVm::new());
    let (a, b) = (CtxId(1), CtxId(2));
    mem.fallback_mut().register_process(a, shared.pid);
    mem.fallback_mut().register_process(b, plain.pid);
    // Only the first page of the shared child is a region.
    let id = mem
        .add_region(a, shared.addr, page_size() as u64, &fd)
        .unwrap();

    // Region, past the region (fallback), straddling (fallback), other process (fallback).
    let mut buf = vec![0; 64];
    mem.read(a, shared.addr + 8, &mut buf).unwrap();
    assert_eq!(buf, expected(8, 64));
    let p = page_size() as u64;
    mem.read(a, shared.addr + p + 8, &mut buf).unwrap();
    assert_eq!(buf, expected(p as usize + 8, 64));
    mem.read(a, shared.addr + p - 32, &mut buf).unwrap();
    assert_eq!(buf, expected(p as usize - 32, 64));
    mem.write(b, plain.addr + 3, b"fallback").unwrap();
    assert_eq!(plain.get(3, 8), b"fallback");
    mem.write(a, shared.addr + p + 1, b"xy").unwrap();
    assert_eq!(shared.get(p as usize + 1, 2), b"xy");
    // Atomic through the fallback (read-modify-write).
    plain.set(16, &1u64.to_ne_bytes());
    assert_eq!(
        mem.atomic(b, plain.addr + 16, AtomicOp::FetchAdd { add: 1 }),
        Ok(1)
    );
    assert_eq!(plain.get(16, 8), 2u64.to_ne_bytes());
    // Removing the region leaves the address to the fallback (the core's key check is what
    // forbids access after dereg_mr).
    assert!(mem.remove_region(id));
    mem.read(a, shared.addr + 8, &mut buf).unwrap();
    assert_eq!(mem.remove_context(a), 0);
}

#[test]
fn add_region_rejects_bad_files_and_ranges() {
    let buf = PageBuf::new(4 * page_size());
    let fd = share_in_place(buf.addr(), 2 * page_size()).unwrap();
    let mut shm = SharedMappings::new();
    let base = buf.addr() as u64;
    let p = page_size() as u64;
    assert!(matches!(
        shm.add_region(CTX, base, 0, &fd),
        Err(RegionError::BadRange)
    ));
    assert!(matches!(
        shm.add_region(CTX, u64::MAX - 10, 100, &fd),
        Err(RegionError::BadRange)
    ));
    // Larger than the file (share_in_place's own files have room to grow: a sealed memfd
    // of exactly two pages here).
    let two = rustix::fs::memfd_create(
        "two",
        rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
    )
    .unwrap();
    rustix::fs::ftruncate(&two, 2 * p).unwrap();
    rustix::fs::fcntl_add_seals(
        &two,
        rustix::fs::SealFlags::SHRINK | rustix::fs::SealFlags::GROW,
    )
    .unwrap();
    assert!(matches!(
        shm.add_region(CTX, base, 2 * p + 1, &two),
        Err(RegionError::TooSmall { .. })
    ));
    // Not sealed: a plain memfd, and a regular file.
    let unsealed = rustix::fs::memfd_create("x", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&unsealed, p).unwrap();
    assert!(matches!(
        shm.add_region(CTX, base, p, &unsealed),
        Err(RegionError::NotSealed)
    ));
    let file = std::fs::File::open("/proc/self/exe").unwrap();
    assert!(matches!(
        shm.add_region(CTX, base, p, &file),
        Err(RegionError::NotSealed)
    ));
    // Overlap within a context is refused, other contexts are independent.
    let id = shm.add_region(CTX, base + 10, p, &fd).unwrap();
    let e = shm.add_region(CTX, base + p, 10, &fd).unwrap_err();
    assert!(matches!(e, RegionError::Overlap(o) if o == id), "{e:?}");
    assert!(matches!(
        shm.add_region(CTX, base, 11, &fd),
        Err(RegionError::Overlap(_))
    ));
    shm.add_region(CTX, base, 10, &fd).unwrap(); // Adjacent below.
    shm.add_region(CTX, base + p + 10, 10, &fd).unwrap(); // Adjacent above.
    shm.add_region(CtxId(9), base, p, &fd).unwrap();
    assert_eq!(shm.region_count(), 4);
    assert_eq!(shm.remove_context(CTX), 3);
    assert_eq!(shm.region_count(), 1);
    let _: &NoFallback = shm.fallback();
}

#[test]
fn share_in_place_keeps_contents_and_refuses_other_memory() {
    let p = page_size();
    let buf = PageBuf::new(3 * p);
    for i in 0..buf.len() {
        buf.set(i, pattern(i));
    }
    // Unaligned range: the whole pages around it are converted.
    let fd = share_in_place(buf.addr() + p + 5, 10).unwrap();
    for i in 0..buf.len() {
        assert_eq!(buf.get(i), pattern(i));
    }
    let st = rustix::fs::fstat(&fd).unwrap();
    // The converted page, and room for the program to grow the mapping (realloc).
    assert!(st.st_size as usize >= p, "{}", st.st_size);
    let seals = rustix::fs::fcntl_get_seals(&fd).unwrap();
    assert!(seals.contains(rustix::fs::SealFlags::SHRINK | rustix::fs::SealFlags::GROW));
    // Writes through the memfd are visible at the original address and vice versa.
    rustix::io::pwrite(&fd, b"zz", 5).unwrap();
    assert_eq!((buf.get(p + 5), buf.get(p + 6)), (b'z', b'z'));
    buf.set(p + 7, b'!');
    let mut b = [0; 1];
    rustix::io::pread(&fd, &mut b, 7).unwrap();
    assert_eq!(b[0], b'!');
    // The converted page is now shared memory and cannot be converted again; nor can
    // unmapped, read-only or file-backed memory.
    assert!(matches!(
        share_in_place(buf.addr() + p, 1),
        Err(ShareError::Unsupported { .. })
    ));
    assert!(matches!(
        share_in_place(0x1000, 1),
        Err(ShareError::Unsupported { .. })
    ));
    static READ_ONLY: [u8; 16] = [0; 16];
    assert!(matches!(
        share_in_place(READ_ONLY.as_ptr() as usize, 1),
        Err(ShareError::Unsupported { .. })
    ));
    assert!(matches!(
        share_in_place(buf.addr(), 0),
        Err(ShareError::BadRange)
    ));
    assert!(matches!(
        share_in_place(usize::MAX - 5, 10),
        Err(ShareError::BadRange)
    ));
}

/// Memory that is `mlock`ed, `MADV_DONTFORK` or `MADV_WIPEONFORK` is not converted: a shared
/// mapping moved over it would lose the flag (docs/design/registered-memory.md, "What registration
/// must not change"); the same buffer without the flag is.
#[test]
fn share_in_place_leaves_locked_dontfork_and_wipeonfork_memory_alone() {
    use rustix::mm::Advice;
    let p = page_size();
    type SetFlag = fn(usize, usize);
    let flags: [(&str, SetFlag); 3] = [
        ("lo", |a, n| {
            // SAFETY: locks pages of a buffer this test owns; nothing else is affected.
            unsafe { rustix::mm::mlock(a as *mut std::ffi::c_void, n) }.unwrap()
        }),
        ("dc", |a, n| {
            // SAFETY: advice on pages of a buffer this test owns, which no child uses.
            unsafe { rustix::mm::madvise(a as *mut std::ffi::c_void, n, Advice::LinuxDontFork) }
                .unwrap()
        }),
        ("wf", |a, n| {
            // SAFETY: advice on pages of a buffer this test owns, which no child uses.
            unsafe { rustix::mm::madvise(a as *mut std::ffi::c_void, n, Advice::LinuxWipeOnFork) }
                .unwrap()
        }),
    ];
    for (flag, set) in flags {
        let buf = PageBuf::new(3 * p);
        set(buf.addr() + p, p);
        match share_in_place(buf.addr() + p, 10) {
            Err(ShareError::Unsupported { found, .. }) => {
                assert_eq!(found, format!("VmFlags {flag}"))
            }
            other => panic!("{flag}: {other:?}"),
        }
        // The neighbours have no flag: converted where write protection is available.
        match share_in_place(buf.addr(), 10) {
            Ok(_) | Err(ShareError::NoWriteProtection(_)) => {}
            other => panic!("{flag}, the page before: {other:?}"),
        }
    }
}

/// Another thread storing into the pages, and the kernel writing into them on a thread's
/// behalf (`pread(2)` into the buffer), while `share_in_place` converts them: no store is
/// lost, no `pread` fails with `EFAULT` (an `mprotect`-based guard would make it fail), and
/// every byte the kernel wrote is there afterwards. Skipped, with the reason, where
/// userfaultfd write-protection is unavailable (then nothing is converted at all).
#[test]
fn share_in_place_keeps_writes_of_other_threads_and_of_the_kernel() {
    let done = writes_survive(
        |buf| Ok((buf.addr(), buf.len())),
        |&(addr, len)| share_in_place(addr, len).map(|_fd| ()),
    );
    if let Some(n) = done {
        assert_eq!(n, ROUNDS);
    }
}

#[test]
fn unshare_in_place_keeps_writes_of_other_threads_and_of_the_kernel() {
    let done = writes_survive(
        |buf| {
            let fd = share_in_place(buf.addr(), buf.len())?;
            Ok(Converted::of(buf.addr(), buf.len(), &fd).unwrap())
        },
        unshare_in_place,
    );
    if let Some(n) = done {
        assert_eq!(n, ROUNDS);
    }
}

#[test]
fn unshare_in_place_makes_the_pages_private_with_their_bytes() {
    let p = page_size();
    let buf = PageBuf::new(3 * p);
    for i in 0..buf.len() {
        buf.set(i, pattern(i));
    }
    // An MR in the middle of the first and last page, as malloc would place it.
    let (addr, len) = (buf.addr() + 100, 2 * p);
    let fd = match share_in_place(addr, len) {
        Ok(fd) => fd,
        Err(ShareError::NoWriteProtection(e)) => {
            eprintln!("SKIP: userfaultfd write-protection unavailable here: {e}");
            return;
        }
        Err(e) => panic!("share_in_place: {e}"),
    };
    assert!(maps_line(buf.addr()).contains("memfd:softverbs-mr"));
    let c = Converted::of(addr, len, &fd).unwrap();
    drop(fd);
    buf.set(5, 0xEE);
    unshare_in_place(&c).unwrap();
    for at in [buf.addr(), buf.addr() + 2 * p] {
        let line = maps_line(at);
        let f: Vec<&str> = line.split_ascii_whitespace().collect();
        assert!(
            f[1] == "rw-p" && f[4] == "0" && f.len() == 5,
            "not private anonymous: {line}"
        );
    }
    for i in 0..buf.len() {
        let want = if i == 5 { 0xEE } else { pattern(i) };
        assert_eq!(buf.get(i), want, "byte {i}");
    }
    // A second unshare finds no memfd of ours there.
    assert!(matches!(
        unshare_in_place(&c),
        Err(ShareError::Unsupported { .. })
    ));
}

#[test]
fn unshare_in_place_leaves_memory_the_program_replaced() {
    let p = page_size();
    let buf = PageBuf::new(2 * p);
    buf.set(0, 7);
    let fd = match share_in_place(buf.addr(), buf.len()) {
        Ok(fd) => fd,
        Err(ShareError::NoWriteProtection(e)) => {
            eprintln!("SKIP: userfaultfd write-protection unavailable here: {e}");
            return;
        }
        Err(e) => panic!("share_in_place: {e}"),
    };
    let c = Converted::of(buf.addr(), buf.len(), &fd).unwrap();
    // The program maps other memory over the range (as after freeing a buffer before its
    // deregistration): that is the program's now, and must stay as it is.
    buf.replace_with_fresh_anonymous();
    buf.set(0, 9);
    assert!(matches!(
        unshare_in_place(&c),
        Err(ShareError::Unsupported { .. })
    ));
    assert_eq!(buf.get(0), 9);
    assert!(!maps_line(buf.addr()).contains("memfd:"));
}

/// Rounds of [`writes_survive`].
const ROUNDS: u64 = 60;

/// The `/proc/self/maps` line of the mapping holding `addr`.
fn maps_line(addr: usize) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .find(|l| {
            let (lo, hi) = l.split_once(' ').unwrap().0.split_once('-').unwrap();
            let lo = usize::from_str_radix(lo, 16).unwrap();
            let hi = usize::from_str_radix(hi, 16).unwrap();
            lo <= addr && addr < hi
        })
        .unwrap()
        .to_owned()
}

/// `ROUNDS` times: a fresh four-page buffer, `prepare` (not timed against writers), then
/// `remap` while one thread stores one word after another into pages 0..3 and another
/// `pread`s a file into page 3 over and over; afterwards no store and no kernel write may be
/// missing. `Some(rounds done)`, or `None` (with a SKIP message) where userfaultfd
/// write-protection is unavailable.
fn writes_survive<T>(
    prepare: impl Fn(&PageBuf) -> Result<T, ShareError>,
    remap: impl Fn(&T) -> Result<(), ShareError> + Sync,
) -> Option<u64>
where
    T: Sync,
{
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    let p = page_size();
    let words = 3 * p / 8;
    let src: Vec<u8> = (0..p).map(pattern).collect();
    let file = {
        let f = rustix::fs::memfd_create("src", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::io::write(&f, &src).unwrap();
        f
    };
    let mut done = 0;
    for round in 1..=ROUNDS {
        let buf = PageBuf::new(4 * p);
        for i in 0..buf.len() {
            buf.set(i, 0);
        }
        let prepared = match prepare(&buf) {
            Ok(t) => t,
            Err(ShareError::NoWriteProtection(e)) => {
                eprintln!("SKIP: userfaultfd write-protection unavailable here: {e}");
                return None;
            }
            Err(e) => panic!("prepare: {e}"),
        };
        let stored = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let kernel_reads = AtomicUsize::new(0);
        let result = std::thread::scope(|s| {
            // User-mode stores, one per word of pages 0..3, paced over ~1 ms.
            s.spawn(|| {
                let t0 = std::time::Instant::now();
                for i in 0..words {
                    buf.atomic(i * 8)
                        .store(round << 32 | (i as u64 + 1), Ordering::Relaxed);
                    stored.store(i + 1, Ordering::Release);
                    while t0.elapsed() < std::time::Duration::from_nanos(300 * (i as u64 + 1)) {}
                }
            });
            // Kernel-mode writes into page 3, over and over until the remap is done.
            s.spawn(|| {
                while !stop.load(Ordering::Acquire) {
                    // SAFETY: page 3 of our live buffer; only raw-pointer access elsewhere.
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut((buf.addr() + 3 * p) as *mut u8, p)
                    };
                    let n = rustix::io::pread(&file, dst, 0).expect("pread into the buffer");
                    assert_eq!(n, p);
                    kernel_reads.fetch_add(1, Ordering::Relaxed);
                    // Leave the CPU to the storing thread most of the time.
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
            });
            while stored.load(Ordering::Acquire) < 16 {}
            let r = remap(&prepared);
            // Let the kernel writer run once more after the remap.
            let k = kernel_reads.load(Ordering::Relaxed);
            while kernel_reads.load(Ordering::Relaxed) < k + 1 {}
            stop.store(true, Ordering::Release);
            r
        });
        match result {
            Ok(()) => done += 1,
            Err(ShareError::NoWriteProtection(e)) => {
                eprintln!("SKIP: userfaultfd write-protection unavailable here: {e}");
                return None;
            }
            Err(e) => panic!("round {round}: {e}"),
        }
        for i in 0..words {
            assert_eq!(
                buf.atomic(i * 8).load(Ordering::Relaxed),
                round << 32 | (i as u64 + 1),
                "round {round}: the store to word {i} was lost"
            );
        }
        for (i, &want) in src.iter().enumerate() {
            assert_eq!(
                buf.get(3 * p + i),
                want,
                "round {round}: kernel write lost at {i}"
            );
        }
    }
    Some(done)
}

#[test]
fn concurrent_conversions_of_buffers_sharing_a_page_never_both_move_it() {
    let p = page_size();
    let probe = PageBuf::new(p);
    if let Err(ShareError::NoWriteProtection(e)) = share_in_place(probe.addr(), p) {
        eprintln!("SKIP: userfaultfd write-protection unavailable here: {e}");
        return;
    }
    let (mut both, mut one) = (0, 0);
    for round in 0..200 {
        let buf = PageBuf::new(3 * p);
        for i in 0..buf.len() {
            buf.set(i, pattern(i));
        }
        // Two MRs whose ranges share page 1, registered by two threads at once.
        let (a, b) = ((buf.addr(), p + 100), (buf.addr() + p + 200, 2 * p - 200));
        let start = std::sync::Barrier::new(2);
        let (ra, rb) = std::thread::scope(|s| {
            let ta = s.spawn(|| {
                start.wait();
                share_in_place(a.0, a.1)
            });
            let tb = s.spawn(|| {
                start.wait();
                share_in_place(b.0, b.1)
            });
            (ta.join().unwrap(), tb.join().unwrap())
        });
        // Refused (the page is a memfd already, or the other's guard holds it) is fine.
        both += usize::from(ra.is_ok() && rb.is_ok());
        one += usize::from(ra.is_ok() != rb.is_ok());
        // Whichever converted, its memfd holds what the program sees in page 1.
        for (r, lo) in [(&ra, buf.addr()), (&rb, buf.addr() + p)] {
            if let Ok(fd) = r {
                let mut got = vec![0u8; p];
                rustix::io::pread(fd, &mut got, (buf.addr() + p - lo) as u64).unwrap();
                for (i, &g) in got.iter().enumerate() {
                    assert_eq!(g, buf.get(p + i), "round {round}: page 1 byte {i}");
                }
            }
        }
    }
    assert_eq!(
        both, 0,
        "rounds in which both conversions moved the shared page"
    );
    assert!(one > 0, "no round converted either buffer");
}

#[test]
fn a_range_larger_than_a_piece_converts_and_comes_back_whole() {
    let p = page_size();
    // 5 MiB and a bit: three pieces of the conversion, the last one short.
    let buf = PageBuf::new((5 << 20) + 3 * p);
    for i in (0..buf.len()).step_by(61) {
        buf.set(i, pattern(i));
    }
    let fd = match share_in_place(buf.addr() + 10, buf.len() - 20) {
        Ok(fd) => fd,
        Err(ShareError::NoWriteProtection(e)) => {
            eprintln!("SKIP: userfaultfd write-protection unavailable here: {e}");
            return;
        }
        Err(e) => panic!("share_in_place: {e}"),
    };
    let mut from_file = vec![0u8; buf.len()];
    rustix::io::pread(&fd, &mut from_file, 0).unwrap();
    for i in (0..buf.len()).step_by(61) {
        assert_eq!(buf.get(i), pattern(i), "program's byte {i}");
        assert_eq!(from_file[i], pattern(i), "memfd byte {i}");
    }
    for at in [
        buf.addr(),
        buf.addr() + (2 << 20),
        buf.addr() + buf.len() - 1,
    ] {
        assert!(
            maps_line(at).contains("memfd:softverbs-mr"),
            "{at:#x} not shared"
        );
    }
    let c = Converted::of(buf.addr() + 10, buf.len() - 20, &fd).unwrap();
    drop(fd);
    unshare_in_place(&c).unwrap();
    for at in [
        buf.addr(),
        buf.addr() + (4 << 20),
        buf.addr() + buf.len() - 1,
    ] {
        assert!(!maps_line(at).contains("memfd:"), "{at:#x} still shared");
    }
    for i in (0..buf.len()).step_by(61) {
        assert_eq!(buf.get(i), pattern(i), "byte {i} after unsharing");
    }
}
