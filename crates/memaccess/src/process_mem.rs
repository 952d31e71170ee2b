//! The path for memory that is not shared: `pread`/`pwrite` on the client's own
//! `/proc/self/mem`, opened by the client and passed to the daemon at context open.
//!
//! Why a descriptor and not a pid (docs/design/registered-memory.md, "Which process"): opening
//! `/proc/<pid>/mem` binds the file to that process's address space (`mm`) at `open(2)`
//! time (proc(5): the permission is a ptrace access-mode check made when the file is
//! opened, against the opener). Every later `pread`/`pwrite` goes to that same address
//! space or fails: once the process exits or `execve`s, its old `mm` has no users and the
//! kernel transfers nothing (`pread` returns 0 or `EIO`), whatever process later gets the
//! pid. A pid, by contrast, is a number the kernel hands to the next process after the
//! client is reaped, and `process_vm_readv`/`writev` take only that number.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use rustix::fs::{fcntl_getfl, fstatfs, OFlags};
use rustix::io::Errno;
use softverbs_core::ids::CtxId;
use softverbs_core::memory::{AtomicOp, Fault, Memory};

use crate::batch::{Backend, Batch, BatchStats};

/// `statfs(2)` `f_type` of procfs (`PROC_SUPER_MAGIC`, linux/magic.h).
const PROC_SUPER_MAGIC: i64 = 0x9fa0;

/// Why a descriptor offered as a process's memory was refused.
#[derive(Debug, thiserror::Error)]
pub enum MemFdError {
    /// Not opened for both reading and writing (uverbs answers `EBADF` for a descriptor
    /// of the wrong mode).
    #[error("the memory descriptor is not open for reading and writing")]
    NotReadWrite,
    /// Not the `mem` file of the process that sent it.
    #[error("not /proc/{expected}/mem: {found}")]
    NotPeerMem {
        /// The sender's pid.
        expected: u32,
        /// What the descriptor is.
        found: String,
    },
    /// `fstatfs`, `fcntl` or `readlink` failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl MemFdError {
    /// The errno the daemon answers with.
    pub fn errno(&self) -> i32 {
        match self {
            MemFdError::NotReadWrite => softverbs_core::errno::EBADF,
            MemFdError::NotPeerMem { .. } | MemFdError::Io(_) => softverbs_core::errno::EINVAL,
        }
    }
}

/// An address space the daemon may read and write: a validated `/proc/<pid>/mem`
/// descriptor of the process that opened a context.
#[derive(Debug)]
pub struct ProcessMemory {
    fd: OwnedFd,
    pid: u32,
    maps: Option<OwnedFd>,
}

impl ProcessMemory {
    /// Accepts `fd` as the memory of process `pid` (the sender of the message it came with,
    /// as the kernel reported it): it must be a procfs file named `/proc/<pid>/mem`, open
    /// read-write. Anything else (a regular file, a memfd, another process's `mem`, a
    /// read-only or `O_PATH` descriptor) is refused, so a client cannot make the daemon
    /// write into some other file it holds.
    ///
    /// The check is a guard against mistakes and substitutes; the safety argument does
    /// not rest on it. The kernel checked, when the client opened the file, that the
    /// client may attach to that process (proc(5), `/proc/pid/mem`), so whatever file a
    /// client hands over, the daemon can do with it no more than the client could itself.
    pub fn validate(fd: OwnedFd, pid: u32) -> Result<ProcessMemory, MemFdError> {
        let mode = fcntl_getfl(&fd).map_err(io::Error::from)? & OFlags::RWMODE;
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        let found = link.to_string_lossy().into_owned();
        let on_procfs = fstatfs(&fd).map_err(io::Error::from)?.f_type as i64 == PROC_SUPER_MAGIC;
        if !on_procfs || found != format!("/proc/{pid}/mem") {
            return Err(MemFdError::NotPeerMem {
                expected: pid,
                found,
            });
        }
        if mode != OFlags::RDWR {
            return Err(MemFdError::NotReadWrite);
        }
        Ok(ProcessMemory {
            fd,
            pid,
            maps: None,
        })
    }

