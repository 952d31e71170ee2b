//! A memfd mapped `MAP_SHARED` into this process. This module holds the crate's only
//! `unsafe` code: `mmap`/`munmap`, and handing out slices of atomics over the mapping.
//!
//! The rule that keeps the rest sound: memory another process may write is never seen
//! through a plain Rust reference (`&u8`, `&[u8]`, `&mut T`), only through `&AtomicU8`,
//! `&AtomicU32` and `&AtomicU64`. Atomics have interior mutability, so a shared reference
//! to memory that changes underneath is allowed, and every bit pattern is a valid value,
//! so whatever a peer writes is just a number the reader must validate.

use std::ffi::c_void;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

use rustix::fs::{fstat, ftruncate, memfd_create, FileType, MemfdFlags, SealFlags};
use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};

/// Seals [`Region::create`] puts on its memfd. `SHRINK` is the one that matters: without
/// it the peer could `ftruncate` the file and turn our next access into `SIGBUS`.
const CREATE_SEALS: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// A memfd of a fixed size, mapped read-write and `MAP_SHARED`; unmapped on drop.
///
/// Its memory is reachable only as atomics ([`Region::atomic_u32`], [`Region::atomic_u64s`],
/// [`Region::read`], [`Region::write`]), so the other process writing any bytes at any time
/// cannot cause undefined behaviour here; it can only produce values the reader rejects.
#[derive(Debug)]
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `Region` owns its mapping (nobody else unmaps it) and only ever gives out shared
// references to atomics inside it, which are `Sync`; moving the owner to another thread or
// sharing it does not change what the memory is or who may unmap it.
unsafe impl Send for Region {}
// SAFETY: as above; all access through `&Region` is through atomic types.
unsafe impl Sync for Region {}

/// The atomic integer types a [`Region`] hands out. Sealed: each one must have the size and
/// alignment of its integer and accept every bit pattern.
pub trait Atom: sealed::Sealed + Sized {}
impl Atom for AtomicU8 {}
impl Atom for AtomicU32 {}
impl Atom for AtomicU64 {}
mod sealed {
    pub trait Sealed {}
    impl Sealed for std::sync::atomic::AtomicU8 {}
    impl Sealed for std::sync::atomic::AtomicU32 {}
    impl Sealed for std::sync::atomic::AtomicU64 {}
}

impl Region {
    /// Creates a zero-filled memfd of `len` bytes, seals its size (`F_SEAL_SHRINK |
    /// F_SEAL_GROW | F_SEAL_SEAL`) and maps it. Returns the mapping and the descriptor to
    /// pass to the other process (close-on-exec; [`Region::map`] it there).
    pub fn create(name: &str, len: usize) -> io::Result<(Region, OwnedFd)> {
        if len == 0 {
            return Err(invalid("a shared region cannot be empty"));
        }
        let fd = memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        ftruncate(&fd, len as u64)?;
        rustix::fs::fcntl_add_seals(&fd, CREATE_SEALS)?;
        let region = Region::map(&fd, len)?;
        Ok((region, fd))
    }

    /// Maps a region received from the other process. The descriptor must be a regular,
    /// size-sealed (`F_SEAL_SHRINK`) memfd of exactly `len` bytes (checked with `fstat` and
    /// `F_GET_SEALS`), so the peer can neither hand over something else nor shrink the file
    /// under the mapping later. The descriptor may be closed afterwards.
    pub fn map(fd: impl AsFd, len: usize) -> io::Result<Region> {
        Region::map_with(fd.as_fd(), len, MapFlags::SHARED)
    }

    /// [`Region::map`], with every page of the region allocated and in this process's page
    /// tables before it returns (`MAP_POPULATE`, mmap(2)): for rings on a latency path. A
    /// ring's first lap otherwise takes a page fault every few entries in each process that
    /// maps it — microseconds each on a VM, and the p99 of `ib_send_lat` on the direct path
    /// (docs/performance.md, "Issue 16: first-lap page faults"). The price is the
    /// region's memory at once rather than as the ring first wraps, which the queues of a
    /// hardware device pin at creation too.
    pub fn map_populated(fd: impl AsFd, len: usize) -> io::Result<Region> {
        Region::map_with(fd.as_fd(), len, MapFlags::SHARED | MapFlags::POPULATE)
    }

