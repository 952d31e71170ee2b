//! An eventfd doorbell: how a producer wakes a consumer that went to sleep.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};

/// A non-blocking eventfd that a sleeping consumer waits on and a producer rings.
///
/// One doorbell may serve many rings (the daemon waits on one per client, say): the
/// consumer raises `need_wakeup` on each ring it is about to sleep on and then waits here.
#[derive(Debug)]
pub struct Doorbell {
    fd: OwnedFd,
}

impl Doorbell {
    /// A fresh eventfd (close-on-exec, non-blocking).
    pub fn new() -> io::Result<Doorbell> {
        Ok(Doorbell {
            fd: softverbs_ipc::new_eventfd()?,
        })
    }

    /// Wraps a descriptor received from the other process. It is switched to non-blocking
    /// mode, so a peer that passed something other than an eventfd cannot make
    /// [`ring`](Doorbell::ring) or [`drain`](Doorbell::drain) block.
    pub fn from_fd(fd: OwnedFd) -> io::Result<Doorbell> {
        let fl = fcntl_getfl(&fd)?;
        if !fl.contains(OFlags::NONBLOCK) {
            fcntl_setfl(&fd, fl | OFlags::NONBLOCK)?;
        }
        Ok(Doorbell { fd })
    }

    /// Wakes the waiter (one `write` system call; only needed when a push said so).
    pub fn ring(&self) {
        softverbs_ipc::signal_eventfd(self.fd.as_fd());
    }

    /// Resets the doorbell; returns whether it had been rung.
    pub fn drain(&self) -> bool {
        softverbs_ipc::drain_eventfd(self.fd.as_fd())
    }

    /// Blocks until rung or `timeout` passes (`None`: forever); returns whether it was rung.
    /// Does not reset it (see [`drain`](Doorbell::drain)).
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        let ms = timeout.map(|t| {
            // Round up so a short timeout still sleeps, and clamp to poll's range.
            let ms = t.as_nanos().div_ceil(1_000_000);
            i32::try_from(ms).unwrap_or(i32::MAX)
        });
        softverbs_ipc::wait_readable(self.fd.as_fd(), ms)
    }
}

impl AsFd for Doorbell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl From<Doorbell> for OwnedFd {
    fn from(d: Doorbell) -> OwnedFd {
        d.fd
    }
}