    /// Opens the memory of the sender `pid` on its behalf, from a pidfd of itself that it
    /// sent instead of its `mem` (docs/design/registered-memory.md, "A process that is not
    /// dumpable"): a process that made itself non-dumpable (`PR_SET_DUMPABLE` 0, a setuid or
    /// privilege-dropping program) cannot open its own `/proc/self/mem`, because the file then
    /// belongs to root, mode 0600 (proc(5), "/proc/pid"), and the permission check of
    /// `open(2)` comes before the ptrace check that would let it in. (Its `maps`, mode 0444,
    /// it still opens and sends itself.) The daemon opens `/proc/<pid>/mem` itself, which only
    /// a daemon with `CAP_SYS_PTRACE` and `CAP_DAC_OVERRIDE` (root) can do for such a process.
    ///
    /// Why this reaches exactly the sender, whatever happens to the pid: `pidfd` must be a
    /// pidfd whose `Pid:` (`/proc/self/fdinfo`) is `pid`, the pid the kernel attached to the
    /// message (`SCM_CREDENTIALS`, which a process cannot forge without `CAP_SYS_ADMIN`).
    /// The pidfd existed when the message was sent, by the sender alive with that pid; after
    /// both files are opened the pidfd must still show a live process (`poll` without
    /// `POLLIN`, pidfd_open(2)). A live process keeps its pid, so the files opened in
    /// between are that process's, and a pidfd of an earlier holder of the number is dead by
    /// then and refused. The daemon acts only for the process that asked, on its own memory,
    /// and the direct path never hands such a descriptor to anyone (the process is not
    /// dumpable: [`reachable_as`]).
    pub fn open_for(pidfd: OwnedFd, pid: u32) -> Result<ProcessMemory, MemFdError> {
        let not_it = |found: String| MemFdError::NotPeerMem {
            expected: pid,
            found,
        };
        let link = std::fs::read_link(format!("/proc/self/fd/{}", pidfd.as_raw_fd()))?;
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd()))?;
        let named = info
            .lines()
            .find_map(|l| l.strip_prefix("Pid:"))
            .map(str::trim);
        if !link.to_string_lossy().contains("pidfd") || named != Some(pid.to_string().as_str()) {
            return Err(not_it(format!("{} (Pid {named:?})", link.display())));
        }
        let open = |what: &str, flags: OFlags| {
            rustix::fs::open(
                format!("/proc/{pid}/{what}").as_str(),
                flags | OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(io::Error::from)
        };
        let fd = open("mem", OFlags::RDWR)?;
        let mut poll = [rustix::event::PollFd::new(
            &pidfd,
            rustix::event::PollFlags::IN,
        )];
        let exited = match rustix::event::poll(&mut poll, Some(&rustix::event::Timespec::default()))
        {
            Ok(n) => n > 0,
            Err(e) => return Err(io::Error::from(e).into()),
        };
        if exited {
            return Err(not_it("a process that has exited".to_owned()));
        }
        Ok(ProcessMemory {
            fd,
            pid,
            maps: None,
        })
    }

    /// [`validate`](Self::validate) for a `/proc/<pid>/mem` descriptor, [`open_for`](Self::open_for)
    /// for a pidfd: what the daemon accepts as `HELLO_MEM_FD`.
    pub fn accept(fd: OwnedFd, pid: u32) -> Result<ProcessMemory, MemFdError> {
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        if link.to_string_lossy().contains("pidfd") {
            Self::open_for(fd, pid)
        } else {
            Self::validate(fd, pid)
        }
    }

    /// Adds the same process's own `/proc/self/maps` (ABI 7), through which
    /// [`ProcessMem::check_range`] judges registrations. Checked like the `mem` file: a procfs
    /// file named `/proc/<pid>/maps`, open for reading. Opened by the client, it is bound to
    /// its address space at `open(2)` as `mem` is (proc(5)), so what it reports is that
    /// address space, never whatever process later has the pid.
    pub fn with_maps(mut self, fd: OwnedFd) -> Result<ProcessMemory, MemFdError> {
        let mode = fcntl_getfl(&fd).map_err(io::Error::from)? & OFlags::RWMODE;
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        let found = link.to_string_lossy().into_owned();
        let on_procfs = fstatfs(&fd).map_err(io::Error::from)?.f_type as i64 == PROC_SUPER_MAGIC;
        if !on_procfs || found != format!("/proc/{}/maps", self.pid) {
            return Err(MemFdError::NotPeerMem {
                expected: self.pid,
                found,
            });
        }
        if mode == OFlags::WRONLY {
            return Err(MemFdError::NotReadWrite);
        }
        self.maps = Some(fd);
        Ok(self)
    }

    /// The pid the memory belonged to when it was validated (for logs; the descriptor, not
    /// this number, decides what is accessed).
    pub fn pid(&self) -> u32 {
        self.pid
    }
}