    fn map_with(fd: BorrowedFd<'_>, len: usize, flags: MapFlags) -> io::Result<Region> {
        if len == 0 {
            return Err(invalid("a shared region cannot be empty"));
        }
        let st = fstat(fd)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(invalid("shared region descriptor is not a regular file"));
        }
        if u64::try_from(st.st_size).ok() != Some(len as u64) {
            return Err(invalid("shared region has the wrong size"));
        }
        let seals = rustix::fs::fcntl_get_seals(fd)
            .map_err(|_| invalid("shared region descriptor is not a sealable memfd"))?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(invalid("shared region is not sealed against shrinking"));
        }
        // SAFETY: a fresh mapping at an address the kernel chooses (null hint, no
        // MAP_FIXED), so no existing memory or Rust reference is affected. The file is at
        // least `len` bytes and cannot shrink (checked above), so every byte of the
        // mapping stays backed and accessing it cannot raise SIGBUS.
        let ptr = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                flags,
                fd,
                0,
            )?
        };
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| invalid("mmap returned null"))?;
        Ok(Region { ptr, len })
    }

    /// The address of the mapping's first byte in this process (page-aligned): what a
    /// memory registration names. An integer, not a pointer: the bytes are reached only
    /// through the accessors.
    #[inline]
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Size of the mapping in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: a region is never empty. (For clippy's `len_without_is_empty`.)
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `count` consecutive atomics starting at byte `offset`.
    ///
    /// # Panics
    /// If `offset` is not aligned for `A` or the range does not lie inside the region. The
    /// offsets are the caller's own (derived from its layout, never read from the shared
    /// memory), so this is a programming error, not something a peer can provoke.
    pub fn atomics<A: Atom>(&self, offset: usize, count: usize) -> &[A] {
        let size = std::mem::size_of::<A>();
        let end = count
            .checked_mul(size)
            .and_then(|b| b.checked_add(offset))
            .expect("region range overflows");
        assert!(
            end <= self.len,
            "range {offset}..{end} outside region of {}",
            self.len
        );
        assert_eq!(
            offset % std::mem::align_of::<A>(),
            0,
            "misaligned atomic at {offset}"
        );
        // SAFETY: `offset..end` lies inside the mapping (checked), which stays mapped for as
        // long as `&self` is borrowed (it is unmapped only in `Drop`). The start is aligned
        // for `A` (checked; the mapping itself is page-aligned). `A` is one of
        // AtomicU8/U32/U64 (sealed trait), which have the size and alignment of their
        // integer, accept every bit pattern, and have interior mutability, so a shared slice
        // of them over memory that this or another process modifies concurrently is sound:
        // this process accesses the memory only through such atomics.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset).cast::<A>(), count) }
    }

    /// The `AtomicU32` at byte `offset` (4-aligned). Panics as [`Region::atomics`].
    #[inline]
    pub fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        &self.atomics::<AtomicU32>(offset, 1)[0]
    }

    /// `count` `AtomicU64`s at byte `offset` (8-aligned). Panics as [`Region::atomics`].
    #[inline]
    pub fn atomic_u64s(&self, offset: usize, count: usize) -> &[AtomicU64] {
        self.atomics::<AtomicU64>(offset, count)
    }

    /// Copies `dst.len()` bytes starting at `offset` out of the region, with relaxed atomic
    /// loads (whole 8-byte words where aligned). A racing writer yields some mix of old and
    /// new bytes, never undefined behaviour; the caller validates what it got. Ordering
    /// with respect to the writer comes from the caller's acquire on an index.
    /// Panics as [`Region::atomics`] if the range is outside the region.
    #[inline]
    pub fn read(&self, offset: usize, dst: &mut [u8]) {
        let (head, words, tail) = self.split(offset, dst.len());
        let (d_head, rest) = dst.split_at_mut(head.len());
        let (d_words, d_tail) = rest.split_at_mut(words.len() * 8);
        for (d, a) in d_head.iter_mut().zip(head) {
            *d = a.load(Ordering::Relaxed);
        }
        for (d, a) in d_words.chunks_exact_mut(8).zip(words) {
            d.copy_from_slice(&a.load(Ordering::Relaxed).to_ne_bytes());
        }
        for (d, a) in d_tail.iter_mut().zip(tail) {
            *d = a.load(Ordering::Relaxed);
        }
    }

    /// Copies `src` into the region at `offset` with relaxed atomic stores (the mirror of
    /// [`Region::read`]); the caller publishes it with a release store of an index.
    /// Panics as [`Region::atomics`] if the range is outside the region.
    #[inline]
    pub fn write(&self, offset: usize, src: &[u8]) {
        let (head, words, tail) = self.split(offset, src.len());
        let (s_head, rest) = src.split_at(head.len());
        let (s_words, s_tail) = rest.split_at(words.len() * 8);
        for (s, a) in s_head.iter().zip(head) {
            a.store(*s, Ordering::Relaxed);
        }
        for (s, a) in s_words.chunks_exact(8).zip(words) {
            let w = u64::from_ne_bytes(s.try_into().expect("chunk of 8"));
            a.store(w, Ordering::Relaxed);
        }
        for (s, a) in s_tail.iter().zip(tail) {
            a.store(*s, Ordering::Relaxed);
        }
    }

    /// `offset..offset+len` as unaligned leading bytes, aligned words, trailing bytes.
    #[inline]
    fn split(&self, offset: usize, len: usize) -> (&[AtomicU8], &[AtomicU64], &[AtomicU8]) {
        let head = ((8 - offset % 8) % 8).min(len);
        let words = (len - head) / 8;
        let tail = len - head - words * 8;
        let w_off = offset + head;
        let t_off = w_off + words * 8;
        (
            self.atomics::<AtomicU8>(offset, head),
            self.atomics::<AtomicU64>(w_off, words),
            self.atomics::<AtomicU8>(t_off, tail),
        )
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe a mapping this `Region` created and owns; every
        // reference into it borrows `self`, so none outlives this call.
        let _ = unsafe { munmap(self.ptr.as_ptr().cast::<c_void>(), self.len) };
    }
}

