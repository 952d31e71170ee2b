//! `--capture DIR`: where a daemon writes one pcap file per device address.
//!
//! A root daemon writing by name into a directory another user can change would truncate or
//! create whatever file a planted symlink names (issue 35, item 9). So the directory must pass
//! `private_dir::open_checked` (it and its ancestors owned by root or the daemon's uid, not
//! writable by group or others; docs/security.md, "Paths") and each file is opened relative
//! to that descriptor with `O_NOFOLLOW` (open(2)): a symlink in its place is refused
//! (`ELOOP`), never followed. Either failure stops the daemon with the reason, since a capture
//! asked for and silently not written is worse than none.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{openat, Mode, OFlags};
use softverbs_ipc::private_dir::{self, Owner};

/// A checked capture directory.
pub struct CaptureDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl CaptureDir {
    /// Opens and checks `path`, or says why it will not be written to.
    pub fn open(path: &Path) -> io::Result<CaptureDir> {
        let fd = private_dir::open_checked(path, Owner::MeOrRoot)
            .map_err(|e| io::Error::new(e.kind(), format!("--capture: {e}")))?;
        Ok(CaptureDir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// Creates (or truncates) the regular file `name` in it, never through a symlink. Mode
    /// 0600: a capture holds every user's traffic.
    pub fn create(&self, name: &str) -> io::Result<std::fs::File> {
        let flags = OFlags::WRONLY
            | OFlags::CREATE
            | OFlags::TRUNC
            | OFlags::NOFOLLOW
            | OFlags::NOCTTY
            | OFlags::CLOEXEC;
        openat(&self.fd, name, flags, Mode::from_raw_mode(0o600))
            .map(std::fs::File::from)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "--capture: {}: {e}{}",
                        self.path.join(name).display(),
                        if e == rustix::io::Errno::LOOP {
                            " (a symlink: refused, not followed)"
                        } else {
                            ""
                        }
                    ),
                )
            })
    }
}
