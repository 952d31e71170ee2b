//! The fallback path: `process_vm_readv`/`process_vm_writev` into the client's address space.

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut};

use nix::errno::Errno;
use nix::sys::uio::{process_vm_readv, process_vm_writev, RemoteIoVec};
use nix::unistd::Pid;
use softverbs_core::ids::CtxId;
use softverbs_core::memory::{Fault, Memory};

/// Reaches any memory of a client process with one `process_vm_readv`/`process_vm_writev`
/// per access (plus one more per short transfer).
///
/// **Not safe against pid reuse**, and the daemon does not use it: once the client exits
/// and its pid goes to another process, accesses reach that process (with the daemon's
/// rights). The daemon uses [`ProcessMem`](crate::ProcessMem); this stays as the measured
/// comparison (docs/design/registered-memory.md).
///
/// Each context is mapped to the pid of the process that opened it
/// ([`register_process`](Self::register_process)). The daemon needs ptrace-read/attach
/// permission over the client: as root it has it; otherwise the client calls
/// [`authorize_daemon`](crate::authorize_daemon) with the daemon's pid (Yama
/// `PR_SET_PTRACER`), and both run under the same uid.
///
/// Every failure (the process is gone, the address is unmapped or not writable, permission
/// denied, an address that does not fit `usize`) is a [`Fault`] on the first byte that could
/// not be transferred; nothing panics. A short transfer is resumed from where it stopped, so
/// a read or write that fails half way has transferred a prefix (as a NIC that hits a
/// fault half way through a DMA).
///
/// # Atomics
///
/// [`Memory::atomic`] is the trait's default: a read and a write, two system calls. It is
/// atomic only with respect to other atomics that go through this daemon (which owns the
/// engine and its `&mut` memory on one thread, so no other daemon-side access interleaves),
/// not with respect to the client's own CPU accesses or to other processes writing the
/// memory. That is the guarantee IBA gives by default (`IBV_ATOMIC_HCA`: atomic with respect
/// to other atomics on the same HCA). Memory registered through
/// [`SharedMappings`](crate::SharedMappings) gets real CPU atomics instead
/// (`IBV_ATOMIC_GLOB`-like).
#[derive(Debug, Default)]
pub struct ProcessVm {
    pids: HashMap<CtxId, Pid>,
}

impl ProcessVm {
    /// No process known.
    pub fn new() -> Self {
        Self::default()
    }

    /// Accesses for `ctx` go to the process `pid` from now on (replacing an earlier one).
    pub fn register_process(&mut self, ctx: CtxId, pid: i32) {
        self.pids.insert(ctx, Pid::from_raw(pid));
    }

    /// Forgets `ctx` (when the context is closed); its pid, if it was known.
    pub fn unregister_process(&mut self, ctx: CtxId) -> Option<i32> {
        self.pids.remove(&ctx).map(Pid::as_raw)
    }

    /// The pid accesses for `ctx` go to.
    pub fn pid(&self, ctx: CtxId) -> Option<i32> {
        self.pids.get(&ctx).map(|p| p.as_raw())
    }

    fn target(&self, ctx: CtxId, addr: u64, len: usize) -> Result<(Pid, usize), Fault> {
        let pid = *self.pids.get(&ctx).ok_or(Fault { ctx, addr })?;
        let base = usize::try_from(addr).map_err(|_| Fault { ctx, addr })?;
        // The whole range must exist as addresses; the kernel would reject it as well.
        base.checked_add(len).ok_or(Fault { ctx, addr })?;
        Ok((pid, base))
    }
}

/// Runs `step(done)` until `len` bytes are transferred; `step` returns how many bytes one
/// system call moved. `EINTR` is retried, a zero-byte transfer or any other error is a fault
/// at the first byte not transferred.
fn transfer(
    ctx: CtxId,
    addr: u64,
    len: usize,
    mut step: impl FnMut(usize) -> nix::Result<usize>,
) -> Result<(), Fault> {
    let mut done = 0;
    while done < len {
        match step(done) {
            Ok(0) => return Err(fault_at(ctx, addr, done)),
            Ok(n) => done += n,
            Err(Errno::EINTR) => {}
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

impl Memory for ProcessVm {
    fn read(&mut self, ctx: CtxId, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        let (pid, base) = self.target(ctx, addr, buf.len())?;
        let len = buf.len();
        transfer(ctx, addr, len, |done| {
            let remote = [RemoteIoVec {
                base: base + done,
                len: len - done,
            }];
            process_vm_readv(pid, &mut [IoSliceMut::new(&mut buf[done..])], &remote)
        })
    }

    fn write(&mut self, ctx: CtxId, addr: u64, data: &[u8]) -> Result<(), Fault> {
        let (pid, base) = self.target(ctx, addr, data.len())?;
        let len = data.len();
        transfer(ctx, addr, len, |done| {
            let remote = [RemoteIoVec {
                base: base + done,
                len: len - done,
            }];
            process_vm_writev(pid, &[IoSlice::new(&data[done..])], &remote)
        })
    }
}
