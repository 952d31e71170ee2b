//! Holding every write to a range of this process back while [`share_in_place`] copies it
//! and maps the copy over it, so that no write of another thread (or of the kernel on its
//! behalf, such as `read(2)` into the buffer) lands in the old pages after they were copied
//! (docs/design/registered-memory.md, "Registration while other threads write").
//!
//! Mechanism: userfaultfd write-protection (userfaultfd(2), ioctl_userfaultfd(2),
//! `UFFDIO_REGISTER_MODE_WP`, `UFFDIO_WRITEPROTECT`; Linux 5.7, and 6.4 for pages never
//! touched, `UFFD_FEATURE_WP_UNPOPULATED`). A write to a write-protected page, from user
//! mode or from the kernel's copy to user memory, waits in the kernel until the page is
//! unprotected or the userfaultfd is closed, and is then retried against whatever is mapped
//! there by then: the shared copy. Nobody reads the userfaultfd: faults just wait. Reads are
//! not affected. `mprotect` would not do: a kernel write into a `PROT_READ` page fails with
//! `EFAULT` instead of waiting, which would break a program's `read(2)` into its buffer.
//!
//! The userfaultfd is created without `UFFD_USER_MODE_ONLY` (which would make the kernel's
//! writes fail, as `mprotect` does), so it needs `CAP_SYS_PTRACE` unless
//! `vm.unprivileged_userfaultfd` is 1; without it [`WriteGuard::arm`] fails and the caller
//! does not convert.
//!
//! [`share_in_place`]: crate::share_in_place

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::ioctl::{ioctl, opcode, Updater};
use rustix::mm::{userfaultfd, UserfaultfdFlags};

const UFFD_API: u64 = 0xAA;
const UFFD_FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
const UFFD_FEATURE_WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
const UFFD_FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;
/// Bit of `uffdio_register.ioctls` saying `UFFDIO_WRITEPROTECT` works on the range.
const UFFDIO_WRITEPROTECT_BIT: u64 = 1 << 0x06;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

const UFFDIO_API: rustix::ioctl::Opcode = opcode::read_write::<UffdioApi>(0xAA, 0x3F);
const UFFDIO_REGISTER: rustix::ioctl::Opcode = opcode::read_write::<UffdioRegister>(0xAA, 0x00);
const UFFDIO_WRITEPROTECT: rustix::ioctl::Opcode =
    opcode::read_write::<UffdioWriteprotect>(0xAA, 0x06);

/// `userfaultfd(2)` was refused to this process (`EPERM`, `ENOSYS`): [`WriteGuard::arm`]
/// fails at once from then on.
static REFUSED: AtomicBool = AtomicBool::new(false);

/// Whether a write guard can be armed at all in this process, as far as is known: false once
/// `userfaultfd(2)` was refused. [`share_in_place`](crate::share_in_place) asks before it
/// prepares a copy.
pub(crate) fn may_arm() -> bool {
    !REFUSED.load(Ordering::Relaxed)
}

/// While alive, writes to the guarded pages wait; dropping it lets them go on (against
/// whatever is mapped there then).
#[derive(Debug)]
pub(crate) struct WriteGuard {
    uffd: OwnedFd,
    range: (u64, u64),
}

impl WriteGuard {
    /// Write-protects the page-aligned range `[lo, lo + len)` of this process's private
    /// anonymous memory, or with `shmem` of a shared memfd mapping (which needs
    /// `UFFD_FEATURE_WP_HUGETLBFS_SHMEM`, Linux 5.19). When this returns, no write to it can
    /// complete until the guard is dropped (the write-protect ioctl flushes the TLBs of every
    /// CPU before it returns).
    pub(crate) fn arm(lo: usize, len: usize, shmem: bool) -> io::Result<WriteGuard> {
        if REFUSED.load(Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        // SAFETY: creating the descriptor is harmless; it is used below only to protect
        // pages the caller is about to replace, and closed (which releases every waiting
        // fault) when the guard drops.
        let uffd =
            match unsafe { userfaultfd(UserfaultfdFlags::CLOEXEC | UserfaultfdFlags::NONBLOCK) } {
                Ok(fd) => fd,
                Err(e) => {
                    // No privilege (or no userfaultfd in the kernel): the same answer every time,
                    // so later registrations skip the work of preparing a conversion.
                    if matches!(e, rustix::io::Errno::PERM | rustix::io::Errno::NOSYS) {
                        REFUSED.store(true, Ordering::Relaxed);
                    }
                    return Err(e.into());
                }
            };
        let mut api = UffdioApi {
            api: UFFD_API,
            features: UFFD_FEATURE_PAGEFAULT_FLAG_WP
                | UFFD_FEATURE_WP_UNPOPULATED
                | if shmem {
                    UFFD_FEATURE_WP_HUGETLBFS_SHMEM
                } else {
                    0
                },
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API takes a `struct uffdio_api`, which `UffdioApi` lays out.
        unsafe { ioctl(&uffd, Updater::<UFFDIO_API, UffdioApi>::new(&mut api)) }?;
        let range = UffdioRange {
            start: lo as u64,
            len: len as u64,
        };
        let mut reg = UffdioRegister {
            range,
            mode: UFFDIO_REGISTER_MODE_WP,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER takes a `struct uffdio_register`. Registering changes
        // nothing for the program until pages are write-protected.
        unsafe {
            ioctl(
                &uffd,
                Updater::<UFFDIO_REGISTER, UffdioRegister>::new(&mut reg),
            )
        }?;
        if reg.ioctls & UFFDIO_WRITEPROTECT_BIT == 0 {
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        }
        let guard = WriteGuard {
            uffd,
            range: (lo as u64, len as u64),
        };
        guard.protect(true)?;
        Ok(guard)
    }

    fn protect(&self, on: bool) -> io::Result<()> {
        let mut wp = UffdioWriteprotect {
            range: UffdioRange {
                start: self.range.0,
                len: self.range.1,
            },
            mode: if on { UFFDIO_WRITEPROTECT_MODE_WP } else { 0 },
        };
        // SAFETY: UFFDIO_WRITEPROTECT takes a `struct uffdio_writeprotect`; it changes only
        // whether writes to the registered range wait (and, turning it off, wakes them).
        unsafe {
            ioctl(
                &self.uffd,
                Updater::<UFFDIO_WRITEPROTECT, UffdioWriteprotect>::new(&mut wp),
            )
        }?;
        Ok(())
    }
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        // When the pages were replaced, the range is no longer registered and this fails
        // (ENOENT), which is fine; otherwise (the conversion failed) the original pages
        // become writable again. Closing the descriptor then wakes every waiting write,
        // which is retried against what is mapped now.
        let _ = self.protect(false);
    }
}
