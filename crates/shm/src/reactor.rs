//! Descriptors on tokio's reactor (feature `tokio`), for the client's async completions.

use std::io;
use std::os::fd::OwnedFd;

use tokio::io::unix::AsyncFd;

/// Registers `fd` with the current tokio reactor, for readiness only (the caller reads it
/// with its own calls). The `AsyncFd` owns the descriptor, so it stays open for as long as
/// it is registered: what `AsyncFd::register` requires, here guaranteed by ownership.
pub fn register_readable(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the AsyncFd takes ownership of `fd`; nothing else can close or replace that
    // descriptor number while it is registered, and the AsyncFd deregisters it before
    // dropping (closing) it.
    unsafe {
        AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
            .map_err(|e| e.into_parts().1)
    }
}
