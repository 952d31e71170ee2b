//! The client's side: making its own buffer shareable in place, and letting the daemon in.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{fcntl_add_seals, fstat, ftruncate, memfd_create, MemfdFlags, SealFlags};
use rustix::process::{set_ptracer, PTracer, Pid};

use crate::map::Mapping;
use crate::page_size;
use crate::write_guard::WriteGuard;

/// Why [`share_in_place`] refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    /// Zero length, or the range wraps around the address space.
    #[error("empty range or one that wraps around the address space")]
    BadRange,
    /// Part of the page-rounded range is not private anonymous read-write memory.
    #[error("page {addr:#x} is not private anonymous read-write memory ({found})")]
    Unsupported {
        /// First page that is not.
        addr: usize,
        /// What `/proc/self/maps` says about it.
        found: String,
    },
    /// Writes to the range could not be held back during the conversion (userfaultfd
    /// write-protection is unavailable: no `CAP_SYS_PTRACE` with
    /// `vm.unprivileged_userfaultfd` 0, a kernel before 6.4, or the program already uses
    /// userfaultfd on these pages). Nothing was changed; register without sharing.
    #[error("cannot hold writes back during the conversion: {0}")]
    NoWriteProtection(io::Error),
    /// A system call failed (the range keeps its contents, see
    /// [`share_in_place`]).
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl From<rustix::io::Errno> for ShareError {
    fn from(e: rustix::io::Errno) -> Self {
        Self::Io(e.into())
    }
}

