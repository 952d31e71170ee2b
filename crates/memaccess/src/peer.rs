//! Single-copy transfers between this process's registered memory and a peer process's, for
//! the same-host direct path (docs/design/direct-path.md): the kernel copies straight between the
//! two address spaces through the peer's `/proc/<pid>/mem` descriptor (which the peer opened
//! on itself and the daemon checked and handed over), one `preadv`/`pwritev` per contiguous
//! remote range, however many local pieces it has.
//!
//! The local side is named by raw addresses of memory the caller registered (the promise of
//! [`RawMemory`](crate::RawMemory)): the kernel reads or writes it itself, so no Rust
//! reference to memory another party may write is ever made. A descriptor is bound to the
//! peer's address space, not to its pid, so a peer that died and whose pid was reused leads
//! nowhere (its reads and writes fail).

use std::os::fd::{AsRawFd, OwnedFd};

/// Which side of a transfer failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PeerFault {
    /// A local address was not mapped (`EFAULT` from the kernel).
    #[error("local memory not reachable")]
    Local,
    /// The peer's memory could not be reached (its range unmapped).
    #[error("peer memory not reachable")]
    Remote,
    /// The peer's address space is gone (the process exited or was killed): the kernel
    /// moves nothing at all through the descriptor.
    #[error("peer gone")]
    Gone,
}

/// The most local pieces one system call takes here (`UIO_FASTIOV` is 8; the kernel allows
/// 1024).
const MAX_IOV: usize = 64;

/// A peer process's memory.
#[derive(Debug)]
pub struct PeerMemory {
    fd: OwnedFd,
}

impl PeerMemory {
    /// Over the peer's `/proc/<pid>/mem` (validated by whoever handed it over).
    pub fn new(fd: OwnedFd) -> PeerMemory {
        PeerMemory { fd }
    }

    /// Copies the local pieces `(address, length)` of this process, in order, to the peer's
    /// `[remote, remote + total)`.
    pub fn write_from(&self, local: &[(u64, u64)], remote: u64) -> Result<(), PeerFault> {
        self.transfer(local, remote, true)
    }

    /// Copies the peer's `[remote, remote + total)` into the local pieces, in order.
    pub fn read_into(&self, local: &[(u64, u64)], remote: u64) -> Result<(), PeerFault> {
        self.transfer(local, remote, false)
    }

    fn transfer(&self, local: &[(u64, u64)], remote: u64, write: bool) -> Result<(), PeerFault> {
        let mut pieces: Vec<(u64, u64)> = local.iter().copied().filter(|p| p.1 > 0).collect();
        let mut offset = remote;
        let mut first = 0;
        while first < pieces.len() {
            let end = (first + MAX_IOV).min(pieces.len());
            let iov: Vec<libc::iovec> = pieces[first..end]
                .iter()
                .map(|&(a, l)| libc::iovec {
                    iov_base: a as usize as *mut libc::c_void,
                    iov_len: l as usize,
                })
                .collect();
            let off = i64::try_from(offset).map_err(|_| PeerFault::Remote)?;
            if iov.is_empty() {
                break;
            }
            // SAFETY: the iovecs name memory of this process that the caller registered
            // (RawMemory's contract: allocated to it for the registration's lifetime); the
            // kernel reads (pwritev) or writes (preadv) it and reports an unmapped address as
            // EFAULT rather than touching anything else. No Rust reference to it is made.
            let n = unsafe {
                if write {
                    libc::pwritev(self.fd.as_raw_fd(), iov.as_ptr(), iov.len() as i32, off)
                } else {
                    libc::preadv(self.fd.as_raw_fd(), iov.as_ptr(), iov.len() as i32, off)
                }
            };
            if n < 0 {
                let e = std::io::Error::last_os_error().raw_os_error();
                if e == Some(libc::EINTR) {
                    continue;
                }
                return Err(if e == Some(libc::EFAULT) {
                    PeerFault::Local
                } else {
                    PeerFault::Remote
                });
            }
            if n == 0 {
                return Err(PeerFault::Gone);
            }
            // Advance past what was moved (a short transfer resumes mid-piece).
            let mut moved = n as u64;
            offset += moved;
            while moved > 0 && first < pieces.len() {
                let p = &mut pieces[first];
                let take = moved.min(p.1);
                p.0 += take;
                p.1 -= take;
                moved -= take;
                if p.1 == 0 {
                    first += 1;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_between_pieces_and_reports_which_side_failed() {
        let fd = crate::open_own_memory().unwrap();
        let peer = PeerMemory::new(fd);
        let src = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let mut dst = [0u8; 8];
        let (s, d) = (src.as_ptr() as u64, dst.as_mut_ptr() as u64);
        // Two local pieces to one remote range.
        peer.write_from(&[(s, 3), (s + 3, 5)], d).unwrap();
        assert_eq!(std::hint::black_box(dst), src);
        let mut back = [0u8; 8];
        peer.read_into(&[(back.as_mut_ptr() as u64, 8)], s).unwrap();
        assert_eq!(back, src);
        assert_eq!(peer.write_from(&[(8, 8)], d), Err(PeerFault::Local));
        assert_eq!(peer.write_from(&[(s, 8)], 8), Err(PeerFault::Remote));
    }
}
