//! `softverbs daemon` as a systemd service (dist/systemd/): the listening socket a socket
//! unit passes (sd_listen_fds(3)) and the readiness and reload notices (sd_notify(3)).
//!
//! Both through the sd-notify crate, a small pure-Rust implementation of those two
//! protocols; the one thing it cannot do safely, owning the passed descriptor, is here.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use sd_notify::NotifyState;
use softverbs_daemon::Notice;

/// Whether [`take_listener`] has run: the passed descriptor gets one owner.
static TAKEN: AtomicBool = AtomicBool::new(false);

/// The socket the service manager passed, if it passed one to this process: `LISTEN_PID`
/// names this process and `LISTEN_FDS` is 1 (fd 3, SD_LISTEN_FDS_START). The variables are
/// removed either way, so programs this one starts do not take them for theirs. More than
/// one socket is an error: the daemon serves one.
///
/// # Safety
///
/// Call before this process opens or closes any descriptor (first thing in the daemon's
/// start-up, while it has one thread): then fd 3, which the service manager left open across
/// exec, is still the passed socket and nothing else owns it.
#[allow(unsafe_code)]
pub unsafe fn take_listener() -> Result<Option<OwnedFd>, String> {
    // Removes LISTEN_PID and LISTEN_FDS (the crate's listen_fds; it also sets FD_CLOEXEC).
    let fds = sd_notify::listen_fds().map_err(|e| format!("socket activation: {e}"))?;
    std::env::remove_var("LISTEN_FDNAMES");
    let fds: Vec<_> = fds.collect();
    match fds[..] {
        [] => Ok(None),
        [fd] => {
            if TAKEN.swap(true, Ordering::SeqCst) {
                return Err("socket activation: the passed socket was already taken".into());
            }
            // SAFETY: `listen_fds` returned it, so LISTEN_PID named this process and the
            // service manager passed `fd` open across exec; the caller guarantees nothing
            // has opened or closed a descriptor since (so it is still that socket and no
            // other object owns it), and TAKEN makes this the only OwnedFd made from it.
            Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
        }
        _ => Err(format!(
            "socket activation: {} sockets passed, the daemon serves one",
            fds.len()
        )),
    }
}

/// Sends `notices` to the service manager when it asked for them (`NOTIFY_SOCKET`); kept
/// set, since every reload notifies again.
pub fn notify(notices: &[Notice]) {
    // One assignment per line (sd_notify(3)): a multi-line message (a TOML error shows the
    // line it refers to) becomes one line.
    let lines: Vec<String> = notices
        .iter()
        .map(|n| match n {
            Notice::Status(s) => s.split_whitespace().collect::<Vec<_>>().join(" "),
            _ => String::new(),
        })
        .collect();
    let mut states = Vec::new();
    for (n, line) in notices.iter().zip(&lines) {
        match n {
            Notice::Ready => states.push(NotifyState::Ready),
            Notice::Reloading => {
                states.push(NotifyState::Reloading);
                // systemd 253's Type=notify-reload wants the reload's start time with it.
                if let Ok(t) = NotifyState::monotonic_usec_now() {
                    states.push(t);
                }
            }
            Notice::Status(_) => states.push(NotifyState::Status(line)),
        }
    }
    if let Err(e) = sd_notify::notify(false, &states) {
        tracing::warn!("sd_notify: {e}");
    }
}
