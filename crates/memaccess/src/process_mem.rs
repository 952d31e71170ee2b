//! The path for memory that is not shared: `pread`/`pwrite` on the client's own
//! `/proc/self/mem`, opened by the client and passed to the daemon at context open.
//!
//! Why a descriptor and not a pid (docs/registered-memory.md, "Which process"): opening
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
use softverbs_core::memory::{Fault, Memory};

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
        Ok(ProcessMemory { fd, pid })
    }

    /// The pid the memory belonged to when it was validated (for logs; the descriptor, not
    /// this number, decides what is accessed).
    pub fn pid(&self) -> u32 {
        self.pid
    }
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
/// `proc_mem.force_override=` says otherwise), so a remote write into an MR registered
/// with `IBV_ACCESS_REMOTE_WRITE` over read-only pages of the client lands (in a private
/// copy of the page) where a NIC would fault. Only the client's own registration allows
/// that, and the client could write those pages the same way itself.
///
/// # Atomics
///
/// As for [`ProcessVm`](crate::ProcessVm): the trait's default read-modify-write, atomic
/// only with respect to other atomics of this daemon (`IBV_ATOMIC_HCA`).
#[derive(Debug, Default)]
pub struct ProcessMem {
    spaces: HashMap<CtxId, ProcessMemory>,
}

impl ProcessMem {
    /// No process known.
    pub fn new() -> Self {
        Self::default()
    }

    /// Accesses for `ctx` go to `mem` from now on (replacing an earlier one).
    pub fn register_process(&mut self, ctx: CtxId, mem: ProcessMemory) {
        self.spaces.insert(ctx, mem);
    }

    /// Forgets `ctx` (when the context is closed), closing its descriptor; the pid it was
    /// validated for, if it had one.
    pub fn unregister_process(&mut self, ctx: CtxId) -> Option<u32> {
        self.spaces.remove(&ctx).map(|m| m.pid)
    }

    /// The pid `ctx`'s memory was validated for.
    pub fn pid(&self, ctx: CtxId) -> Option<u32> {
        self.spaces.get(&ctx).map(|m| m.pid)
    }

    fn target(&self, ctx: CtxId, addr: u64, len: usize) -> Result<&OwnedFd, Fault> {
        let m = self.spaces.get(&ctx).ok_or(Fault { ctx, addr })?;
        // File offsets are signed: the whole range must fit below i64::MAX.
        let end = addr.checked_add(len as u64).ok_or(Fault { ctx, addr })?;
        if end > i64::MAX as u64 {
            return Err(Fault { ctx, addr });
        }
        Ok(&m.fd)
    }
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
        let fd = self.target(ctx, addr, buf.len())?.as_fd();
        let len = buf.len();
        transfer(ctx, addr, len, |done| {
            rustix::io::pread(fd, &mut buf[done..], addr + done as u64)
        })
    }

    fn write(&mut self, ctx: CtxId, addr: u64, data: &[u8]) -> Result<(), Fault> {
        let fd = self.target(ctx, addr, data.len())?.as_fd();
        let len = data.len();
        transfer(ctx, addr, len, |done| {
            rustix::io::pwrite(fd, &data[done..], addr + done as u64)
        })
    }
}
