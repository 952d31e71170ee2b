//! How the engine reaches registered memory: key checks are the core's
//! ([`crate::Core::check_mem`]: key, PD, bounds, access flags), byte access is a
//! [`Memory`] the shell provides (shared mappings, `process_vm_readv`, or a test buffer).

use crate::ids::CtxId;

/// The memory could not be touched although the key check passed (e.g. the owner unmapped
/// it). The engine reports it as a protection/operational error, never panics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("memory of context {ctx:?} at {addr:#x} is not accessible")]
pub struct Fault {
    /// Owner.
    pub ctx: CtxId,
    /// Address.
    pub addr: u64,
}

/// An 8-byte atomic operation (IBA 9.4.5), on a value in host byte order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp {
    /// Store `swap` if the value equals `compare`.
    CompareSwap {
        /// Expected.
        compare: u64,
        /// New.
        swap: u64,
    },
    /// Add `add` (wrapping).
    FetchAdd {
        /// Addend.
        add: u64,
    },
}

impl AtomicOp {
    /// The new value for `old`.
    pub fn apply(self, old: u64) -> u64 {
        match self {
            AtomicOp::CompareSwap { compare, swap } => {
                if old == compare {
                    swap
                } else {
                    old
                }
            }
            AtomicOp::FetchAdd { add } => old.wrapping_add(add),
        }
    }
}

/// Byte access to the address spaces of the clients (the keys were checked already).
pub trait Memory {
    /// Reads `buf.len()` bytes at `addr` of `ctx`.
    fn read(&mut self, ctx: CtxId, addr: u64, buf: &mut [u8]) -> Result<(), Fault>;
    /// Writes `data` at `addr` of `ctx`.
    fn write(&mut self, ctx: CtxId, addr: u64, data: &[u8]) -> Result<(), Fault>;
    /// Applies `op` to the 8 bytes at `addr` of `ctx` atomically with respect to other
    /// atomics, returning the original value.
    fn atomic(&mut self, ctx: CtxId, addr: u64, op: AtomicOp) -> Result<u64, Fault> {
        let mut b = [0u8; 8];
        self.read(ctx, addr, &mut b)?;
        let old = u64::from_ne_bytes(b);
        self.write(ctx, addr, &op.apply(old).to_ne_bytes())?;
        Ok(old)
    }

    /// A hint: the engine is about to read the `len` bytes at `addr` of `ctx` front to back
    /// for one work request (a gather list piece of a message it starts sending, an RDMA
    /// READ response it starts generating), so a memory that pays per call may fetch them in
    /// larger pieces than the packets it is asked for. Bytes fetched on a hint may serve
    /// reads of this range until the next hint overlapping it: the owner may not change a
    /// buffer while a request that reads it is outstanding (ibv_post_send(3)), and every
    /// request's reads are preceded by its own hint. `on_demand` as for
    /// [`Memory::read_for`]. The default does nothing.
    fn will_read(&mut self, on_demand: bool, ctx: CtxId, addr: u64, len: u64) {
        let _ = (on_demand, ctx, addr, len);
    }

    /// Makes every [`Memory::write`] so far visible in the owners' memory. A memory may
    /// hold writes back to coalesce them (consecutive packets of one message into one
    /// system call); the shell calls this before anything that lets a program look at the
    /// written bytes leaves it: a completion, a packet on a wire (an ACK lets the requester
    /// complete). Reads and atomics of this memory see held-back writes without it. A
    /// fault is reported for the first held-back write that could not be made (the others
    /// are still attempted). The default holds nothing back.
    fn flush(&mut self) -> Result<(), Fault> {
        Ok(())
    }

    /// [`Memory::read`] of the memory mapped at `addr` at this moment, for an on-demand-paging
    /// MR ([`crate::datapath::MemTarget::on_demand`]): never through a mapping kept from some
    /// registration, which would show pages the owner has since unmapped or replaced.
    fn read_mapped(&mut self, ctx: CtxId, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        self.read(ctx, addr, buf)
    }
    /// [`Memory::write`] as [`Memory::read_mapped`] reads.
    fn write_mapped(&mut self, ctx: CtxId, addr: u64, data: &[u8]) -> Result<(), Fault> {
        self.write(ctx, addr, data)
    }
    /// [`Memory::atomic`] as [`Memory::read_mapped`] reads.
    fn atomic_mapped(&mut self, ctx: CtxId, addr: u64, op: AtomicOp) -> Result<u64, Fault> {
        self.atomic(ctx, addr, op)
    }