fn invalid(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_mappings_see_each_others_writes() {
        let (a, fd) = Region::create("t", 4096).unwrap();
        let b = Region::map(&fd, 4096).unwrap();
        a.atomic_u32(8).store(0xdead_beef, Ordering::Release);
        assert_eq!(b.atomic_u32(8).load(Ordering::Acquire), 0xdead_beef);
        let msg: Vec<u8> = (0..37).collect();
        b.write(3, &msg);
        let mut back = [0u8; 37];
        a.read(3, &mut back);
        assert_eq!(&back[..], &msg[..]);
    }

    #[test]
    fn map_rejects_wrong_size_and_unsealed_files() {
        let (_a, fd) = Region::create("t", 4096).unwrap();
        assert!(Region::map(&fd, 8192).is_err());
        assert!(Region::map(&fd, 0).is_err());
        // The seal holds: the file cannot be shrunk under a mapping.
        assert!(ftruncate(&fd, 100).is_err());
        // An unsealed memfd is refused.
        let plain = memfd_create("plain", MemfdFlags::CLOEXEC).unwrap();
        ftruncate(&plain, 4096).unwrap();
        assert!(Region::map(&plain, 4096).is_err());
        // So is something that is not a file at all.
        let efd = softverbs_ipc::new_eventfd().unwrap();
        assert!(Region::map(&efd, 4096).is_err());
    }

    /// The resident size of the mapping at `addr`, from /proc/self/smaps (proc(5)).
    fn rss_kib(addr: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut mine = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((start, _)) = range.split_once('-') {
                    if let Ok(start) = usize::from_str_radix(start, 16) {
                        mine = start == addr;
                        continue;
                    }
                }
            }
            if let Some(kb) = line.strip_prefix("Rss:").filter(|_| mine) {
                return kb.trim().trim_end_matches("kB").trim().parse().unwrap();
            }
        }
        panic!("no mapping at {addr:#x}");
    }

    #[test]
    fn a_populated_mapping_is_resident_at_once_and_checked_as_map_checks() {
        const LEN: usize = 256 * 1024;
        let (a, fd) = Region::create("t", LEN).unwrap();
        let lazy = Region::map(&fd, LEN).unwrap();
        assert_eq!(
            rss_kib(lazy.addr()),
            0,
            "a plain mapping faults pages in as touched"
        );
        let b = Region::map_populated(&fd, LEN).unwrap();
        assert_eq!(rss_kib(b.addr()), (LEN / 1024) as u64);
        a.atomic_u32(LEN - 4).store(7, Ordering::Release);
        assert_eq!(b.atomic_u32(LEN - 4).load(Ordering::Acquire), 7);
        assert!(Region::map_populated(&fd, 2 * LEN).is_err());
        let plain = memfd_create("plain", MemfdFlags::CLOEXEC).unwrap();
        ftruncate(&plain, 4096).unwrap();
        assert!(Region::map_populated(&plain, 4096).is_err());
    }

    #[test]
    #[should_panic(expected = "outside region")]
    fn out_of_range_access_is_refused() {
        let (a, _fd) = Region::create("t", 64).unwrap();
        let _ = a.atomic_u64s(32, 5);
    }
}
