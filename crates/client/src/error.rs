//! The client's error type: which call failed and the errno it failed with.

use softverbs_ipc::IpcErrno;

/// Linux errno values the client reports (the daemon's answers pass through unchanged).
pub mod errno {
    pub use softverbs_core::errno::{
        EAGAIN, EBADF, EBUSY, EINVAL, ENOENT, ENOMEM, ENOSYS, EOPNOTSUPP,
    };

    /// I/O error: the socket failed in a way that has no better errno.
    pub const EIO: i32 = 5;
    /// Protocol error: the daemon's answer did not follow the ABI.
    pub const EPROTO: i32 = 71;
    /// Connection reset: the daemon closed the connection.
    pub const ECONNRESET: i32 = 104;
    /// Connection refused: nothing listens on the socket.
    pub const ECONNREFUSED: i32 = 111;
    /// File exists.
    pub const EEXIST: i32 = 17;
    /// No such device.
    pub const ENODEV: i32 = 19;
}

/// A failed call: the operation (`"alloc_pd"`, `"connect"`, …) and its errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {} (errno {errno})", strerror(*.errno))]
pub struct Error {
    /// The operation that failed.
    pub op: &'static str,
    /// The errno (positive, Linux numbering).
    pub errno: i32,
}

impl Error {
    /// An error of `op` with `errno`.
    pub fn new(op: &'static str, errno: i32) -> Error {
        Error { op, errno }
    }

    /// The errno.
    pub fn errno(&self) -> i32 {
        self.errno
    }

    /// The operation that failed.
    pub fn op(&self) -> &'static str {
        self.op
    }

    pub(crate) fn from_io(op: &'static str, e: &std::io::Error) -> Error {
        Error::new(op, e.raw_os_error().unwrap_or(errno::EIO))
    }

    pub(crate) fn from_ipc(op: &'static str, e: IpcErrno) -> Error {
        Error::new(op, e.raw_os_error())
    }

    pub(crate) fn proto(op: &'static str) -> Error {
        Error::new(op, errno::EPROTO)
    }
}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        let os = std::io::Error::from_raw_os_error(e.errno);
        std::io::Error::new(os.kind(), e)
    }
}

/// The C library's description of `errno` ("No such file or directory"), without the
/// "(os error N)" suffix the standard library adds.
fn strerror(errno: i32) -> String {
    let s = std::io::Error::from_raw_os_error(errno).to_string();
    let suffix = format!(" (os error {errno})");
    match s.strip_suffix(&suffix) {
        Some(text) => text.to_string(),
        None => s,
    }
}

/// Result of a client call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_op_the_text_and_the_number() {
        let e = Error::new("close_xrcd", errno::EBUSY);
        assert_eq!(
            e.to_string(),
            "close_xrcd: Device or resource busy (errno 16)"
        );
        assert_eq!(e.errno(), 16);
        assert_eq!(e.op(), "close_xrcd");
        let e = Error::new("connect", errno::ECONNREFUSED);
        assert_eq!(e.to_string(), "connect: Connection refused (errno 111)");
        assert_eq!(Error::proto("query_qp").errno(), errno::EPROTO);
    }

    #[test]
    fn converts_to_io_error_with_the_os_kind() {
        let io: std::io::Error = Error::new("open_xrcd", errno::ENOENT).into();
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        assert!(io.to_string().starts_with("open_xrcd: "));
        assert_eq!(
            Error::from_io("x", &std::io::Error::from_raw_os_error(111)).errno(),
            errno::ECONNREFUSED
        );
        assert_eq!(
            Error::from_io("x", &std::io::Error::other("no os")).errno(),
            errno::EIO
        );
        assert_eq!(
            Error::from_ipc("x", IpcErrno::CONNREFUSED).errno(),
            errno::ECONNREFUSED
        );
    }
}
