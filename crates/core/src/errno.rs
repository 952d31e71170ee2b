//! Linux errno values, as the C boundary reports them: the one table every softverbs crate
//! uses (abi, core, daemon, client, drop-in library, CLI), so a number is spelled once.
//!
//! The core is platform independent and has no libc dependency, so the values are spelled out
//! here. They are the Linux (asm-generic) numbers that rdma-core callers see; the drop-in
//! library checks them against its libc at compile time.

/// Operation not permitted: a command only the daemon's own user may send.
pub const EPERM: i32 = 1;
/// No such file or directory: an unknown handle given to a destroy/close.
pub const ENOENT: i32 = 2;
/// I/O error: the device is gone (the daemon died), or a socket failed with no better errno.
pub const EIO: i32 = 5;
/// Bad address: a registration over pages that are not mapped as asked, a prefetch of a
/// range that is not.
pub const EFAULT: i32 = 14;
/// Bad file descriptor.
pub const EBADF: i32 = 9;
/// Try again: open_xrcd without `O_CREAT` for a file that has no domain yet.
pub const EAGAIN: i32 = 11;
/// Out of memory, or a device resource limit was reached.
pub const ENOMEM: i32 = 12;
/// Device or resource busy: the object still has dependants.
pub const EBUSY: i32 = 16;
/// File exists.
pub const EEXIST: i32 = 17;
/// No such device.
pub const ENODEV: i32 = 19;
/// Invalid argument.
pub const EINVAL: i32 = 22;
/// Broken pipe: the daemon's end of the connection is closed.
pub const EPIPE: i32 = 32;
/// Function not implemented.
pub const ENOSYS: i32 = 38;
/// No data available: an empty GID table entry (`ibv_query_gid_ex(3)`).
pub const ENODATA: i32 = 61;
/// Protocol error: the daemon's answer did not follow the ABI.
pub const EPROTO: i32 = 71;
/// Message too long: a request that does not fit a datagram.
pub const EMSGSIZE: i32 = 90;
/// Protocol not supported: a client ABI older than the daemon accepts.
pub const EPROTONOSUPPORT: i32 = 93;
/// Operation not supported.
pub const EOPNOTSUPP: i32 = 95;
/// Address already in use: a CM listener already has the service ID.
pub const EADDRINUSE: i32 = 98;
/// Connection reset: the daemon closed the connection.
pub const ECONNRESET: i32 = 104;
/// Not connected: the connection to the daemon is gone.
pub const ENOTCONN: i32 = 107;
/// Connection refused: nothing listens on the socket.
pub const ECONNREFUSED: i32 = 111;

/// Linux `O_CREAT` (octal 0100), as passed in `ibv_xrcd_init_attr.oflags`.
pub const O_CREAT: u32 = 0o100;
/// Linux `O_EXCL` (octal 0200).
pub const O_EXCL: u32 = 0o200;