/// Whether a process of uid `uid` could open the memory `fd` names itself, as far as
/// ptrace(2) "Ptrace access mode checking" decides by credentials: the process is alive,
/// *dumpable* (`PR_GET_DUMPABLE` 1) and its effective uid is `uid` — the file `/proc/<pid>/mem`
/// then belongs to that uid (proc(5): the files of a process that is not dumpable belong to
/// root). A same-uid process may attach to such a process (step 3 of the check: caller's
/// fsuid equals the target's uids, which a dumpable process that kept its uid has; step 5:
/// the target is dumpable), so handing it the descriptor grants nothing it could not take.
/// What the check does not evaluate: capability sets (step 3's "permitted capabilities"
/// subset, which matters between processes of uid 0) and LSMs such as Yama
/// (docs/design/direct-path.md, "Who goes direct").
///
/// `pid` is the number the memory was validated for. The owner is read by path
/// (`stat("/proc/<pid>/mem")`), because only a path lookup makes procfs recompute it
/// (`fstat` on an open descriptor reports what the last lookup found); the path's inode must
/// then be the descriptor's own, so the answer is about that process even if the number has
/// since gone to another (a dead process's entry is a different inode, or none).
pub fn reachable_as(fd: impl AsFd, pid: u32, uid: u32) -> bool {
    let Ok(held) = rustix::fs::fstat(fd) else {
        return false;
    };
    let Ok(now) = rustix::fs::stat(format!("/proc/{pid}/mem").as_str()) else {
        return false;
    };
    now.st_dev == held.st_dev && now.st_ino == held.st_ino && now.st_uid == uid
}

/// A pidfd of the calling process (pidfd_open(2), Linux 5.3), close-on-exec: what a client
/// that is not dumpable sends at context open instead of its `mem`, which it cannot open
/// ([`ProcessMemory::open_for`]).
pub fn own_pidfd() -> io::Result<OwnedFd> {
    Ok(rustix::process::pidfd_open(
        rustix::process::getpid(),
        rustix::process::PidfdFlags::empty(),
    )?)
}

