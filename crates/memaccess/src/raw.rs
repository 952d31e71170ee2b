//! A promise about raw memory, for registering memory the library did not allocate.

use std::os::fd::OwnedFd;

use crate::client::{share_in_place, ShareError};

/// `len` bytes at `addr` of this process that their owner promised (with `unsafe`) may be
/// registered: what the raw-address registrations of the client library
/// (`softverbs::Pd::reg_mr`, `reg_mr_iova`, `reg_mr_shared`, `Mr::rereg`) take, so that
/// safe code cannot make the daemon write memory it does not own. Safe Rust code uses the
/// library's owned or borrowed registrations instead; this is for FFI callers such as the
/// drop-in `libibverbs.so.1`, whose C callers make the same promise to `ibv_reg_mr(3)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawMemory {
    addr: usize,
    len: usize,
    shareable: bool,
}

impl RawMemory {
    /// Names `[addr, addr + len)` for registration.
    ///
    /// # Safety
    ///
    /// From the registration of a memory region over (part of) this range until its
    /// deregistration has returned (dropping the MR deregisters it), the daemon may write
    /// the registered bytes at any moment, as a NIC's DMA would: for a local receive, a READ
    /// or an atomic result, and, with remote write or atomic access, on behalf of any peer
    /// holding the R_Key. During that time the bytes must stay allocated to the caller (not
    /// freed, not reused for other objects) and must not be reached through Rust references
    /// (`&T`, `&mut T`, `&[u8]`) of any kind, only through raw pointers (e.g.
    /// `ptr::read_volatile`) or atomics. Memory that is only ever sent (no write access of
    /// any kind in the registration) is read, never written, by the daemon; it must still not
    /// be freed while registered if its contents must stay private.
    pub unsafe fn new(addr: usize, len: usize) -> RawMemory {
        RawMemory {
            addr,
            len,
            shareable: false,
        }
    }

    /// Like [`RawMemory::new`], and the range may also be turned into shared memory in
    /// place at registration ([`share_in_place`], `softverbs::Pd::reg_mr_shared`).
    ///
    /// # Safety
    ///
    /// Everything [`RawMemory::new`] requires, and: during the registration call no thread
    /// may unmap any of the pages the range touches, and no write to them may go through
    /// pages pinned before the call (`O_DIRECT`, `io_uring` fixed buffers, a device's DMA in
    /// flight). Other writes, by threads or by the kernel on their behalf, including to
    /// other objects on the first and last page, wait for the conversion and are kept
    /// ([`share_in_place`]). Afterwards those pages are `MAP_SHARED`, so a child created by
    /// `fork()` shares them instead of getting a copy.
    pub unsafe fn new_shareable(addr: usize, len: usize) -> RawMemory {
        RawMemory {
            addr,
            len,
            shareable: true,
        }
    }

    /// The whole address space of this process, for an implicit on-demand-paging MR
    /// (ibv_reg_mr(3) with `addr` NULL and `length` `SIZE_MAX`; `softverbs::Pd::reg_mr_on_demand`).
    ///
    /// # Safety
    ///
    /// What [`RawMemory::new`] requires, for every byte of memory the process has mapped or
    /// will map while the MR is registered: with write or atomic access in the registration,
    /// a peer holding the R_Key may write any of it (as a NIC with an implicit ODP key may),
    /// so no memory that Rust references reach may be written through the keys. The caller
    /// names the ranges its work requests and peers use, and vouches for them as for
    /// [`RawMemory::new`].
    pub unsafe fn address_space() -> RawMemory {
        RawMemory {
            addr: 0,
            len: usize::MAX,
            shareable: false,
        }
    }

    /// The first byte's address.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Bytes in the range.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` for an empty range.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether [`RawMemory::share_in_place`] may convert it.
    pub fn is_shareable(&self) -> bool {
        self.shareable
    }

    /// [`share_in_place`] of the range, when its owner promised it may be
    /// ([`RawMemory::new_shareable`]); `None` otherwise.
    pub fn share_in_place(&self) -> Option<Result<OwnedFd, ShareError>> {
        self.shareable.then(|| share_in_place(self.addr, self.len))
    }
}
