//! How the daemon reaches registered client memory (`docs/design/registered-memory.md` argues the
//! design from measurements).
//!
//! The core has already checked key, protection domain, bounds and access flags when the
//! transport engine calls its [`Memory`](softverbs_core::memory::Memory); this crate provides
//! the byte access behind it:
//!
//! * [`SharedMappings`]: memory the client turned into a memfd in place
//!   ([`share_in_place`]) and passed to the daemon, which maps it once at registration and
//!   then reaches it with `memcpy` and real CPU atomics, no system call per access.
//!   Unmapped by [`SharedMappings::remove_region`] when the memory region is deregistered,
//!   after which the client turns the pages back into private memory ([`unshare_in_place`]);
//!   a child the client forks meanwhile gets its own copy (`fork_child`).
//! * [`ProcessMem`]: any other memory, one `pread`/`pwrite` per access on the client's own
//!   `/proc/self/mem`, which the client opens ([`open_own_memory`]) and passes at context
//!   open and the daemon checks ([`ProcessMemory::validate`]). The descriptor is bound to
//!   the client's address space, not to its pid, so a reused pid never leads anywhere.
//! * [`ProcessVm`]: the same by pid with `process_vm_readv`/`process_vm_writev`. The daemon
//!   no longer uses it (a pid can be reused by an unrelated process between two accesses);
//!   it stays as the measured comparison (`benches/access.rs`).
//!
//! The daemon stacks them: `SharedMappings::with_fallback(ProcessMem::new())`.
//!
//! Also one socket option the daemon's sockets need and no safe wrapper offers
//! ([`accept_zero_udp6_checksums`]): this is the daemon's crate for `unsafe` system calls.
//!
//! `unsafe` is confined to the OS boundary (`mmap`, `munmap`, `mremap`, raw copies and the
//! atomic view of a shared word), all of it in the one module allowed to use it (`map`), each
//! block argued with a `SAFETY:` comment; the public API is safe.
#![deny(unsafe_code)]

mod batch;
mod client;
#[allow(unsafe_code)]
mod direct_copy;
#[allow(unsafe_code)]
mod fork_child;
#[allow(unsafe_code)]
mod map;
#[allow(unsafe_code)]
mod peer;
mod process_mem;
mod process_vm;
#[allow(unsafe_code)]
mod raw;
mod shared;
#[allow(unsafe_code)]
mod sockopt;
#[allow(unsafe_code)]
mod vmas;
#[allow(unsafe_code)]
mod write_guard;

pub use batch::{BatchStats, MAX_HELD, MAX_STREAMS, MIN_STREAM, WINDOW};
pub use client::{
    authorize_daemon, share_in_place, unshare_in_place, Authorization, Converted, ShareError,
};
pub use direct_copy::{atomic_own, read_own, write_own, PeerMapping};
pub use fork_child::install_fork_handler;
pub use peer::{PeerFault, PeerMemory};
pub use process_mem::{
    open_own_maps, open_own_memory, own_pidfd, reachable_as, MemFdError, ProcessMem, ProcessMemory,
    RangeError,
};
pub use process_vm::ProcessVm;
pub use raw::RawMemory;
pub use shared::{NoFallback, RegionError, RegionId, SharedMappings};
pub use sockopt::accept_zero_udp6_checksums;

/// The system page size (what registrations are rounded to).
pub fn page_size() -> usize {
    rustix::param::page_size()
}
