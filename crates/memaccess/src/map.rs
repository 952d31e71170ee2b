//! An owned `MAP_SHARED` mapping of a file, and the crate's only `unsafe` code: `mmap`,
//! `munmap`, `mremap`, the raw copies in and out of a mapping and the atomic view of a word
//! in it. Everything else in the crate reaches memory through the safe methods here, which
//! check their offsets against the mapping they own.

use std::ffi::c_void;
use std::os::fd::AsFd;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::mm::{
    madvise, mmap, mmap_anonymous, mremap_fixed, munmap, Advice, MapFlags, MremapFlags, ProtFlags,
};
use softverbs_core::memory::AtomicOp;

/// `len` bytes of a file mapped read-write and shared at `ptr`, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a `Mapping` is a plain owned address range of this process; the mapping is as
// valid on any thread as on the one that created it, and the raw pointer is only
// dereferenced through methods that take `&self`/`&mut self` of the owner.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `fd` (`len > 0`) read-write and shared, wherever the
    /// kernel likes.
    pub(crate) fn shared(fd: impl AsFd, len: usize, populate: bool) -> std::io::Result<Self> {
        Self::shared_at(fd, 0, len, populate)
    }

    /// Bytes `offset..offset + len` of `fd` (`offset` page-aligned, `len > 0`), read-write and
    /// shared, wherever the kernel likes.
    pub(crate) fn shared_at(
        fd: impl AsFd,
        offset: usize,
        len: usize,
        populate: bool,
    ) -> std::io::Result<Self> {
        let mut flags = MapFlags::SHARED;
        if populate {
            flags |= MapFlags::POPULATE;
        }
        // SAFETY: no address hint and no MAP_FIXED, so the kernel picks a range that
        // overlaps no existing mapping: nothing this process (or Rust) owns is replaced.
        // The result is a fresh range that only this `Mapping` refers to.
        let ptr = unsafe {
            mmap(
                ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                flags,
                fd,
                offset as u64,
            )
        }?;
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }

    /// `len` bytes (`len > 0`) of fresh private anonymous read-write memory, wherever the
    /// kernel likes: what [`unshare_in_place`](crate::unshare_in_place) and the fork child
    /// (`fork_child.rs`) copy a shared range into before moving it back in place.
    pub(crate) fn private_anonymous(len: usize) -> std::io::Result<Self> {
        // SAFETY: as in `shared`: no hint and no MAP_FIXED, so nothing existing is replaced,
        // and only the new `Mapping` refers to the range.
        let ptr = unsafe {
            mmap_anonymous(
                ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }?;
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }

    /// Keeps the mapping out of children created by `fork()` (`MADV_DONTFORK`, madvise(2)):
    /// for a peer's memory mapped by this process, which a child has no business reaching
    /// and which the fork child handler would otherwise copy for nothing.
    pub(crate) fn keep_from_children(&self) -> std::io::Result<()> {
        // SAFETY: advice on exactly the range this `Mapping` owns; MADV_DONTFORK changes
        // only what a future child inherits, nothing in this process.
        unsafe { madvise(self.ptr.cast::<c_void>(), self.len, Advice::LinuxDontFork) }?;
        Ok(())
    }

    /// First byte of the mapping (for the raw copies of `direct_copy.rs`, which check their
    /// ranges against [`Mapping::len`]).
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes (whole pages).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Copies the `self.len()` bytes at address `lo` of this process into the mapping, then
    /// moves the mapping onto `lo` (`mremap` with `MREMAP_FIXED`): the pages there become
    /// pages of this mapping (shared pages of the file, or private ones) holding the same
    /// bytes. On success the range belongs to whoever owned `lo..` before, so nothing is
    /// unmapped when this returns.
    ///
    /// Contract (what [`share_in_place`](crate::share_in_place),
    /// [`unshare_in_place`](crate::unshare_in_place) and the fork child check and document
    /// before calling): `lo` is page-aligned, `lo..lo + self.len()` is readable memory of
    /// this process that the program owns (private anonymous, or a memfd this crate put
    /// there), and no thread writes it (they wait on a write guard, or there is no other
    /// thread) or unmaps it during the call.
    pub(crate) fn copy_and_move_onto(self, lo: usize) -> rustix::io::Result<()> {
        let n = self.len;
        // SAFETY: `lo..lo+n` is readable memory of this process (checked against
        // /proc/self/maps by the caller: private anonymous read-write pages or a memfd this
        // crate mapped there, which nothing but the caller unmaps, per the contract). `self`
        // is a fresh mapping of `n` bytes that nothing else refers to, so the ranges do not
        // overlap. Only raw
        // pointers are used; the source may hold any bytes (`u8` has no invalid values).
        unsafe { std::ptr::copy_nonoverlapping(lo as *const u8, self.ptr, n) };
        // SAFETY: moves this mapping (owned, `n` bytes) onto `lo..lo+n`, replacing the
        // pages there with pages of this mapping holding the same bytes at the same
        // addresses. Memory the program owns there (the caller's buffer and whatever shares
        // its first and last page) keeps its contents, so no Rust value observes a change;
        // writes by other threads wait on the caller's write guard (write_guard.rs) until the
        // new pages are in place, so none lands in the old pages after the copy. The target
        // range is exactly the range the caller checked, so no other mapping is replaced.
        let moved = unsafe {
            mremap_fixed(
                self.ptr.cast::<c_void>(),
                n,
                n,
                MremapFlags::MAYMOVE,
                lo as *mut c_void,
            )
        };
        if moved.is_ok() {
            // The range now belongs to the caller's allocation again; nothing to unmap.
            std::mem::forget(self);
        }
        moved.map(|_| ())
    }

    /// Copies `buf.len()` bytes at offset `at` of the mapping into `buf`.
    ///
    /// # Panics
    /// If `at + buf.len()` exceeds the mapping (callers translate within a region first).
    pub(crate) fn read(&self, at: usize, buf: &mut [u8]) {
        self.check(at, buf.len());
        // SAFETY: `at..at+len` lies inside this live read-write mapping (checked above), owned
        // by `self` and unmapped only on drop, which cannot happen while `&self` is held. The
        // file behind it holds at least the whole mapping and is sealed against shrinking, so
        // the access cannot fault. `buf` is a distinct allocation of ours, so the ranges do
        // not overlap. The client may write these bytes concurrently; no reference to the
        // mapping is created and `u8` has no invalid values, so a racing write yields
        // arbitrary but valid bytes (the same as a NIC's DMA racing the CPU).
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.add(at).cast_const(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        }
    }

    /// Copies `data` to offset `at` of the mapping.
    ///
    /// # Panics
    /// If `at + data.len()` exceeds the mapping.
    pub(crate) fn write(&self, at: usize, data: &[u8]) {
        self.check(at, data.len());
        // SAFETY: as in `read`: `at..at+len` is inside a live, writable, non-truncatable
        // shared mapping owned by `self`; `data` is our own memory and does not overlap it; no
        // reference into the mapping exists, so writing bytes the client may be reading
        // concurrently invalidates nothing Rust relies on.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(at), data.len()) }
    }

    /// Applies `op` as a CPU atomic (`lock cmpxchg`/`lock xadd`) to the 8 bytes at offset
    /// `at` and returns the old value; `None` if that address is not 8-byte aligned.
    ///
    /// # Panics
    /// If `at + 8` exceeds the mapping.
    pub(crate) fn atomic(&self, at: usize, op: AtomicOp) -> Option<u64> {
        self.check(at, 8);
        let p = self.ptr.wrapping_add(at);
        if p.align_offset(std::mem::align_of::<AtomicU64>()) != 0 {
            return None;
        }
        // SAFETY: `p` is 8-byte aligned (checked above) and valid for reads and writes of 8
        // bytes for as long as `self` is borrowed (see `read`), which outlives `a`. Every
        // access to those bytes from this process goes through raw-pointer copies or this
        // atomic, never through a Rust reference; the client's concurrent accesses happen in
        // another address space, and its atomics use the same hardware instructions, so they
        // are mutually atomic.
        let a = unsafe { AtomicU64::from_ptr(p.cast::<u64>()) };
        Some(match op {
            AtomicOp::CompareSwap { compare, swap } => {
                match a.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(old) | Err(old) => old,
                }
            }
            AtomicOp::FetchAdd { add } => a.fetch_add(add, Ordering::SeqCst),
        })
    }

    /// The bounds rule that keeps `read`, `write` and `atomic` inside the mapping.
    fn check(&self, at: usize, len: usize) {
        assert!(
            at.checked_add(len).is_some_and(|end| end <= self.len),
            "{len} bytes at offset {at} outside a mapping of {} bytes",
            self.len
        );
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr+len` is exactly the range `Mapping::shared` obtained from mmap and
        // nobody else refers to it (no references into it are ever handed out; raw pointers
        // derived from it are used only while the owner is borrowed). An munmap error cannot
        // leave anything dangling, so it is ignored.
        let _ = unsafe { munmap(self.ptr.cast::<c_void>(), self.len) };
    }
}