/// Turns the caller's memory `[addr, addr + len)`, rounded outward to whole pages, into a
/// `MAP_SHARED` mapping of a new memfd at the same address, keeping its contents, and
/// returns the memfd. The caller sends the memfd to the daemon, which maps it
/// ([`SharedMappings::add_region`](crate::SharedMappings::add_region) with the same
/// `addr`/`len`): from then on both see each other's writes and the daemon reaches the
/// buffer with `memcpy` instead of a system call per access.
///
/// How: create a memfd of the rounded size plus room for the program to grow the mapping
/// (`realloc`, [`GROWTH`]), seal it against shrinking and growing (so the daemon cannot be
/// made to fault by a truncation), and, piece by piece of at most 2 MiB
/// (so the copy never needs more than that much memory besides the program's), map the
/// piece of the file at a fresh address with `MAP_POPULATE`, copy the pages in and `mremap`
/// the populated mapping over them (one atomic replacement; the page tables move along, so
/// the client takes no page faults afterwards). This is the technique measured in
/// `docs/design/measurements.md` §2, with `mremap` instead of a second `mmap(MAP_FIXED)`.
///
/// Only private anonymous read-write memory is accepted (heap, `mmap(MAP_ANONYMOUS |
/// MAP_PRIVATE)`, named anonymous mappings) without `mlock`, `MADV_DONTFORK` or
/// `MADV_WIPEONFORK` (which a shared mapping would lose); anything else (file-backed,
/// `MAP_SHARED`, hugetlb, stacks, device memory, unmapped holes, read-only pages) is
/// [`ShareError::Unsupported`] and must be registered for the `process_vm_*` path instead.
///
/// # Caveats
///
/// * **Other threads.** Other threads may keep writing the pages (the buffer, and the
///   objects that share its first and last page) during the call: from just before the copy
///   until the shared copy is in place, the pages are write-protected through userfaultfd
///   (`write_guard`), so a write, by a thread or by the kernel on its behalf (`read(2)` into
///   the buffer), waits a few microseconds and then lands in the shared copy; none is lost.
///   Where that protection is unavailable the call changes nothing and fails with
///   [`ShareError::NoWriteProtection`]. Not covered: writes through pages pinned before the
///   call (`O_DIRECT` or `io_uring` fixed buffers in flight, another device's DMA), which
///   go to the old pages; and a signal handler of the calling thread that writes the pages
///   during the call, which would wait for itself. No thread may unmap the pages during the
///   call.
/// * **Neighbours are shared too.** The whole pages are shared with the daemon (which only
///   accesses the registered bytes, enforced by the core's bounds check), until
///   [`unshare_in_place`] makes them private again at deregistration.
/// * **fork.** After the conversion the pages are `MAP_SHARED`, which a child created by
///   `fork()` would share with the parent; the first conversion installs a child handler
///   that gives the child its own copy (`fork_child.rs`).
/// * **Failure.** If a piece cannot be mapped or moved (e.g. `ENOMEM`), the pieces before it
///   are already shared pages holding the same bytes and the rest is untouched: reported as
///   [`ShareError::Io`], the range is still the program's memory with its contents, and the
///   caller registers it without sharing — unless the failing call was the `mremap` itself,
///   after which the kernel may have unmapped that piece (then reported the same way; the
///   program would find the piece gone, as it would after any failed `MAP_FIXED`).
/// * **Aliasing.** From now on the daemon writes these bytes behind the program's back, as
///   a NIC does: the client library must not let Rust references to a registered buffer
///   coexist with remote access to it.
pub fn share_in_place(addr: usize, len: usize) -> Result<OwnedFd, ShareError> {
    let page = page_size();
    let end = addr.checked_add(len).ok_or(ShareError::BadRange)?;
    if len == 0 {
        return Err(ShareError::BadRange);
    }
    let lo = addr & !(page - 1);
    let hi = end
        .checked_next_multiple_of(page)
        .ok_or(ShareError::BadRange)?;
    let n = hi - lo;
    let _one_at_a_time = conversions();
    check_private_anonymous(lo, hi)?;
    if let Some((at, flag)) = crate::vmas::kept_flag_in(lo, hi)? {
        // mlock, MADV_DONTFORK, MADV_WIPEONFORK: a shared mapping moved over the pages would
        // drop the flag, so a later mlock'd page could be swapped, or a child would get
        // pages it must not have. Left alone, on the process path, as a NIC leaves them.
        return Err(ShareError::Unsupported {
            addr: at.max(lo),
            found: format!("VmFlags {flag}"),
        });
    }
    if !crate::write_guard::may_arm() {
        // Known unavailable: skip allocating and filling a copy that could not be used.
        return Err(ShareError::NoWriteProtection(io::Error::from_raw_os_error(
            libc::EPERM,
        )));
    }

    let fd = memfd_create(MEMFD_NAME, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    ftruncate(&fd, file_size(n))?;
    fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    let guard = WriteGuard::arm(lo, n, false).map_err(ShareError::NoWriteProtection)?;
    in_pieces(lo, n, |off, len| Mapping::shared_at(&fd, off, len, true))?;
    // Writes that waited go on now, into the shared pages.
    drop(guard);
    // From now on a child created by fork() must get its own copy of these pages.
    crate::fork_child::install();
    Ok(fd)
}

/// How far the program may grow a converted mapping with `mremap` (what glibc's `realloc`
/// does to a chunk it got from `mmap`) before the grown part lies past the memfd's end,
/// where the first access would raise `SIGBUS` (mmap(2)). Private anonymous memory can grow
/// without limit; the file is made this much larger than the range, which costs nothing
/// until the grown part is written (a memfd's size reserves nothing: its pages are
/// allocated, and charged to the program, when first written).
const GROWTH: u64 = 1 << 40;

/// The size of the memfd for a conversion of `n` bytes: `n` plus [`GROWTH`], within the
/// process's `RLIMIT_FSIZE` (a larger `ftruncate` would raise `SIGXFSZ`).
fn file_size(n: usize) -> u64 {
    let n = n as u64;
    let limit = rustix::process::getrlimit(rustix::process::Resource::Fsize)
        .current
        .unwrap_or(u64::MAX);
    n.saturating_add(GROWTH).min(limit).max(n)
}

/// Serialises [`share_in_place`] and [`unshare_in_place`] in the process. Each checks
/// `/proc/self/maps` and then moves pages; two threads registering neighbouring buffers that
/// share a page would otherwise both see it private, and the second would move its own copy
/// over the first one's memfd page, so that the first MR and the program no longer see the
/// same byte there. (A conversion takes tens of microseconds to a millisecond per MiB.)
fn conversions() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The name [`share_in_place`] gives its memfds, which `/proc/self/maps` shows as
/// `/memfd:softverbs-mr (deleted)`: how the fork child and [`unshare_in_place`] recognise
/// the ranges this crate converted.
pub(crate) const MEMFD_NAME: &str = "softverbs-mr";

/// A range [`share_in_place`] converted, as [`unshare_in_place`] finds it again: the
/// page-rounded range and the memfd's inode, which tells it from anything the program
/// mapped there since.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Converted {
    lo: usize,
    hi: usize,
    inode: u64,
}

