//! The client's error type: which call failed and the errno it failed with.

use softverbs_ipc::IpcErrno;

/// Linux errno values the client reports (the daemon's answers pass through unchanged): those
/// of the one table, `softverbs_core::errno`.
pub mod errno {
    pub use softverbs_core::errno::{
        EADDRINUSE, EAGAIN, EBADF, EBUSY, ECONNREFUSED, ECONNRESET, EEXIST, EINVAL, EIO, ENODEV,
        ENOENT, ENOMEM, ENOSYS, ENOTCONN, EOPNOTSUPP, EPIPE, EPROTO,
    };
}

/// A failed call: the operation (`"alloc_pd"`, `"connect"`, …), its errno, and whether the
/// device is gone ([`ErrorKind::DeviceFatal`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {}{} (errno {errno})", kind_text(*.kind), strerror(*.errno))]
pub struct Error {
    /// The operation that failed.
    pub op: &'static str,
    /// The errno (positive, Linux numbering).
    pub errno: i32,
    kind: ErrorKind,
}

/// What kind of failure an [`Error`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The daemon, or the client's own checks, refused the call with the errno.
    Refused,
    /// The device is gone: the daemon exited (or closed the connection), the context saw
    /// `IBV_EVENT_DEVICE_FATAL`, and every verb on it fails with `EIO` except the ones that
    /// destroy objects, which succeed so the program can clean up (docs/guide/dropin.md, "When the
    /// daemon dies"). Open a new [`Context`](crate::Context) once a daemon runs again.
    DeviceFatal,
}

fn kind_text(k: ErrorKind) -> &'static str {
    match k {
        ErrorKind::Refused => "",
        ErrorKind::DeviceFatal => "device fatal error, the daemon is gone: ",
    }
}

impl Error {
    /// An error of `op` with `errno`.
    pub fn new(op: &'static str, errno: i32) -> Error {
        Error {
            op,
            errno,
            kind: ErrorKind::Refused,
        }
    }

    /// `op` failed because the device is gone (errno `EIO`).
    pub fn device_fatal(op: &'static str) -> Error {
        Error {
            op,
            errno: errno::EIO,
            kind: ErrorKind::DeviceFatal,
        }
    }

    /// The errno.
    pub fn errno(&self) -> i32 {
        self.errno
    }

    /// The operation that failed.
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Whether the device is gone ([`ErrorKind::DeviceFatal`]).
    pub fn is_device_fatal(&self) -> bool {
        self.kind == ErrorKind::DeviceFatal
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
        let e = Error::device_fatal("alloc_pd");
        assert_eq!((e.errno(), e.kind()), (errno::EIO, ErrorKind::DeviceFatal));
        assert!(e.is_device_fatal() && !Error::new("alloc_pd", errno::EIO).is_device_fatal());
        assert_eq!(
            e.to_string(),
            "alloc_pd: device fatal error, the daemon is gone: Input/output error (errno 5)"
        );
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
