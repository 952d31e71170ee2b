//! Copies of the same-host direct path that need no system call (docs/design/direct-path.md, "How
//! work moves"): into and out of a peer's MR that is shared memory, mapped here from the
//! memfd the daemon handed over ([`PeerMapping`]), and between a message and this process's
//! own registered memory ([`read_own`], [`write_own`]).
//!
//! Local addresses are those of memory this process registered, as [`PeerMemory`]'s are
//! (the promise of [`RawMemory`](crate::RawMemory): allocated to the registration until it
//! is deregistered, reached by others only through raw pointers or atomics); the caller
//! checks them against its own MR table first. Unlike the kernel behind `PeerMemory`, a raw
//! copy cannot report an unmapped local address: a program that broke that promise (unmapped
//! registered memory) faults here as it would touching the memory itself.
//!
//! [`PeerMemory`]: crate::PeerMemory

use std::os::fd::OwnedFd;

use softverbs_core::memory::AtomicOp;

use crate::map::Mapping;
use crate::PeerFault;

/// A peer's shared-memory MR mapped into this process: file byte 0 is the peer's address
/// `base` (the page holding the MR's first byte).
#[derive(Debug)]
pub struct PeerMapping {
    map: Mapping,
    base: u64,
}

impl PeerMapping {
    /// Maps the first `len` bytes of the memfd `fd` (sealed against shrinking by the
    /// daemon's check at registration, so no access can raise `SIGBUS`), read-write and
    /// shared; `base` is the peer address of its byte 0.
    pub fn map(fd: OwnedFd, base: u64, len: usize) -> std::io::Result<PeerMapping> {
        if len == 0 {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let map = Mapping::shared(&fd, len, false)?;
        // A child of this process must not reach the peer's memory (and the fork child
        // handler would otherwise copy it for nothing).
        map.keep_from_children()?;
        Ok(PeerMapping { map, base })
    }

    /// Where peer bytes `[addr, addr + len)` are in the mapping, if it holds them all.
    fn offset(&self, addr: u64, len: u64) -> Option<usize> {
        let off = addr.checked_sub(self.base)?;
        (off.checked_add(len)? <= self.map.len() as u64).then_some(off as usize)
    }

    /// Copies the local pieces `(address, length)` of this process, in order, to the peer's
    /// `[remote, remote + total)`; `Remote` if the mapping does not hold all of it.
    pub fn write_from(&self, local: &[(u64, u64)], remote: u64) -> Result<(), PeerFault> {
        let total: u64 = local.iter().map(|p| p.1).sum();
        let mut at = self.offset(remote, total).ok_or(PeerFault::Remote)?;
        for &(a, l) in local {
            // SAFETY: `at..at+l` lies inside this live shared mapping (checked by `offset`
            // for the whole run); the file cannot shrink under it. `a..a+l` is registered
            // memory of this process (the module's contract, checked by the caller against
            // its MR table). Only raw pointers are used and `u8` has no invalid values, so a
            // peer or thread writing either range concurrently yields arbitrary bytes, as a
            // NIC's DMA racing the CPU would, never undefined behaviour in Rust's terms. The
            // ranges may overlap only if the peer mapped its own memory here, which
            // `copy` (memmove) tolerates.
            unsafe { std::ptr::copy(a as usize as *const u8, self.map.ptr().add(at), l as usize) };
            at += l as usize;
        }
        Ok(())
    }

    /// Applies `op` as a CPU atomic to the peer's 8 bytes at `remote` and returns their old
    /// value: the same instructions on the same memfd pages as the daemon's engine uses for
    /// the atomics it executes on a shared MR (`SharedMappings`), so the two are atomic with
    /// respect to each other. `Remote` if the mapping does not hold the 8 bytes or they are
    /// not 8-byte aligned.
    pub fn atomic(&self, remote: u64, op: AtomicOp) -> Result<u64, PeerFault> {
        let at = self.offset(remote, 8).ok_or(PeerFault::Remote)?;
        self.map.atomic(at, op).ok_or(PeerFault::Remote)
    }

    /// Copies the peer's `[remote, remote + total)` into the local pieces, in order.
    pub fn read_into(&self, local: &[(u64, u64)], remote: u64) -> Result<(), PeerFault> {
        let total: u64 = local.iter().map(|p| p.1).sum();
        let mut at = self.offset(remote, total).ok_or(PeerFault::Remote)?;
        for &(a, l) in local {
            // SAFETY: as in `write_from`, the other way round: the mapping's range is
            // checked, the local range is registered memory of this process.
            unsafe {
                std::ptr::copy(
                    self.map.ptr().add(at).cast_const(),
                    a as usize as *mut u8,
                    l as usize,
                )
            };
            at += l as usize;
        }
        Ok(())
    }
}

/// Copies `buf.len()` bytes of this process's registered memory at `addr` into `buf` (the
/// module's contract: the caller checked the range against its own MR table).
pub fn read_own(addr: u64, buf: &mut [u8]) {
    // SAFETY: `addr..addr+len` is registered memory of this process, which stays allocated
    // while registered (RawMemory's promise) and is reached by others only through raw
    // pointers; `buf` is a distinct allocation of ours. Racing writers give arbitrary bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(addr as usize as *const u8, buf.as_mut_ptr(), buf.len())
    }
}