impl Converted {
    /// The conversion of `[addr, addr + len)` that produced `fd`.
    pub fn of(addr: usize, len: usize, fd: impl AsFd) -> io::Result<Converted> {
        let page = page_size();
        let hi = addr
            .checked_add(len)
            .and_then(|e| e.checked_next_multiple_of(page))
            .ok_or(io::ErrorKind::InvalidInput)?;
        Ok(Converted {
            lo: addr & !(page - 1),
            hi,
            inode: fstat(fd)?.st_ino,
        })
    }
}

/// Turns a range [`share_in_place`] converted back into private anonymous memory with the
/// same contents, at the same address (what deregistration does, so that after
/// `ibv_dereg_mr` the memory is what `malloc` gave the program again: a child forked later
/// copies it, `MADV_DONTNEED` zeroes it, `realloc` may grow it with `mremap`, which on a
/// sealed memfd would raise `SIGBUS` past its end).
///
/// Other threads' writes wait during the move as they do in [`share_in_place`] (the write
/// guard, here on shared memory: Linux 5.19). Does nothing and says why if the range is no
/// longer exactly that memfd (the program unmapped or replaced it: then it is the program's
/// memory, not ours to move) or if writes cannot be held back; the memory then stays as it
/// is, shared with nobody once the daemon has unmapped it, and still correct to use.
///
/// # Contract
///
/// The caller (the client library's deregistration) passes a conversion whose memory region
/// the daemon has deregistered, so no peer writes the pages any more; as in
/// [`share_in_place`], no thread unmaps them during the call.
pub fn unshare_in_place(c: &Converted) -> Result<(), ShareError> {
    let _one_at_a_time = conversions();
    check_converted(c)?;
    let n = c.hi - c.lo;
    let guard = WriteGuard::arm(c.lo, n, true).map_err(ShareError::NoWriteProtection)?;
    in_pieces(c.lo, n, |_, len| Mapping::private_anonymous(len))?;
    drop(guard);
    Ok(())
}

/// Largest piece [`in_pieces`] copies and moves at once.
const PIECE: usize = 2 << 20;

/// Moves new pages over `[lo, lo + n)` (page-aligned) with the same bytes, in pieces of at
/// most [`PIECE`]: `fresh(offset, len)` makes the pages for `lo + offset..`, which are filled
/// from the range and moved onto it. Each piece's old pages are freed as its copy moves over
/// them, so the move never needs more memory than one piece besides the program's (one copy
/// of a 12 GiB registration would need 12 GiB more). If a piece fails, the pieces before it
/// have moved already: the range holds the same bytes throughout, part of it in new pages.
pub(crate) fn in_pieces(
    lo: usize,
    n: usize,
    mut fresh: impl FnMut(usize, usize) -> io::Result<Mapping>,
) -> io::Result<()> {
    let mut off = 0;
    while off < n {
        let len = (n - off).min(PIECE);
        fresh(off, len)?.copy_and_move_onto(lo + off)?;
        off += len;
    }
    Ok(())
}

/// Checks that `c.lo..c.hi` is covered by read-write shared mappings of `c`'s memfd.
fn check_converted(c: &Converted) -> Result<(), ShareError> {
    check_covered(c.lo, c.hi, |m| {
        m.converted_by_us()
            && m.perms.starts_with("rw")
            && m.inode.parse::<u64>().ok() == Some(c.inode)
    })
}

/// Checks that `lo..hi` (page-aligned) is covered by private anonymous read-write mappings.
fn check_private_anonymous(lo: usize, hi: usize) -> Result<(), ShareError> {
    check_covered(lo, hi, |m| m.private_anonymous_rw())
}

