//! An owned `MAP_SHARED` mapping of a file (the one place this crate calls `mmap`/`munmap`).

use std::ffi::c_void;
use std::os::fd::AsFd;
use std::ptr;

use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};

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
                0,
            )
        }?;
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }

    /// First byte.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes (whole pages).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Gives up ownership without unmapping (the range was moved elsewhere by `mremap`).
    pub(crate) fn forget(self) {
        std::mem::forget(self);
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