/// What the client sends at context open: its own `/proc/self/mem`, read-write and
/// close-on-exec. Opening one's own `mem` is always allowed (the ptrace check passes for
/// the caller's own thread group), also without root and under Yama.
pub fn open_own_memory() -> io::Result<OwnedFd> {
    use rustix::fs::{open, Mode};
    Ok(open(
        "/proc/self/mem",
        OFlags::RDWR | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// What the client sends with its `mem` (ABI 7): its own `/proc/self/maps`, read-only and
/// close-on-exec.
pub fn open_own_maps() -> io::Result<OwnedFd> {
    use rustix::fs::{open, Mode};
    Ok(open(
        "/proc/self/maps",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Why [`ProcessMem::check_range`] refused a registration (both are `EFAULT`, as
/// `ibv_reg_mr` answers when `ib_umem_get` cannot pin the pages).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// Some page of the range is not mapped, or not readable.
    #[error("{addr:#x} is not mapped readable")]
    NotMapped {
        /// The first address found wanting.
        addr: u64,
    },
    /// Write access was asked for and some page of the range is not writable.
    #[error("{addr:#x} is not writable")]
    NotWritable {
        /// The first address found wanting.
        addr: u64,
    },
}

impl RangeError {
    /// `EFAULT`, the errno the daemon answers with.
    pub fn errno(&self) -> i32 {
        Errno::FAULT.raw_os_error()
    }
}

/// Reaches the memory of each context's process with one `pread`/`pwrite` on its `mem`
/// descriptor per access (plus one more per short transfer).
///
/// Every failure (the process is gone or has `execve`d, the address is unmapped, a
/// context without a descriptor, an address past `i64::MAX`) is a [`Fault`] on the first
/// byte not transferred; nothing panics. A context whose client sent no descriptor (an
/// older client) has no memory here: only its shared MRs work.
///
/// # Writes to read-only pages
///
/// The kernel writes through `/proc/pid/mem` as a debugger does (`FOLL_FORCE`, unless
/// `proc_mem.force_override=` says otherwise), so it would write read-only pages. The
/// daemon therefore refuses, at `reg_mr`/`rereg_mr`, write access over pages that are not
/// writable, as `ib_umem_get` does by pinning with `FOLL_WRITE` ([`ProcessMem::check_range`],
/// docs/design/registered-memory.md). A later `mprotect` by the program does not stop the writes,
/// as it does not stop a NIC's DMA into pinned pages.
///
/// # Atomics
///
/// As for [`ProcessVm`](crate::ProcessVm): the trait's default read-modify-write, atomic
/// only with respect to other atomics of this daemon (`IBV_ATOMIC_HCA`).
///
/// # Batching
///
/// Reads inside a range the engine announced ([`Memory::will_read`]) are served from one
/// large `pread` per window, and writes are held back and coalesced into one `pwrite` per
/// contiguous run until [`Memory::flush`] (crate `batch`, docs/design/registered-memory.md, "One
/// system call per work request"). On-demand-paging accesses (`*_mapped`) and atomics go
/// straight to memory, in order after the held-back writes they overlap.
#[derive(Debug, Default)]
pub struct ProcessMem {
    spaces: HashMap<CtxId, ProcessMemory>,
    batch: Batch,
    /// Off: one system call per access, as before batching (for measurements).
    unbatched: bool,
}

/// The system calls behind [`Batch`]: the contexts' `mem` descriptors.
struct Fds<'a>(&'a HashMap<CtxId, ProcessMemory>);

impl Fds<'_> {
    fn target(&self, ctx: CtxId, addr: u64, len: usize) -> Result<&OwnedFd, Fault> {
        let m = self.0.get(&ctx).ok_or(Fault { ctx, addr })?;
        // File offsets are signed: the whole range must fit below i64::MAX.
        let end = addr.checked_add(len as u64).ok_or(Fault { ctx, addr })?;
        if end > i64::MAX as u64 {
            return Err(Fault { ctx, addr });
        }
        Ok(&m.fd)
    }
}

impl Backend for Fds<'_> {
    fn read_at(&mut self, ctx: CtxId, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        let fd = self.target(ctx, addr, buf.len())?.as_fd();
        let len = buf.len();
        transfer(ctx, addr, len, |done| {
            rustix::io::pread(fd, &mut buf[done..], addr + done as u64)
        })
    }

    fn write_at(&mut self, ctx: CtxId, addr: u64, data: &[u8]) -> Result<(), Fault> {
        let fd = self.target(ctx, addr, data.len())?.as_fd();
        let len = data.len();
        transfer(ctx, addr, len, |done| {
            rustix::io::pwrite(fd, &data[done..], addr + done as u64)
        })
    }
}

impl ProcessMem {
    /// No process known.
    pub fn new() -> Self {
        Self::default()
    }

    /// With `on` false, every access is its own system call (no read-ahead, no held-back
    /// writes): the behaviour before batching, kept for measuring against it.
    pub fn with_batching(mut self, on: bool) -> Self {
        self.unbatched = !on;
        self
    }

    /// Accesses for `ctx` go to `mem` from now on (replacing an earlier one).
    pub fn register_process(&mut self, ctx: CtxId, mem: ProcessMemory) {
        self.spaces.insert(ctx, mem);
    }

    /// Forgets `ctx` (when the context is closed), closing its descriptor; the pid it was
    /// validated for, if it had one. Writes still held back are made first.
    pub fn unregister_process(&mut self, ctx: CtxId) -> Option<u32> {
        self.batch.forget(&mut Fds(&self.spaces), ctx);
        self.spaces.remove(&ctx).map(|m| m.pid)
    }

    /// What batching saved so far.
    pub fn batch_stats(&self) -> BatchStats {
        self.batch.stats()
    }

    /// Whether writes are held back (until [`Memory::flush`]).
    pub fn holds_writes(&self) -> bool {
        self.batch.holds_writes()
    }

    /// The pid `ctx`'s memory was validated for.
    pub fn pid(&self, ctx: CtxId) -> Option<u32> {
        self.spaces.get(&ctx).map(|m| m.pid)
    }

    /// Whether `len` bytes at `addr` of `ctx`'s process may be registered, `write` saying
    /// whether the access flags let the MR be written (`IBV_ACCESS_LOCAL_WRITE`,
    /// `REMOTE_WRITE`, `REMOTE_ATOMIC`, `MW_BIND`: the flags for which `ib_umem_get` pins
    /// with `FOLL_WRITE`). Every page must be mapped readable, and writable if `write`,
    /// else [`RangeError`] (`EFAULT`). Judged from the process's own `maps` descriptor at
    /// the moment of the call. A context without one (a client older than ABI 7) is not
    /// judged: `Ok`. A descriptor that no longer reads (the process exited or `execve`d)
    /// reports no mappings, so the range is `NotMapped`.
    pub fn check_range(
        &self,
        ctx: CtxId,
        addr: u64,
        len: u64,
        write: bool,
    ) -> Result<(), RangeError> {
        let Some(maps) = self.spaces.get(&ctx).and_then(|m| m.maps.as_ref()) else {
            return Ok(());
        };
        if len == 0 {
            return Ok(());
        }
        let text = read_all(maps).map_err(|_| RangeError::NotMapped { addr })?;
        let end = addr.saturating_add(len);
        covered(&text, addr, end, write)
    }
}

/// The whole of a procfs text file, read with `pread` from offset 0 (the descriptor's own
/// offset is left alone: the client may hold the same open file).
fn read_all(fd: &OwnedFd) -> rustix::io::Result<String> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match rustix::io::pread(fd, &mut buf, out.len() as u64) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Whether `maps` text (`start-end perms ...` lines, ascending) covers `[lo, hi)` with
/// readable mappings, writable too if `write`.
fn covered(maps: &str, lo: u64, hi: u64, write: bool) -> Result<(), RangeError> {
    let mut at = lo;
    for line in maps.lines() {
        let mut f = line.split_ascii_whitespace();
        let Some((start, end)) = f.next().and_then(|r| r.split_once('-')) else {
            continue;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
        else {
            continue;
        };
        let perms = f.next().unwrap_or("");
        if end <= at {
            continue;
        }
        if start > at || !perms.starts_with('r') {
            return Err(RangeError::NotMapped { addr: at });
        }
        if write && perms.as_bytes().get(1) != Some(&b'w') {
            return Err(RangeError::NotWritable { addr: at });
        }
        at = end;
        if at >= hi {
            return Ok(());
        }
    }
    Err(RangeError::NotMapped { addr: at })
}

/// Runs `step(done)` until `len` bytes are transferred. `EINTR` is retried; a zero-byte
/// transfer (the address space is gone) or any other error (`EIO`: an unmapped page) is a
/// fault at the first byte not transferred.
fn transfer(
    ctx: CtxId,
    addr: u64,
    len: usize,
    mut step: impl FnMut(usize) -> rustix::io::Result<usize>,
) -> Result<(), Fault> {
    let mut done = 0;
    while done < len {
        match step(done) {
            Ok(0) => return Err(fault_at(ctx, addr, done)),
            Ok(n) => done += n,
            Err(Errno::INTR) => {}
            Err(_) => return Err(fault_at(ctx, addr, done)),
        }
    }
    Ok(())
}

fn fault_at(ctx: CtxId, addr: u64, done: usize) -> Fault {
    Fault {
        ctx,
        addr: addr.wrapping_add(done as u64),
    }
}

impl Memory for ProcessMem {
    fn read(&mut self, ctx: CtxId, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        self.batch.read(&mut Fds(&self.spaces), ctx, addr, buf)
    }

    fn write(&mut self, ctx: CtxId, addr: u64, data: &[u8]) -> Result<(), Fault> {
        // Checked now, so that a context without memory faults at the write as before.
        Fds(&self.spaces).target(ctx, addr, data.len())?;
        if self.unbatched {
            return self
                .batch
                .write_direct(&mut Fds(&self.spaces), ctx, addr, data);
        }
        self.batch.write(&mut Fds(&self.spaces), ctx, addr, data)
    }

    fn atomic(&mut self, ctx: CtxId, addr: u64, op: AtomicOp) -> Result<u64, Fault> {
        let mut b = [0u8; 8];
        let fds = &mut Fds(&self.spaces);
        self.batch.read_direct(fds, ctx, addr, &mut b)?;
        let old = u64::from_ne_bytes(b);
        self.batch
            .write_direct(fds, ctx, addr, &op.apply(old).to_ne_bytes())?;
        Ok(old)
    }

    fn read_mapped(&mut self, ctx: CtxId, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        self.batch
            .read_direct(&mut Fds(&self.spaces), ctx, addr, buf)
    }

    fn write_mapped(&mut self, ctx: CtxId, addr: u64, data: &[u8]) -> Result<(), Fault> {
        self.batch
            .write_direct(&mut Fds(&self.spaces), ctx, addr, data)
    }

    fn atomic_mapped(&mut self, ctx: CtxId, addr: u64, op: AtomicOp) -> Result<u64, Fault> {
        self.atomic(ctx, addr, op)
    }

    fn will_read(&mut self, on_demand: bool, ctx: CtxId, addr: u64, len: u64) {
        // An on-demand MR must see what is mapped at each access: no read-ahead.
        if !on_demand && !self.unbatched {
            self.batch.will_read(ctx, addr, len);
        }
    }

    fn flush(&mut self) -> Result<(), Fault> {
        self.batch.flush(&mut Fds(&self.spaces))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "1000-3000 rw-p 00000000 00:00 0\n\
3000-4000 r--p 00000000 00:00 0\n\
5000-6000 ---p 00000000 00:00 0\n\
6000-7000 rw-s 00000000 00:01 7 /memfd:x (deleted)\n";

    #[test]
    fn writable_readable_holes() {
        assert_eq!(covered(MAPS, 0x1000, 0x3000, true), Ok(()));
        assert_eq!(covered(MAPS, 0x2000, 0x4000, false), Ok(()));
        assert_eq!(
            covered(MAPS, 0x2000, 0x4000, true),
            Err(RangeError::NotWritable { addr: 0x3000 })
        );
        assert_eq!(
            covered(MAPS, 0x3800, 0x4800, false),
            Err(RangeError::NotMapped { addr: 0x4000 })
        );
        assert_eq!(
            covered(MAPS, 0x5000, 0x5001, false),
            Err(RangeError::NotMapped { addr: 0x5000 })
        );
        assert_eq!(covered(MAPS, 0x6000, 0x7000, true), Ok(()));
        assert_eq!(
            covered(MAPS, 0x6800, 0x8000, true),
            Err(RangeError::NotMapped { addr: 0x7000 })
        );
        assert_eq!(
            covered(MAPS, 0x100, 0x200, false),
            Err(RangeError::NotMapped { addr: 0x100 })
        );
    }
}