/// Checks that mappings cover `lo..hi` without a hole and that each of them is `fit`;
/// [`ShareError::Unsupported`] names the first page where that fails.
fn check_covered(
    lo: usize,
    hi: usize,
    fit: impl Fn(&MapsLine<'_>) -> bool,
) -> Result<(), ShareError> {
    let lines = crate::vmas::lines_covering(lo, hi)?;
    let mut at = lo;
    for line in &lines {
        let Some(m) = MapsLine::parse(line) else {
            continue;
        };
        if m.end <= at {
            continue;
        }
        if m.start > at || !fit(&m) {
            return Err(ShareError::Unsupported {
                addr: at,
                found: if m.start > at {
                    "not mapped".to_owned()
                } else {
                    line.clone()
                },
            });
        }
        at = m.end;
        if at >= hi {
            return Ok(());
        }
    }
    Err(ShareError::Unsupported {
        addr: at,
        found: "not mapped".to_owned(),
    })
}

/// One line of `/proc/self/maps`: `start-end perms offset dev inode [path]`.
pub(crate) struct MapsLine<'a> {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) perms: &'a str,
    pub(crate) inode: &'a str,
    path: &'a str,
}

impl<'a> MapsLine<'a> {
    pub(crate) fn parse(line: &'a str) -> Option<Self> {
        let mut f = line.split_ascii_whitespace();
        let (start, end) = f.next()?.split_once('-')?;
        let perms = f.next()?;
        let _offset = f.next()?;
        let _dev = f.next()?;
        let inode = f.next()?;
        let path = f.next().unwrap_or("");
        Some(Self {
            start: usize::from_str_radix(start, 16).ok()?,
            end: usize::from_str_radix(end, 16).ok()?,
            perms,
            inode,
            path,
        })
    }

    /// A shared mapping of a memfd [`share_in_place`] made (any permissions: the program may
    /// have `mprotect`ed it).
    pub(crate) fn converted_by_us(&self) -> bool {
        self.perms.ends_with('s')
            && self
                .path
                .strip_prefix("/memfd:")
                .is_some_and(|p| p.starts_with(MEMFD_NAME))
    }

    fn private_anonymous_rw(&self) -> bool {
        self.perms.starts_with("rw")
            && self.perms.ends_with('p')
            && self.inode == "0"
            && (self.path.is_empty() || self.path == "[heap]" || self.path.starts_with("[anon:"))
    }
}

/// What [`authorize_daemon`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Authorization {
    /// Yama is active and now lets the daemon attach (`PR_SET_PTRACER`).
    Yama,
    /// Yama is not in the kernel: plain ptrace rules apply (same uid and a dumpable
    /// client, or a privileged daemon), nothing to grant.
    NotNeeded,
}

/// Lets the daemon process `daemon_pid` use `process_vm_readv`/`writev` on the calling
/// process without root: `prctl(PR_SET_PTRACER, daemon_pid)` for Yama's
/// `ptrace_scope = 1` (the common default), which otherwise allows that only to ancestors.
/// The daemon must still run under the client's uid (or be privileged), and the grant
/// names one pid, replacing any earlier one. With `ptrace_scope` 2 or 3 only a privileged
/// daemon can get in.
pub fn authorize_daemon(daemon_pid: i32) -> io::Result<Authorization> {
    let pid = Pid::from_raw(daemon_pid).ok_or(io::Error::from(io::ErrorKind::InvalidInput))?;
    match set_ptracer(PTracer::ProcessID(pid)) {
        Ok(()) => Ok(Authorization::Yama),
        // Without Yama the prctl option does not exist (EINVAL); with it, EINVAL means an
        // unknown pid.
        Err(rustix::io::Errno::INVAL)
            if !std::path::Path::new("/proc/sys/kernel/yama").exists() =>
        {
            Ok(Authorization::NotNeeded)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_maps_lines() {
        let m = MapsLine::parse("7f0000000000-7f0000021000 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!((m.start, m.end), (0x7f00_0000_0000, 0x7f00_0002_1000));
        assert!(m.private_anonymous_rw());
        let heap = MapsLine::parse("55d0-55e0 rw-p 00000000 00:00 0     [heap]").unwrap();
        assert!(heap.private_anonymous_rw());
        for other in [
            "1000-2000 rw-s 00000000 00:01 1234 /memfd:x (deleted)",
            "1000-2000 r--p 00000000 00:00 0",
            "1000-2000 rw-p 00000000 00:00 0 [stack]",
            "1000-2000 rw-p 00001000 08:01 42 /usr/lib/libc.so.6",
            "1000-2000 rw-p 00000000 00:0f 77 /anon_hugepage (deleted)",
        ] {
            assert!(
                !MapsLine::parse(other).unwrap().private_anonymous_rw(),
                "{other}"
            );
        }
    }
}
