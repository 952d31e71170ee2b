//! Linux errno values, as the C boundary reports them.
//!
//! The core is platform independent and has no libc dependency, so the few values it needs are
//! spelled out here. They are the Linux (asm-generic) numbers that rdma-core callers see.

/// No such file or directory: an unknown handle given to a destroy/close.
pub const ENOENT: i32 = 2;
/// Bad file descriptor.
pub const EBADF: i32 = 9;
/// Try again: open_xrcd without `O_CREAT` for a file that has no domain yet.
pub const EAGAIN: i32 = 11;
/// Out of memory, or a device resource limit was reached.
pub const ENOMEM: i32 = 12;
/// Device or resource busy: the object still has dependants.
pub const EBUSY: i32 = 16;
/// Invalid argument.
pub const EINVAL: i32 = 22;
/// Function not implemented.
pub const ENOSYS: i32 = 38;
/// Operation not supported.
pub const EOPNOTSUPP: i32 = 95;

/// Linux `O_CREAT` (octal 0100), as passed in `ibv_xrcd_init_attr.oflags`.
pub const O_CREAT: u32 = 0o100;
/// Linux `O_EXCL` (octal 0200).
pub const O_EXCL: u32 = 0o200;