/// Copies `data` into this process's registered memory at `addr` (see [`read_own`]). What
/// the receiver's library does with a small SEND's bytes when it takes the completion.
pub fn write_own(addr: u64, data: &[u8]) {
    // SAFETY: as in `read_own`: the target is registered memory of this process (checked by
    // the caller against its MR table with LOCAL_WRITE), which no Rust reference covers
    // (RawMemory's promise), so writing it invalidates nothing Rust relies on. Had the
    // program unmapped it while registered, against that promise, this faults (SIGSEGV) as
    // the program's own access would.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as usize as *mut u8, data.len()) }
}

/// Applies `op` as a CPU atomic to this process's registered 8 bytes at `addr` (see
/// [`read_own`]) and returns their old value; `None` if `addr` is not 8-byte aligned (IBA
/// 9.4.5 requires it; the responder's checks refuse it before). What the library's engine
/// does for an atomic that reaches a QP it runs itself (docs/design/net-path.md).
pub fn atomic_own(addr: u64, op: AtomicOp) -> Option<u64> {
    use std::sync::atomic::{AtomicU64, Ordering};
    if addr % 8 != 0 {
        return None;
    }
    // SAFETY: the 8 bytes at `addr` are registered memory of this process (the caller
    // checked them against its MR table), aligned (checked above), and reached by others only
    // through raw pointers or atomics (RawMemory's promise), so viewing them as an AtomicU64
    // for the duration of this call creates no aliasing Rust relies on.
    let a = unsafe { AtomicU64::from_ptr(addr as usize as *mut u64) };
    let old = match op {
        AtomicOp::CompareSwap { compare, swap } => {
            match a.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(v) | Err(v) => v,
            }
        }
        AtomicOp::FetchAdd { add } => a.fetch_add(add, Ordering::SeqCst),
    };
    Some(old)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapping_is_reached_at_the_peer_addresses_it_covers() {
        let (fd, len) = {
            let fd = rustix::fs::memfd_create("t", rustix::fs::MemfdFlags::empty()).unwrap();
            rustix::fs::ftruncate(&fd, 8192).unwrap();
            (fd, 8192usize)
        };
        let other = PeerMapping::map(fd.try_clone().unwrap(), 0x10000, len).unwrap();
        let m = PeerMapping::map(fd, 0x10000, len).unwrap();
        let src = [1u8, 2, 3, 4, 5, 6];
        let (s, n) = (src.as_ptr() as u64, src.len() as u64);
        m.write_from(&[(s, 2), (s + 2, 4)], 0x10ffe).unwrap();
        let mut back = [0u8; 6];
        other
            .read_into(&[(back.as_mut_ptr() as u64, n)], 0x10ffe)
            .unwrap();
        assert_eq!(back, src, "through another mapping of the same file");
        assert_eq!(
            m.write_from(&[(s, n)], 0xffff),
            Err(PeerFault::Remote),
            "before"
        );
        assert_eq!(
            m.write_from(&[(s, n)], 0x11ffc),
            Err(PeerFault::Remote),
            "past the end"
        );
        let mut own = [0u8; 3];
        write_own(own.as_mut_ptr() as u64, &[7, 8, 9]);
        assert_eq!(std::hint::black_box(own), [7, 8, 9]);
        let mut got = [0u8; 3];
        read_own(own.as_ptr() as u64, &mut got);
        assert_eq!(got, [7, 8, 9]);
    }
}