    /// `read` or `read_mapped`, as an MR registered with or without on-demand paging needs.
    fn read_for(
        &mut self,
        on_demand: bool,
        ctx: CtxId,
        addr: u64,
        buf: &mut [u8],
    ) -> Result<(), Fault> {
        if on_demand {
            self.read_mapped(ctx, addr, buf)
        } else {
            self.read(ctx, addr, buf)
        }
    }
    /// `write` or `write_mapped` (see [`Memory::read_for`]).
    fn write_for(
        &mut self,
        on_demand: bool,
        ctx: CtxId,
        addr: u64,
        data: &[u8],
    ) -> Result<(), Fault> {
        if on_demand {
            self.write_mapped(ctx, addr, data)
        } else {
            self.write(ctx, addr, data)
        }
    }
    /// `atomic` or `atomic_mapped` (see [`Memory::read_for`]).
    fn atomic_for(
        &mut self,
        on_demand: bool,
        ctx: CtxId,
        addr: u64,
        op: AtomicOp,
    ) -> Result<u64, Fault> {
        if on_demand {
            self.atomic_mapped(ctx, addr, op)
        } else {
            self.atomic(ctx, addr, op)
        }
    }
}

/// Memory for tests and benchmarks: one flat byte vector per context, addressed from 0.
#[derive(Debug, Default)]
pub struct VecMemory {
    spaces: std::collections::HashMap<CtxId, Vec<u8>>,
    hints: Vec<(CtxId, u64, u64)>,
}

/// How many [`Memory::will_read`] hints a [`VecMemory`] remembers (the first ones).
pub const VEC_MEMORY_HINTS: usize = 4096;

impl VecMemory {
    /// Gives `ctx` an address space of `len` zero bytes.
    pub fn add(&mut self, ctx: CtxId, len: usize) {
        self.spaces.insert(ctx, vec![0; len]);
    }

    /// The bytes of `ctx`.
    pub fn space(&self, ctx: CtxId) -> &[u8] {
        &self.spaces[&ctx]
    }

    /// The bytes of `ctx`, writable.
    pub fn space_mut(&mut self, ctx: CtxId) -> &mut [u8] {
        self.spaces.get_mut(&ctx).expect("known context")
    }

    /// The [`Memory::will_read`] hints received, `(ctx, addr, len)` in order (the first
    /// [`VEC_MEMORY_HINTS`]), for tests of what the engine announces.
    pub fn hints(&self) -> &[(CtxId, u64, u64)] {
        &self.hints
    }

    fn range(&mut self, ctx: CtxId, addr: u64, len: usize) -> Result<&mut [u8], Fault> {
        let space = self.spaces.get_mut(&ctx).ok_or(Fault { ctx, addr })?;
        let start = usize::try_from(addr).map_err(|_| Fault { ctx, addr })?;
        let end = start
            .checked_add(len)
            .filter(|&e| e <= space.len())
            .ok_or(Fault { ctx, addr })?;
        Ok(&mut space[start..end])
    }
}

impl Memory for VecMemory {
    fn read(&mut self, ctx: CtxId, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        buf.copy_from_slice(self.range(ctx, addr, buf.len())?);
        Ok(())
    }

    fn write(&mut self, ctx: CtxId, addr: u64, data: &[u8]) -> Result<(), Fault> {
        self.range(ctx, addr, data.len())?.copy_from_slice(data);
        Ok(())
    }

    fn will_read(&mut self, _on_demand: bool, ctx: CtxId, addr: u64, len: u64) {
        if self.hints.len() < VEC_MEMORY_HINTS {
            self.hints.push((ctx, addr, len));
        }
    }
}
